"""``results.json`` → ``docs/results.md`` and its figures (``alfa report``). Never edit the output by hand.

Every number and every sentence of the report is computed here from the records of a benchmark run
(:mod:`alfa.study.bench.runner`): the tables (mean ± standard deviation over seeds of each record's mean
over persons), the verdicts (who wins where, and whether a difference is larger than its spread), the
protocol (from the configuration stored in ``results.json``), and the figures (from the records and
from the figure data the run stored next to them). Re-running the command regenerates the same file.

How differences are judged (stated in the report too): for two rows ``a`` and ``b``, per seed, the mean
over pairs of ``error(a) − error(b)`` on the same base; its mean over seeds ``Δ`` and the sample standard
deviation of those per-seed differences. A difference is *clear* when ``|Δ|`` exceeds that standard
deviation and every seed has the same sign; otherwise it is *within the spread*. With one seed there is
no spread, and nothing is called clear.
"""

from __future__ import annotations

import os
import statistics
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from alfa.adapters import METHODS
from alfa.fileio import write_text

from . import figures as F
from .ablations import REGISTRY, family_of
from .flip_report import flip_sections, flip_summary, table_rows
from .markdown import number as _num
from .markdown import table as _table
from .methods import MAIN_METHODS, POSITIVE_CONTROLS, SOURCE_TRAINING, SOURCES, STAND_INS, TARGETS
from .names import NAMES, SELECTED, display_name
from .results import FIGURE_DIR, RANK_SLICES_FILE, UPDATES_FILE, load_results
from .stats import (
    PARTS,
    Diff,
    Index,
    Stat,
    cell,
    diff,
    index_records,
    pairs_of,
    part,
    pooled,
    sanity_summary,
    seeds_of,
    signed,
)

__all__ = [
    "Stat",
    "Diff",
    "index_records",
    "cell",
    "pooled",
    "diff",
    "sanity_summary",
    "NAMES",
    "LORA_FAMILY",
    "main_verdicts",
    "render_report",
    "build_report",
]

# Table 2's rows: the low-rank methods (the "lora" family, then "spectral") in Table 1's order, then Alfa.
LORA_FAMILY = tuple(
    m for family in ("lora", "spectral") for m in MAIN_METHODS if m in METHODS and METHODS[m].family == family
)
_name = display_name


# ----------------------------------------------------------------------------- markdown helpers


def _count(n: int | None) -> str:
    if n is None:
        return "—"
    return f"{n / 1e6:.3f} M" if n >= 1e6 else f"{n / 1e3:.1f} k" if n >= 1e3 else str(n)


def _bytes(n: float | None) -> str:
    if n is None:
        return "—"
    return f"{n / 2**20:.2f} MiB" if n >= 2**20 else f"{n / 2**10:.1f} KiB"


def _merge_note(merge: str | None) -> str:
    """What the parameter count after merging needs a word about (densified, or prompts left attached)."""
    if merge == "densified":
        return " (densified)"
    if merge and merge.startswith("not mergeable"):
        return " (unmerged)"
    return ""


def _median(values: Iterable[float | None]) -> float | None:
    vals = [v for v in values if v is not None]
    return statistics.median(vals) if vals else None


def _records_of(idx: Index, method: str) -> list[dict[str, Any]]:
    return [r for (m, _, _), r in sorted(idx.items()) if m == method]


def _ordinal(k: int) -> str:
    return f"{k}{'th' if 10 <= k % 100 <= 20 else {1: 'st', 2: 'nd', 3: 'rd'}.get(k % 10, 'th')}"


# ----------------------------------------------------------------------------- verdicts


def _competitors(idx: Index) -> list[str]:
    """Table 1's rows that have records: each method, then its selected-recipe row where there is one."""
    return table_rows(idx, MAIN_METHODS)


def main_verdicts(idx: Index) -> list[str]:
    """The plain sentences about Table 1: where Alfa wins, where it does not, and what is within the spread.

    With a selected-recipe row of Alfa (``alfa[selected]``), its standing gets the same sentences after the
    paper recipe's, compared with LoRA's selected row: a reader should not find "Alfa does not win" next to
    "Alfa (selected recipe) is best" without a sentence about the latter."""
    pairs = pairs_of(idx)
    methods = _competitors(idx)
    if "alfa" not in methods or not pairs:
        return ["Alfa was not run; no verdict."]
    lines = _row_verdicts(idx, pairs, methods, "alfa", "lora")
    selected = f"alfa{SELECTED}"
    if selected in methods:
        lines += _row_verdicts(idx, pairs, methods, selected, f"lora{SELECTED}")
    beating = []
    for m in methods:
        if m == "source-only":
            continue
        d = diff(idx, m, "source-only", pairs) if "source-only" in methods else None
        if d is not None and d.mean < 0:
            beating.append((m, d))
    if "source-only" in methods:
        names = ", ".join(f"{_name(m)} ({signed(d.mean)}°{', clear' if d.clear else ''})" for m, d in beating)
        others = [m for m in methods if m != "source-only" and m not in {b for b, _ in beating}]
        text = f"Methods whose pooled error is below source-only: {names or 'none'}."
        if others:
            text += f" Not below source-only: {', '.join(_name(m) for m in others)}."
        lines.append(text)
    return lines


