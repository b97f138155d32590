"""The report's flip-premise sections (docs/flip-premise.md): what a flip can see of the error on each pair,
how much of that ceiling each method gets, the reference protocol replayed, and the recipes selected on the
stand-in. A section is left out when the results lack what it reads (the flip measures and the replayed
steps, optional fields of :class:`~alfa.study.bench.record.Record`, or the selection records), so results
scored without them render without it. The sections' fixed paragraphs are :mod:`alfa.study.bench.report_prose`'s.
"""

from __future__ import annotations

import dataclasses
import json
import math
import statistics
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from . import report_prose as prose
from .markdown import clear_count, degrees_detected, seeds_note, seeds_words, span
from .markdown import table as _table
from .methods import CONSTRUCTED_CONTROLS, FIRST_SEEDS, POSITIVE_CONTROLS, SELECTION_RULE
from .names import DEFAULT
from .names import display_name as _name
from .ratios import share
from .record import Record, as_records
from .replay import replay, replay_section
from .stats import Diff, Index, Measure, Stat, cell, diff, level, pairs_of, seeds_of, text_of
from .tta_report import tta_lines
from .variants import GRID, SELECTED

__all__ = ["flip_sections", "flip_summary", "ceilings", "constructed_control_section", "table_rows"]

SHARE_FLOOR = 0.5
"""A gain is shown as a share of the flip-TTA ceiling only where the ceiling is at least this many degrees
(a share of a near-zero ceiling is noise in a percentage)."""

CRITERION = 1 / 3
"""A positive control's flip-TTA ceiling must reach this share of the oracle headroom (declared)."""


def _flip(key: str) -> Measure:
    """A measure reading one mean of what a flip sees of a record's error (``record.flip[key]``, its persons'
    ``record.per_person_flip[...][key]``; none for records scored before flips were measured)."""

    def read(record: Record) -> tuple[float | None, dict[str, float]]:
        per_person = {p: v[key] for p, v in (record.per_person_flip or {}).items() if key in v}
        return (record.flip or {}).get(key), per_person

    return Measure(key.replace("_", " "), read)


def _most_seeds(candidates: list[tuple[float, str, Any]]) -> list[tuple[float, str, Any]]:
    """The ``(value, row, Diff)`` candidates with the most seeds: a row of fewer seeds cannot be clearly worse,
    so in a choice of the best it would win by having less evidence against it."""
    most = max(d.n for _, _, d in candidates)
    return [c for c in candidates if c[2].n == most]


def _choice_words(chosen: list[tuple[float, str, Any]], every: Iterable[int], of: int) -> str:
    """How many rows a best-of choice among :func:`_most_seeds` was made from, and on which seeds, where that is
    fewer than the ``of`` rows compared; ``""`` where every row took part."""
    if len(chosen) == of:
        return ""
    on = seeds_words(chosen[0][2].per_seed, every) or f"all {chosen[0][2].n} seeds"
    return f"chosen among the {len(chosen)} with the most seeds, {on}"


def _fewer_seeds_line(
    candidates: list[tuple[float, str, Any]], chosen: list[tuple[float, str, Any]], pair: str, what: str, minus: str,
    every: Iterable[int], gains_only: bool = False,
) -> list[str]:  # fmt: skip
    """A sentence naming the lowest of the ``(value, row, Diff)`` rows left out of a best-of choice for having fewer
    seeds, where it is below the chosen lowest (the sentence before it names that one): a summary must not hide
    a larger gain. ``what`` names what is lowest, ``minus`` completes the difference after the row's name."""
    fewer = [c for c in candidates if c not in chosen]
    if not fewer or min(fewer)[0] >= min(chosen)[0] or (gains_only and min(fewer)[0] >= 0):
        return []  # nothing lower left out; or, where only a gain is worth naming, a row that gains nothing
    _, m, d = min(fewer)
    return [
        f"On {pair}, of the {len(fewer)} rows with fewer seeds, {what} {_name(m)}'s, on "
        f"{seeds_words(d.per_seed, every) or 'its seeds'} (fewer seeds, so a wider interval): {_name(m)}{minus} = "
        f"{d.describe()}."
    ]


def table_rows(idx: Index, main: Sequence[str]) -> list[str]:
    """Table 1's rows in order: each method of ``main`` that has records, followed by its selected-recipe row
    and its shipped-default row where there are such."""
    present = {m for (m, _, _) in idx}
    out = []
    for m in main:
        out += [label for label in (m, f"{m}{SELECTED}", f"{m}{DEFAULT}") if label in present]
    return out


