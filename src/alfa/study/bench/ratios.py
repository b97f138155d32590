"""A ratio of two differences of rows, with a 95 % interval of its own (Fieller's).

The pages quote a few ratios of means: the share of the oracle's headroom a row recovers,
``(source-only − row) / (source-only − oracle)``; the within-target yardstick as a multiple of source-only. A
ratio has no standard error of the kind a difference has: its sampling distribution is skewed and, where the
denominator may be near zero, has no moments at all. Fieller's construction (E. C. Fieller, *Some problems in
interval estimation*, JRSS B 16, 1954) needs none. For a candidate value ``r``,

    L(r) = N − r · D

(N and D the numerator's and the denominator's differences of rows) is itself a difference of rows, whose mean is
zero exactly when ``r`` is the true ratio. Its standard error comes from the hierarchical bootstrap every
difference of the pages uses (:func:`alfa.study.bench.stats.bootstrap_se`: persons and seeds as random effects),
and the interval is every ``r`` whose ``L(r) / SE(L(r))`` lies within ``± t₀.₉₇₅`` with the difference's degrees of
freedom. A bootstrap replicate's deviation of ``L(r)`` is N's deviation minus ``r`` times D's (one set of
replicates draws both), so

    SE(L(r))² = v_N − 2 r c + r² v_D

with ``v_N``, ``v_D``, ``c`` the variances and the covariance of N's and D's replicates, and the interval is a
quadratic inequality in ``r``, solved in closed form. Where D is clear of zero (``D² > t² v_D``) the solution
is a bounded interval around ``N / D``, asymmetric as a ratio's interval should be; where it is not, the
solution is unbounded, and a page says that the ratio has no finite interval rather than print one.

A ratio is descriptive: it joins no page's family (:class:`~alfa.study.bench.stats.Comparisons`) and gets no
verdict; a criterion declared on the ratio of the means is still judged on the means, with this interval beside
it. ``tests/test_ratios.py`` checks the closed form against a bootstrap of ``L(r)`` itself, and the interval's
coverage in a simulation of the benchmark's design (where a ratio over ``SE(N)`` alone falls short).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from .markdown import seeds_words
from .stats import ALPHA, Index, Measure, angular, bootstrap_se, bound, seeds_of, stable_seed, t_quantile

__all__ = ["Ratio", "fieller", "ratio", "share"]

Rows = tuple[tuple[str, float], ...]
"""A linear combination of rows: ``((row, coefficient), ...)``; ``(("source-only", 1.0), ("oracle", -1.0))`` is
the oracle's headroom."""


def fieller(n: float, d: float, var_n: float, var_d: float, cov: float, t: float) -> tuple[float, float] | None:
    """The set ``{r : (n − r d)² ≤ t² (var_n − 2 r cov + r² var_d)}`` where it is a bounded interval (``d`` clear
    of zero: ``d² > t² var_d``); ``None`` where it is unbounded."""
    a = d * d - t * t * var_d
    if a <= 0.0:
        return None
    b = n * d - t * t * cov
    c = n * n - t * t * var_n
    # at r = n / d the left side is 0, so the discriminant is never negative but for rounding
    root = math.sqrt(max(b * b - a * c, 0.0))
    return (b - root) / a, (b + root) / a