def _row_verdicts(idx: Index, pairs: Sequence[str], methods: Sequence[str], row: str, lora: str) -> list[str]:
    """Where the Alfa row ``row`` is best, where not, against source-only and against the LoRA row ``lora``."""
    me = _name(row)
    best_pairs = []
    per_pair: list[str] = []
    for pair in pairs:
        ranked = sorted(((cell(idx, m, pair), m) for m in methods if cell(idx, m, pair)), key=lambda t: t[0].mean)
        if not any(m == row for _, m in ranked):
            continue
        mine = next(s for s, m in ranked if m == row)
        if len(ranked) == 1:
            continue
        best_stat, best = ranked[0]
        if best == row:
            best_pairs.append(pair)
            runner_stat, runner = ranked[1]
            d = diff(idx, row, runner, [pair])
            per_pair.append(
                f"On {pair} {me} ({mine.format()}°) leads the runner-up {_name(runner)} ({runner_stat.format()}°) "
                f"by {runner_stat.mean - mine.mean:.2f}°; {me} − {_name(runner)} = {d.describe() if d else 'n/a'}."
            )
        else:
            rank = 1 + [m for _, m in ranked].index(row)
            d = diff(idx, row, best, [pair])
            per_pair.append(
                f"On {pair} {me} does not win: {_name(best)} is best ({best_stat.format()}°), {me} is "
                f"{_ordinal(rank)} of {len(ranked)} ({mine.format()}°); {me} − {_name(best)} = "
                f"{d.describe() if d else 'n/a'}."
            )
    where = f" ({', '.join(best_pairs)})" if best_pairs else ""
    lines = [f"{me} has the lowest mean error on {len(best_pairs)} of {len(pairs)} pairs{where}.", *per_pair]
    if "source-only" in methods:
        helped = [p for p in pairs if cell(idx, row, p) and cell(idx, "source-only", p)]
        lower = [p for p in helped if cell(idx, row, p).mean < cell(idx, "source-only", p).mean]
        d = diff(idx, row, "source-only", pairs)
        text = (
            f"Against its own starting point (source-only), {me} lowers the mean error on "
            f"{len(lower)} of {len(helped)} pairs"
        )
        if len(lower) < len(helped):
            text += f"; it does not on {', '.join(p for p in helped if p not in lower)}"
        if d is not None:
            text += f". Pooled over pairs: {me} − source-only = {d.describe()}"
        lines.append(text + ".")
    if lora in methods:
        d = diff(idx, row, lora, pairs)
        how = "same recipe, same steps" if lora == "lora" else "its recipe selected by the same rule"
        if d is not None:
            lines.append(f"Against {_name(lora)} ({how}), pooled over pairs: {me} − {_name(lora)} = {d.describe()}.")
    return lines


def _range(values: Sequence[float], digits: int, unit: str) -> str:
    lo, hi = min(values), max(values)
    return (
        f"{lo:.{digits}f}{unit}"
        if f"{lo:.{digits}f}" == f"{hi:.{digits}f}"
        else f"{lo:.{digits}f}–{hi:.{digits}f}{unit}"
    )


def _deg_range(items: Sequence[tuple[str, float, float]]) -> str:
    """``"0.8–2.1°"``: the range of the differences over ``(pair, difference, reference)`` items."""
    return _range([d for _, d, _ in items], 2, "°")


def _share_range(items: Sequence[tuple[str, float, float]]) -> str:
    """``"12–30 %"``: the range of ``difference / reference`` over ``(pair, difference, reference)`` items."""
    return _range([100 * d / ref for _, d, ref in items], 0, " %")


def _below_source_only(idx: Index, pairs: Sequence[str], method: str) -> list[tuple[str, float, float]]:
    """``(pair, source-only − method, source-only)`` for every pair where both rows exist."""
    out = []
    for p in pairs:
        ref, other = cell(idx, "source-only", p), cell(idx, method, p)
        if ref and other:
            out.append((p, ref.mean - other.mean, ref.mean))
    return out


def _gap_sentence(items: list[tuple[str, float, float]], subject: str, by: str, missing: str) -> str:
    """ "<subject> on k of n pairs, <by> <range> (<share>); <missing> on <pairs>." for gaps that should be > 0."""
    below = [g for g in items if g[1] > 0]
    text = f"{subject} on {len(below)} of {len(items)} pairs"
    if below:
        text += f"{by}{_deg_range(below)} ({_share_range(below)} of the source-only error)"
    if len(below) < len(items):
        text += f"; {missing} on {', '.join(g[0] for g in items if g[1] <= 0)}"
    return text + "."


def sanity_verdicts(idx: Index) -> list[str]:
    lines = []
    pairs = pairs_of(idx)
    gaps = _below_source_only(idx, pairs, "in-domain")
    if gaps:
        lines.append(
            _gap_sentence(
                gaps,
                "In-domain error (the base on held-out source persons) is below the cross-domain source-only error",
                ", by ",
                "NO domain gap",
            )
        )
    own = _below_source_only(idx, pairs, "target-trained")
    if own:
        lines.append(
            _gap_sentence(
                own,
                "The same model trained on other persons of the target world (the within-dataset yardstick of the "
                "gaze literature) is below the source model on the target's scored persons",
                ", by ",
                "NOT",
            )
        )
    ratios = []
    for pair, s in sanity_summary(idx.values()).items():
        ind, src = s["in_domain"], s["source_only"]
        if ind and src and s.get("in_domain_constant_deg") and s.get("target_constant_deg"):
            ratios.append((pair, ind["mean"] / s["in_domain_constant_deg"], src["mean"] / s["target_constant_deg"]))
    if ratios:
        worse = [p for p, a, b in ratios if b > a]
        lines.append(
            "Relative to the spread of the labels (the error of always predicting the set's mean gaze), the "
            "in-domain error is "
            + ", ".join(f"{100 * a:.0f} %" for _, a, _ in ratios)
            + " of a constant prediction's and the cross-domain error "
            + ", ".join(f"{100 * b:.0f} %" for _, _, b in ratios)
            + f" ({', '.join(p for p, _, _ in ratios)}): relatively worse across domains on {len(worse)} of "
            f"{len(ratios)} pairs."
        )
    rooms = _below_source_only(idx, pairs, "oracle")
    if rooms:
        lines.append(
            _gap_sentence(
                rooms,
                "The oracle (per-person supervised fine-tuning) is below source-only",
                ": headroom ",
                "NO headroom",
            )
        )
        if "alfa" in {m for (m, _, _) in idx}:
            shares = []
            for p, room, _ in rooms:
                a, s = cell(idx, "alfa", p), cell(idx, "source-only", p)
                if a and s and room > 0:
                    shares.append((p, (s.mean - a.mean) / room))
            if shares:
                lines.append(
                    "Share of the headroom Alfa recovers (source-only − Alfa, over source-only − oracle): "
                    + ", ".join(f"{p} {_num(100 * v, 0)} %" for p, v in shares)
                    + "."
                )
    return lines