def _paper_recipe_row(label: str) -> bool:
    """Whether a row runs its method's paper recipe (not a selected or a shipped one)."""
    return not label.endswith((SELECTED, DEFAULT))


def ceilings(idx: Index) -> dict[str, dict[str, Any]]:
    """Per pair with a flip-TTA row: source-only and flip-TTA (each a :class:`Stat` on their shared seeds), the
    ceiling (source-only − flip-TTA), the oracle headroom, their ratio, the visible share of the source model's
    mean-square error and its flip loss (each a :class:`Stat`, ``None`` without flip measures)."""
    out: dict[str, dict[str, Any]] = {}
    for pair in pairs_of(idx):
        so, tta, oracle = (cell(idx, m, pair) for m in ("source-only", "flip-tta", "oracle"))
        if so is None or tta is None:
            continue
        # the ceiling on the seeds source-only and flip-TTA share, the headroom and the ratio on the seeds all
        # three rows share (a row may have fewer seeds while a run is under way: a ratio of means over different
        # seeds would compare different source models), of the first three only: the control criterion was
        # declared on them, before seeds 3–5 got an oracle (docs/flip-premise.md §7.2, amended 2026-12-04)
        seeds = set(so.values) & set(tta.values)
        if not seeds:
            continue
        so_mean, tta_mean = (statistics.fmean(c.values[s] for s in seeds) for c in (so, tta))
        both = seeds & set(oracle.values) & set(FIRST_SEEDS) if oracle is not None else set()
        headroom = ratio = None
        if both:
            so_both, tta_both, oracle_both = (statistics.fmean(c.values[s] for s in both) for c in (so, tta, oracle))
            headroom = so_both - oracle_both
            ratio = (so_both - tta_both) / headroom if headroom > 0 else None
        out[pair] = {
            "seeds": len(seeds),
            "ratio_seeds": len(both),
            "source_only": level(idx, "source-only", pair, seeds=seeds),
            "flip_tta": level(idx, "flip-tta", pair, seeds=seeds),
            "ceiling": so_mean - tta_mean,
            "headroom": headroom,
            "ratio": ratio,
            # the ratio's Fieller interval, read once for the table and the sentences
            "share": share(idx, "flip-tta", [pair], seeds=FIRST_SEEDS) if ratio is not None else None,
            "visible_share": level(idx, "source-only", pair, _flip("visible_share")),
            "flip_loss": level(idx, "source-only", pair, _flip("flip_loss")),
        }
    return out


def _on_seeds(c: dict[str, Any]) -> str:
    """Where the ratio reads fewer seeds than the ceiling (the oracle's, of the first three): on how many."""
    n = c["ratio_seeds"]
    return "" if n in (0, c["seeds"]) else f" (on the oracle's {n} seed{'s' if n != 1 else ''} of {span(FIRST_SEEDS)})"


UNBOUNDED_SHARE = "the headroom is not clear of zero"
"""Why a share of the headroom has no finite interval, said where it has none."""


def _share_text(c: dict[str, Any], unbounded: str = "") -> str:
    """The ceiling's share of the headroom, the ratio of the means on the seeds :func:`ceilings` reads it on, with
    its 95 % interval (Fieller's, :mod:`alfa.study.bench.ratios`)."""
    got = c["share"]
    return _pct(c["ratio"]) if got is None else got.text(unbounded=unbounded, every=got.seeds)


def _pct(x: float | None) -> str:
    return "—" if x is None else f"{100 * x:.0f} %".replace("-", "−")


def _control(pair: str) -> str:
    if pair in CONSTRUCTED_CONTROLS:
        return "constructed positive"
    return "positive" if pair in POSITIVE_CONTROLS else "negative"


def _verdict(c: dict[str, Any], pair: str) -> str:
    if c["ratio"] is None:
        return "—"
    holds = c["ratio"] >= CRITERION
    if pair in POSITIVE_CONTROLS + CONSTRUCTED_CONTROLS:
        return "holds" if holds else "**fails**"
    return "(would hold)" if holds else "not met"


