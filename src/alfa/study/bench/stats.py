"""The statistics of the benchmark: per-seed cells, pooled means and paired differences of its records, each
difference with a 95 % interval and a verdict whose error rate is stated.

A *record* is one (method, pair, seed) result of :mod:`alfa.study.bench.runner`. Every table and verdict of the
report is built from the few functions here and from the measures of :mod:`alfa.study.bench.measures`.

**A difference** ``a − b`` over some pairs, for one measure (the angular error, a part of it, the error with
flip-TTA on top, ...): per seed, the mean over the pairs of ``value(a) − value(b)`` on the same base; its mean
over seeds is the estimate. Behind it are the paired per-person differences: a's and b's values for the same
(pair, seed, person).

**Persons and seeds are random effects.** The persons are a sample of the people a method would meet and the
seeds a sample of its training runs, so the standard error of a difference comes from a hierarchical
bootstrap over both: ``DRAWS`` replicates, each drawing the seeds with replacement (once for every pair) and,
per pair (pairs are fixed effects), its persons with replacement. The design says how persons meet seeds
(:data:`PERSON_DESIGNS`, from the results' ``config.target_draw``):

- *crossed* (the same persons in every seed: today's records): a replicate draws each pair's persons once and
  uses them in every drawn seed. Its deviation from the estimate is split into the drawn seeds' margin (the
  mean of their seed means, against the mean of all seeds) and the drawn persons' margin (the mean of their
  means over the seeds, against all persons'). The scatter of single (seed, person) cells beyond the two
  margins is not drawn a third time: it is already in both margins, so the standard error errs on the large
  side by that scatter over seeds × persons.
- *nested* (persons drawn afresh with each seed): a seed's mean is already the mean of its own sample of
  persons, so drawing the seeds draws the persons with them. Drawing persons again within a drawn seed would
  count their scatter twice (Davison & Hinkley, *Bootstrap Methods and their Application*, 1997, §3.8); only
  the seeds' margin is drawn.

Where a measure has no per-person values only the seeds are drawn; where a and b were scored on different
persons (the in-domain row against the targets), each side's persons are drawn on their own.

**The small-sample correction.** The plain bootstrap's variance of a mean of n draws is (n − 1)/n of the
unbiased one, a third too small with three seeds. Each margin is multiplied by √(n/(n − 1)) of its level (n:
seeds, or the pair's persons), which makes its bootstrap variance the unbiased sample variance of the mean.

**The test.** ``t = Δ / SE`` is referred to Student's t with ``seeds − 1`` degrees of freedom: a two-sided
p-value and the interval ``Δ ± t₀.₉₇₅ · SE``. The seeds are the fewest independent units of the design. In
the nested design this is the exact t test of the seed means (normal seed means: exactly 5 % false alarms);
in the crossed design it is exact where the seeds' variation dominates and conservative where the persons'
does. Crediting the persons with more degrees of freedom (Satterthwaite's, estimated from the same few
seeds) comes out too high exactly when the seeds' variation happens to look small, and fired above the
nominal rate in the tails that Holm's correction uses; so we do not. The price is power: with three seeds
the t reference has two degrees of freedom, and what that costs is stated on every page
(:meth:`Comparisons.detectable`). ``tests/test_stats.py`` simulates the benchmark's design to check the
false-alarm rates.

**Clear** means the difference is judged and its Holm-adjusted p-value is below :data:`ALPHA`, Holm's step-down
correction running over the *family*: every comparison one page makes (:class:`Comparisons`). So the chance
that a page calls any difference clear when no row differs from any other is at most 5 %. A page states its
family and the smallest difference its design detects with 80 % power (:meth:`Comparisons.detectable`).

**One seed**: the seeds' variation is not measured. The interval then draws the persons only (t with the
persons' degrees of freedom, persons − 1 per pair), says so, and the difference is *not judged*: it is never
clear and is not part of the family.

The bootstrap of a comparison is seeded from a hash of the comparison (rows, pairs, measure, design), so a page
regenerates to the same bytes whatever order it makes its comparisons in.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import math
import statistics
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from alfa.gaze.tdist import t_quantile, t_tail

from .methods import PAIRS
from .record import Record, as_records

__all__ = [
    "ALPHA",
    "DRAWS",
    "POWER",
    "PERSON_DESIGNS",
    "Stat",
    "Diff",
    "Comparisons",
    "Index",
    "Measure",
    "design_of",
    "index_records",
    "pairs_of",
    "seeds_of",
    "cell",
    "cell_on",
    "angular",
    "pooled",
    "level",
    "diff",
    "described",
    "signed",
    "text_of",
    "bound",
    "t_tail",
    "t_quantile",
    "holm",
    "detectable_multiple",
    "bootstrap_se",
    "stable_seed",
]

ALPHA = 0.05
"""The familywise error rate of a page's verdicts: the chance of calling any difference clear when none is."""
DRAWS = 4000
"""Bootstrap replicates per comparison."""
POWER = 0.8
"""The power at which a page states the smallest difference its design detects."""
PERSON_DESIGNS = {"fixed": "crossed", "per_seed": "nested"}
"""``config.target_draw`` of the results -> how persons meet seeds: the same target persons in every seed
(crossed), or drawn afresh per seed (nested)."""