# ----------------------------------------------------------------------------- tables


def table1(idx: Index) -> str:
    pairs = pairs_of(idx)
    header = ["method", *pairs, "mean over pairs", "params at inference", "Δ vs source-only (pooled)"]
    best = {}
    for p in pairs:
        stats = [(cell(idx, m, p), m) for m in _competitors(idx) if cell(idx, m, p)]
        if stats:
            best[p] = min(stats, key=lambda t: t[0].mean)[1]
    rows = []
    for m in _competitors(idx):
        cells = []
        for p in pairs:
            s = cell(idx, m, p)
            text = s.format() if s else "—"
            cells.append(f"**{text}**" if best.get(p) == m else text)
        pool = pooled(idx, m, pairs)
        recs = _records_of(idx, m)
        params = _median(r.get("inference_params") for r in recs)
        merge = recs[0].get("merge") if recs else None
        d = (
            diff(idx, m, "source-only", pairs)
            if m != "source-only" and ("source-only", pairs[0], seeds_of(idx)[0]) in idx
            else None
        )
        dtext = (
            "—"
            if d is None
            else f"{signed(d.mean)}" + ("" if d.std is None else f" ± {d.std:.2f}") + (" (clear)" if d.clear else "")
        )
        size = _count(int(params)) if params is not None else "—"
        size += _merge_note(merge)
        rows.append([_name(m), *cells, pool.format() if pool else "—", size, dtext])
    return _table(header, rows)


def person_table(idx: Index) -> str:
    """Per method: the spread over persons and how many persons each method helps."""
    pairs = pairs_of(idx)
    rows = []
    for m in _competitors(idx):
        recs = _records_of(idx, m)
        if not recs:
            continue
        spread = statistics.fmean(r.get("std_over_persons", 0.0) for r in recs)
        worst = max(max(r["per_person"].values()) for r in recs if r.get("per_person"))
        d = diff(idx, m, "source-only", pairs) if m != "source-only" else None
        helped = "—" if d is None or not d.persons else f"{d.persons_better} / {d.persons}"
        changes = []
        if m != "source-only":
            for (mm, p, s), r in idx.items():
                base = idx.get(("source-only", p, s))
                if mm == m and base:
                    changes += [
                        r["per_person"][q] - base["per_person"][q]
                        for q in r["per_person"].keys() & base["per_person"].keys()
                    ]
        worst_change = signed(max(changes)) if changes else "—"
        best_change = signed(min(changes)) if changes else "—"
        rows.append([_name(m), f"{spread:.2f}", f"{worst:.2f}", helped, best_change, worst_change])
    header = [
        "method",
        "std over persons (mean over records)",
        "worst person",
        "persons better than source-only",
        "best person change",
        "worst person change",
    ]
    return _table(header, rows)


def table2(idx: Index) -> str:
    pairs = pairs_of(idx)
    rows = []
    for m in [*LORA_FAMILY, "alfa"]:
        recs = _records_of(idx, m)
        if not recs:
            continue
        pool = pooled(idx, m, pairs)
        r = recs[0]
        rows.append(
            [
                _name(m),
                pool.format() if pool else "—",
                _count(r.get("trainable_params")),
                _count(r.get("inference_params")) + _merge_note(r.get("merge")),
                _count(r.get("compact_merge_params")),
                _bytes(r.get("adapter_bytes")),
                _bytes(r.get("compact_bytes")),
            ]
        )
    header = [
        "method",
        "error, mean over pairs (deg)",
        "trainable",
        "params after merge",
        "exact compact merge",
        "per-user file",
        "compact file (d×d mix per layer)",
    ]
    return _table(header, rows)


# ----------------------------------------------------------------------------- yaw and pitch


def parts_table(idx: Index, methods: Sequence[str]) -> str:
    pairs = pairs_of(idx)
    rows = []
    for m in methods:
        stats = [pooled(idx, m, pairs), *(pooled(idx, m, pairs, part(k)) for k in PARTS)]
        if all(st is not None for st in stats):
            rows.append([_name(m), *(st.format() for st in stats)])
    header = ["method", "angular error", *(title for title, _ in PARTS.values())]
    return _table(header, rows) if rows else ""


def parts_verdicts(idx: Index, methods: Sequence[str]) -> list[str]:
    """Where each method's change of error against source-only lies: yaw or pitch, scatter or bias."""
    pairs = pairs_of(idx)
    out = []
    worse, pitch_led = [], []
    for m in methods:
        if m == "source-only":
            continue
        total = diff(idx, m, "source-only", pairs)
        dy, dp = (diff(idx, m, "source-only", pairs, part(k)) for k in ("yaw", "pitch"))
        if total is None or dy is None or dp is None:
            continue
        if total.mean > 0:
            worse.append(_name(m))
            if dp.mean > dy.mean:
                pitch_led.append(_name(m))
        if m == "alfa":
            db = diff(idx, m, "source-only", pairs, part("pitch_bias"))
            out.append(f"Alfa − source-only, pooled over pairs: yaw error {dy.describe()}.")
            out.append(f"Alfa − source-only, pooled over pairs: pitch error {dp.describe()}.")
            if db is not None:
                out.append(f"Alfa − source-only, pooled over pairs: absolute pitch bias {db.describe()}.")
    if worse:
        out.append(
            f"Of the {len(worse)} method(s) whose error ends above source-only, the pitch error grew more than the yaw "
            f"error for {len(pitch_led)}" + (f" ({', '.join(pitch_led)})" if pitch_led else "") + "."
        )
    return out