def _ceiling_sentences(idx: Index, ceil: dict[str, dict[str, Any]]) -> list[str]:
    lines = []
    for pair, c in ceil.items():
        tta = diff(idx, "flip-tta", "source-only", [pair])
        text = (
            f"On {pair} ({_control(pair)} control) a flip sees {text_of(c['visible_share'], percent=True)} of the "
            f"source model's mean-square error; flip-TTA − source-only = {tta.describe() if tta else 'n/a'} "
            f"({c['source_only'].format('°')} → {c['flip_tta'].format('°')})"
        )
        room = diff(idx, "source-only", "oracle", [pair])
        if c["headroom"] is not None and room is not None:
            text += (
                f", against an oracle headroom (source-only − oracle) of {room.compact()}°"
                f"{seeds_note(room.per_seed, seeds_of(idx))} "
                f"(ratio of the means {_share_text(c, UNBOUNDED_SHARE)}{_on_seeds(c)})"
            )
        if pair in POSITIVE_CONTROLS + CONSTRUCTED_CONTROLS and c["ratio"] is not None:
            text += f": the positive-control criterion (≥ {CRITERION:.0%} of the headroom, on the means) " + (
                "holds" if c["ratio"] >= CRITERION else "FAILS"
            )
        lines.append(text + ".")
    return lines


MIXES = ("diag_gate", "linear_mix")
"""Alfa's two simpler mixes (ablation rows, not Table 1's): they also get selected recipes, so the flip-premise
sections compare them with the rest."""


def _rows(idx: Index, main: Sequence[str]) -> list[str]:
    """:func:`table_rows` of ``main`` and the two mixes."""
    return table_rows(idx, (*main, *MIXES))


def _methods(idx: Index, main: Sequence[str]) -> list[str]:
    return [m for m in _rows(idx, main) if m not in ("source-only", "flip-tta")]


def _share_table(idx: Index, main: Sequence[str], ceil: dict[str, dict[str, Any]]) -> str:
    pairs = list(ceil)
    rows = []
    for m in _methods(idx, main):
        cells = []
        for pair in pairs:
            gain = diff(idx, "source-only", m, [pair])  # source-only − m: the gain, with its interval
            c = ceil[pair]["ceiling"]
            if gain is None:
                cells.append("—")
                continue
            part = f" ({_of_ceiling(idx, m, pair, gain)})" if c is not None and c >= SHARE_FLOOR else ""
            cells.append(f"{gain.compact()}{part}")
        rows.append([_name(m), *cells])
    header = (
        "method (gain over source-only, deg, with its 95 % interval; share of the flip-TTA ceiling, the ratio of "
        "the means with its 95 % interval, none finite where the ceiling is not clear of zero)"
    )
    return _table([header, *pairs], rows)


def _of_ceiling(idx: Index, method: str, pair: str, gain: Diff, unbounded: str = "") -> str:
    """``method``'s share of the flip-TTA ceiling, (source-only − method) / (source-only − flip-TTA), on the seeds
    all three rows have, with its 95 % interval (Fieller's); those seeds named where they are not ``gain``'s."""
    got = share(idx, method, [pair], reference="flip-tta")
    if got is None:
        return "—"
    return got.text(unbounded=unbounded, every=gain.per_seed)


def _harmless_best(idx: Index, main: Sequence[str], pairs: Sequence[str], ceil) -> list[str]:
    """Per positive control: of the rows compared with source-only, the one with the largest gain among those
    not clearly worse (among the rows with the most seeds), with how many were compared."""
    lines = []
    for pair in pairs:
        compared = [(m, d) for m in _methods(idx, main) if (d := diff(idx, m, "source-only", [pair])) is not None]
        candidates = [(-d.mean, m, d) for m, d in compared if not (d.mean > 0 and d.clear)]
        if not candidates:
            continue
        chosen = _most_seeds(candidates)
        gain, m, d = max(chosen)
        c = ceil[pair]["ceiling"]
        words = "the ceiling is not clear of zero"
        part = f", {_of_ceiling(idx, m, pair, d, words)} of the flip-TTA ceiling" if c and c >= SHARE_FLOOR else ""
        choice = _choice_words(chosen, seeds_of(idx), len(candidates))
        among = (
            f"of the {len(compared)} rows compared with source-only ({len(candidates)} not clearly worse"
            f"{f'; {choice}' if choice else ''})"
        )
        if gain > 0:
            lines.append(
                f"On {pair}, {among}, the largest gain is {_name(m)}'s{seeds_note(d.per_seed, seeds_of(idx))}: "
                f"{_name(m)} − source-only = {d.describe()}{part}."
            )
        else:
            lines.append(
                f"On {pair}, {among}, none lowers the mean error below source-only; the least harm: {_name(m)}."
            )
        by_difference = [(dd.mean, row, dd) for _, row, dd in candidates]  # the lowest difference: the largest gain
        chosen_rows = [(dd.mean, row, dd) for _, row, dd in chosen]
        minus = " − source-only"
        lines += _fewer_seeds_line(
            by_difference, chosen_rows, pair, "the largest gain is", minus, seeds_of(idx), gains_only=True
        )
    return lines


