"""The report's label-free test-time augmentation tables (issue 26): the TTA rows per pair with their inference
cost (:func:`tta_table`), and how much of the source model's error is one constant offset per person, in yaw
(which a flip and a roll both see) and in pitch (which a roll sees and a flip cannot) (:func:`offset_table`, from
the source-only records' ``per_person_parts``). Each is left out when the results lack what it reads, so the pages
of results made before these rows and this measure render as they did.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence

from alfa.gaze.distill import DISTILL_OBJECTIVE
from alfa.gaze.tta import ROLL_TTA_DEG, tta_kind

from ..timing import median_text
from . import report_prose as prose
from .markdown import table as _table
from .methods import TTA_OF_ROW, TTA_ROWS
from .names import DEFAULT, SELECTED, display_name
from .record import Record
from .stats import Index, Stat, cell, cell_on, diff, pairs_of

__all__ = [
    "OFFSET_COLUMNS",
    "LABEL_FREE_BASELINES",
    "passes",
    "tta_table",
    "offset_shares",
    "offset_table",
    "label_free_verdicts",
    "tta_lines",
]

LABEL_FREE_BASELINES = ("ruda", DISTILL_OBJECTIVE, "pnpga")
"""Issue 26's trained label-free rows (each predicts with one forward pass of one merged model)."""


def passes(records: Sequence[Record], label: str) -> str:
    """The forward passes per image of a TTA row: as its records store them (``tta.passes``); a record made
    before they were stored (a flip-TTA record) counts its kind's, which a kind of :mod:`alfa.gaze.tta` fixes."""
    stored = {(r.tta or {}).get("passes") for r in records}
    if None in stored:
        stored = (stored - {None}) | {tta_kind(TTA_OF_ROW[label]).passes}
    return "/".join(str(n) for n in sorted(stored))


def latency_ratio(records: Sequence[Record]) -> str:
    """The median over records of the row's latency over the base's, with its distribution-free 95 % interval from
    six records up (``—`` where none measured both)."""
    return median_text((r.latency_ms / r.base_latency_ms for r in records if r.latency_ms and r.base_latency_ms), 2)


def _cell(idx: Index, method: str, pair: str) -> str:
    """The row's error on ``pair`` with its interval, and its difference from source-only with its interval."""
    stat = cell(idx, method, pair)
    if stat is None:
        return "—"
    text = stat.format()
    if method != "source-only":
        d = diff(idx, method, "source-only", [pair])
        text += f"; {d.compact()}" if d is not None else ""
    return text


def tta_table(idx: Index) -> str | None:
    """Per TTA row (flip-TTA and :data:`~alfa.study.bench.methods.TTA_ROWS`, after source-only): forward passes
    per image, latency over the base's, and per pair its error and its difference from source-only (``None``
    without records of :data:`~alfa.study.bench.methods.TTA_ROWS`: the pages made before them are unchanged)."""
    present = {m for (m, _, _) in idx}
    if not present & set(TTA_ROWS):
        return None
    pairs = pairs_of(idx)
    rows = []
    for m in ("source-only", *TTA_OF_ROW):
        recs = idx.records(m)
        if not recs:
            continue
        cost = "1" if m == "source-only" else passes(recs, m)
        rows.append([display_name(m), cost, latency_ratio(recs), *(_cell(idx, m, p) for p in pairs)])
    header = ["row", "forward passes per image", "latency / base (median, 95 % interval)", *pairs]
    return _table(header, rows)


OFFSET_COLUMNS = {
    "yaw_offset": "one yaw offset per person: a flip and a roll see it",
    "pitch_offset": "one pitch offset per person: a roll sees it, a flip cannot",
    "scatter": "scatter around the person's offset",
}
"""The shares of :func:`offset_shares` the offset table shows, and their headers, in its order."""


