"""The benchmark report's figures: the error-against-setting curves of the ablations that declare one, the
SVD rank-slice and update maps drawn from the figure data a run stores, and the sentence on the update maps'
numerical ranks.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..plotted import plotted_path
from . import figures as F
from . import report_prose as prose
from .ablations import REGISTRY, family_of
from .names import display_name as _name
from .results import FIGURE_DIR, RANK_SLICES_FILE, UPDATES_FILE
from .stats import Index, Stat, index_records, pairs_of, pooled, seeds_of

__all__ = ["ablation_curves", "render_figures", "update_rank_lines", "default_figure_dir", "unasked_figures"]

RANK_SLICES_FIGURE, UPDATE_MAPS_FIGURE = "rank_slices.png", "update_maps.png"


def _curve_figure(name: str) -> str:
    """The file of ablation ``name``'s error-against-setting figure."""
    return f"error_vs_{name}.png"


FIGURE_FILES = (
    *(_curve_figure(name) for name, a in REGISTRY.items() if a.figure is not None),
    RANK_SLICES_FIGURE,
    UPDATE_MAPS_FIGURE,
)
"""Every figure :func:`render_figures` can write, by file name."""


def default_figure_dir(out_md: str | os.PathLike) -> Path:
    """Where a page's figures go when no folder is named: ``figures/results`` beside the page."""
    return Path(out_md).parent / "figures" / "results"


def unasked_figures(out_md: str | os.PathLike, figure_dir: str | os.PathLike | None = None) -> list[Path]:
    """The existing files a report written to ``out_md``, its figures in ``figure_dir``, would replace that are not
    that page's own: each figure (and its ``.plotted.json``) that ``out_md`` does not link. Regenerating a page
    rewrites the figures it shows; writing a new page never replaces another page's figures unasked (the default
    folder is shared by every page of a folder)."""
    out_md = Path(out_md)
    folder = Path(figure_dir) if figure_dir is not None else default_figure_dir(out_md)
    linked: set[Path] = set()
    if out_md.is_file():
        text = out_md.read_text(encoding="utf-8", errors="replace")
        linked = {(out_md.parent / link).resolve() for link in re.findall(r"\]\(([^)\s]+\.png)\)", text)}
    found = []
    for name in FIGURE_FILES:
        figure = folder / name
        if figure.resolve() not in linked:
            found += [f for f in (figure, plotted_path(figure)) if os.path.lexists(f)]
    return found


def _curve(
    idx: Index, rows_layout: Sequence[dict[str, Any]], family: str, pairs: Sequence[str]
) -> tuple[list[tuple[float, float, float | None]], tuple[int, ...]]:
    """``(setting, mean, half-width of its 95 % interval)`` of the ``family`` rows of one ablation with a numeric
    setting, pooled over ``pairs`` (no half-width: one seed), and the seeds they are on."""
    stats = []
    for row in rows_layout:
        if family_of(row["label"]) != family:
            continue
        s = pooled(idx, row["label"], pairs)
        if s is not None and isinstance(row["value"], (int, float)):
            stats.append((float(row["value"]), s))
    # One line over one set of seeds: a point on more seeds than its neighbours (the default setting's row, run by
    # every seed) would move the line by the seeds it has, not by the setting. Those the page's sentence reads too.
    common = set.intersection(*(set(s.values) for _, s in stats)) if stats else set()
    if not common:
        return [], ()
    kept = [(value, Stat({seed: v for seed, v in s.values.items() if seed in common})) for value, s in stats]
    return [(value, s.mean, s.seed_half_width) for value, s in kept], tuple(sorted(common))


def ablation_curves(
    idx: Index, name: str, rows: Sequence[dict[str, Any]]
) -> dict[str, tuple[list[tuple[float, float, float | None]], tuple[int, ...]]]:
    """The lines of ablation ``name``'s figure (``"<family> <pair>"`` -> its points and the seeds they are on),
    from its stored layout ``rows``; ``{}`` where it declares no figure or no line has two points."""
    ablation = REGISTRY.get(name)
    if ablation is None or ablation.figure is None or not rows:
        return {}
    labels = {r["label"] for r in rows}
    pairs = [p for p in pairs_of(idx) if any((lab, p, s) in idx for lab in labels for s in seeds_of(idx))]
    curves = {}
    for fam in ablation.figure.families:
        for p in pairs:
            points, seeds = _curve(idx, rows, fam, [p])
            if len(points) >= 2:
                curves[f"{fam} {p}"] = (points, seeds)
    return curves


def render_figures(results: dict[str, Any], results_dir: Path | None, figure_dir: Path) -> dict[str, Path]:
    """Every figure of the report, written to ``figure_dir``; returns name -> path."""
    idx = index_records(results.get("records", []))
    layout = results.get("layout", {}).get("ablations", {})
    out: dict[str, Path] = {}
    for name, ablation in REGISTRY.items():
        curves = ablation_curves(idx, name, layout.get(name, []))
        if curves:
            figure = ablation.figure
            points = {label: line for label, (line, _) in curves.items()}
            out[name] = F.plot_curves(
                points, figure_dir / _curve_figure(name), xlabel=figure.xlabel, title=figure.title
            )
    if results_dir is not None:
        data_dir = results_dir / FIGURE_DIR
        path = data_dir / RANK_SLICES_FILE
        if path.is_file():
            tensors, meta = F.load_figure_data(path)
            out["rank_slices"] = F.plot_rank_slices(tensors, meta, figure_dir / RANK_SLICES_FIGURE)
        path = data_dir / UPDATES_FILE
        if path.is_file():
            tensors, meta = F.load_figure_data(path)
            out["updates"] = F.plot_update_maps(tensors, meta, figure_dir / UPDATE_MAPS_FIGURE)
    return out


def update_rank_lines(figure_data: Any) -> list[str]:
    """A sentence on the numerical rank of each shown ΔW (from the update-map data ``(tensors, meta)``)."""
    if not figure_data:
        return []
    tensors, meta = figure_data
    parts = []
    for method, info in sorted(meta.get("methods", {}).items()):
        ranks = [F.numerical_rank(tensors[f"{method}/{p}"]) for p in info["persons"] if f"{method}/{p}" in tensors]
        norms = [float(tensors[f"{method}/{p}"].norm()) for p in info["persons"] if f"{method}/{p}" in tensors]
        if ranks:
            parts.append(
                prose.UPDATE_RANK_OF.format(
                    method=_name(method),
                    ranks=", ".join(map(str, ranks)),
                    norms=", ".join(f"{n:.3g}" for n in norms),
                )
            )
    if not parts:
        return []
    sentence = prose.UPDATE_RANKS.format(
        layer=meta.get("layer"),
        m=meta.get("m"),
        n=meta.get("n"),
        persons=", ".join(next(iter(meta["methods"].values()))["persons"]),
        ranks="; ".join(parts),
        rtol=F.RANK_RTOL,
    )
    return [sentence, ""]
