"""The reference protocol replayed: what test-label selection of a step per person would report.

The paper's reference protocol scores each person at the personalization step its labels say is best. The benchmark
stores, per record, the error at every step on all of a person's images and the error that selection gives; this
module sets the selection against the last step (the honest result) for every row that has them, as a table and
sentences of the flip-premise sections (:mod:`alfa.study.bench.flip_report`). It is not a result of any method.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence

from . import report_prose as prose
from .markdown import table as _table
from .names import display_name as _name
from .record import Record
from .stats import Index, Measure, Stat, pairs_of, pooled, text_of

__all__ = ["replay", "replay_section"]

_reference_protocol = Measure("error under the reference protocol", lambda record: (record.reference_protocol_deg, {}))
"""The record's error under the replayed reference protocol (test-label selection), where it was replayed."""


def _step_all_images(step: int) -> Measure:
    """The error after personalization step ``step`` (``-1``: the last) on all of each person's images. Step 0
    is the base before personalization for an adapter that starts as the identity (every method but TPGaze,
    whose step 0 carries its meta-trained prompts)."""

    def read(record: Record) -> tuple[float | None, dict[str, float]]:
        steps = record.per_person_steps
        if not steps:
            return None, {}
        per_person = {p: v[step] for p, v in steps.items()}
        return statistics.fmean(per_person.values()), per_person

    return Measure(f"error after step {step} on all images", read)


def replay(idx: Index, methods: Sequence[str]) -> tuple[str | None, list[str]]:
    """The table of the reference protocol replayed for each of ``methods`` that has it (pooled over pairs: the
    result, the last step on all images, the best step per person chosen with its labels, and what that selection
    adds, each with its interval), and its sentences (``None`` and none without such records)."""
    rows, inflation, scored = [], [], []
    pairs = pairs_of(idx)
    for m in methods:
        ref = pooled(idx, m, pairs, _reference_protocol)
        if ref is None:
            continue
        honest = pooled(idx, m, pairs)
        last_all = pooled(idx, m, pairs, _step_all_images(-1))
        infl = _selection_gain(last_all, ref)
        if infl is not None:
            inflation.append((infl.mean, m, infl))
            scored.append((ref, last_all))
        rows.append(
            [
                _name(m),
                honest.format() if honest else "—",
                last_all.format() if last_all else "—",
                ref.format(),
                text_of(infl),
            ]
        )
    if not rows:
        return None, []
    header = [
        "method (pooled over pairs)",
        "last step, scored images (the result)",
        "last step, all images",
        "best step per person, all images (reference protocol: test-label selection)",
        "what the selection adds",
    ]
    lines = []
    if inflation:
        (_, lo_row, lo), (_, hi_row, hi) = min(inflation), max(inflation)
        alfa = next((x for _, m, x in inflation if m == "alfa"), None)
        text = (
            f"Replaying the reference protocol (per person the best of steps 0…{_steps(idx)} chosen with its labels) "
            f"reports {_from_to(lo, lo_row, hi, hi_row)} less error than the last step on the same images over "
            f"the {len(inflation)} rows replayed (means over seeds, each with its 95 % interval)"
        )
        if alfa is not None:
            text += f"; for Alfa {alfa.format('°')}"
        lines.append(text + ". That gain is made by test-label selection, not by any method.")
    base = pooled(idx, "alfa", pairs, _step_all_images(0))
    if base is not None and scored:
        by_ref = sum(ref.mean < base.mean for ref, _ in scored)
        by_last = sum(last.mean < base.mean for _, last in scored)
        lines.append(
            f"On the same images the base before personalization (step 0) scores {base.format('°')} pooled; the "
            f"reference protocol puts the mean error of {by_ref} of the {len(scored)} rows replayed below it, the "
            f"honest last step {by_last}."
        )
    return _table(header, rows), lines


def _from_to(lo: Stat, lo_row: str, hi: Stat, hi_row: str) -> str:
    """``"from 0.10° [..] (a) to 2.00° [..] (b)"``; one row's alone where both ends are its."""
    if lo_row == hi_row:
        return f"{lo.format('°')} ({_name(lo_row)})"
    return f"from {lo.format('°')} ({_name(lo_row)}) to {hi.format('°')} ({_name(hi_row)})"


def _selection_gain(last: Stat | None, selected: Stat) -> Stat | None:
    """Per seed, the last step's error less the reference protocol's (both on all images): what its test-label
    selection of a step per person takes off; ``None`` without a seed both have."""
    if last is None:
        return None
    gain = {s: last.values[s] - selected.values[s] for s in sorted(last.values.keys() & selected.values.keys())}
    return Stat(gain) if gain else None


def _steps(idx: Index) -> str:
    counts = {len(next(iter(r.per_person_steps.values()))) - 1 for r in idx.values() if r.per_person_steps}
    return "/".join(map(str, sorted(counts))) or "?"


def replay_section(idx: Index, methods: Sequence[str]) -> list[str]:
    """The reference protocol's test-label selection replayed (none without its records)."""
    replay_table, replay_lines = replay(idx, methods)
    if not replay_table:
        return []
    return [
        "## The reference protocol, replayed (test-label selection, not a result)",
        "",
        prose.REPLAY_INTRO,
        "",
        replay_table,
        "",
        *(f"- {s}" for s in replay_lines),
        "",
    ]