def _attention_lines(idx: Index, pairs: Sequence[str]) -> list[str]:
    lines = []
    recipes = {"": "paper recipe", SELECTED: "selected recipes", DEFAULT: "shipped default recipes"}
    for suffix, recipe in recipes.items():
        alfa = f"alfa{suffix}"
        for other in ("lora", "diag_gate", "linear_mix"):
            d = diff(idx, alfa, f"{other}{suffix}", pairs)
            if d is not None:
                lines.append(
                    f"Positive controls ({', '.join(pairs)}), {recipe}{seeds_note(d.per_seed, seeds_of(idx))}: "
                    f"{_name(alfa)} − {_name(other + suffix)} = {d.describe()}."
                )
    return lines


def _read_with_tta(record: Record) -> tuple[float | None, dict[str, float]]:
    per_person = {p: v["tta_error"] for p, v in (record.per_person_flip or {}).items() if "tta_error" in v}
    return record.flip_tta_error_deg, per_person


_with_tta = Measure("error with flip-TTA on top", _read_with_tta)
"""The record's error with flip-TTA on top of its model, and its persons' (none for records scored before
flip-TTA was measured)."""


def _after_table(idx: Index, main: Sequence[str], pairs: Sequence[str]) -> str | None:
    """Per row and pair: the error with flip-TTA on top, its difference from flip-TTA on the source model (with
    its interval), the flip loss after personalization and the visible share of the error that remains."""
    rows = []
    for m in _rows(idx, main):
        if m == "flip-tta":
            continue
        cells = []
        for pair in pairs:
            tta = level(idx, m, pair, _with_tta)
            loss = level(idx, m, pair, _flip("flip_loss"))
            share = level(idx, m, pair, _flip("visible_share"))
            if tta is None:
                cells.append("—")
                continue
            cell_text = tta.format()
            if m != "source-only":
                d = diff(idx, m, "source-only", [pair], _with_tta)
                if d is not None:
                    cell_text += f" ({d.compact()})"
            cell_text += f"; {text_of(loss)} · {text_of(share, percent=True)}"
            cells.append(cell_text)
        if any(c != "—" for c in cells):
            rows.append([_name(m), *cells])
    if len(rows) < 2:
        return None
    return _table(
        [
            "model: error with flip-TTA on top, deg (its difference from flip-TTA alone, 95 % interval); flip loss "
            "· visible share",
            *pairs,
        ],
        rows,
    )


def _paper_rows(idx: Index, main: Sequence[str]) -> list[str]:
    """The rows with the paper's recipe (no selected recipe) compared with source-only."""
    return [m for m in _methods(idx, main) if _paper_recipe_row(m)]


def _loss_table(idx: Index, main: Sequence[str]) -> str | None:
    """With the paper's recipe, pooled over every pair: each row's flip loss and error against source-only's,
    each difference with its interval (none without the flip measures)."""
    everywhere = pairs_of(idx)
    rows = []
    for m in _paper_rows(idx, main):
        loss = diff(idx, m, "source-only", everywhere, _flip("flip_loss"))
        err = diff(idx, m, "source-only", everywhere)
        if loss is not None and err is not None:
            rows.append([_name(m), loss.compact(), err.compact()])
    if not rows:
        return None
    header = ["method (paper recipe), − source-only, pooled over pairs", "flip loss", "error (deg)"]
    return _table(header, rows)