def sanity_table(idx: Index) -> str:
    rows = []
    for pair, s in sanity_summary(idx.values()).items():

        def fmt(d: dict[str, Any] | None) -> str:
            if d is None:
                return "—"
            return f"{d['mean']:.2f}" + ("" if d["std"] is None else f" ± {d['std']:.2f}")

        rows.append(
            [
                pair,
                fmt(s["in_domain"]),
                fmt(s.get("target_trained")),
                fmt(s["source_only"]),
                fmt(s["oracle"]),
                _num(s["domain_gap_deg"]),
                _num(s.get("target_gap_deg")),
                _num(s["headroom_deg"]),
                _num(s.get("in_domain_constant_deg")),
                _num(s.get("target_constant_deg")),
            ]
        )
    header = [
        "pair",
        "in-domain (held-out source persons)",
        "target-trained (target)",
        "source-only (target)",
        "oracle (target)",
        "domain gap",
        "gap to target-trained",
        "headroom",
        "constant prediction, held-out source",
        "constant prediction, target",
    ]
    return _table(header, rows)


def cost_table(idx: Index, labels: Sequence[str]) -> str:
    rows = []
    for m in labels:
        recs = _records_of(idx, m)
        if not recs:
            continue
        r = recs[0]
        lat, base_lat = _median(x.get("latency_ms") for x in recs), _median(x.get("base_latency_ms") for x in recs)
        peak = [x.get("peak_rss_mib") for x in recs if x.get("peak_rss_mib") is not None]
        inc = [x.get("peak_rss_increase_mib") for x in recs if x.get("peak_rss_increase_mib") is not None]
        rows.append(
            [
                _name(m),
                _count(r.get("trainable_params")),
                f"{_count(r.get('inference_params'))}",
                str(r.get("merge")),
                _bytes(r.get("adapter_bytes")),
                _num(_median(x.get("seconds_per_user") for x in recs)),
                _num(_median(x.get("cpu_seconds_per_user") for x in recs)),
                _num(max(peak), 0) if peak else "—",
                _num(max(inc), 0) if inc else "—",
                _num(lat, 1),
                _num(base_lat, 1),
                "—" if not lat or not base_lat else f"{lat / base_lat:.2f}",
            ]
        )
    header = [
        "method",
        "trainable",
        "params at inference",
        "merge",
        "per-user file",
        "s / user (wall)",
        "CPU s / user",
        "peak RSS (MiB)",
        "peak increase (MiB)",
        "latency merged (ms)",
        "latency base (ms)",
        "ratio",
    ]
    return _table(header, rows)


def ablation_table(
    idx: Index, rows_layout: Sequence[dict[str, Any]], extra_params: bool = False
) -> tuple[str, list[str]]:
    """Rows of one ablation (label, value) × the pairs it ran on; returns the table and its pairs."""
    labels = [r["label"] for r in rows_layout]
    present = {(m, p) for (m, p, _) in idx if m in labels}
    # The ablation's pairs: where its own variants ran (the reference rows are main methods, run everywhere).
    own = [lab for lab in labels if lab not in MAIN_METHODS]
    pairs = [p for p in pairs_of(idx) if any((lab, p) in present for lab in own)]
    rows = []
    for row in rows_layout:
        lab = row["label"]
        if not any((lab, p) in present for p in pairs):
            continue
        cells = [(cell(idx, lab, p).format() if cell(idx, lab, p) else "—") for p in pairs]
        pool = pooled(idx, lab, pairs)
        line = [_name(lab), str(row["value"]), *cells, pool.format() if pool else "—"]
        if extra_params:
            recs = _records_of(idx, lab)
            line.append(_count(recs[0].get("trainable_params")) if recs else "—")
        rows.append(line)
    header = ["row", "setting", *pairs, "mean over pairs"] + (["trainable"] if extra_params else [])
    return _table(header, rows, "ll" + "r" * (len(header) - 2)), pairs


def _curve(idx: Index, rows_layout: Sequence[dict[str, Any]], family: str, pairs: Sequence[str]):
    points = []
    for row in rows_layout:
        if family_of(row["label"]) != family:
            continue
        s = pooled(idx, row["label"], pairs)
        if s is not None and isinstance(row["value"], (int, float)):
            points.append((float(row["value"]), s.mean, s.std))
    return points


def ablation_verdicts(idx: Index, name: str, layout: Sequence[dict[str, Any]], pairs: Sequence[str]) -> list[str]:
    """Plain sentences for one ablation, pooled over its pairs (none for an ablation this alfa does not know)."""
    ablation = REGISTRY.get(name)
    return ablation.sentences(idx, layout, pairs) if ablation is not None else []


def _title(name: str) -> tuple[str, str]:
    """An ablation's section title and what it changes (a name this alfa does not know: the name)."""
    ablation = REGISTRY.get(name)
    return (ablation.title, ablation.what) if ablation is not None else (name, "")


# ----------------------------------------------------------------------------- protocol


def _scale_words(scale: dict[str, float] | None) -> str:
    if not scale:
        return "the same rate for every parameter"
    return "scaled " + ", ".join(f"×{v:g} on `{k}`" for k, v in scale.items())


def _positive_control_words(results: dict[str, Any], idx: Index) -> list[str]:
    """The asymmetric worlds' part of the Data bullet (nothing for results without positive controls)."""
    if not any(p in POSITIVE_CONTROLS for p in pairs_of(idx)):
        return []
    changes = SOURCE_TRAINING.get("S", {})
    return [
        f"Positive controls (`docs/flip-premise.md` §2): source S = `{SOURCES['S']}` of the same size, trained",
        f"with {', '.join(f'{k} = {v:g}' for k, v in changes.items())} in pre-training and recovery; targets",
        f"W = `{TARGETS['W']}`, C = `{TARGETS['C']}` of the same size as M and D.",
    ]


def _selection_words(results: dict[str, Any]) -> list[str]:
    """The selected rows' part of the recipe bullet (nothing for results without selection records)."""
    if not any(r.get("kind") == "selection" for r in results.get("records", [])):
        return []
    stand_ins = ", ".join(f"{SOURCES[t]} for {s}" for s, t in STAND_INS.items())
    return [
        "Rows marked *selected recipe* replace the recipe's detach, learning rate, ×10, steps and pitch anchor by",
        "those the declared rule (`docs/flip-premise.md` §4) chose on the stand-in for that method, source and",
        f"seed: the `val` persons of another symmetric source world ({stand_ins}), as many and as large as",
        "a target's, never a target (§ Recipes selected without target labels).",
    ]


