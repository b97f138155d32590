"""What a page measures of a record beyond its angular error.

A :class:`~alfa.study.bench.stats.Measure` reads a record's value and its persons' values. The parts of the error
(yaw, pitch and their biases) and the error as a share of a constant prediction's are measures like the angular
error, so every table and sentence that quotes them gets the same 95 % interval a cell of the angular error gets
(:func:`~alfa.study.bench.stats.level`) and the same differences (:func:`~alfa.study.bench.stats.diff`). The
per-pair summary the runner stores in ``results.json`` (:func:`sanity_summary`) is here too.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Mapping
from typing import Any

from .record import Record
from .stats import Index, Measure, Stat, cell, index_records, level, pairs_of

__all__ = ["PARTS", "part", "part_gap", "constant_prediction", "label_spread", "sanity_summary"]


def _label_spread(record: Record) -> tuple[float | None, dict[str, float]]:
    constant = record.constant_prediction_deg
    if not constant or record.error_deg is None:
        return None, {}
    return record.error_deg / constant, {p: e / constant for p, e in record.per_person.items()}


constant_prediction = Measure("error of a constant prediction", lambda record: (record.constant_prediction_deg, {}))
"""The error of always predicting the set's mean gaze on the record's images (stored with the rows without
adaptation; no per-person values)."""

label_spread = Measure("error as a share of a constant prediction's", _label_spread)
"""The error as a share (a fraction) of a constant prediction's on the same images (always the set's mean gaze:
how spread its labels are), per person over the record's constant; none for a record without that constant."""


def _stat_dict(stat: Stat | None) -> dict[str, Any] | None:
    if stat is None:
        return None
    return {"mean": stat.mean, "std": stat.std, "seeds": sorted(stat.values)}


def _constant(idx: Index, method: str, pair: str) -> float | None:
    """The constant-prediction error stored with a row's records on ``pair``, their mean over seeds."""
    stat = level(idx, method, pair, constant_prediction)
    return None if stat is None else stat.mean


def sanity_summary(records: Iterable[Record | Mapping[str, Any]]) -> dict[str, Any]:
    """Per pair: in-domain, target-trained, source-only and oracle errors, the domain gap (source-only −
    in-domain), the gap to a model trained on the target world (source-only − target-trained) and the
    headroom (source-only − oracle). Stored in ``results.json`` as its ``sanity`` record."""
    idx = index_records(records)
    out: dict[str, Any] = {}
    for pair in pairs_of(idx):
        ind, src, orc, own = (cell(idx, m, pair) for m in ("in-domain", "source-only", "oracle", "target-trained"))
        if ind is None and src is None and orc is None and own is None:
            continue
        out[pair] = {
            "in_domain": _stat_dict(ind),
            "target_trained": _stat_dict(own),
            "source_only": _stat_dict(src),
            "oracle": _stat_dict(orc),
            "domain_gap_deg": src.mean - ind.mean if src and ind else None,
            "target_gap_deg": src.mean - own.mean if src and own else None,
            "headroom_deg": src.mean - orc.mean if src and orc else None,
            "in_domain_constant_deg": _constant(idx, "in-domain", pair),
            "target_constant_deg": _constant(idx, "source-only", pair),
        }
    return out


# What the tables read of a record's ``per_person_parts`` (degrees): mean |error| and signed bias per component
# (records scored since 2026-12-02 also hold each component's mean square, deg²: tta_report.offset_shares).
PARTS = {
    "yaw": ("yaw error", lambda q: q["yaw"]),
    "pitch": ("pitch error", lambda q: q["pitch"]),
    "yaw_bias": ("yaw bias (abs)", lambda q: abs(q["yaw_bias"])),
    "pitch_bias": ("pitch bias (abs)", lambda q: abs(q["pitch_bias"])),
}


def part(key: str) -> Measure:
    """The measure of one part of the error (``PARTS[key]``): the mean over persons and the persons' values;
    not available for records without parts (scored before they were measured)."""
    title, get = PARTS[key]

    def read(record: Record) -> tuple[float | None, dict[str, float]]:
        values = {person: get(q) for person, q in (record.per_person_parts or {}).items()}
        return (statistics.fmean(values.values()) if values else None), values

    return Measure(title, read)


def part_gap(first: str, second: str) -> Measure:
    """Part ``first`` minus part ``second`` of the error (e.g. pitch error − yaw error), per person and its mean:
    a difference of rows in this measure is how much more one part changed than the other."""
    get_first, get_second = PARTS[first][1], PARTS[second][1]

    def read(record: Record) -> tuple[float | None, dict[str, float]]:
        values = {person: get_first(q) - get_second(q) for person, q in (record.per_person_parts or {}).items()}
        return (statistics.fmean(values.values()) if values else None), values

    return Measure(f"{PARTS[first][0]} − {PARTS[second][0]}", read)
