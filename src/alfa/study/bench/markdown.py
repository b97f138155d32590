"""Markdown pieces the report's sections share: tables and signed numbers (the report and its
flip-premise sections both write them)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Protocol

__all__ = [
    "byte_size",
    "table",
    "number",
    "degrees_detected",
    "span",
    "spans",
    "usual_seeds",
    "seeds_words",
    "seeds_note",
    "clear_count",
]


def byte_size(n: float | None) -> str:
    """``n`` bytes in MiB (KiB below one MiB), as every page and printout gives a file's size; ``—`` for none."""
    if n is None:
        return "—"
    return f"{n / 2**20:.2f} MiB" if n >= 2**20 else f"{n / 2**10:.1f} KiB"


def table(header: Sequence[str], rows: Sequence[Sequence[str]], align: str | None = None) -> str:
    """A markdown table; ``align`` has one letter per column (``l`` or ``r``), default: first left, rest right."""
    align = align or "l" + "r" * (len(header) - 1)
    rule = ["---:" if a == "r" else "---" for a in align]
    lines = ["| " + " | ".join(header) + " |", "| " + " | ".join(rule) + " |"]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


def number(x: float | None, digits: int = 2, unit: str = "") -> str:
    """``x`` with ``digits`` decimals and a typographic minus; ``—`` when there is none."""
    return "—" if x is None else f"{x:.{digits}f}{unit}".replace("-", "−")


ANGLE_LIMIT = 180.0
"""No two angular errors differ by more (degrees)."""


def degrees_detected(x: float) -> str:
    """A difference a design detects, in degrees; one beyond any two angular errors' difference is said as such (a
    design with few seeds and a large family can need thousands of degrees: it detects nothing)."""
    if x <= ANGLE_LIMIT:
        return f"{number(x)}°"
    return f"more than {ANGLE_LIMIT:.0f}°, beyond any two angular errors' difference"


def span(values: Sequence[int]) -> str:
    """A run of consecutive seeds (or epochs) as ``first–last``."""
    return f"{values[0]}–{values[-1]}"


def usual_seeds(sets: Sequence[tuple[int, ...]]) -> tuple[int, ...]:
    """The seed set most of ``sets`` (sorted tuples) have, ties to the larger set: what a table's *seeds* column
    says once, so that only the cells on other seeds need to name theirs; ``()`` when there are none."""
    return max(set(sets), key=lambda seeds: (sets.count(seeds), seeds)) if sets else ()


def spans(values: Iterable[int]) -> str:
    """Seeds (or epochs) in any number as their runs of consecutive values, each ``first–last`` (:func:`span`)
    and a lone value alone: ``0–2, 5``; ``—`` when there are none."""
    runs: list[list[int]] = []
    for v in sorted(set(values)):
        if runs and v == runs[-1][-1] + 1:
            runs[-1].append(v)
        else:
            runs.append([v])
    return ", ".join(span(run) if len(run) > 1 else str(run[0]) for run in runs) or "—"


def seeds_words(seeds: Iterable[int], every: Iterable[int] = ()) -> str:
    """``"seeds 3–7"``, ``"seed 3"``: the seeds a number is computed on, for a sentence or cell to name where they
    are not ``every`` (the page's seeds, which its header names); ``""`` where they are."""
    seeds = set(seeds)
    if seeds == set(every):
        return ""
    return f"seed{'s' if len(seeds) != 1 else ''} {spans(seeds)}"


def seeds_note(seeds: Iterable[int], every: Iterable[int] = ()) -> str:
    """:func:`seeds_words` in brackets after a number (``" (seeds 3–7)"``), or ``""``."""
    words = seeds_words(seeds, every)
    return f" ({words})" if words else ""


class Judged(Protocol):
    """What :func:`clear_count` reads of a difference (:class:`~alfa.study.bench.stats.Diff`, which this module,
    below the statistics, does not import)."""

    @property
    def judged(self) -> bool: ...

    @property
    def clear(self) -> bool: ...

    @property
    def n(self) -> int: ...

    declared: bool


def clear_count(diffs: Sequence[Judged], after: str = "") -> str:
    """How many of ``diffs`` are called clear, for a sentence that counts them: ``"2 called clear"`` where they are
    all judged, ``"1 called clear of the 3 judged"`` where only some are, and otherwise why none can be (one
    seed; outside the page's declared family), so that "0 called clear" never describes comparisons that were
    never judged. ``after`` follows a count of verdicts (``" after Holm's correction"``), never a reason."""
    judged = sum(d.judged for d in diffs)
    clear = f"{sum(d.clear for d in diffs)} called clear"
    if judged == len(diffs):
        return clear + after
    if judged:
        return f"{clear} of the {judged} judged{after}"
    if all(d.n == 1 for d in diffs):
        return "not judged: one seed"
    if not any(d.declared for d in diffs):
        return "descriptive: not in the declared family"
    return "not judged"