def _after_lines(idx: Index, main: Sequence[str], pairs: Sequence[str]) -> list[str]:
    """Per positive control, the lowest error of flip-TTA on top of a personalized model against flip-TTA
    alone (of how many rows); and across the paper-recipe rows, whether a lower flip loss came with a lower
    error."""
    lines = []
    methods = _methods(idx, main)
    for pair in pairs:
        alone = level(idx, "source-only", pair, _with_tta)
        diffs = [(d.mean, m, d) for m in methods if (d := diff(idx, m, "source-only", [pair], _with_tta))]
        if not diffs or alone is None:
            continue
        chosen = _most_seeds(diffs)
        _, m, d = min(chosen)
        # the two means on the difference's seeds, so that they differ by what it says
        mine, alone = (level(idx, row, pair, _with_tta, d.per_seed) for row in (m, "source-only"))
        on = seeds_words(d.per_seed, seeds_of(idx))
        lines.append(
            f"On {pair}, of the {len(diffs)} personalized models with flip-TTA on top"
            f"{f' ({choice})' if (choice := _choice_words(chosen, seeds_of(idx), len(diffs))) else ''}, the lowest "
            f"mean error is "
            f"{_name(m)}'s ({text_of(mine, '°')}, flip-TTA alone {text_of(alone, '°')}"
            f"{f', on {on}' if on else ''}): "
            f"{_name(m)} + flip-TTA − flip-TTA = {d.describe()}."
        )
        minus = " + flip-TTA − flip-TTA"
        lines += _fewer_seeds_line(diffs, chosen, pair, "the lowest mean error is", minus, seeds_of(idx))
    everywhere = pairs_of(idx)
    compared: list[tuple[Diff, Diff]] = []
    for m in _paper_rows(idx, main):
        loss = diff(idx, m, "source-only", everywhere, _flip("flip_loss"))
        err = diff(idx, m, "source-only", everywhere)
        if loss is not None and err is not None:
            compared.append((loss, err))
    lower_loss = [(loss, err) for loss, err in compared if loss.mean < 0]
    if lower_loss:
        worse = [(loss, err) for loss, err in lower_loss if err.mean > 0]
        text = (
            f"With the paper's recipe, of the {len(compared)} rows compared, the pooled flip loss ends below "
            f"source-only's for {len(lower_loss)} ({clear_count([loss for loss, _ in lower_loss])}), and "
            f"the error ends above source-only's for {len(worse)} of them"
        )
        if worse:
            names = ", ".join(_name(err.a) for _, err in worse)
            text += f" ({names}; {clear_count([err for _, err in worse])})"
        lines.append(text + ": a lower flip loss is no evidence of a lower error (intervals: § After personalization).")
    return lines


def _pooled_lines(idx: Index, rows: Sequence[str], table1: Sequence[str]) -> list[str]:
    """Every row of ``rows`` (Table 1's, ``table1``, and Alfa's two simpler mixes') against source-only, pooled over
    every pair, each with its interval, grouped by where it lies (:func:`_side`)."""
    pairs = pairs_of(idx)
    groups: dict[str, list[str]] = {
        "below": [],
        "below, not clear": [],
        "within": [],
        "above, not clear": [],
        "above": [],
    }
    counted = []
    for m in rows:
        if m == "source-only":
            continue
        d = diff(idx, m, "source-only", pairs)
        if d is None:
            continue
        counted.append(m)
        groups[_side(d)].append(f"{_name(m)} {d.compact()}{seeds_note(d.per_seed, seeds_of(idx))}")
    if not any(groups.values()):
        return []
    # "Not clear" is a verdict on the declared family; a descriptive row's interval far from zero is said as such.
    words = {
        "below": "clearly below it",
        "below, not clear": "below it by their own intervals, not called clear (descriptive, one seed, or not clear)",
        "within": "intervals containing zero",
        "above, not clear": "above it by their own intervals, not called clear (descriptive, one seed, or not clear)",
        "above": "clearly above it",
    }
    parts = [f"{words[g]}: {', '.join(v)}" for g, v in groups.items() if v]
    # the sentences near it count Table 1's rows alone: say which rows this count holds beside them
    extra = [_name(m) for m in counted if m not in table1]
    own = len(counted) - len(extra)
    named = [f"Table 1's {own} other row" + ("s" if own != 1 else "")] if own else []
    held = " and ".join(named + ([", ".join(extra)] if extra else []))
    over = f"the {len(pairs)} pairs" if len(pairs) != 1 else "its one pair"
    return [f"Pooled over {over}, {held} against source-only — " + "; ".join(parts) + "."]


def _side(d: Diff) -> str:
    """Where a difference from source-only lies: called clear (below, above), or not, by its own interval."""
    if d.clear:
        return "below" if d.mean < 0 else "above"
    if d.below_zero:
        return "below, not clear"
    return "above, not clear" if d.above_zero else "within"


def _over_seeds(records: Iterable[Record], value: Callable[[Record], float | None]) -> str:
    """The mean over the records' seeds of ``value`` with its 95 % interval (``—`` where none has it)."""
    values = {r.seed: float(v) for r in records if (v := value(r)) is not None}
    return Stat(values).format() if values else "—"


