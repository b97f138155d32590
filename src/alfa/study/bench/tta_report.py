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

from alfa.gaze.tta import ROLL_TTA_DEG, tta_kind

from . import report_prose as prose
from .markdown import number as _num
from .markdown import table as _table
from .methods import TTA_OF_ROW, TTA_ROWS
from .names import display_name
from .record import Record
from .stats import Index, Stat, cell, diff, pairs_of

__all__ = ["OFFSET_COLUMNS", "passes", "tta_table", "offset_shares", "offset_table", "tta_lines"]


def _records(idx: Index, method: str) -> list[Record]:
    return [r for (m, _, _), r in sorted(idx.items()) if m == method]


def passes(records: Sequence[Record], label: str) -> str:
    """The forward passes per image of a TTA row: as its records store them (``tta.passes``); a record made
    before they were stored (a flip-TTA record) counts its kind's, which a kind of :mod:`alfa.gaze.tta` fixes."""
    stored = {(r.tta or {}).get("passes") for r in records}
    if None in stored:
        stored = (stored - {None}) | {tta_kind(TTA_OF_ROW[label]).passes}
    return "/".join(str(n) for n in sorted(stored))


def _latency_ratio(records: Sequence[Record]) -> str:
    """The median over records of the row's latency over the base's (``—`` where none measured both)."""
    ratios = [r.latency_ms / r.base_latency_ms for r in records if r.latency_ms and r.base_latency_ms]
    return f"{statistics.median(ratios):.2f}" if ratios else "—"


def _cell(idx: Index, method: str, pair: str) -> str:
    """The row's error on ``pair`` with its interval, and its difference from source-only with its interval."""
    stat = cell(idx, method, pair)
    if stat is None:
        return "—"
    text = stat.format_interval()
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
        recs = _records(idx, m)
        if not recs:
            continue
        cost = "1" if m == "source-only" else passes(recs, m)
        rows.append([display_name(m), cost, _latency_ratio(recs), *(_cell(idx, m, p) for p in pairs)])
    header = ["row", "forward passes per image", "latency / base (median)", *pairs]
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
    return Stat(kept).format_interval() if kept else "—"


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
                _num(statistics.fmean(v["ms"] for v in measured.values())) if measured else "—",
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
    return lines