@dataclass
class Stat:
    """A row's error on one pair (or pooled over pairs): per-seed values, their mean and sample std; with one seed
    on one pair, that record's per-person errors (``persons``), which give it an interval over persons."""

    values: dict[int, float]
    persons: tuple[float, ...] = ()

    @property
    def n(self) -> int:
        return len(self.values)

    @property
    def mean(self) -> float:
        return statistics.fmean(self.values.values())

    @property
    def std(self) -> float | None:
        return statistics.stdev(self.values.values()) if self.n > 1 else None

    @property
    def interval(self) -> tuple[float, float] | None:
        """The 95 % interval of the mean over seeds, ``mean ± t₀.₉₇₅(n − 1) · std / √n`` (Student's t with
        seeds − 1 degrees of freedom, the seeds being the independent units); with one seed, the same over its
        persons where it has them (the seeds' own variation unmeasured: narrower for it), else ``None``."""
        units = list(self.values.values()) if self.n > 1 else list(self.persons)
        if len(units) < 2:
            return None
        half = _critical(ALPHA, len(units) - 1) * statistics.stdev(units) / math.sqrt(len(units))
        return self.mean - half, self.mean + half

    @property
    def seed_half_width(self) -> float | None:
        """The half-width of the interval over seeds (what a figure's error bar draws); ``None`` with one seed,
        whose interval, over persons only, a figure does not draw."""
        return None if self.n < 2 else self.interval[1] - self.mean

    def format(self, unit: str = "") -> str:
        """A cell: the mean over seeds with its 95 % interval, ``"6.00 [3.52, 8.48]"``; with one seed
        ``"6.00 [5.10, 6.90] (one seed)"`` (its persons' interval) or ``"6.00 (one seed)"`` where it has none.
        ``unit`` follows the mean (``"6.00° [3.52, 8.48]"``)."""
        interval = self.interval
        if interval is None:
            return f"{self.mean:.2f}{unit} (one seed)"
        text = f"{self.mean:.2f}{unit} [{bound(interval[0])}, {bound(interval[1])}]"
        return text + (" (one seed)" if self.n == 1 else "")

    def format_percent(self) -> str:
        """A share (a fraction) in percent with its 95 % interval, as :meth:`format`: ``"29 % [27, 31]"``."""
        text = f"{_whole(100 * self.mean)} %"
        if self.interval is not None:
            text += f" [{_whole(100 * self.interval[0])}, {_whole(100 * self.interval[1])}]"
        return text + (" (one seed)" if self.n == 1 else "")


def text_of(stat: Stat | None, unit: str = "", percent: bool = False) -> str:
    """A cell of a row's level: :meth:`Stat.format` (:meth:`Stat.format_percent` for a share, ``percent``), or ``—``
    where the row has no value there."""
    if stat is None:
        return "—"
    return stat.format_percent() if percent else stat.format(unit)


def _whole(x: float) -> str:
    """A whole number with a typographic minus, and no "−0" from rounding a small negative one."""
    text = f"{x:.0f}"
    return "0" if text == "-0" else text.replace("-", "−")


def signed(x: float) -> str:
    return f"{x:+.2f}".replace("-", "−")


def bound(x: float) -> str:
    """An interval's end: two decimals and a typographic minus, no plus."""
    return f"{x:.2f}".replace("-", "−")


# ----------------------------------------------------------------------------- Student's t, Holm


@functools.cache
def _critical(tail: float, df: int) -> float:
    """:func:`t_quantile` of one level (a page asks for the same few many times)."""
    return float(t_quantile(tail, df))


def _normal_cdf(x: np.ndarray) -> np.ndarray:
    # on the whole array at once: a solve takes 80 steps over 4000 points, a tenth of a second element by element
    return 0.5 * torch.special.erfc(torch.from_numpy(-x / math.sqrt(2))).numpy()