def _selection(results: Mapping[str, Any], idx: Index, main: Sequence[str]) -> tuple[list[str], list[str]]:
    records = [r for r in as_records(results.get("records", [])) if r.kind == "selection"]
    if not records:
        return [], []
    by: dict[tuple[str, str], list[Record]] = {}
    for r in records:
        by.setdefault((r.method.removesuffix(GRID), r.source), []).append(r)
    cases = any(r.selection_case for r in records)  # the second rule says which of its cases applied
    rows = []
    order = {m: i for i, m in enumerate(main)}
    for (method, source), recs in sorted(by.items(), key=lambda kv: (order.get(kv[0][0], len(order)), kv[0][1])):
        chosen = Counter(r.selected_label for r in recs)
        row = [
            _name(method),
            source,
            "; ".join(f"{label} ({n}×)" for label, n in chosen.most_common()),
            _over_seeds(recs, lambda r: r.source_only_deg),
            _over_seeds(recs, lambda r: r.paper_recipe_deg),
            _over_seeds(recs, lambda r: r.error_deg),
        ]
        if cases:
            row.append("; ".join(f"{c} ({n}×)" for c, n in Counter(r.selection_case or "—" for r in recs).items()))
        rows.append(row)
    header = ["method", "source", "selected recipe (seeds)", "stand-in: source-only", "stand-in: paper recipe"]
    header += ["stand-in: selected", *(["the rule's case (seeds)"] if cases else [])]
    table = _table(header, rows)
    sentences = []
    # the goal of §4 is the selected rows'; of the shipped defaults the sentence only says where they harm
    rules = {SELECTED: ("its recipe selected on the stand-in", True), DEFAULT: ("its shipped default recipe", False)}
    for suffix, (words, goal) in rules.items():
        compared = [
            d
            for pair in pairs_of(idx)
            for m in _rows(idx, main)
            if m.endswith(suffix) and (d := diff(idx, m, "source-only", [pair])) is not None
        ]
        if not compared:
            continue
        if outside_family(compared):
            # outside the declared family (a v2 page): nothing can be clear, so the sentence must not read as a
            # verdict; it names the comparisons whose own, unadjusted interval lies above zero
            sentences.append(_descriptive_harm(words, compared))
            continue
        harmed = [f"{_name(d.a)} on {d.pairs[0]} ({d.compact()})" for d in compared if d.mean > 0 and d.clear]
        detectable = [x for x in idx.family.detectable(compared) if math.isfinite(x)]
        median = degrees_detected(statistics.median(detectable)) if detectable else ""
        power = (
            f"; the design detects a harm of {median} (median over them) with 80 % power, so a smaller one is not "
            "ruled out"
            if detectable and not harmed
            else ""
        )
        held = "the goal holds as far as this design can tell" if goal else "as far as this design can tell"
        none = f"none ({held}{power})"
        sentences.append(
            f"With {words}, of the {len(compared)} (method, pair) comparisons with source-only, a method is "
            "clearly worse than source-only on: " + ("; ".join(harmed) if harmed else none) + "."
        )
    return [table], sentences


def outside_family(compared: Sequence[Diff]) -> bool:
    """Whether none of ``compared`` is in the page's declared family (a v2 page's per-pair comparisons): then
    none can be clear, whatever its seeds. A declared comparison of one seed is unjudged for lack of seeds, which
    the verdict sentence handles; it is not descriptive."""
    return not any(d.declared for d in compared)


def _descriptive_harm(words: str, compared: Sequence[Diff]) -> str:
    """The per-pair harm sentence where its comparisons are descriptive: those whose own 95 % interval lies
    above zero (unadjusted for their number, so some are expected by chance), and that no verdict is given."""
    above = [
        f"{_name(d.a)} on {d.pairs[0]} ({d.compact()})"
        for d in compared
        if (interval := d.interval) is not None and interval[0] > 0
    ]
    return (
        f"With {words}, of the {len(compared)} (method, pair) comparisons with source-only (descriptive: "
        "outside the declared family, so none is judged), the 95 % interval lies wholly "
        "above zero, a harm taken alone, on: " + ("; ".join(above) if above else "none") + "."
    )


def flip_summary(
    results: Mapping[str, Any], idx: Index, main: Sequence[str], table1: Sequence[str] | None = None
) -> list[str]:
    """The flip-premise sentences the report's summary leads with (none for results without these rows).
    ``table1``: Table 1's rows, which the pooled sentence compares with source-only beside the mixes' rows (by
    default the rows of ``main``)."""
    ceil = ceilings(idx)
    positive = [p for p in pairs_of(idx) if p in POSITIVE_CONTROLS]
    lines = _ceiling_sentences(idx, ceil)
    lines += _harmless_best(idx, main, [p for p in positive if p in ceil], ceil)
    lines += _attention_lines(idx, positive)
    lines += _after_lines(idx, main, [p for p in positive if p in ceil])
    table1 = table_rows(idx, main) if table1 is None else table1
    mixes = [m for m in table_rows(idx, MIXES) if m not in table1]
    lines += _pooled_lines(idx, [*table1, *mixes], table1)
    lines += _selection(results, idx, main)[1]
    lines += replay(idx, _rows(idx, main))[1]
    return lines


def _interval(d: Diff | None) -> str:
    return "—" if d is None else d.compact()


