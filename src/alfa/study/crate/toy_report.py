"""The plane toy's record and its generated sections of ``docs/crate.md``.

``alfa crate toy --data-to PATH`` keeps every run of one invocation in one JSON record (:func:`toy_record`):
the command, the constants, the seeds, every run's per-layer statistics (one run per line) and, for the first
seed of each panel, the tokens the figure draws. ``alfa pages`` renders from such a record a section of the
hand-written page, between its markers (:func:`alfa.study.sections.with_section`): the command, one table per
panel of the mean
over the seeds with its 95 % interval per layer, each panel's reading, and the figure (:func:`plot_record`),
so that no number of the toy on the page is typed by hand.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np

from alfa import fileio

from .toy import (
    LEVEL,
    PANELS,
    ToyConfig,
    ToyRun,
    over_seeds,
    panel_cells,
    panel_header,
    plot_toy,
    read_panel,
    seed_values,
)

__all__ = [
    "RECORD_FORMAT",
    "toy_record",
    "write_record",
    "load_record",
    "runs_from_record",
    "markdown_table",
    "toy_section",
    "plot_record",
]

RECORD_FORMAT = "alfa-crate-toy"
"""What a toy record says it is (``format``), so that a page is never rendered from another file."""


def toy_record(runs: list[ToyRun], config: ToyConfig, command: str) -> dict[str, Any]:
    """The record of one ``alfa crate toy`` invocation: ``format``, ``command``, ``config`` (the toy's
    constants), ``panels``, ``seeds`` and ``runs`` (each :meth:`ToyRun.to_dict`; the first run of each panel
    also holds ``tokens``: per layer, the measured tokens as ``[xs, ys]``)."""
    panels = list(dict.fromkeys(run.key for run in runs))
    seeds = list(dict.fromkeys(run.seed for run in runs))
    rows, drawn = [], set()
    for run in runs:
        row = run.to_dict()
        if run.key not in drawn:  # the figure draws the first seed's tokens of each panel
            drawn.add(run.key)
            row["tokens"] = [t.tolist() for t in run.tokens]
        rows.append(row)
    return {
        "format": RECORD_FORMAT,
        "command": command,
        "config": asdict(config),
        "panels": panels,
        "seeds": seeds,
        "runs": rows,
    }


def write_record(path: str | os.PathLike, record: dict[str, Any]) -> None:
    """Write ``record`` atomically, one run per line (a changed run is one changed line for git)."""
    fileio.write_json(path, record, indent=1, compact_list="runs")


def load_record(path: str | os.PathLike) -> dict[str, Any]:
    """Read a record :func:`write_record` wrote; another JSON file is refused, naming ``path``."""
    record = json.loads(Path(path).read_text(encoding="utf-8"))
    if not isinstance(record, dict) or record.get("format") != RECORD_FORMAT:
        raise ValueError(f"{path} is not a plane-toy record (no format {RECORD_FORMAT!r})")
    return record


def runs_from_record(record: dict[str, Any]) -> list[ToyRun]:
    """The runs of ``record`` as :class:`ToyRun` (statistics, labels, and tokens where the record has them)."""
    per_cluster = record["config"]["tokens_per_cluster"]
    runs = []
    for row in record["runs"]:
        panel = PANELS[row["key"]]
        labels = np.repeat([0, 1], per_cluster) if panel.both_clusters else np.zeros(per_cluster, dtype=int)
        runs.append(
            ToyRun(
                key=row["key"],
                panel=row["panel"],
                length=row["length"],
                kappa=row["kappa"],
                seed=row["seed"],
                eps=row["eps"],
                eta=row.get("eta"),
                lam=row.get("lam"),
                layers=row["layers"],
                tokens=[np.asarray(t, dtype=np.float64) for t in row.get("tokens", [])],
                labels=labels,
            )
        )
    return runs


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """A markdown table, the first column left-aligned and the others right-aligned."""
    rule = ["---"] + ["---:"] * (len(header) - 1)
    return "\n".join("| " + " | ".join(row) + " |" for row in (header, rule, *rows))


def _cell_words(seeds: int) -> str:
    if seeds == 1:
        return "Each cell is the one seed's value (no interval)."
    return (
        f"Each cell is the mean over the {seeds} seeds and its {LEVEL * 100:.0f} % interval (Student's t over the "
        f"seeds, {seeds - 1} degree{'s' if seeds != 2 else ''} of freedom; not clipped to the range a measure can "
        "take, so a thickness or a share can have a lower bound below 0)."
    )


def _seed_words(seeds: Sequence[int]) -> str:
    consecutive = list(seeds) == list(range(seeds[0], seeds[0] + len(seeds)))
    listed = f"{seeds[0]}–{seeds[-1]}" if consecutive and len(seeds) > 1 else ", ".join(map(str, seeds))
    return f"{len(seeds)} seed{'s' if len(seeds) != 1 else ''} ({listed})"


def toy_section(record: dict[str, Any], *, data: str, figure: str, alt: str) -> str:
    """The markdown of one record's section: how it was made, per panel its table and reading, and the figure
    (``figure``: its link from the page; ``data``: the record's path in the repository)."""
    runs = runs_from_record(record)
    values = seed_values(runs)
    seeds = record["seeds"]
    parts = [
        f"```\n$ {record['command']}\n$ alfa pages --write\n```",
        f"Rendered from `{data}` by `alfa pages` (`alfa.study.crate.toy_report`): {_seed_words(seeds)}, "
        f"ε = {record['config']['eps']:g}. {_cell_words(len(seeds))} "
        "`--show-runs` prints every single run's table; the record holds every run.",
    ]
    for key, panel_values in values.items():
        first = next(run for run in runs if run.key == key)
        n = len(first.labels)
        parts.append(f"**{_title(first)}**")
        parts.append(markdown_table(panel_header(n), panel_cells(panel_values)))
        parts.append(read_panel(panel_values, n))
    parts.append(f"![{alt}]({figure})")
    parts.append(_caption(runs, len(seeds)))
    return "\n\n".join(parts)


def _title(run: ToyRun) -> str:
    panel = PANELS[run.key]
    text = f"{panel.title}: length {panel.length:g}, κ = {panel.kappa:g}"
    if panel.ista and run.eta is not None:
        text += f", η = {run.eta:g}, λ = {run.lam:g}"
    return text


def _caption(runs: list[ToyRun], seeds: int) -> str:
    first = runs[0]
    last = len(first.layers) - 1
    text = f"Top row: seed {first.seed}, input tokens faint, layer-{last} tokens solid"
    keys = {run.key for run in runs}
    if {"c", "c-len1"} <= keys:
        scale = PANELS["c"].length / PANELS["c-len1"].length
        text += f" (in (c) the crosses are the length-1 variant's layer-{last} tokens, scaled by {scale:g})"
    text += f". Bottom row: per layer, {over_seeds(seeds)}, of each cluster's thickness, the misassigned share"
    return text + (" and the one-axis share." if "d" in keys else ".")


def plot_record(record: dict[str, Any], path: str | os.PathLike) -> None:
    """The figure of ``record`` (:func:`alfa.study.crate.toy.plot_toy`), with its plotted data beside it."""
    plot_toy(runs_from_record(record), path)