@functools.cache
def detectable_multiple(level: float, df: int, power: float = POWER) -> float:
    """How many standard errors a difference must be for a two-sided t test at ``level`` with ``df`` degrees
    of freedom to call it clear with probability ``power``: the noncentral t's power,
    ``E[Φ(λ − c·S) + Φ(−λ − c·S)]`` with ``c`` the critical t and ``S² ~ χ²(df)/df`` the estimated standard
    error over the true one (integrated on a grid), solved for λ by bisection."""
    c = _critical(level, df)
    top = math.sqrt(1 + 10 * math.sqrt(2 / df) + 40 / df)
    s = np.linspace(0.0, top, 4001)[1:]
    x = df * s * s  # the χ²(df) value of each S
    log_density = np.log(2 * df * s) + (df / 2 - 1) * np.log(x) - x / 2 - (df / 2) * math.log(2) - math.lgamma(df / 2)
    weight = np.exp(log_density)
    weight /= weight.sum()
    lo, hi = 0.0, c * top + 10.0
    for _ in range(80):
        mid = (lo + hi) / 2
        reached = float((weight * (_normal_cdf(mid - c * s) + _normal_cdf(-mid - c * s))).sum()) >= power
        lo, hi = (lo, mid) if reached else (mid, hi)
    return (lo + hi) / 2


def holm(p: Any) -> np.ndarray:
    """Holm's step-down adjusted p-values along the last axis: the k-th smallest of m is multiplied by
    m − k + 1, then made non-decreasing in that order and capped at 1. A family's member is clear at level
    α exactly when its adjusted value is below α."""
    p = np.asarray(p, dtype=float)
    m = p.shape[-1]
    order = np.argsort(p, axis=-1, kind="stable")
    ranked = np.take_along_axis(p, order, axis=-1) * (m - np.arange(m))
    ranked = np.minimum(np.maximum.accumulate(ranked, axis=-1), 1.0)
    out = np.empty_like(ranked)
    np.put_along_axis(out, order, ranked, axis=-1)
    return out


# ----------------------------------------------------------------------------- the hierarchical bootstrap


def _draw_weights(units: int, draws: int, rng: np.random.Generator) -> np.ndarray:
    """Per replicate, each unit's weight in a draw of ``units`` units with replacement: how often it was
    drawn, over ``units`` (``draws × units``)."""
    drawn = rng.integers(0, units, size=(draws, units)) + units * np.arange(draws)[:, None]
    return np.bincount(drawn.ravel(), minlength=draws * units).reshape(draws, units) / units


def bootstrap_se(
    blocks: Sequence[tuple[float, np.ndarray]],
    persons: str,
    rng: np.random.Generator,
    draws: int = DRAWS,
) -> np.ndarray:
    """The corrected hierarchical-bootstrap standard error of ``Σ weight · mean(values)`` (module docstring).

    ``blocks``: ``(weight, values)`` with values of shape ``(..., seeds, persons)`` (NaN where a seed has
    fewer persons, its persons first: nested only), every block on the same seeds; leading axes are separate
    comparisons of one shape (a simulation's many null comparisons), answered at once. A replicate draws the
    seeds once for all blocks; in the crossed design (and with one seed) it draws each block's persons too."""
    if persons not in PERSON_DESIGNS.values():
        raise ValueError(f"persons must be one of {sorted(PERSON_DESIGNS.values())}, not {persons!r}")
    seeds = blocks[0][1].shape[-2]
    seed_weight = _draw_weights(seeds, draws, rng)
    deviation = np.zeros(blocks[0][1].shape[:-2] + (draws,))
    for weight, values in blocks:
        present = ~np.isnan(values)
        seed_means = np.where(present, values, 0.0).sum(-1) / present.sum(-1)  # (..., seeds)
        if seeds > 1:  # the drawn seeds' margin
            margin = seed_means @ seed_weight.T - seed_means.mean(-1)[..., None]
            deviation += weight * math.sqrt(seeds / (seeds - 1)) * margin
        width = values.shape[-1]
        if (persons == "crossed" or seeds == 1) and width > 1:  # the drawn persons' margin (their mean over seeds)
            if not present.all():
                raise ValueError("a crossed design needs the same persons in every seed")
            person_means = values.mean(-2)
            margin = person_means @ _draw_weights(width, draws, rng).T - person_means.mean(-1)[..., None]
            deviation += weight * math.sqrt(width / (width - 1)) * margin
    return np.std(deviation, axis=-1, ddof=1)