def _ceiling_table(idx: Index, ceil: dict[str, dict[str, Any]]) -> str:
    """Per pair: source-only, flip-TTA, the ceiling against the oracle headroom (each with its interval) and the
    criterion's verdict, the visible share and the flip loss."""
    every = len(seeds_of(idx))
    on = {pair: "" if c["seeds"] == every else f" ({c['seeds']} of {every} seeds)" for pair, c in ceil.items()}
    rows = [
        [
            pair,
            _control(pair),
            c["source_only"].format() + on[pair],
            c["flip_tta"].format() + on[pair],
            _interval(diff(idx, "source-only", "flip-tta", [pair])),
            _interval(diff(idx, "source-only", "oracle", [pair])) if c["headroom"] is not None else "—",
            _share_text(c) + _on_seeds(c),
            _verdict(c, pair),
            text_of(c["visible_share"], percent=True),
            text_of(c["flip_loss"]),
        ]
        for pair, c in ceil.items()
    ]
    header = [
        "pair",
        "control",
        "source-only",
        "flip-TTA",
        "ceiling (95 % interval)",
        "oracle headroom (95 % interval)",
        "ceiling / headroom (ratio of the means, 95 % interval; none finite where the headroom is not clear of zero)",
        "criterion",
        "visible share",
        "flip loss",
    ]
    return _table(header, rows)


def constructed_control_section(idx: Index) -> list[str]:
    """The constructed positive control (docs/flip-premise.md §7.4), from an index of its records alone (no page
    pools it with the other pairs or puts it in its family): its ceiling against its headroom, the criterion."""
    ceil = {p: c for p, c in ceilings(idx).items() if p in CONSTRUCTED_CONTROLS}
    if not ceil:
        return []
    return [
        "### The constructed positive control (docs/flip-premise.md §7.4)",
        "",
        prose.CONSTRUCTED_CONTROL,
        "",
        _ceiling_table(idx, ceil),
        "",
        *[f"- {s}" for s in _ceiling_sentences(idx, ceil)],
        "",
    ]


def _ceiling_section(idx: Index, main: Sequence[str], ceil: dict[str, dict[str, Any]]) -> list[str]:
    """What a flip can see on each pair, and every method's gain as a share of that ceiling."""
    positive = [p for p in ceil if p in POSITIVE_CONTROLS]
    return [
        "## What a flip can see",
        "",
        prose.FLIP_CEILING_INTRO.format(criterion=CRITERION),
        "",
        _ceiling_table(idx, ceil),
        "",
        *(f"- {s}" for s in _ceiling_sentences(idx, ceil)),
        "",
        prose.FLIP_SHARE_INTRO.format(share_floor=SHARE_FLOOR),
        "",
        _share_table(idx, main, ceil),
        "",
        *(f"- {s}" for s in _harmless_best(idx, main, positive, ceil)),
        *(f"- {s}" for s in _attention_lines(idx, positive)),
        "",
    ]


def _after_section(idx: Index, main: Sequence[str], ceil: dict[str, dict[str, Any]]) -> list[str]:
    """Flip-TTA on top of each personalized model, and what a flip still sees (none with fewer than two rows);
    then the paper-recipe rows' flip loss and error against source-only's."""
    after = _after_table(idx, main, list(ceil))
    loss = _loss_table(idx, main)
    lines = ["### After personalization: flip-TTA on top, and what a flip still sees", ""] if after or loss else []
    if after:
        positive = [p for p in ceil if p in POSITIVE_CONTROLS]
        lines += [prose.FLIP_AFTER_INTRO, "", after, "", *(f"- {s}" for s in _after_lines(idx, main, positive)), ""]
    if loss:
        lines += [prose.FLIP_LOSS_INTRO, "", loss, ""]
    return lines


def _selection_section(results: Mapping[str, Any], idx: Index, main: Sequence[str]) -> list[str]:
    """The recipes the declared rule selected on the stand-in (none without selection records)."""
    selection_table, selection_lines = _selection(results, idx, main)
    if not selection_table:
        return []
    # the first protocol's grid was fixed after label-scored ablations on its symmetric pairs' targets
    caveat = [prose.GRID_CAVEAT_V1, ""] if results["config"].get("worlds", "v1") == "v1" else []
    return [
        "## Recipes selected without target labels",
        "",
        prose.SELECTION_INTRO,
        "",
        *caveat,
        *selection_table,
        "",
        *(f"- {s}" for s in selection_lines),
        "",
    ]


