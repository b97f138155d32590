"""Student's t distribution for the few places that judge a mean over few units (the benchmark's differences over
seeds, the recipe rule's no-harm bound over stand-in persons): its two-sided tail in closed form and its
quantile, with numpy alone (no scipy in the dependencies); and the ratio of two timings paired over rounds with
its t-interval, which the timing pages (:mod:`alfa.study.timing`) and ``alfa throughput`` both judge by."""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = ["t_tail", "t_quantile", "Ratio", "paired_ratio"]

LEVEL = 0.95


def t_tail(t: Any, df: int) -> np.ndarray:
    """Two-sided tail ``P(|T| ≥ |t|)`` of Student's t with a whole number ``df ≥ 1`` of degrees of freedom
    (the closed forms of Abramowitz & Stegun 26.7.3–4; vectorized over ``t``)."""
    if df < 1 or int(df) != df:
        raise ValueError(f"t_tail needs a whole number of degrees of freedom ≥ 1, not {df!r}")
    t = np.abs(np.asarray(t, dtype=float))
    theta = np.arctan(t / math.sqrt(df))
    c2, s = np.cos(theta) ** 2, np.sin(theta)
    if df % 2:  # odd: (2/π)(θ + sin θ (cos θ + (2/3) cos³θ + ...)), the series up to cos^(df−2)
        term, series = np.cos(theta), np.zeros_like(t)
        for k in range(1, (df - 1) // 2 + 1):
            series += term
            term = term * c2 * (2 * k) / (2 * k + 1)
        inside = 2 / math.pi * (theta + s * series)
    else:  # even: sin θ (1 + (1/2) cos²θ + (1·3)/(2·4) cos⁴θ + ...), up to cos^(df−2)
        term, series = np.ones_like(t), np.zeros_like(t)
        for k in range(df // 2):
            series += term
            term = term * c2 * (2 * k + 1) / (2 * k + 2)
        inside = s * series
    return np.clip(1.0 - inside, 0.0, 1.0)


def t_quantile(tail: Any, df: int) -> np.ndarray:
    """The ``|t|`` whose two-sided tail is ``tail`` (e.g. ``0.05`` -> the 97.5 % quantile), by bisection."""
    if np.ndim(tail) == 0:  # a page asks for the same few levels hundreds of times: each bisection once
        return np.float64(_scalar_quantile(float(tail), df))
    return _bisect(np.asarray(tail, dtype=float), df)


@functools.cache
def _scalar_quantile(tail: float, df: int) -> float:
    return float(_bisect(np.asarray(tail, dtype=float), df))


def _bisect(tail: np.ndarray, df: int) -> np.ndarray:
    lo, hi = np.zeros_like(tail), np.full_like(tail, 1e9)
    for _ in range(120):
        mid = (lo + hi) / 2
        beyond = t_tail(mid, df) < tail
        hi, lo = np.where(beyond, mid, hi), np.where(beyond, lo, mid)
    return (lo + hi) / 2


@dataclass(frozen=True)
class Ratio:
    """``numerator / denominator`` over ``rounds`` paired rounds: the geometric mean of the per-round ratios
    (``value``) and its 95 % interval ``[low, high]``."""

    value: float
    low: float
    high: float
    rounds: int

    def text(self, digits: int = 2, scale: float = 1.0) -> str:
        """``0.87 [0.84, 0.90]``: the value and, in square brackets, its 95 % interval (each times ``scale``)."""
        v, lo, hi = (scale * x for x in (self.value, self.low, self.high))
        return f"{v:.{digits}f} [{lo:.{digits}f}, {hi:.{digits}f}]"


def paired_ratio(numerator: Sequence[float], denominator: Sequence[float]) -> Ratio | None:
    """The ratio of two timings round by round (``numerator[i]`` and ``denominator[i]`` from the same round),
    with its 95 % t-interval over the rounds (module docstring); ``None`` under two rounds (no spread to
    judge)."""
    if len(numerator) != len(denominator):
        sides = f"{len(numerator)} and {len(denominator)}"
        raise ValueError(f"paired timings need as many rounds on each side, not {sides}")
    if any(t <= 0 for t in (*numerator, *denominator)):
        raise ValueError("a timing must be positive to take its ratio")
    logs = [math.log(a / b) for a, b in zip(numerator, denominator)]
    n = len(logs)
    if n < 2:
        return None
    mean = sum(logs) / n
    sd = math.sqrt(sum((x - mean) ** 2 for x in logs) / (n - 1))
    half = float(t_quantile(1 - LEVEL, n - 1)) * sd / math.sqrt(n)
    return Ratio(math.exp(mean), math.exp(mean - half), math.exp(mean + half), n)