# ----------------------------------------------------------------------------- a difference and its family


@dataclass
class Diff:
    """``a − b`` over ``pairs`` for one measure (module docstring): per seed the mean over pairs of the
    records' differences; its bootstrap standard error, degrees of freedom and what was drawn; how many
    distinct persons have the lower value with a; and, once its family is closed, its Holm-adjusted p-value."""

    a: str
    b: str
    pairs: tuple[str, ...]
    measure: str
    per_seed: dict[int, float]
    se: float | None  # None: nothing to draw (one seed and no per-person values)
    df: int
    drawn: str  # what the bootstrap drew, in words ("persons and seeds drawn")
    persons_better: int  # distinct persons whose value is lower with a (crossed: their mean over seeds)
    persons_worse: int  # ... higher with a
    persons: int
    adjusted: float | None = None  # Holm-adjusted p-value over the family (None: the family is not closed)
    family: int = 0  # the family's size when it was closed
    declared: bool = True  # in the page's declared family; False: descriptive, an interval and no verdict

    @property
    def n(self) -> int:
        return len(self.per_seed)

    @property
    def mean(self) -> float:
        return statistics.fmean(self.per_seed.values())

    @property
    def judged(self) -> bool:
        """Whether a verdict is given: in the page's declared family, with at least two seeds (with one, the
        seeds' variation is unmeasured)."""
        return self.declared and self.n > 1 and self.se is not None

    @property
    def p(self) -> float | None:
        """The two-sided p-value of ``Δ / SE`` under t with :attr:`df` degrees of freedom (unadjusted)."""
        if self.se is None or self.df < 1:
            return None
        if self.se == 0.0:
            return 0.0 if self.mean != 0.0 else 1.0
        return float(t_tail(self.mean / self.se, self.df))

    @property
    def interval(self) -> tuple[float, float] | None:
        """The 95 % interval ``Δ ± t₀.₉₇₅(df) · SE``."""
        if self.se is None or self.df < 1:
            return None
        half = _critical(ALPHA, self.df) * self.se
        return self.mean - half, self.mean + half

    @property
    def below_zero(self) -> bool:
        """Whether its own 95 % interval lies wholly below zero (unadjusted: whether it is *clear* is Holm's)."""
        interval = self.interval
        return interval is not None and interval[1] < 0

    @property
    def above_zero(self) -> bool:
        """Whether its own 95 % interval lies wholly above zero (unadjusted, as :attr:`below_zero`)."""
        interval = self.interval
        return interval is not None and interval[0] > 0

    @property
    def clear(self) -> bool:
        """Judged, and its p-value below :data:`ALPHA` after Holm over its family (alone while the family is
        open)."""
        if not self.judged:
            return False
        p = self.adjusted if self.adjusted is not None else self.p
        return p is not None and p < ALPHA

    def verdict(self) -> str:
        if not self.judged:
            if self.n == 1:
                return "not judged (one seed)"
            return "not judged (no interval)" if self.declared else "descriptive (not in the declared family)"
        if self.adjusted is None:
            return f"{'clear' if self.clear else 'not clear'} at 5 % judged alone (p = {self.p:.3g})"
        words = "clear" if self.clear else "not clear"
        return f"{words} after Holm over {self.family} comparisons (adjusted p = {self.adjusted:.2g})"

    def interval_text(self) -> str:
        """``[lo, hi]`` (or why there is none)."""
        if self.interval is None:
            return "(no interval: one seed and no per-person values)"
        lo, hi = self.interval
        return f"[{bound(lo)}, {bound(hi)}]"

    def describe(self) -> str:
        """E.g. ``"−0.31° [−0.52, −0.10] (95 %, persons and seeds drawn); clear after Holm over 38 comparisons
        (adjusted p = 0.01); lower for 30 of 45 persons"``."""
        persons = f"; lower for {self.persons_better} of {self.persons} persons" if self.persons else ""
        how = f" (95 %, {self.drawn})" if self.interval is not None else ""
        return f"{signed(self.mean)}° {self.interval_text()}{how}; {self.verdict()}{persons}"

    def compact(self) -> str:
        """A table cell: ``"−0.31 [−0.52, −0.10] clear"`` (``clear``: after Holm over the page's family); ``"(one
        seed)"`` after a difference of one seed, whose interval draws persons only and is narrower for it."""
        return self.mean_interval_text() + (" (one seed)" if self.n == 1 else "")

    def mean_interval_text(self) -> str:
        """The mean, its interval and ``clear`` where it is (:meth:`compact` without its seed note, for a cell that
        names its seeds itself)."""
        text = signed(self.mean) + (f" {self.interval_text()}" if self.interval is not None else "")
        return text + (" clear" if self.clear else "")

    def detectable(self, level: float = ALPHA) -> float:
        """The difference this comparison detects with :data:`POWER` at two-sided ``level``:
        :func:`detectable_multiple` standard errors, its standard error as estimated; ``nan`` when it is not
        judged."""
        if not self.judged:
            return math.nan
        return detectable_multiple(level, self.df) * (self.se or 0.0)

    def reversed(self) -> Diff:
        """``b − a``: the same comparison (one member of the family), the other way round."""
        return dataclasses.replace(
            self,
            a=self.b,
            b=self.a,
            per_seed={s: -v for s, v in self.per_seed.items()},
            persons_better=self.persons_worse,
            persons_worse=self.persons_better,
        )