def _config_lines(results: dict[str, Any], idx: Index) -> list[str]:
    c = results.get("config", {})
    rec = c.get("personalize", {})
    pre, recov = c.get("pretrain", {}), c.get("recovery", {})
    meta, oracle = c.get("meta", {}), c.get("oracle", {})
    seeds = ", ".join(map(str, seeds_of(idx))) or "—"
    n_adapt = rec.get("n_adapt") or 0
    size = c.get("image_size")
    tp = c.get("target_persons")
    targets = "every person (15 and 14)" if tp is None else f"{tp} persons"
    scored = (c.get("target_images") or 0) - n_adapt
    detached = "detached" if rec.get("detach_flipped") else "not detached"
    bullets = [
        [
            f"**Preset** `{results.get('preset')}`; **seeds** {seeds}.",
            "A seed sets the source model (initial weights, batch order, recovery) and the personalization",
            "(adapter init, augmentation draws); the data are the same for every seed.",
        ],
        [
            f"**Data**: the synthetic worlds (`docs/synthetic.md`), {size}×{size} faces.",
            f"Sources E = `eth`, G = `gaze360`: {c.get('source_persons')} persons × {c.get('source_images')} images",
            f"for training, {c.get('val_persons')} held-out persons × {c.get('val_images')} images (the domains'",
            f"`val` split) for the in-domain row. Targets M = `mpii`, D = `eyediap`: {targets} ×",
            f"{c.get('target_images')} images; the first {n_adapt} of each person are the adaptation images,",
            f"the other {scored} are scored.",
            *_positive_control_words(results, idx),
        ],
        [
            f"**Source model** per (source, seed): `{c.get('model')}` pre-trained {pre.get('epochs')} epochs",
            f"(Adam, lr {pre.get('lr')}, batch {pre.get('batch_size')}, L1 + symmetry term of weight",
            f"{pre.get('symmetry_weight')}), truncated at SVD rank d = {c.get('rank')}, recovered",
            f"{recov.get('epochs')} epochs (lr {recov.get('lr')}), canonicalized. Every method of a (pair, seed)",
            "starts from this same truncated + recovered base.",
        ],
        [
            f"**Personalization recipe** (every adapter method, spec §4): the {n_adapt} adaptation images, one",
            f"augmented copy of each, and the horizontal flips of all, in one batch; loss `{rec.get('loss')}`",
            f"(flipped branch {detached}); AdamW lr {rec.get('lr')} (×10 on layer3/layer4), weight decay",
            f"{rec.get('weight_decay')}; BatchNorm in eval mode; **{rec.get('steps')} steps** for every method;",
            "the last step is the result. Nothing is chosen on target labels.",
            *_selection_words(results),
        ],
        [
            f"**Alfa**: H = {c.get('alfa_heads')} heads, r = {c.get('alfa_rank')}, on every factorized layer.",
            "Baselines at their defaults (`docs/adapters.md`): rank 8, α = 16 for LoRA/MoSLoRA/DoRA, α = 8 for",
            "PiSSA/MiLoRA, FLoRA with full kernel modes; BitFit trains biases and BatchNorm affines; full",
            "fine-tuning trains everything.",
        ],
        [
            f"**TPGaze**: prompts (Gaussian init, σ = {c.get('tpgaze_init_std')}) meta-trained once per",
            f"(source, seed) base ({meta.get('epochs')} epochs × {meta.get('steps_per_epoch')} meta-steps,",
            f"batches of {meta.get('batch_size')}, inner/outer Adam lr {meta.get('inner_lr')}/{meta.get('outer_lr')}),",
            "then personalized with its own optimizer (Adam, lr 0.01, prompts only) on the same images, loss and",
            "step count (`docs/tpgaze.md`).",
        ],
        [
            "**Oracle** (the headroom, not a competitor): per target person, every parameter fine-tuned with",
            f"labels on the {n_adapt} adaptation images plus {oracle.get('extra_images')} more labelled images of",
            "the same person that are never scored (rendered after the scored ones); AdamW",
            f"(lr {oracle.get('lr')}, {_scale_words(oracle.get('lr_scale'))}, "
            f"weight decay {oracle.get('weight_decay')}) with the",
            f"supervised L1 loss, {oracle.get('steps')} steps on batches of {oracle.get('batch_size')}, BatchNorm in",
            "eval mode. Scored on the same images as every method.",
        ],
        [
            "**Error**: angular error in degrees per person over that person's scored images, then the unweighted",
            "mean over persons: one number per record (method, pair, seed). Tables show the mean ± sample standard",
            "deviation over seeds of those numbers; one seed gives no ±.",
        ],
        [
            "**Differences**: a − b per seed on the same base (mean over the pairs concerned), averaged over seeds,",
            "± the sample standard deviation of the per-seed differences. *Clear*: |Δ| above that standard",
            "deviation with the same sign in every seed; otherwise *within the spread*. One seed: no spread, never",
            "clear. Persons: how many (pair, seed, person) cases have the lower error.",
        ],
        [
            "**Costs**: trainable = tensors the optimizer updates; params at inference = after `alfa.merge`",
            "(LoRA-style updates of a factorized layer are densified; TPGaze's prompts cannot be merged and stay",
            "attached); exact compact merge = `alfa.merge(model, extend=True)` (rank d + r); per-user file =",
            "`alfa.save_adapter`; s / user = wall time of one person's personalization (not its evaluation);",
            "CPU s / user = process CPU time per person; peak RSS = the process's peak resident memory during the",
            "record's personalizations (Linux VmHWM, reset before) and its increase over the memory just before",
            "(memory freed by earlier work stays resident, so the increase is a lower bound);",
            f"latency = median of one forward of {c.get('latency_batch')} target images through the merged model",
            "and through the base, interleaved.",
        ],
    ]
    return ["- " + " ".join(parts) for parts in bullets]


