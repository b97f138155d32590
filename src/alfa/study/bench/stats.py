"""The statistics of the benchmark: per-seed cells, pooled means and paired differences of its records.

A *record* is one (method, pair, seed) result of :mod:`alfa.study.bench.runner`. Every table and verdict of the
report is built from the few functions here, and the runner stores :func:`sanity_summary` in
``results.json``; so both use this module and neither needs the other.

How differences are judged: for two rows ``a`` and ``b``, per seed, the mean over pairs of
``error(a) − error(b)`` on the same base; its mean over seeds ``Δ`` and the sample standard deviation of
those per-seed differences. A difference is *clear* when ``|Δ|`` exceeds that standard deviation and every
seed has the same sign; otherwise it is *within the spread*. With one seed there is no spread, and nothing
is called clear.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .methods import PAIRS
from .record import Record, as_records

__all__ = [
    "Stat",
    "Diff",
    "Index",
    "Measure",
    "PARTS",
    "index_records",
    "pairs_of",
    "seeds_of",
    "cell",
    "angular",
    "part",
    "pooled",
    "diff",
    "signed",
    "sanity_summary",
]


@dataclass
class Stat:
    """A row's error on one pair (or pooled over pairs): per-seed values, their mean and sample std."""

    values: dict[int, float]

    @property
    def n(self) -> int:
        return len(self.values)

    @property
    def mean(self) -> float:
        return statistics.fmean(self.values.values())

    @property
    def std(self) -> float | None:
        return statistics.stdev(self.values.values()) if self.n > 1 else None

    def format(self, digits: int = 2) -> str:
        if self.std is None:
            return f"{self.mean:.{digits}f}"
        return f"{self.mean:.{digits}f} ± {self.std:.{digits}f}"


@dataclass
class Diff:
    """``a − b``: per seed, the mean over pairs of the difference of the records' errors (same base)."""

    a: str
    b: str
    per_seed: dict[int, float]
    persons_better: int  # (pair, seed, person) triples where a's error is below b's
    persons: int

    @property
    def n(self) -> int:
        return len(self.per_seed)

    @property
    def mean(self) -> float:
        return statistics.fmean(self.per_seed.values())

    @property
    def std(self) -> float | None:
        return statistics.stdev(self.per_seed.values()) if self.n > 1 else None

    @property
    def same_sign(self) -> bool:
        signs = {math.copysign(1.0, v) for v in self.per_seed.values() if v != 0}
        return len(signs) <= 1 and all(v != 0 for v in self.per_seed.values())

    @property
    def clear(self) -> bool:
        return self.std is not None and abs(self.mean) > self.std and self.same_sign

    def describe(self) -> str:
        """E.g. ``"−0.31 ± 0.12° over 3 seeds (paired): clear; lower for 30 of 45 persons"``."""
        persons = f"; lower for {self.persons_better} of {self.persons} persons" if self.persons else ""
        if self.std is None:
            return f"{signed(self.mean)}° (one seed: no spread measured){persons}"
        verdict = "a clear difference" if self.clear else "within the spread"
        return f"{signed(self.mean)} ± {self.std:.2f}° over {self.n} seeds (paired): {verdict}{persons}"


def signed(x: float) -> str:
    return f"{x:+.2f}".replace("-", "−")


Index = dict[tuple[str, str, int], Record]


def index_records(records: Iterable[Record | Mapping[str, Any]]) -> Index:
    """``(method, pair, seed) -> record`` (the recipe-selection records, scored on a stand-in and not on a
    pair, are no table rows and are left out; so are records without an error). JSON objects are read as
    :class:`~alfa.study.bench.record.Record`."""
    return {
        (r.method, r.pair, int(r.seed)): r
        for r in as_records(records)
        if r.error_deg is not None and r.kind != "selection"
    }


def pairs_of(idx: Index) -> list[str]:
    present = {p for (_, p, _) in idx}
    return [p for p in PAIRS if p in present] + sorted(present - set(PAIRS))


def seeds_of(idx: Index) -> list[int]:
    return sorted({s for (_, _, s) in idx})


def cell(idx: Index, method: str, pair: str) -> Stat | None:
    values = {
        s: float(r.error_deg) for (m, p, s), r in idx.items() if m == method and p == pair and r.error_deg is not None
    }
    return Stat(values) if values else None


# A measure of a record: its value (``None``: not available) and the per-person values behind it.
Measure = Callable[[Record], tuple[float | None, dict[str, float]]]


def angular(record: Record) -> tuple[float | None, dict[str, float]]:
    """The record's error (mean over persons of the angular error) and its persons' errors."""
    return record.error_deg, record.per_person


def pooled(idx: Index, method: str, pairs: Sequence[str], measure: Measure = angular) -> Stat | None:
    """Per seed the mean over ``pairs`` (only seeds where the method has all of them)."""
    values = {}
    for s in seeds_of(idx):
        vals = [measure(idx[(method, p, s)])[0] for p in pairs if (method, p, s) in idx]
        if pairs and len(vals) == len(pairs) and all(v is not None for v in vals):
            values[s] = statistics.fmean(vals)
    return Stat(values) if values else None


def diff(idx: Index, a: str, b: str, pairs: Sequence[str], measure: Measure = angular) -> Diff | None:
    """``a − b`` over the seeds where both have every pair of ``pairs`` (``None`` without pairs)."""
    if not pairs:
        return None
    per_seed: dict[int, float] = {}
    better = total = 0
    for s in seeds_of(idx):
        if not all((a, p, s) in idx and (b, p, s) in idx for p in pairs):
            continue
        ma = [measure(idx[(a, p, s)]) for p in pairs]
        mb = [measure(idx[(b, p, s)]) for p in pairs]
        if any(v is None for v, _ in ma + mb):
            continue
        per_seed[s] = statistics.fmean(va - vb for (va, _), (vb, _) in zip(ma, mb))
        for (_, pa), (_, pb) in zip(ma, mb):
            for person in pa.keys() & pb.keys():
                total += 1
                better += pa[person] < pb[person]
    if not per_seed:
        return None
    return Diff(a, b, per_seed, better, total)


def _stat_dict(stat: Stat | None) -> dict[str, Any] | None:
    if stat is None:
        return None
    return {"mean": stat.mean, "std": stat.std, "seeds": sorted(stat.values)}


def _constant(idx: Index, method: str, pair: str) -> float | None:
    """The constant-prediction error stored with a sanity record (the same data for every seed)."""
    values = [r.constant_prediction_deg for (m, p, _), r in idx.items() if m == method and p == pair]
    values = [v for v in values if v is not None]
    return statistics.fmean(values) if values else None


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


# What a record's ``per_person_parts`` hold (degrees): mean |error| and signed bias per component.
PARTS = {
    "yaw": ("yaw error", lambda q: q["yaw"]),
    "pitch": ("pitch error", lambda q: q["pitch"]),
    "yaw_bias": ("yaw bias (abs)", lambda q: abs(q["yaw_bias"])),
    "pitch_bias": ("pitch bias (abs)", lambda q: abs(q["pitch_bias"])),
}


def part(key: str) -> Measure:
    """The measure of one part of the error (``PARTS[key]``): the mean over persons and the persons' values;
    not available for records without parts (scored before they were measured)."""
    get = PARTS[key][1]

    def measure(record: Record) -> tuple[float | None, dict[str, float]]:
        values = {person: get(q) for person, q in (record.per_person_parts or {}).items()}
        return (statistics.fmean(values.values()) if values else None), values

    return measure