Key = tuple[str, str, tuple[str, ...], str]


@dataclass
class Comparisons:
    """The family of one page: every comparison it makes, judged together with Holm's correction.

    A page is rendered twice with one family: the first rendering makes every comparison (each :func:`diff`
    registers itself here by its key), :meth:`close` adjusts their p-values over the whole family, and the
    second rendering quotes the same comparisons, now judged. A comparison the second rendering makes that
    the first did not is an error: the family must be what the page shows.

    ``declared``: the comparisons a protocol declared before its runs as the page's family (keys as
    :func:`diff` makes them, either way round); every other comparison the page makes is *descriptive*: it
    keeps its 95 % interval but gets no verdict and does not enlarge the family. ``None`` (the first records'
    pages): every comparison the page makes is in the family. A small declared family is what lets a page
    with few seeds detect differences of a useful size (:mod:`alfa.study.bench.power`)."""

    persons: str = "crossed"
    draws: int = DRAWS
    declared: frozenset[Key] | None = None
    made: dict[Key, Diff | None] = field(default_factory=dict)
    outside: dict[Key, Diff | None] = field(default_factory=dict)  # described(): never part of the family
    closed: bool = False

    def __post_init__(self) -> None:
        if self.persons not in PERSON_DESIGNS.values():
            raise ValueError(f"persons must be one of {sorted(PERSON_DESIGNS.values())}, not {self.persons!r}")

    def lookup(self, key: Key, make: Callable[[], Diff | None]) -> Diff | None:
        """The comparison ``key``, made by ``make`` the first time it is asked for."""
        if key not in self.made:
            if self.closed:
                raise RuntimeError(f"comparison {key} was not made before the family closed")
            made = make()
            if made is not None and self.declared is not None:
                made.declared = key in self.declared or (key[1], key[0], *key[2:]) in self.declared
            self.made[key] = made
        return self.made[key]

    def descriptive(self) -> list[Diff]:
        """The comparisons made outside the declared family (none without a declaration)."""
        return [d for d in self.made.values() if d is not None and not d.declared]

    def missing(self) -> list[Key]:
        """Declared comparisons the page did not make (or could not: a row without records), sorted."""
        if self.declared is None:
            return []
        made = {k for k, d in self.made.items() if d is not None}
        made |= {(k[1], k[0], *k[2:]) for k in made}
        return sorted(k for k in self.declared if k not in made)

    def judged(self) -> list[Diff]:
        return [d for d in self.made.values() if d is not None and d.judged]

    @property
    def size(self) -> int:
        """How many comparisons Holm's correction counts: every judged one, and with a declared family every
        declared one, judged or not (a page of a run under way, whose records make a few of them, is held to the
        level of the whole family it declared, so a verdict cannot be undone by the records still to come only
        because the family grew; an unmade one counts as not clear)."""
        return max(len(self.judged()), len(self.declared) if self.declared is not None else 0)

    def close(self) -> None:
        """Adjust every judged comparison's p-value over the family (Holm, over :attr:`size`)."""
        members = self.judged()
        padding = [1.0] * (self.size - len(members))  # the family's unmade members, never clear
        adjusted = holm([d.p for d in members] + padding) if members else []
        for d, q in zip(members, adjusted):
            d.adjusted, d.family = float(q), self.size
        self.closed = True

    def clear(self) -> list[Diff]:
        return [d for d in self.judged() if d.clear]

    @property
    def level(self) -> float:
        """Holm's first step: ALPHA over the family's size, the strictest level any member is held to."""
        return ALPHA / max(self.size, 1)

    def detectable(self, members: Sequence[Diff] | None = None) -> list[float]:
        """Per judged comparison (of ``members``, default all), the difference it detects with :data:`POWER`
        at :attr:`level` (:meth:`Diff.detectable`)."""
        level = self.level
        members = self.judged() if members is None else [d for d in members if d.judged]
        return [d.detectable(level) for d in members]

    def kinds(self) -> str:
        """What the judged comparisons are, in words: by measure, and pooled or on one pair."""
        members = self.judged()
        measures = Counter(d.measure for d in members)
        pooled_ = sum(len(d.pairs) > 1 for d in members)
        by_measure = ", ".join(f"{n} of the {m}" for m, n in sorted(measures.items(), key=lambda t: (-t[1], t[0])))
        return f"{by_measure}; {pooled_} pooled over several pairs, {len(members) - pooled_} on one pair"