def _runs_lines(results: dict[str, Any]) -> list[str]:
    runs = results.get("runs", [])
    if not runs:
        return ["No run metadata."]
    wall = sum(r.get("wall_s", 0.0) for r in runs)
    cpu = sum(r.get("cpu_s", 0.0) for r in runs)
    rows = []
    for r in runs:
        sel = r.get("selection", {})
        rows.append(
            [
                f"`{r.get('command') or '(library call)'}`",
                str(r.get("started", "")),
                f"{r.get('wall_s', 0.0) / 60:.1f}",
                f"{r.get('cpu_s', 0.0) / 60:.1f}",
                str(r.get("records_run", 0)),
                str(sel.get("threads", "")),
                f"{r.get('load_average_start', float('nan')):.1f} / {r.get('load_average_end', float('nan')):.1f}",
                "yes" if r.get("finished") else "no (interrupted)",
            ]
        )
    records = results.get("records", [])
    record_min = sum(r.get("wall_s") or 0.0 for r in records) / 60
    sources = results.get("sources", {})
    model_min = sum(s.get("recorded_train_seconds") or 0.0 for s in sources.values()) / 60
    unknown = sorted(k for k, s in sources.items() if not s.get("recorded_train_seconds"))
    total = record_min + model_min
    lines = [
        f"**What this file cost: {total:.0f} process-minutes**, about **{total / 2:.0f} min of wall time** with two "
        f"processes at a time on this {runs[0].get('cpus')}-CPU machine: {record_min:.1f} min for its "
        f"{len(records)} records (each record's own wall time) and {model_min:.1f} min of model training (source "
        "and target-trained models, their recoveries at other SVD ranks, TPGaze's meta-training: the per-epoch "
        "times kept in their checkpoints, so models loaded from the cache count what they once cost)"
        + (f"; no recorded time for {', '.join(unknown)}" if unknown else "")
        + ".",
        "",
        f"The runs that wrote the file: {len(runs)}, **{wall / 60:.1f} min wall time, {cpu / 60:.1f} min CPU time** "
        "summed over the processes, including interrupted runs and runs whose records were redone later "
        f"(torch {runs[0].get('torch')}).",
        "",
        _table(
            ["command", "started", "wall (min)", "CPU (min)", "records", "threads", "load avg start / end", "finished"],
            rows,
            "llrrrrrl",
        ),
    ]
    return lines


def _source_lines(results: dict[str, Any]) -> list[str]:
    sources = results.get("sources", {})
    if not sources:
        return []
    rows = []
    for key in sorted(sources):
        s = sources[key]
        e = (s.get("truncation") or {}).get("errors") or {}
        tp = s.get("tpgaze_meta") or {}
        source, _, seed = key.partition("|")
        rows.append(
            [
                f"{source}, {seed.replace('seed', 'seed ')}",
                _num(e.get("before_truncation")),
                _num(e.get("after_truncation")),
                _num(e.get("after_recovery")),
                _num(tp.get("final_val_error")),
                f"{s['recorded_train_seconds'] / 60:.1f}" if s.get("recorded_train_seconds") else "—",
            ]
        )
    return [
        _table(
            [
                "source, seed",
                "held-out error, dense",
                "truncated",
                "recovered",
                "with TPGaze's meta-trained prompts",
                "training (min, as recorded)",
            ],
            rows,
        )
    ]


# ----------------------------------------------------------------------------- the report


def render_figures(results: dict[str, Any], results_dir: Path | None, figure_dir: Path) -> dict[str, Path]:
    """Every figure of the report, written to ``figure_dir``; returns name -> path."""
    idx = index_records(results.get("records", []))
    layout = results.get("layout", {}).get("ablations", {})
    out: dict[str, Path] = {}
    for name, ablation in REGISTRY.items():
        if ablation.figure is None:
            continue
        setting, families, title = ablation.figure.xlabel, ablation.figure.families, ablation.figure.title
        rows = layout.get(name, [])
        if not rows:
            continue
        labels = {r["label"] for r in rows}
        pairs = [p for p in pairs_of(idx) if any((lab, p, s) in idx for lab in labels for s in seeds_of(idx))]
        curves = {}
        for fam in families:
            for p in pairs:
                pts = _curve(idx, rows, fam, [p])
                if len(pts) >= 2:
                    curves[f"{fam} {p}"] = pts
        if curves:
            out[name] = F.plot_curves(curves, figure_dir / f"error_vs_{name}.png", xlabel=setting, title=title)
    if results_dir is not None:
        data_dir = results_dir / FIGURE_DIR
        path = data_dir / RANK_SLICES_FILE
        if path.is_file():
            tensors, meta = F.load_figure_data(path)
            out["rank_slices"] = F.plot_rank_slices(tensors, meta, figure_dir / "rank_slices.png")
        path = data_dir / UPDATES_FILE
        if path.is_file():
            tensors, meta = F.load_figure_data(path)
            out["updates"] = F.plot_update_maps(tensors, meta, figure_dir / "update_maps.png")
    return out


def update_rank_lines(figure_data: dict[str, Any] | None) -> list[str]:
    """A sentence on the numerical rank of each shown ΔW (from the update-map data)."""
    if not figure_data:
        return []
    tensors, meta = figure_data
    parts = []
    for method, info in sorted(meta.get("methods", {}).items()):
        ranks = [F.numerical_rank(tensors[f"{method}/{p}"]) for p in info["persons"] if f"{method}/{p}" in tensors]
        norms = [float(tensors[f"{method}/{p}"].norm()) for p in info["persons"] if f"{method}/{p}" in tensors]
        if ranks:
            parts.append(
                f"{_name(method)}: numerical rank {', '.join(map(str, ranks))} "
                f"(‖ΔW‖_F {', '.join(f'{n:.3g}' for n in norms)})"
            )
    if not parts:
        return []
    return [
        f"Update maps of `{meta.get('layer')}` ({meta.get('m')}×{meta.get('n')}), persons "
        f"{', '.join(next(iter(meta['methods'].values()))['persons'])}: " + "; ".join(parts) + ". Numerical rank: "
        "the number of singular values of ΔW above 10⁻³ times the largest.",
        "",
    ]


