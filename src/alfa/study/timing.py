"""Ratios of two timings taken in the same interleaved rounds, each with its 95 % interval, and goals judged on
that interval: what the timing pages (docs/serving.md, docs/speed.md, docs/llm.md) print beside every comparison;
and the description of the machine a timing ran on, which its record keeps. Below the study packages that time
(``alfa.study.bench``, ``alfa.study.llm``), so that each can use it without importing the other.

The rounds are the unit. Within a round every configuration is timed back to back, so one round's ratio of two
timings is paired: a slow spell of the shared machine that lasts the round scales both sides and cancels. The
estimate is the geometric mean of the per-round ratios, ``exp(mean log ratio)``, and its interval is Student's t
interval of the mean log ratio over the rounds, exponentiated. Chosen over a bootstrap of the median of the
per-round ratios because it is closed form (the same numbers every time, with no seed to fix), still sound at the
9 rounds the transformer section times (a bootstrap of a median of 9 values can only land on a handful of
them), and the same whichever side is the denominator (the interval of ``b / a`` is the reciprocal of
``a / b``'s). The interval speaks of round-to-round noise on the machine that ran the command, not of other
machines.
"""

from __future__ import annotations

import contextlib
import math
import os
import platform
import statistics
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

from alfa.gaze.tdist import LEVEL, Ratio, paired_ratio

__all__ = [
    "LEVEL",
    "Ratio",
    "paired_ratio",
    "ratio_cell",
    "median_interval",
    "median_cell",
    "median_text",
    "goal_verdict",
    "interval_note",
    "no_rounds_note",
    "machine",
    "cpu_name",
    "load_average",
    "load_text",
]


def ratio_cell(
    numerator: Sequence[float] | None,
    denominator: Sequence[float] | None,
    of_medians: float,
    digits: int = 2,
    scale: float = 1.0,
) -> tuple[str, Ratio | None]:
    """What a page prints for a ratio, and the ratio: paired over the rounds with its interval where both sides'
    rounds are kept (``None``: a record made before they were), else ``of_medians`` alone, without an interval."""
    paired = None if numerator is None or denominator is None else paired_ratio(numerator, denominator)
    if paired is None:
        return f"{scale * of_medians:.{digits}f}", None
    return paired.text(digits, scale), paired


