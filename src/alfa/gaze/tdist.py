"""Student's t distribution for the few places that judge a mean over few units (the benchmark's differences over
seeds, the recipe rule's no-harm bound over stand-in persons): its two-sided tail in closed form and its
quantile, with numpy alone (no scipy in the dependencies)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

__all__ = ["t_tail", "t_quantile"]


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
    tail = np.asarray(tail, dtype=float)
    lo, hi = np.zeros_like(tail), np.full_like(tail, 1e9)
    for _ in range(120):
        mid = (lo + hi) / 2
        beyond = t_tail(mid, df) < tail
        hi, lo = np.where(beyond, mid, hi), np.where(beyond, lo, mid)
    return (lo + hi) / 2