def _seed_of(key: Key, persons: str) -> int:
    """The bootstrap's seed for one comparison: a hash of what it compares (stable across runs and orders)."""
    return stable_seed("|".join([*key[:2], ",".join(key[2]), key[3], persons]))


def stable_seed(text: str) -> int:
    """A bootstrap seed from ``text`` (its SHA-256): the same for the same comparison in every run and order."""
    return int.from_bytes(hashlib.sha256(text.encode("utf-8")).digest()[:8], "little")


class Index(dict[tuple[str, str, int], Record]):
    """``(method, pair, seed) -> record``, and the family (:class:`Comparisons`) its differences are judged in."""

    family: Comparisons

    def row(self, method: str, pair: str) -> dict[int, Record]:
        """``seed -> record`` of one row on one pair (grouped once: a page asks for every cell many times)."""
        if not hasattr(self, "_rows"):
            self._rows: dict[tuple[str, str], dict[int, Record]] = {}
            for (m, p, s), r in self.items():
                self._rows.setdefault((m, p), {})[s] = r
        return self._rows.get((method, pair), {})

    def records(self, method: str) -> list[Record]:
        """Every record of the row ``method``, in (pair, seed) order (grouped once, like :meth:`row`)."""
        if not hasattr(self, "_by_method"):
            self._by_method: dict[str, list[Record]] = {}
            for (m, _, _), r in sorted(self.items(), key=lambda kv: kv[0]):
                self._by_method.setdefault(m, []).append(r)
        return list(self._by_method.get(method, []))

    def seeds(self) -> list[int]:
        """Every seed the records have, sorted (once: a page asks for them for every sentence)."""
        if not hasattr(self, "_seeds"):
            self._seeds = sorted({s for (_, _, s) in self})
        return list(self._seeds)


def design_of(results: Mapping[str, Any]) -> str:
    """How the results' persons meet their seeds: ``config.target_draw`` (``fixed`` when absent) ->
    ``crossed`` or ``nested``."""
    draw = results.get("config", {}).get("target_draw", "fixed")
    if draw not in PERSON_DESIGNS:
        raise ValueError(f"unknown config.target_draw {draw!r}; expected one of {sorted(PERSON_DESIGNS)}")
    return PERSON_DESIGNS[draw]


def index_records(records: Iterable[Record | Mapping[str, Any]], family: Comparisons | None = None) -> Index:
    """``(method, pair, seed) -> record`` (the recipe-selection records, scored on a stand-in and not on a
    pair, are no table rows and are left out; so are records without an error). JSON objects are read as
    :class:`~alfa.study.bench.record.Record`. Its differences are judged in ``family`` (default: a new one,
    crossed, judged alone until closed)."""
    idx = Index(
        ((r.method, r.pair, int(r.seed)), r)
        for r in as_records(records)
        if r.error_deg is not None and r.kind != "selection"
    )
    idx.family = family if family is not None else Comparisons()
    return idx


def pairs_of(idx: Index) -> list[str]:
    present = {p for (_, p, _) in idx}
    return [p for p in PAIRS if p in present] + sorted(present - set(PAIRS))


def seeds_of(idx: Index) -> list[int]:
    return idx.seeds()


def cell(idx: Index, method: str, pair: str) -> Stat | None:
    """``method``'s angular error on ``pair`` (:func:`level`)."""
    return level(idx, method, pair)


