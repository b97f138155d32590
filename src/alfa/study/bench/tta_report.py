"""The report's label-free test-time augmentation tables (issue 26): the TTA rows per pair with their inference
cost (:func:`tta_table`), and what a flip, a roll, both and neither see of the source model's error
(:func:`orbit_table`, from the source-only records' ``orbit``). Each is left out when the results lack what it
reads, so the pages of results made before these rows and this measure render as they did.
"""

from __future__ import annotations

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

__all__ = ["ORBIT_COLUMNS", "passes", "tta_table", "orbit_table", "tta_lines"]

ORBIT_COLUMNS = {
    "flip_seen": "a flip sees",
    "roll_seen": "a roll sees",
    "both": "both see",
    "flip_only": "the flip only",
    "roll_only": "the roll only",
    "neither": "neither sees",
    "cross": "cross terms",
}
"""The orbit table's shares (keys of :class:`alfa.gaze.orbit.OrbitParts`) and their headers, in its order."""


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


def _share(records: dict[int, Record], key: str) -> Stat | None:
    """Per seed, the record's mean over persons of one orbit share, in percent (seeds without ``orbit`` left
    out)."""
    values = {s: 100 * r.orbit[key] for s, r in records.items() if r.orbit and r.orbit.get(key) is not None}
    return Stat(values) if values else None


def orbit_table(idx: Index) -> str | None:
    """Per pair with source-only records: of how many seeds' records have the orbit parts, their mean-square
    error and each share of :data:`ORBIT_COLUMNS` (mean over seeds with its 95 % interval; ``—`` where no record
    has them; ``None`` where no source-only record has them)."""
    if not any(r.orbit for r in _records(idx, "source-only")):
        return None
    rows = []
    for pair in pairs_of(idx):
        records = idx.row("source-only", pair)
        if not records:
            continue
        with_orbit = {s: r for s, r in records.items() if r.orbit}
        mse = [r.orbit["mse"] for r in with_orbit.values() if r.orbit and r.orbit.get("mse") is not None]
        shares = [_share(with_orbit, key) for key in ORBIT_COLUMNS]
        rows.append(
            [
                pair,
                f"{len(with_orbit)} of {len(records)}",
                _num(statistics.fmean(mse)) if mse else "—",
                *("—" if s is None else s.format_interval() for s in shares),
            ]
        )
    header = ["pair", "seeds measured", "mean-square error (deg²)", *(f"{h} (%)" for h in ORBIT_COLUMNS.values())]
    return _table(header, rows)


def tta_lines(idx: Index, heading: str = "###") -> list[str]:
    """The flip sections' part on the label-free TTA rows and what a roll sees, under a heading of level
    ``heading`` (no lines where the results have neither)."""
    tta, orbit = tta_table(idx), orbit_table(idx)
    if tta is None and orbit is None:
        return []
    lines = [f"{heading} Label-free test-time augmentation: the flip, the roll and both", ""]
    if tta is not None:
        lines += [prose.TTA_ROWS_INTRO.format(roll_deg=ROLL_TTA_DEG), "", tta, ""]
    if orbit is not None:
        lines += [prose.ORBIT_INTRO.format(roll_deg=ROLL_TTA_DEG), "", orbit, ""]
    return lines