@dataclass
class _Report:
    """What every section of the report is written from: the records (indexed), the stored layout, the
    figures, and the verdicts that more than one section quotes."""

    results: dict[str, Any]
    figures: dict[str, Path]
    figure_data: Any
    md_dir: Path | None
    command: str
    source: str

    def __post_init__(self) -> None:
        self.idx = index_records(self.results.get("records", []))
        self.layout: dict[str, list[dict[str, Any]]] = self.results.get("layout", {}).get("ablations", {})
        self.seeds = seeds_of(self.idx)
        self.main = main_verdicts(self.idx)
        self.sanity = sanity_verdicts(self.idx)
        self.parts_methods = [m for m in ("source-only", *MAIN_METHODS[1:], "oracle") if _records_of(self.idx, m)]
        self.parts = parts_verdicts(self.idx, self.parts_methods)

    def figure(self, name: str, caption: str) -> list[str]:
        """The lines that show figure ``name`` (none if it was not drawn)."""
        if name not in self.figures:
            return []
        path = self.figures[name]
        rel = os.path.relpath(path, self.md_dir) if self.md_dir is not None else str(path)
        return [f"![{caption}]({rel})", "", f"*{caption}*", ""]


def _bullets(sentences: Iterable[str]) -> list[str]:
    return [f"- {s}" for s in sentences]


def _header_section(r: _Report) -> list[str]:
    lines = [
        "# Benchmark results",
        "",
        f"<!-- Generated by `{r.command}` from `{r.source}`. Do not edit by hand: re-run the command. -->",
        "",
        f"Generated by `{r.command}` from `{r.source}` (preset `{r.results.get('preset')}`, {len(r.idx)} records, "
        f"seeds {', '.join(map(str, r.seeds)) or '—'}). Every number and every sentence below is computed from that "
        "file. The data are the synthetic worlds, not the paper's datasets: these tables reproduce the *form* of the "
        "paper's evidence, not its numbers.",
        "",
    ]
    selection = [rec for rec in r.results.get("records", []) if rec.get("kind") == "selection"]
    if selection:
        present = {m for (m, _, _) in r.idx}
        missing = [display_name(m) for m in MAIN_METHODS if m not in present]
        lines += [
            f"Besides those, {len(selection)} recipe-selection records (one per method, source and seed, on the "
            "stand-in; § Recipes selected without target labels)."
            + (f" Not in these results (not run yet): {', '.join(missing)}." if missing else ""),
            "",
        ]
    if len(r.seeds) < 3:
        lines += [
            f"**Only {len(r.seeds)} seed(s)**: this is not the full benchmark (≥ 3 seeds); differences below cannot be "
            "told from noise.",
            "",
        ]
    return lines


def _summary_section(r: _Report) -> list[str]:
    """The first sentences of every verdict, then the first two of each ablation shown in the summary."""
    flip = flip_summary(r.results, r.idx, MAIN_METHODS)
    lines = ["## Summary", "", *_bullets(flip + r.main[:1] + r.sanity[:2] + r.main[1:] + r.parts), ""]
    for name, rows in r.layout.items():
        if name in REGISTRY and REGISTRY[name].in_summary:
            _, pairs = ablation_table(r.idx, rows)
            if pairs:
                lines += [f"- ({_title(name)[0]}) {s}" for s in ablation_verdicts(r.idx, name, rows, pairs)[:2]]
    return lines + [""]


def _protocol_section(r: _Report) -> list[str]:
    lines = ["## Protocol", "", *_config_lines(r.results, r.idx), "", "### Runs", "", *_runs_lines(r.results), ""]
    src_lines = _source_lines(r.results)
    if src_lines:
        lines += [
            "### Source models",
            "",
            "Error (deg) of each source model on its held-out source persons (all their images), as built.",
            "",
            *src_lines,
            "",
        ]
    return lines


def _sanity_section(r: _Report) -> list[str]:
    return [
        "## Sanity: domain gap and headroom",
        "",
        "In-domain: the truncated + recovered base on held-out persons of its own source (their images after the first "
        "few, like the targets). Target-trained: the same model, trained and truncated the same way on as many "
        "*other* persons of the target world (its `train` split), on the target's scored images: the within-dataset "
        "error, which controls for the target's narrower gaze range. Source-only: the source base on the target. "
        "Oracle: per-person supervised fine-tuning (see Protocol). Domain gap = source-only − in-domain; gap to "
        "target-trained = source-only − target-trained; headroom = source-only − oracle (means over seeds). "
        "Constant prediction: the error of always predicting the set's mean gaze, a measure of how spread its labels "
        "are (a narrow-range target is easier for any model).",
        "",
        sanity_table(r.idx),
        "",
        *_bullets(r.sanity),
        "",
    ]


def _table1_section(r: _Report) -> list[str]:
    lines = [
        "## Table 1: cross-domain personalization error (deg)",
        "",
        "Mean over persons per record, then mean ± std over seeds; **bold**: lowest on the pair. Params at inference: "
        "after merging the adapter (see Costs).",
        "",
        table1(r.idx),
        "",
        *_bullets(r.main),
        "",
        "Per person (all pairs and seeds pooled):",
        "",
        person_table(r.idx),
        "",
    ]
    return lines + _tpgaze_lines(r.idx)


def _tpgaze_lines(idx: Index) -> list[str]:
    """TPGaze's meta-trained prompts alone against TPGaze after its personalization steps."""
    if "tpgaze" not in {m for (m, _, _) in idx}:
        return []
    rows = []
    for pair in pairs_of(idx):
        meta_only = {
            s: rec["meta_only"]["error_deg"]
            for (m, p, s), rec in idx.items()
            if m == "tpgaze" and p == pair and rec.get("meta_only")
        }
        full = cell(idx, "tpgaze", pair)
        if meta_only and full:
            rows.append([pair, Stat(meta_only).format(), full.format()])
    if not rows:
        return []
    return [
        "TPGaze with its meta-trained prompts before any personalization step, and after its steps:",
        "",
        _table(["pair", "meta-trained prompts only", "TPGaze (after personalization)"], rows),
        "",
    ]