def cell_on(idx: Index, method: str, pairs: Sequence[str], seeds: Iterable[int]) -> Stat | None:
    """``method`` pooled over ``pairs`` on ``seeds`` only (per seed the mean over the pairs; a seed without a
    record on every pair is left out), so that rows of different seeds can be compared on the same ones."""
    values = {}
    for s in sorted(seeds):
        records = [idx.get((method, p, s)) for p in pairs]
        if records and all(r is not None and r.error_deg is not None for r in records):
            values[s] = statistics.fmean(float(r.error_deg) for r in records)
    if not values:
        return None
    return level(idx, method, pairs[0], seeds=values) if len(pairs) == 1 else Stat(values)


def cell_covering(idx: Index, method: str, pair: str, seeds: Iterable[int]) -> Stat | None:
    """``method`` on ``pair`` on exactly ``seeds`` (``None`` if it lacks any of them): the row a comparison with
    another row reads on that row's seeds, since each seed has its own models and persons."""
    seeds = set(seeds)
    stat = cell_on(idx, method, [pair], seeds)
    return stat if stat is not None and set(stat.values) == seeds else None


@dataclass(frozen=True)
class Measure:
    """A measure of a record: its value (``None``: not available) and the per-person values behind it, and
    its name (how a page's family counts its comparisons)."""

    name: str
    read: Callable[[Record], tuple[float | None, dict[str, float]]]

    def __call__(self, record: Record) -> tuple[float | None, dict[str, float]]:
        return self.read(record)


angular = Measure("angular error", lambda record: (record.error_deg, record.per_person))
"""The record's error (mean over persons of the angular error) and its persons' errors."""


def level(
    idx: Index, method: str, pair: str, measure: Measure = angular, seeds: Iterable[int] | None = None
) -> Stat | None:
    """``method``'s level in ``measure`` on ``pair``: per seed its record's value (on ``seeds`` only, if given), with
    one seed that record's persons' values where they are its value's (they give its interval over persons);
    ``None`` where no record has the measure."""
    kept = None if seeds is None else set(seeds)
    values: dict[int, float] = {}
    persons: dict[str, float] = {}
    for s, record in sorted(idx.row(method, pair).items()):
        value, persons_of = measure(record)
        if value is not None and (kept is None or s in kept):
            values[s], persons = float(value), persons_of
    if not values:
        return None
    one = next(iter(values.values()))
    if len(values) == 1 and persons and abs(statistics.fmean(persons.values()) - one) <= 1e-9 * max(1.0, abs(one)):
        return Stat(values, tuple(float(v) for v in persons.values()))
    return Stat(values)


def pooled(idx: Index, method: str, pairs: Sequence[str], measure: Measure = angular) -> Stat | None:
    """Per seed the mean over ``pairs`` (only seeds where the method has all of them)."""
    values = {}
    for s in seeds_of(idx):
        vals = [measure(idx[(method, p, s)])[0] for p in pairs if (method, p, s) in idx]
        if pairs and len(vals) == len(pairs) and all(v is not None for v in vals):
            values[s] = statistics.fmean(vals)
    return Stat(values) if values else None


Sides = list[tuple[dict[str, float], dict[str, float]]]  # per seed: a's and b's per-person values on one pair


@dataclass
class _Persons:
    """What the bootstrap of one comparison draws from: its blocks, what is drawn (in words), and how many
    distinct persons have the lower and the higher value with a."""

    blocks: list[tuple[float, np.ndarray]]
    drawn: str
    lower: int = 0
    higher: int = 0
    counted: int = 0

    def count(self, changes: np.ndarray) -> None:
        self.lower += int((changes < 0).sum())
        self.higher += int((changes > 0).sum())
        self.counted += changes.size


def _padded(rows: list[list[float]]) -> np.ndarray:
    width = max(map(len, rows))
    return np.array([row + [math.nan] * (width - len(row)) for row in rows])


def _paired(values: dict[str, Sides], persons: str) -> _Persons | None:
    """Blocks of the per-person differences, one per pair (crossed: the persons in every seed); ``None`` where
    some seed of a pair has no person that a and b share."""
    out = _Persons([], "persons and seeds drawn" if persons == "crossed" else "seeds drawn, each with its own persons")
    for seeds in values.values():
        common = [sorted(pa.keys() & pb.keys()) for pa, pb in seeds]
        if persons == "crossed":
            common = [sorted(set.intersection(*map(set, common)))] * len(seeds)
        if not all(common):
            return None
        rows = [[pa[q] - pb[q] for q in names] for (pa, pb), names in zip(seeds, common)]
        table = _padded(rows)
        out.count(table.mean(0) if persons == "crossed" else np.concatenate([np.array(r) for r in rows]))
        out.blocks.append((1.0 / len(values), table))
    return out