@dataclass(frozen=True)
class Ratio:
    """The ratio of the means over seeds of two differences of rows, on the seeds and pairs every row has; the
    variances and the covariance of their bootstrap replicates, the degrees of freedom and what was drawn."""

    numerator: Rows
    denominator: Rows
    pairs: tuple[str, ...]
    seeds: tuple[int, ...]
    n: float  # the numerator's mean over seeds
    d: float  # the denominator's
    var_n: float | None  # None: nothing to draw (one seed and no per-person values)
    var_d: float | None
    cov: float | None
    df: int
    drawn: str

    @property
    def value(self) -> float | None:
        """``n / d``; ``None`` where the denominator's mean is zero."""
        return self.n / self.d if self.d != 0.0 else None

    @property
    def interval(self) -> tuple[float, float] | None:
        """Fieller's 95 % interval; ``None`` where it is unbounded or there is none (:attr:`unbounded` says which)."""
        if self.var_n is None or self.var_d is None or self.cov is None or self.df < 1:
            return None
        return fieller(self.n, self.d, self.var_n, self.var_d, self.cov, float(t_quantile(ALPHA, self.df)))

    @property
    def unbounded(self) -> bool:
        """Whether there is an interval and it is unbounded (the denominator not clear of zero)."""
        return self.var_n is not None and self.df >= 1 and self.interval is None

    def text(
        self,
        scale: float = 100.0,
        unit: str = " %",
        digits: int = 0,
        unbounded: str = "",
        every: Iterable[int] | None = None,
    ) -> str:
        """The value and its interval, both times ``scale``: ``"−290 % [−496, −151]"``; ``"… (no finite interval:
        <unbounded>)"`` where it is unbounded; then its seeds where they are not ``every`` (``" (seeds 0–2)"``,
        ``" (one seed: 0)"``), else ``" (one seed)"`` where it has one: an interval of one seed draws persons only."""
        value = self.value
        if value is None:
            return "— (a denominator of zero)"
        shown = f"{scale * value:.{digits}f}".replace("-", "−") + unit
        interval = self.interval
        if interval is not None:
            lo, hi = (f"{scale * x:.{digits}f}".replace("-", "−") for x in interval)
            shown += f" [{lo}, {hi}]"
        elif self.unbounded:
            shown += " (no finite interval" + (f": {unbounded})" if unbounded else ")")
        else:
            shown += " (no interval)"
        if every is not None and set(every) != set(self.seeds):
            return shown + (
                f" (one seed: {self.seeds[0]})" if len(self.seeds) == 1 else f" ({seeds_words(self.seeds)})"
            )
        return shown + (" (one seed)" if len(self.seeds) == 1 else "")

    def times_text(self, unbounded: str = "", every: Iterable[int] | None = None) -> str:
        """:meth:`text` as a multiple with two decimals: ``"0.63 [0.55, 0.72]"``."""
        return self.text(1.0, "", 2, unbounded, every)

    def interval_text(self) -> str:
        """The interval alone, two decimals, as a difference's: ``"[0.55, 0.72]"`` (``""`` where there is none)."""
        interval = self.interval
        return "" if interval is None else f"[{bound(interval[0])}, {bound(interval[1])}]"


def _coefficients(numerator: Rows, denominator: Rows) -> dict[str, np.ndarray]:
    """Per row, its coefficients in N, in D and in N + D (the sum's variance gives the covariance)."""
    out: dict[str, np.ndarray] = {}
    for which, rows in enumerate((numerator, denominator)):
        for m, c in rows:
            out.setdefault(m, np.zeros(3))[[which, 2]] += c
    return out


def _persons_table(per_seed: Sequence[dict[str, float]], names: Sequence[Sequence[str]]) -> np.ndarray:
    """``(seeds, persons)`` of one row's values on ``names`` per seed (NaN-padded where a seed has fewer)."""
    table = np.full((len(per_seed), max(map(len, names))), math.nan)
    for k, (values, chosen) in enumerate(zip(per_seed, names)):
        table[k, : len(chosen)] = [values[q] for q in chosen]
    return table


def _names(per_row: Sequence[Sequence[dict[str, float]]], persons: str) -> list[list[str]]:
    """Per seed, the persons every one of ``per_row`` has (crossed: in every seed)."""
    names = [sorted(set.intersection(*(set(row[k]) for row in per_row))) for k in range(len(per_row[0]))]
    if persons == "crossed":
        names = [sorted(set.intersection(*map(set, names)))] * len(names)
    return names


def _groups(rows: dict[str, list[dict[str, float]]], persons: str) -> list[list[str]]:
    """The rows in groups scored on the same persons: two rows share a group where they share persons in every
    seed (crossed: the same persons across the seeds too), as the rows on a pair's targets do and the in-domain
    row, scored on held-out source persons, does not."""
    groups: list[list[str]] = []
    for m in rows:
        joined = next((g for g in groups if all(_names([*(rows[x] for x in g), rows[m]], persons))), None)
        if joined is None:
            groups.append([m])
        else:
            joined.append(m)
    return groups


