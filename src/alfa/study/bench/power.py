"""The power of a benchmark design, planned before its runs: the smallest difference a page detects with
80 % power, from the number of seeds, persons and pairs behind a comparison and the size of the page's family.

After a run a page states what its design detected from the measured standard errors
(:meth:`~alfa.study.bench.stats.Comparisons.detectable`). Before a run the standard errors are not there; they
follow from the sizes of the random effects of a difference between two rows, which the first records measured
(:data:`PLANNING`). The test is the page's own (:mod:`alfa.study.bench.stats`): t with seeds − 1 degrees of
freedom, at Holm's strictest step (α = 0.05 / family), so a planned figure is what the page's most precise
comparison of that kind would state.

``alfa power`` prints the planning table of docs/flip-premise.md §7.1 (the second protocol's seeds and declared
family were chosen from it).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from .stats import ALPHA, POWER, detectable_multiple

__all__ = ["PLANNING", "Components", "detectable", "plan_table", "standard_error"]


@dataclass(frozen=True)
class Components:
    """The standard deviations (degrees) of the random effects of a difference ``a − b`` between two rows: a
    seed's effect shared by all its pairs, a (seed, pair) effect, a person's effect, and the (person, seed)
    scatter of one person's mean difference."""

    shared: float
    seed: float
    person: float
    noise: float


PLANNING = Components(shared=0.4, seed=0.8, person=0.7, noise=1.7)
"""Estimated once from the first committed records (docs/data/bench-standard and bench-flip: every row against
source-only whose pooled difference is under 2°, two-way ANOVA mean squares per pair): a (seed, pair) effect of
0–0.8, a part shared by a seed's pairs of 0.2–0.4, a person effect of 0–0.7 and a person × seed scatter of
1.6–1.7; the larger of each. tests/test_stats.py simulates the benchmark's design with the same values."""


def standard_error(components: Components, seeds: int, persons: int, pairs: int, design: str = "nested") -> float:
    """The standard error of a difference's estimate (the mean over seeds of the mean over ``pairs`` pairs of
    the mean over ``persons`` persons): ``nested``, each seed with persons of its own; ``crossed``, the same
    persons in every seed."""
    if seeds < 1 or persons < 1 or pairs < 1:
        raise ValueError(f"seeds, persons and pairs must be at least 1, got {seeds}, {persons}, {pairs}")
    c = components
    if design == "nested":
        per_seed = c.shared**2 + (c.seed**2 + (c.person**2 + c.noise**2) / persons) / pairs
        return math.sqrt(per_seed / seeds)
    if design == "crossed":
        per_seed = c.shared**2 + (c.seed**2 + c.noise**2 / persons) / pairs
        return math.sqrt(per_seed / seeds + c.person**2 / (persons * pairs))
    raise ValueError(f"design must be 'nested' or 'crossed', not {design!r}")


def detectable(
    components: Components, seeds: int, persons: int, pairs: int, family: int, design: str = "nested"
) -> float:
    """The difference detected with :data:`~alfa.study.bench.stats.POWER` by a two-sided t test with seeds − 1
    degrees of freedom at α = 0.05 / ``family`` (``inf`` with one seed: no verdict is given then)."""
    if seeds < 2:
        return math.inf
    if family < 1:
        raise ValueError(f"a family has at least one comparison, got {family}")
    multiple = detectable_multiple(ALPHA / family, seeds - 1, POWER)
    return multiple * standard_error(components, seeds, persons, pairs, design)


def plan_table(
    seeds: Sequence[int] = (3, 5, 8, 10),
    # the second protocol's planning table (docs/flip-premise.md §7.1): its declared family of 11 comparisons,
    # 24 and 100 beside it; pooled over its six pairs, over the two positive controls, over one pair
    families: Sequence[int] = (11, 24, 100),
    pairs: Sequence[int] = (6, 2, 1),
    persons: int = 15,
    components: Components = PLANNING,
) -> str:
    """A markdown table: per number of seeds (rows), the detectable difference (degrees) for each family size
    and number of pooled pairs (columns), in the nested design with ``persons`` persons per pair and seed."""
    head = [f"family {k}, {p} pair{'s' if p > 1 else ''}" for p in pairs for k in families]
    lines = ["| seeds | " + " | ".join(head) + " |", "|---|" + "---|" * len(head)]
    for s in seeds:
        cells = [f"{detectable(components, s, persons, p, k):.1f}" for p in pairs for k in families]
        lines.append(f"| {s} | " + " | ".join(cells) + " |")
    return "\n".join(lines)