def _unpaired(values: dict[str, Sides], persons: str) -> _Persons | None:
    """Two blocks per pair, a's persons and b's (crossed: those in every seed), for rows scored on different
    persons; ``None`` where a side has no persons in some seed."""
    out = _Persons(
        [], "seeds and each side's persons drawn" if persons == "crossed" else "seeds drawn, each with its persons"
    )
    for seeds in values.values():
        for sign, side in ((1.0, 0), (-1.0, 1)):
            if persons == "crossed":
                names = [sorted(set.intersection(*(set(v[side]) for v in seeds)))] * len(seeds)
            else:
                names = [sorted(v[side]) for v in seeds]
            if not all(names):
                return None
            rows = [[v[side][q] for q in n] for v, n in zip(seeds, names)]
            out.blocks.append((sign / len(values), _padded(rows)))
    return out


def _make_diff(idx: Index, key: Key, measure: Measure) -> Diff | None:
    """The comparison ``key`` made from the records (see :func:`diff`)."""
    a, b, pairs, _ = key
    per_seed: dict[int, float] = {}
    values: dict[str, Sides] = {p: [] for p in pairs}
    records: dict[int, list[float]] = {}  # per seed, the records' own differences, pair by pair
    for s in seeds_of(idx):
        if not all((a, p, s) in idx and (b, p, s) in idx for p in pairs):
            continue
        ma = [measure(idx[(a, p, s)]) for p in pairs]
        mb = [measure(idx[(b, p, s)]) for p in pairs]
        if any(v is None for v, _ in ma + mb):
            continue
        records[s] = [va - vb for (va, _), (vb, _) in zip(ma, mb)]
        per_seed[s] = statistics.fmean(records[s])
        for p, (_, pa), (_, pb) in zip(pairs, ma, mb):
            values[p].append((pa, pb))
    if not per_seed:
        return None
    persons = idx.family.persons
    drawn = None
    if all(pa and pb for seeds in values.values() for pa, pb in seeds):
        shared = all(pa.keys() & pb.keys() for seeds in values.values() for pa, pb in seeds)
        drawn = _paired(values, persons) if shared else _unpaired(values, persons)
    if drawn is None:  # no per-person values: the records' own differences, only the seeds drawn
        table = np.array([records[s] for s in sorted(records)])  # seeds × pairs
        drawn = _Persons([(1.0 / len(pairs), table[:, [k]]) for k in range(len(pairs))], "seeds drawn")
    made = Diff(a, b, pairs, measure.name, per_seed, None, 0, "", drawn.lower, drawn.higher, drawn.counted)
    if len(per_seed) > 1:
        made.df, made.drawn = len(per_seed) - 1, drawn.drawn
    else:
        made.df = sum(v.shape[-1] - 1 for _, v in drawn.blocks)
        made.drawn = "persons drawn; one seed, whose own variation is not measured"
        if made.df < 1:
            return made
    rng = np.random.default_rng(_seed_of(key, persons))
    made.se = float(bootstrap_se(drawn.blocks, persons, rng, idx.family.draws))
    return made


def diff(idx: Index, a: str, b: str, pairs: Sequence[str], measure: Measure = angular) -> Diff | None:
    """``a − b`` over the seeds where both have every pair of ``pairs`` (``None`` without pairs or seeds),
    made once per family and judged in it (the module docstring says how). ``b − a`` is the same member of
    the family, the other way round."""
    if not pairs:
        return None
    if (b, a) < (a, b):
        made = diff(idx, b, a, pairs, measure)
        return made.reversed() if made is not None else None
    key: Key = (a, b, tuple(pairs), measure.name)
    return idx.family.lookup(key, lambda: _make_diff(idx, key, measure))


def described(idx: Index, a: str, b: str, pairs: Sequence[str], measure: Measure = angular) -> Diff | None:
    """``a − b`` as :func:`diff` makes it, but outside the page's family: its 95 % interval and no verdict
    (*descriptive*), for a sentence that describes rows rather than tests them; it never enlarges the family."""
    if not pairs:
        return None
    if (b, a) < (a, b):
        made = described(idx, b, a, pairs, measure)
        return made.reversed() if made is not None else None
    key: Key = (a, b, tuple(pairs), measure.name)
    if key not in idx.family.outside:  # made once, whichever rendering of the page asks first
        made = _make_diff(idx, key, measure)
        if made is not None:
            made.declared = False
        idx.family.outside[key] = made
    return idx.family.outside[key]