def _table2_section(r: _Report) -> list[str]:
    return [
        "## Table 2: the LoRA family against Alfa, with merged sizes",
        "",
        "Same recipe and steps. Params after merge: `alfa.merge` (LoRA-style updates of the factorized layers are "
        "densified, which brings back the dense layer); exact compact merge: the same function stored as a "
        "factorization of rank d + r (`alfa.merge(model, extend=True)`).",
        "",
        table2(r.idx),
        "",
    ]


def _parts_section(r: _Report) -> list[str]:
    ptable = parts_table(r.idx, r.parts_methods)
    if not ptable:  # records made before the parts existed
        return []
    return [
        "## Where the error goes: yaw and pitch",
        "",
        "The same records split by gaze component (degrees, pooled over pairs; mean ± std over seeds): mean "
        "absolute yaw and pitch error over the scored images, and the absolute *bias* of each, |mean prediction "
        "− mean label| per person, the part of the error that shifts every image of a person alike. Why look: "
        "the flip-symmetry loss compares f(I) with FlipYaw(f(flip(I))). A yaw error is seen only through its "
        "antisymmetric part, and pitch only as p(I) − p(flip(I)): adding the same offset to every pitch "
        "prediction leaves the loss unchanged, so nothing in the loss holds the pitch where it was. (The parts "
        "are plain differences of the predicted angles: a model that drifts far can predict angles beyond ±90°, so "
        "they can exceed the angular error, which stops at 180°.)",
        "",
        ptable,
        "",
        *_bullets(r.parts),
        "",
    ]


def _ablations_section(r: _Report) -> list[str]:
    """One subsection per ablation of the stored layout that ran on some pair, in the layout's order."""
    lines = ["## Ablations", ""]
    for name, rows in r.layout.items():
        extra = name in REGISTRY and REGISTRY[name].extra_params
        table, pairs = ablation_table(r.idx, rows, extra_params=extra)
        if not pairs:
            continue
        title, what = _title(name)
        lines += [f"### {title}", "", what, "", table, ""]
        lines += _bullets(ablation_verdicts(r.idx, name, rows, pairs))
        lines += [""]
        lines += r.figure(name, f"Error against the setting ({title}): mean ± std over seeds, one line per pair.")
    return lines


# The cost table's rows: Table 1's methods, the oracle, and the ablations' other kinds of adapter.
_COST_ROWS = (*MAIN_METHODS, "oracle", "diag_gate", "linear_mix", "alfa[dense]")


def _costs_section(r: _Report) -> list[str]:
    return [
        "## Costs",
        "",
        "Medians over the records of each method (peak memory: the maximum). Measured in the benchmark run itself, on "
        "a shared machine: wall times depend on the load (see Runs), CPU times less so.",
        "",
        cost_table(r.idx, [m for m in _COST_ROWS if _records_of(r.idx, m)]),
        "",
    ]


def _figures_section(r: _Report) -> list[str]:
    lines = ["## Figures", ""]
    lines += r.figure(
        "rank_slices",
        "SVD rank-slice maps (the paper's Figure 4): the response of single dictionary filters "
        "V_base[s] = S_d[s] V_d[s] "
        "of one truncated layer on two target persons, side by side.",
    )
    lines += r.figure(
        "updates",
        "Update maps (the paper's Figure 5): the personalized ΔW of one layer for three target persons, Alfa and LoRA.",
    )
    return lines + update_rank_lines(r.figure_data)


def _records_section(r: _Report) -> list[str]:
    records = r.results.get("records", [])
    failed = [(rec["id"], rec["failed"]) for rec in records if rec.get("failed")]
    lines = ["## Records", "", f"{len(records)} records in `{r.source}`."]
    if not failed:
        return lines + ["No personalization failed."]
    lines += ["", "Persons whose personalization failed (left out of that record's mean):", ""]
    return lines + [f"- `{rid}`: {fails}" for rid, fails in failed]


def _flip_section(r: _Report) -> list[str]:
    """What a flip can see, the recipes selected on the stand-in, the replayed reference protocol (none of it
    for results made before those records existed)."""
    return flip_sections(r.results, r.idx, MAIN_METHODS)


_SECTIONS: tuple[Callable[[_Report], list[str]], ...] = (
    _header_section,
    _summary_section,
    _protocol_section,
    _sanity_section,
    _table1_section,
    _flip_section,
    _table2_section,
    _parts_section,
    _ablations_section,
    _costs_section,
    _figures_section,
    _records_section,
)


def render_report(
    results: dict[str, Any],
    *,
    figures: dict[str, Path] | None = None,
    figure_data: Any = None,
    md_dir: Path | None = None,
    command: str | None = None,
    source: str | None = None,
) -> str:
    """The markdown text of the report (figures, if given, are linked relative to ``md_dir``)."""
    report = _Report(results, figures or {}, figure_data, md_dir, command or "alfa report", source or "results.json")
    lines = [line for section in _SECTIONS for line in section(report)]
    return "\n".join(lines).rstrip() + "\n"


def build_report(
    results_path: str | os.PathLike,
    out_md: str | os.PathLike = "docs/results.md",
    figure_dir: str | os.PathLike | None = None,
    command: str | None = None,
    source: str | None = None,
) -> Path:
    """Read ``results.json`` (or its folder), render the figures and write the markdown report. ``source`` is
    how the page names the results it was made from (default: ``results_path`` as given)."""
    results_path = Path(results_path)
    results = load_results(results_path)
    results_dir = results_path if results_path.is_dir() else results_path.parent
    out_md = Path(out_md)
    figure_dir = Path(figure_dir) if figure_dir is not None else out_md.parent / "figures" / "results"
    figures = render_figures(results, results_dir, figure_dir)
    updates = results_dir / FIGURE_DIR / UPDATES_FILE
    figure_data = F.load_figure_data(updates) if updates.is_file() else None
    text = render_report(
        results,
        figures=figures,
        figure_data=figure_data,
        md_dir=out_md.parent,
        command=command,
        source=str(results_path) if source is None else source,
    )
    write_text(out_md, text)
    return out_md