def offset_shares(record: Record) -> dict[str, float] | None:
    """The record's mean over persons of the shares of each person's (yaw, pitch) mean-square error that are a
    constant yaw offset (``yaw_offset``), a constant pitch offset (``pitch_offset``) and scatter around them
    (``scatter``; the three add up to 1 per person, :class:`alfa.gaze.evaluate.GazeError`), and the mean of that
    mean square (``ms``, degrees²). ``None`` for a record made before the mean squares were stored (one person
    without them is enough: a share over some persons would not be the record's). A person without error has no
    shares and is left out of them; with no such person at all the shares are NaN (shown as missing)."""
    stored = list((record.per_person_parts or {}).values())
    if not stored or any("yaw_ms" not in q or "pitch_ms" not in q for q in stored):
        return None
    ms = [q["yaw_ms"] + q["pitch_ms"] for q in stored]
    erring = [(q, m) for q, m in zip(stored, ms, strict=True) if m > 0]
    if not erring:
        return {"ms": statistics.fmean(ms), **dict.fromkeys(OFFSET_COLUMNS, math.nan)}
    y = statistics.fmean(q["yaw_bias"] ** 2 / m for q, m in erring)
    p = statistics.fmean(q["pitch_bias"] ** 2 / m for q, m in erring)
    return {"ms": statistics.fmean(ms), "yaw_offset": y, "pitch_offset": p, "scatter": 1.0 - y - p}


def _pct_stat(values: dict[int, float | None]) -> str:
    kept = {s: 100 * v for s, v in values.items() if v is not None and not math.isnan(v)}
    return Stat(kept).format() if kept else "—"


def offset_table(idx: Index) -> str | None:
    """Per pair with source-only records: of how many seeds' records have the mean squares, their (yaw, pitch)
    mean-square error, the share a flip sees (``flip.visible_share``) and the shares of :func:`offset_shares`
    (percent, mean over seeds with its 95 % interval; ``—`` where no record has them; ``None`` where no
    source-only record has them)."""
    rows, any_measured = [], False
    for pair in pairs_of(idx):
        records = idx.row("source-only", pair)
        if not records:
            continue
        shares = {s: offset_shares(r) for s, r in records.items()}
        measured = {s: v for s, v in shares.items() if v is not None}
        any_measured = any_measured or bool(measured)
        flip = {s: (records[s].flip or {}).get("visible_share") for s in measured}
        rows.append(
            [
                pair,
                f"{len(measured)} of {len(records)}",
                Stat({s: v["ms"] for s, v in measured.items()}).format() if measured else "—",
                _pct_stat(flip),
                *(_pct_stat({s: v[key] for s, v in measured.items()}) for key in OFFSET_COLUMNS),
            ]
        )
    if not any_measured:
        return None
    header = [
        "pair",
        "seeds measured",
        "mean-square error (deg², yaw and pitch)",
        "a flip sees (%)",
        *(f"{h} (%)" for h in OFFSET_COLUMNS.values()),
    ]
    return _table(header, rows)


def _passes_of(idx: Index, method: str) -> str:
    """Forward passes per image of a label-free row: a TTA row's as stored, every trained row's one."""
    return passes(idx.records(method), method) if method in TTA_OF_ROW else "1"


def _best_label_free(idx: Index, pair: str) -> str | None:
    """Which label-free row has the lowest mean error on ``pair``, among those with every seed source-only has
    there, each's mean over those seeds (so that every mean and difference quoted is over the same seeds), and
    the rows left out for lack of seeds (``None`` where the pair has no label-free row)."""
    seeds = set(idx.row("source-only", pair))
    present = sorted({m for (m, p, _) in idx if p == pair})
    tuned = [m for m in present if m.endswith((SELECTED, DEFAULT))]  # the flip methods' label-free recipes
    rows = [m for m in (*TTA_OF_ROW, *LABEL_FREE_BASELINES, *tuned) if idx.row(m, pair)]
    complete = [m for m in rows if seeds and set(idx.row(m, pair)) >= seeds]
    partial = ", ".join(display_name(m) for m in rows if m not in complete)
    if not complete:
        why = "no source-only record" if not seeds else f"none has all {len(seeds)} seeds of source-only"
        return f"On {pair} no label-free row is ranked ({why}): {partial}." if rows else None
    level = {m: cell_on(idx, m, [pair], seeds) for m in complete}
    ranked = sorted(complete, key=lambda m: level[m].mean)
    best, cost = ranked[0], _passes_of(idx, ranked[0])
    text = (
        f"On {pair}, of the {len(complete)} label-free rows with all {len(seeds)} seeds, {display_name(best)} has "
        f"the lowest mean error ({level[best].format('°')}, {cost} forward pass{'' if cost == '1' else 'es'} per "
        "image)"
    )
    against = diff(idx, best, "source-only", [pair])
    text += f"; {display_name(best)} − source-only = {against.describe()}" if against else ""
    if len(ranked) > 1:
        second = diff(idx, best, ranked[1], [pair])
        text += f"; {display_name(best)} − {display_name(ranked[1])} (the next) = {second.describe()}" if second else ""
    if partial:
        text += f". Not yet on every seed, so not ranked: {partial}"
    return text + "."