def _blocks(
    values: dict[str, dict[str, list[dict[str, float]]]],
    records: dict[str, dict[str, list[float]]],
    coefficients: dict[str, np.ndarray],
    persons: str,
) -> tuple[list[tuple[float, np.ndarray]], str]:
    """The bootstrap's blocks, each ``(3, seeds, persons)``: N's, D's and their sum's values. ``values``: per pair,
    per row, per seed its per-person values; ``records``: the same of the records' own values. Per pair, one block
    per group of rows on the same persons (:func:`_groups`), their persons drawn once for all of the group's rows
    (paired) and apart from another group's; the seeds only where some row has no persons in a seed."""
    weight = 1.0 / len(values)
    if all(all(_names([v], persons)) for rows in values.values() for v in rows.values()):
        blocks, apart = [], False
        for rows in values.values():
            groups = _groups(rows, persons)
            apart |= len(groups) > 1
            for group in groups:
                names = _names([rows[m] for m in group], persons)
                block = sum(coefficients[m][:, None, None] * _persons_table(rows[m], names)[None] for m in group)
                blocks.append((weight, block))
        if persons == "crossed":
            return blocks, "seeds and each row's persons drawn" if apart else "persons and seeds drawn"
        return blocks, "seeds drawn, each with its persons" if apart else "seeds drawn, each with its own persons"
    blocks = [
        (weight, sum(coefficients[m][:, None, None] * np.array(v)[None, :, None] for m, v in rows.items()))
        for rows in records.values()
    ]
    return blocks, "seeds drawn"


def _read(
    idx: Index, rows: Sequence[str], pairs: Sequence[str], seeds: Sequence[int], measure: Measure
) -> tuple[dict[str, dict[str, list[dict[str, float]]]], dict[str, dict[str, list[float]]]]:
    """Per pair, per row, per seed: its per-person values, and its record value."""
    values: dict[str, dict[str, list[dict[str, float]]]] = {p: {m: [] for m in rows} for p in pairs}
    records: dict[str, dict[str, list[float]]] = {p: {m: [] for m in rows} for p in pairs}
    for p in pairs:
        for m in rows:
            for s in seeds:
                value, per_person = measure(idx[(m, p, s)])
                values[p][m].append(per_person)
                records[p][m].append(float(value))
    return values, records


def ratio(
    idx: Index,
    numerator: Rows,
    denominator: Rows,
    pairs: Sequence[str],
    seeds: Iterable[int] | None = None,
    measure: Measure = angular,
) -> Ratio | None:
    """The ratio of ``numerator`` to ``denominator`` over ``pairs`` (per seed the mean over the pairs), on the seeds
    (of ``seeds``, if given) where every row they name has every pair; ``None`` where no seed has."""
    coefficients = _coefficients(numerator, denominator)
    allowed = None if seeds is None else set(seeds)
    chosen = [
        s
        for s in seeds_of(idx)
        if (allowed is None or s in allowed)
        and all((m, p, s) in idx and measure(idx[(m, p, s)])[0] is not None for m in coefficients for p in pairs)
    ]
    if not pairs or not chosen:
        return None
    values, records = _read(idx, list(coefficients), pairs, chosen, measure)
    # per seed the mean over the pairs of each combination, then the mean over seeds
    n_mean, d_mean = (
        statistics.fmean(
            statistics.fmean(sum(coefficients[m][which] * records[p][m][k] for m in coefficients) for p in pairs)
            for k in range(len(chosen))
        )
        for which in (0, 1)
    )
    persons = idx.family.persons
    blocks, drawn = _blocks(values, records, coefficients, persons)
    if len(chosen) > 1:
        df = len(chosen) - 1
    else:
        df = sum(v.shape[-1] - 1 for _, v in blocks)
        drawn = "persons drawn; one seed, whose own variation is not measured"
    variances: tuple[float | None, float | None, float | None] = (None, None, None)
    if df >= 1:
        key = "|".join(
            ["ratio", repr(numerator), repr(denominator), ",".join(pairs), repr(chosen), measure.name, persons]
        )
        se = bootstrap_se(blocks, persons, np.random.default_rng(stable_seed(key)), idx.family.draws)
        var_n, var_d, var_sum = (float(x) ** 2 for x in se)
        variances = (var_n, var_d, (var_sum - var_n - var_d) / 2)
    return Ratio(
        tuple(numerator), tuple(denominator), tuple(pairs), tuple(chosen), n_mean, d_mean, *variances, df, drawn
    )


def share(
    idx: Index,
    method: str,
    pairs: Sequence[str],
    seeds: Iterable[int] | None = None,
    base: str = "source-only",
    reference: str = "oracle",
) -> Ratio | None:
    """The share of the headroom ``method`` recovers: ``(base − method) / (base − reference)`` (:func:`ratio`)."""
    return ratio(idx, ((base, 1.0), (method, -1.0)), ((base, 1.0), (reference, -1.0)), pairs, seeds)