def flip_sections(results: Mapping[str, Any], idx: Index, main: Sequence[str]) -> list[str]:
    """The report's flip-premise sections, as markdown lines; after what a flip can see, the label-free TTA rows
    and what a roll sees (:mod:`alfa.study.bench.tta_report`, where the results have them)."""
    ceil = ceilings(idx)
    lines: list[str] = _ceiling_section(idx, main, ceil) if ceil else []
    lines += tta_lines(idx, "###" if ceil else "##")
    if ceil:
        lines += _after_section(idx, main, ceil)
    return lines + _selection_section(results, idx, main) + replay_section(idx, _rows(idx, main))


DEFAULT_RECIPE_SOURCE = "E"
"""The source whose selection sets ``alfa personalize``'s default: the ETH-XGaze-like one, the paper's main."""


def _pooled_selection(records: list[Record], rule: str) -> tuple[Any, dict[str, Any]]:
    """The declared rule ``rule`` on one method's selection records (one per seed), seeds pooled: the recipe and
    the facts the generated module states about it (seeds, its stand-in error, the paper's, source-only's, and
    under the second rule the case that applied)."""
    from alfa.gaze.recipes import PAPER_RECIPE, Recipe, select_pooled, select_pooled_helping

    per_seed = [{Recipe(**g["recipe"]): g["error_deg"] for g in r.grid or []} for r in records]
    case = {}
    if rule == "lowest-cautious":  # the first rule reads each recipe's mean as stored
        chosen, error = select_pooled(per_seed)
    else:  # the second reads the persons' errors, paired with the unadapted model's (null: a failed person)
        inf = float("inf")
        per_person = [
            (
                {
                    Recipe(**g["recipe"]): {p: inf if e is None else e for p, e in g["per_person"].items()}
                    for g in r.grid
                },
                r.source_only_per_person or {},
            )
            for r in records
        ]
        selection = select_pooled_helping(per_person)
        chosen, error, case = selection.recipe, selection.error, {"case": selection.case}
    return chosen, {
        "seeds": [r.seed for r in records],
        "stand_in_error_deg": round(error, 4),
        "paper_recipe_stand_in_error_deg": round(statistics.fmean(e[PAPER_RECIPE] for e in per_seed), 4),
        "source_only_stand_in_error_deg": round(statistics.fmean(r.source_only_deg for r in records), 4),
        **case,
    }


def selected_recipes_json(results: Mapping[str, Any], data: str) -> str:
    """The text of ``alfa/gaze/selected_recipes.json`` (package data, read by :mod:`alfa.gaze.recipes`): per
    adapter method, the recipe chosen by the declared rule on the stand-in errors of the E source's selection
    records, averaged over the seeds (docs/flip-premise.md §4; under the second protocol's rule, §7, each
    person's errors averaged over the seeds); Alfa's is the default of ``alfa personalize``. The rule is the
    results' protocol's (:data:`~alfa.study.bench.methods.SELECTION_RULE` of their worlds). ``data`` is the
    folder the results were read from, named in the file. Only registered adapter methods (the ones
    ``alfa personalize --method`` accepts) are kept."""
    from alfa.adapters import METHODS

    by_method: dict[str, list[Record]] = {}
    for r in as_records(results["records"]):
        if r.kind == "selection" and r.source == DEFAULT_RECIPE_SOURCE and r.method.endswith(GRID):
            method = r.method.removesuffix(GRID)
            if method in METHODS:
                by_method.setdefault(method, []).append(r)
    if "alfa" not in by_method:
        raise ValueError(f"no alfa{GRID} selection record of source {DEFAULT_RECIPE_SOURCE} in {data}")
    rule = SELECTION_RULE[results.get("config", {}).get("worlds", "v1")]
    selected = {m: _pooled_selection(sorted(rs, key=lambda r: r.seed), rule) for m, rs in sorted(by_method.items())}
    document = {
        "about": (
            "Per adapter method, the personalization recipe alfa personalize --method M uses unless told "
            "otherwise (Alfa's is the default of alfa personalize). Generated by alfa pages --write from the "
            "results named below; do not edit. Each is the recipe the declared rule "
            f"(docs/flip-premise.md {'§4' if rule == 'lowest-cautious' else '§7'}) "
            "selects from the grid for the source below, on the stand-in errors (labelled persons that are "
            "neither a target nor the source's training persons) averaged over the seeds listed with it. No "
            "target label was read to choose them."
        ),
        "results": data,
        "source": DEFAULT_RECIPE_SOURCE,
        "methods": {
            m: {"label": recipe.label, "recipe": dataclasses.asdict(recipe), **facts}
            for m, (recipe, facts) in selected.items()
        },
    }
    return json.dumps(document, indent=2, ensure_ascii=False) + "\n"