def _roll_against_flip(idx: Index) -> str | None:
    """Whether a roll sees error a flip cannot: roll-TTA − flip-TTA on each pair with both (descriptive)."""
    pairs = [p for p in pairs_of(idx) if idx.row("roll-tta", p) and idx.row("flip-tta", p)]
    made = [(p, d) for p in pairs if (d := diff(idx, "roll-tta", "flip-tta", [p])) is not None]
    if not made:
        return None
    lower = [p for p, d in made if d.mean < 0]
    below = [p for p, d in made if d.interval is not None and d.interval[1] < 0]
    where = f" ({', '.join(lower)})" if lower else ""
    return (
        f"Does a roll see error a flip cannot? Roll-TTA's mean error is below flip-TTA's on {len(lower)} of "
        f"{len(made)} pairs{where}, and the 95 % interval of roll-TTA − flip-TTA lies below zero on "
        f"{', '.join(below) if below else 'none'} ("
        + "; ".join(f"{p} {d.compact()}" for p, d in made)
        + "; descriptive, each interval alone). The table above splits what each sees of the source model's error."
    )


def _pnpga_lines(idx: Index) -> list[str]:
    """PnP-GA against Alfa (selected recipe) and against flip-TTA on each pair with PnP-GA's records: every
    row adapts on (or, for flip-TTA, scores) the same persons' same images."""
    pairs = [p for p in pairs_of(idx) if idx.row("pnpga", p)]
    if not pairs:
        return ["This page has no PnP-GA records: no comparison with Alfa or flip-TTA."]
    lines = []
    for other in ("alfa" + SELECTED, "flip-tta"):
        made = [(p, d) for p in pairs if (d := diff(idx, "pnpga", other, [p])) is not None]
        if made:
            lines.append(
                f"PnP-GA − {display_name(other)}, on the same persons and images (PnP-GA also reads labelled "
                "source images and its source snapshots): " + "; ".join(f"{p} {d.describe()}" for p, d in made) + "."
            )
    return lines


def label_free_verdicts(idx: Index) -> list[str]:
    """Issue 26's sentences: which label-free row is best per pair and at what inference cost, whether a roll
    sees what a flip cannot, and PnP-GA against Alfa and flip-TTA (none where the results have no TTA rows)."""
    if not {m for (m, _, _) in idx} & {*TTA_ROWS, *LABEL_FREE_BASELINES}:
        return []
    lines = [line for p in pairs_of(idx) if (line := _best_label_free(idx, p))]
    roll = _roll_against_flip(idx)
    return lines + ([roll] if roll else []) + _pnpga_lines(idx)


def tta_lines(idx: Index, heading: str = "###") -> list[str]:
    """The flip sections' part on the label-free TTA rows and what a roll sees that a flip cannot, under a heading
    of level ``heading`` (no lines where the results have neither)."""
    tta, offsets = tta_table(idx), offset_table(idx)
    if tta is None and offsets is None:
        return []
    lines = [f"{heading} Label-free test-time augmentation: the flip, the roll and both", ""]
    if tta is not None:
        lines += [prose.TTA_ROWS_INTRO.format(roll_deg=ROLL_TTA_DEG), "", tta, ""]
    if offsets is not None:
        lines += [prose.OFFSET_INTRO, "", offsets, ""]
    verdicts = label_free_verdicts(idx)
    return lines + ([*(f"- {v}" for v in verdicts), ""] if verdicts else [])