def median_interval(samples: Sequence[float]) -> tuple[float, float, float] | None:
    """The median of ``samples`` (one timing's rounds) and a distribution-free 95 % interval for it: the ``k``-th
    smallest and ``k``-th largest round, ``k`` the largest whose coverage, ``1 − 2·P(Binomial(n, ½) < k)``, is at
    least 95 %; ``None`` under 6 rounds, where even the smallest and largest cover less (5 rounds: 93.75 %)."""
    n = len(samples)
    if n < 2:
        return None
    ordered = sorted(samples)
    median = float(ordered[n // 2] if n % 2 else (ordered[n // 2 - 1] + ordered[n // 2]) / 2)
    below = 0.0  # P(Binomial(n, ½) < k), growing with k
    k = 0
    while k < n // 2 and 1 - 2 * (below + math.comb(n, k) / 2**n) >= LEVEL:
        below += math.comb(n, k) / 2**n
        k += 1
    if k == 0:
        return None
    return median, float(ordered[k - 1]), float(ordered[n - k])


def median_cell(samples: Sequence[float] | None, median: float | None, digits: int = 0, recorded: bool = False) -> str:
    """What a page prints for one timing: its median with the 95 % interval of :func:`median_interval` where its
    rounds are kept and there are enough, else the ``median`` recorded alone (``—`` for none). ``recorded``: print
    the ``median`` the record stores (a middle round of its own choosing, inside the interval) rather than the
    rounds' median, so that the page quotes what its data file says."""
    interval = None if samples is None else median_interval(samples)
    if interval is None:
        return "—" if median is None else f"{median:.{digits}f}"
    mid, low, high = interval
    mid = median if recorded and median is not None else mid
    return f"{mid:.{digits}f} [{low:.{digits}f}, {high:.{digits}f}]"


def median_text(values: Iterable[float | None], digits: int = 0) -> str:
    """The median of ``values`` (``None`` left out) with its distribution-free 95 % interval
    (:func:`median_cell`; the median alone under six values, ``—`` for none)."""
    kept = [float(v) for v in values if v is not None]
    return median_cell(kept, statistics.median(kept), digits) if kept else "—"


def goal_verdict(ratio: Ratio | None, goal: float, at_least: bool) -> str:
    """Whether ``ratio`` meets ``goal`` (``≥ goal`` when ``at_least``, else ``≤ goal``), judged on its interval:
    *met* only when the whole interval clears the goal, *NOT met* when the whole interval misses it, *not shown*
    when the interval straddles it; *not judged* without an interval."""
    if ratio is None:
        return "not judged without an interval"
    lo, hi = (ratio.low, ratio.high) if at_least else (-ratio.high, -ratio.low)
    bar = goal if at_least else -goal
    if lo >= bar:
        return "met"
    if hi < bar:
        return "NOT met"
    return "not shown (the interval straddles it)"


def interval_note() -> str:
    """The sentence a page prints once to say what its square brackets are."""
    return (
        "Every ratio is paired over the interleaved rounds (within a round the configurations run back to "
        "back): the geometric mean of the per-round ratios and, in square brackets, its 95 % interval, Student's t "
        "over the rounds of the log ratio (closed form, so deterministic without a seed; sound at a few rounds, "
        "where a bootstrap of the median has few values to land on; the same whichever side is divided by). A goal "
        "is met only where the whole interval clears it, *not shown* where the interval straddles it. The intervals "
        "are of this machine's round-to-round noise, one comparison at a time (no correction for the page's several)."
    )


def no_rounds_note(command: str) -> str:
    """The one line a page prints for a record without two rounds' timings (made before they were kept)."""
    return (
        "This record keeps no per-round timings (it was made before they were kept, or has a single round), so its "
        f"ratios are of medians, carry no 95 % interval and judge no goal: re-run `{command}` with two rounds or more "
        "for the intervals."
    )


def cpu_name(cpuinfo: Path = Path("/proc/cpuinfo")) -> str:
    """The CPU's model name (``/proc/cpuinfo``) with its family and model numbers, else what ``platform`` knows,
    else ``"unknown"``. The numbers are kept because a virtual machine's name can be as vague as
    "Intel(R) Xeon(R) Processor", and two kinds of machine render the worlds a few bits apart."""
    try:
        fields: dict[str, str] = {}
        for line in cpuinfo.read_text().splitlines():
            key, _, value = line.partition(":")
            if not key.strip() and fields:
                break  # the first processor's block is enough
            fields.setdefault(key.strip(), value.strip())
        if fields.get("model name"):
            labels = (("cpu family", "family"), ("model", "model"))
            numbers = [f"{name} {fields[k]}" for k, name in labels if fields.get(k)]
            return fields["model name"] + (f" ({', '.join(numbers)})" if numbers else "")
    except OSError:
        pass
    return platform.processor() or "unknown"


@contextlib.contextmanager
def torch_threads(count: int) -> Iterator[None]:
    """Run the block on ``count`` of torch's intra-op threads, and give the caller's count back after it, also
    after an error: a study's numbers are the same bits only at the same thread count."""
    import torch

    previous = torch.get_num_threads()
    torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


def cpu_kind() -> dict[str, str]:
    """The kind of machine a model or record was made on, as the benchmark keeps it: the CPU's name
    (:func:`cpu_name`) and the vector instructions torch's kernels use there (``cpu_capability``: ``AVX2``,
    ``AVX512``, ...), which two CPUs of one name need not share."""
    import torch

    return {"cpu": cpu_name(), "cpu_capability": torch.backends.cpu.get_cpu_capability()}


def load_average() -> float | None:
    """The 1-minute load average, which a timing's record keeps to say how busy the machine was; ``None`` where the
    system keeps none (Windows has no ``os.getloadavg``): minutes of timings are not lost for want of it."""
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):
        return None


def load_text(value: float | None) -> str:
    """A recorded load average as a page prints it (``unknown`` where the system kept none)."""
    return "unknown" if value is None else f"{value:.1f}"


def machine() -> dict[str, Any]:
    """What a timing ran on, as its record keeps it: the CPU's name, torch's version and thread count, Python's."""
    import torch

    return {
        "cpu": cpu_name(),
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "python": platform.python_version(),
    }
