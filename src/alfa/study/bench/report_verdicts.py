"""The benchmark report's verdicts: the sentences that turn the statistics of the records into judgements
(where Alfa is best and where not, what lies below source-only, how large the domain gap and the headroom are,
where the error goes), each computed from :mod:`alfa.study.bench.stats`.

How differences are judged is :mod:`alfa.study.bench.stats`'s (the report states it too): every difference is
quoted with its 95 % interval, and *clear* means its p-value is below 0.05 after Holm's correction over every
comparison of the page. A sentence that ranks rows or counts them says how many it compared; one that says a
row is better or worse quotes the difference with its interval.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .ablations import REGISTRY
from .calibration import IN_DOMAIN_CONDITION, REAL_IN_DOMAIN, REAL_SOURCE_NAMES
from .config import split_pair
from .markdown import clear_count, seeds_note, seeds_words
from .measures import label_spread, part, part_gap
from .names import DEFAULT, SELECTED
from .names import display_name as _name
from .ratios import ratio, share
from .report_tables import table1_rows
from .stats import (
    Diff,
    Index,
    Stat,
    cell,
    cell_covering,
    cell_on,
    described,
    diff,
    level,
    pairs_of,
    seeds_of,
)

__all__ = ["main_verdicts", "sanity_verdicts", "parts_verdicts", "ablation_verdicts"]


def _ordinal(k: int) -> str:
    return f"{k}{'th' if 10 <= k % 100 <= 20 else {1: 'st', 2: 'nd', 3: 'rd'}.get(k % 10, 'th')}"


# ----------------------------------------------------------------------------- Table 1


def main_verdicts(idx: Index) -> list[str]:
    """The plain sentences about Table 1: where Alfa wins, where it does not, and what is within the spread.

    With a selected-recipe row of Alfa (``alfa[selected]``), its standing gets the same sentences after the
    paper recipe's, compared with LoRA's selected row: a reader should not find "Alfa does not win" next to
    "Alfa (selected recipe) is best" without a sentence about the latter. The same for its row with the shipped
    default recipe (``alfa[default]``), against LoRA's."""
    pairs = pairs_of(idx)
    methods = table1_rows(idx)
    # a run may have Alfa's selected or default row without its paper-recipe row (the second protocol's order)
    alfa_rows = [suffix for suffix in ("", SELECTED, DEFAULT) if f"alfa{suffix}" in methods]
    if not alfa_rows or not pairs:
        return ["Alfa was not run; no verdict."]
    lines = []
    for suffix in alfa_rows:
        lines += _row_verdicts(idx, pairs, methods, f"alfa{suffix}", f"lora{suffix}")
    if "source-only" in methods:
        lines.append(_below_source_only_sentence(idx, pairs, methods))
    return lines


def _below_source_only_sentence(idx: Index, pairs: Sequence[str], methods: Sequence[str]) -> str:
    """Of the rows compared with source-only (pooled), which have a lower mean error, with each difference and
    its interval (and its seeds, where they are not the page's), and how many of them clearly."""
    diffs = [(m, diff(idx, m, "source-only", pairs)) for m in methods if m != "source-only"]
    compared = [(m, d) for m, d in diffs if d is not None]
    beating = [(m, d) for m, d in compared if d.mean < 0]
    names = "; ".join(f"{_name(m)} {d.compact()}{seeds_note(d.per_seed, seeds_of(idx))}" for m, d in beating)
    text = (
        f"Of Table 1's {len(compared)} other rows, each compared with source-only pooled over pairs, "
        f"{len(beating)} have a lower mean error ({clear_count([d for _, d in beating])}): {names or 'none'}."
    )
    others = [m for m, _ in compared if m not in {b for b, _ in beating}]
    if others:
        text += f" Not below source-only: {', '.join(_name(m) for m in others)} (Table 1, last column)."
    missing = [m for m, d in diffs if d is None]
    if missing:
        text += f" Not pooled, for want of records on every pair: {', '.join(_name(m) for m in missing)}."
    return text


def _ranked_on_its_seeds(idx: Index, methods: Sequence[str], pair: str, row: str) -> tuple[list[tuple[Stat, str]], str]:
    """The rows on ``pair`` that have every seed ``row`` has, best first, each's mean over those seeds only (a
    row of one seed is ranked against the others' same seed, never against their means over more), and the
    words that say so where another row had more seeds ("" where none had)."""
    mine = cell(idx, row, pair)
    if mine is None:
        return [], ""
    ranked, narrowed = [], False
    for m in methods:
        theirs = cell(idx, m, pair)
        if theirs is None or not set(mine.values) <= set(theirs.values):
            continue
        narrowed |= len(theirs.values) > len(mine.values)
        ranked.append((cell_on(idx, m, [pair], mine.values), m))
    on = f" (on {seeds_words(mine.values)}, the ones it has)" if narrowed else ""
    return sorted(ranked, key=lambda t: t[0].mean), on


def _pair_standing(idx: Index, pair: str, ranked: list[tuple[Stat, str]], row: str, on: str = "") -> str:
    """One sentence on ``row``'s place on ``pair`` (``ranked``: the rows' stats, best first; ``on``: the seeds
    they were ranked on, where narrowed): how far it leads the runner-up, or where it stands behind the best."""
    me, where = _name(row), pair + on
    mine = next(s for s, m in ranked if m == row)
    best_stat, best = ranked[0]
    if best == row:
        runner_stat, runner = ranked[1]
        d = diff(idx, row, runner, [pair])
        return (
            f"On {where} {me} ({mine.format('°')}) leads the runner-up of the {len(ranked)} rows, {_name(runner)} "
            f"({runner_stat.format('°')}), by {runner_stat.mean - mine.mean:.2f}° in the means; {me} − "
            f"{_name(runner)} = {d.describe() if d else 'n/a'}."
        )
    rank = 1 + [m for _, m in ranked].index(row)
    d = diff(idx, row, best, [pair])
    return (
        f"On {where} {me} does not win: {_name(best)} is best ({best_stat.format('°')}), {me} is "
        f"{_ordinal(rank)} of {len(ranked)} ({mine.format('°')}); {me} − {_name(best)} = "
        f"{d.describe() if d else 'n/a'}."
    )


def _against_source_only(idx: Index, pairs: Sequence[str], row: str) -> str:
    """``row`` against its own starting point, per pair (each difference with its interval) and pooled; the seeds
    of the differences, where they are not the page's, said once where all have the same, else after each."""
    me, every = _name(row), seeds_of(idx)
    per_pair = [(p, d) for p in pairs if (d := diff(idx, row, "source-only", [p])) is not None]
    shared = [p for p, _ in per_pair]
    d = diff(idx, row, "source-only", shared) if _poolable(shared, pairs) else None
    sets = {frozenset(x.per_seed) for x in [*(x for _, x in per_pair), *([d] if d else [])]}
    once = seeds_words(next(iter(sets)), every) if len(sets) == 1 else ""
    each = len(sets) > 1  # the differences are on different seeds: each names its own, where not the page's
    lower = [p for p, x in per_pair if x.mean < 0]
    # "lowers the error" would read as a finding where an interval still reaches zero: the means, the intervals
    # below zero and the clear ones are three counts
    below = sum(x.below_zero for _, x in per_pair)
    clear = clear_count([x for _, x in per_pair if x.mean < 0], after=" after Holm's correction")
    text = (
        f"Against its own starting point (source-only{f', on {once}' if once else ''}), the mean error of {me} is "
        f"lower on {len(lower)} of {len(per_pair)} pairs, with its 95 % interval below zero on {below} ({clear})"
    )
    if len(lower) < len(per_pair):
        text += f"; it does not on {', '.join(p for p, _ in per_pair if p not in lower)}"
    if per_pair:
        notes = [seeds_note(x.per_seed, every) if each else "" for _, x in per_pair]
        text += " (" + "; ".join(f"{p} {x.compact()}{n}" for (p, x), n in zip(per_pair, notes)) + ")"
    if d is not None:
        on = "" if once else _on(d, every)
        text += f". Pooled over {_pooled_over(shared, pairs)}{on}: {me} − source-only = {d.describe()}"
    return text + "."


def _with_interval(pair: str, d: Diff | None, every: Sequence[int]) -> str:
    """``"G→M (−0.94 [−1.69, −0.18], seeds 0–5)"``: a pair with its difference, and its seeds where they are not
    the page's ``every``."""
    if d is None:
        return pair
    words = seeds_words(d.per_seed, every)
    return f"{pair} ({d.compact()}{f', {words}' if words else ''})"


def _on(d: Diff, every: Sequence[int]) -> str:
    """``", on seeds 3–7"``: the seeds of a pooled difference, where they are not the page's ``every``."""
    words = seeds_words(d.per_seed, every)
    return f", on {words}" if words else ""


def _poolable(shared: Sequence[str], pairs: Sequence[str]) -> bool:
    """Whether a pooled difference says more than the per-pair ones: over every pair of the page, or over at
    least two of them where a row lacks some (over one, it would repeat that pair's)."""
    return bool(shared) and (list(shared) == list(pairs) or len(shared) > 1)


def _pooled_over(shared: Sequence[str], pairs: Sequence[str]) -> str:
    """``"pairs"``, or, where a row lacks some of the page's pairs, the ones it is pooled over."""
    return "pairs" if list(shared) == list(pairs) else f"{', '.join(shared)} (the pairs with both rows)"


def _row_verdicts(idx: Index, pairs: Sequence[str], methods: Sequence[str], row: str, lora: str) -> list[str]:
    """Where the Alfa row ``row`` is best, where not, against source-only and against the LoRA row ``lora``."""
    me = _name(row)
    best_pairs = []
    per_pair: list[str] = []
    every_row = True  # whether each pair's ranking held every row with records there, on the same seeds
    for pair in pairs:
        ranked, on = _ranked_on_its_seeds(idx, methods, pair, row)
        if not any(m == row for _, m in ranked) or len(ranked) == 1:
            continue
        every_row &= not on and len(ranked) == sum(cell(idx, m, pair) is not None for m in methods)
        if ranked[0][1] == row:
            best_pairs.append(pair)
        per_pair.append(_pair_standing(idx, pair, ranked, row, on))
    where = f" ({', '.join(best_pairs)})" if best_pairs else ""
    unscored = [p for p in pairs if cell(idx, row, p) is None]
    among = (
        f"Of Table 1's {len(methods)} rows"
        if every_row
        else "Ranked on its own seeds against the rows that have them (each pair's sentence says on which seeds, "
        "among how many rows)"
    )
    lines = [
        f"{among}, {me} has the lowest mean error on {len(best_pairs)} of {len(pairs) - len(unscored)} "
        f"pairs{where}" + (f" (it has no records on {', '.join(unscored)})." if unscored else "."),
        *per_pair,
    ]
    if "source-only" in methods:
        lines.append(_against_source_only(idx, pairs, row))
    if lora in methods:
        shared = [p for p in pairs if cell(idx, row, p) and cell(idx, lora, p)]
        d = diff(idx, row, lora, shared) if _poolable(shared, pairs) else None  # the two rows' pooled difference
        how = {"lora": "same recipe, same steps", f"lora{SELECTED}": "its recipe selected by the same rule"}.get(
            lora, "its own shipped default recipe"
        )
        if d is not None:
            lines.append(
                f"Against {_name(lora)} ({how}), pooled over {_pooled_over(shared, pairs)}{_on(d, seeds_of(idx))}: "
                f"{me} − {_name(lora)} = {d.describe()}."
            )
    return lines


# ----------------------------------------------------------------------------- sanity: domain gap and headroom


def _range(values: Sequence[float], digits: int, unit: str) -> str:
    lo, hi = min(values), max(values)
    return (
        f"{lo:.{digits}f}{unit}"
        if f"{lo:.{digits}f}" == f"{hi:.{digits}f}"
        else f"{lo:.{digits}f}–{hi:.{digits}f}{unit}"
    )


def _gap_text(d: Diff) -> str:
    """``"0.80° [0.31, 1.29]"``, marked *one seed* where it is one seed's interval (over persons). Unsigned: the
    sentence says the direction ("below … by"), and "below by +1.19°" would read as a rise."""
    return f"{d.mean:.2f}° {d.interval_text()}" + (" (one seed)" if d.n == 1 and d.interval is not None else "")


def _deg_range(idx: Index, method: str, items: Sequence[tuple[str, float, float]]) -> str:
    """``"0.80° [0.31, 1.29] (E→M) to 2.10° [1.50, 2.70] (S→W)"``: the smallest and the largest difference
    source-only − ``method`` over the pairs of ``items``, each with its interval (the same comparisons the
    sentence counts as clear)."""
    gaps = sorted((d.mean, p, d) for p, _, _ in items if (d := diff(idx, "source-only", method, [p])) is not None)
    if not gaps:
        return _range([d for _, d, _ in items], 2, "°")
    (_, lo_pair, lo), (_, hi_pair, hi) = gaps[0], gaps[-1]
    if lo_pair == hi_pair:
        return _gap_text(lo)
    low, high = (_gap_text(d) for d in (lo, hi))
    return f"{low} ({lo_pair}) to {high} ({hi_pair})"


def _share_range(idx: Index, method: str, items: Sequence[tuple[str, float, float]]) -> str:
    """``"from 12 % [5, 20] (E→M) to 30 % [22, 37] (S→W)"``: the smallest and the largest ``(source-only − method) /
    source-only`` over the pairs of ``items``, each the ratio of the means with its 95 % interval (Fieller's)."""
    gaps = {p: ratio(idx, (("source-only", 1.0), (method, -1.0)), (("source-only", 1.0),), [p]) for p, _, _ in items}
    ranked = sorted(((r.value, p, r) for p, r in gaps.items() if r is not None and r.value is not None))
    if not ranked:
        return _range([100 * d / ref for _, d, ref in items], 0, " %")
    (_, lo_pair, lo), (_, hi_pair, hi) = ranked[0], ranked[-1]
    if lo_pair == hi_pair:
        return lo.text()
    return f"from {lo.text()} ({lo_pair}) to {hi.text()} ({hi_pair})"


def _below_source_only(idx: Index, pairs: Sequence[str], method: str) -> list[tuple[str, float, float]]:
    """``(pair, source-only − method, source-only)`` for every pair where both rows exist, source-only read on the
    seeds ``method`` has (each seed its own source model and persons: means over other seeds would not compare)."""
    out = []
    for p in pairs:
        other = cell(idx, method, p)
        ref = None if other is None else cell_covering(idx, "source-only", p, other.values)
        if ref and other:
            out.append((p, ref.mean - other.mean, ref.mean))
    return out


def _gap_sentence(
    idx: Index, method: str, items: list[tuple[str, float, float]], subject: str, by: str, missing: str
) -> str:
    """ "<subject> on k of n pairs (j called clear), <by> <range> (<share>); <missing> on <pairs>." for the gaps
    source-only − ``method`` that should be > 0 (each with its interval in the sanity table; "descriptive" where
    none of them is in the page's declared family, so none can be clear)."""
    below = [g for g in items if g[1] > 0]
    gaps = [d for p, _, _ in below if (d := diff(idx, "source-only", method, [p])) is not None]
    text = f"{subject} on {len(below)} of {len(items)} pairs ({clear_count(gaps)})"
    if below:
        text += f"{by}{_deg_range(idx, method, below)} ({_share_range(idx, method, below)} of the source-only error)"
    if len(below) < len(items):
        # each with its interval: "no gap in the means" is a comparison too
        none = [(p, diff(idx, "source-only", method, [p])) for p, gap, _ in items if gap <= 0]
        text += f"; {missing} in the means on " + ", ".join(_with_interval(p, d, seeds_of(idx)) for p, d in none)
    compared = {g[0] for g in items}
    unmatched = [p for p in pairs_of(idx) if p not in compared and cell(idx, method, p) and cell(idx, "source-only", p)]
    if unmatched:  # compared on the method's own seeds only (_below_source_only)
        text += f"; not compared on {', '.join(unmatched)}, where source-only lacks some of its seeds"
    return text + "."


def _label_spread_sentence(idx: Index) -> list[str]:
    """The in-domain and cross-domain errors as shares of a constant prediction's, each with its interval, and
    on how many pairs the cross-domain share is the larger (descriptive differences; none without those)."""
    shares = []
    for pair in pairs_of(idx):
        # both levels on the seeds of the difference beside them, so that the counts below read the same seeds
        d = described(idx, "source-only", "in-domain", [pair], label_spread)
        seeds = None if d is None else list(d.per_seed)
        ind, src = (level(idx, m, pair, label_spread, seeds) for m in ("in-domain", "source-only"))
        if ind and src:
            shares.append((pair, ind, src, d))
    if not shares:
        return []
    worse = [p for p, a, b, _ in shares if b.mean > a.mean]
    beyond = [p for p, _, _, d in shares if d is not None and d.interval is not None and d.interval[0] > 0]
    return [
        "Relative to the spread of the labels (the error of always predicting the set's mean gaze), the "
        "in-domain error is "
        + ", ".join(a.format_percent() for _, a, _, _ in shares)
        + " of a constant prediction's and the cross-domain error "
        + ", ".join(b.format_percent() for _, _, b, _ in shares)
        + f" ({', '.join(p for p, _, _, _ in shares)}; 95 % intervals): relatively worse across domains "
        f"on {len(worse)} of {len(shares)} pairs in the means, beyond the interval of the difference on "
        f"{len(beyond)} (descriptive: outside the page's family, no verdict)."
    ]


def _headroom_sentences(idx: Index, pairs: Sequence[str]) -> list[str]:
    """The oracle's headroom below source-only, and the share of it Alfa recovers (none without an oracle)."""
    rooms = _below_source_only(idx, pairs, "oracle")
    if not rooms:
        return []
    lines = [
        _gap_sentence(
            idx,
            "oracle",
            rooms,
            "The oracle (per-person supervised fine-tuning) is below source-only",
            ": headroom ",
            "NO headroom",
        )
    ]
    if "alfa" in {m for (m, _, _) in idx}:
        # all three rows on the seeds that have all three (each seed its own models and persons)
        shares = [(p, r) for p, _, _ in rooms if (r := share(idx, "alfa", [p])) is not None and r.d > 0]
        if shares:
            lines.append(
                "Share of the headroom Alfa recovers (source-only − Alfa, over source-only − oracle: the ratio of "
                "the means on the seeds all three rows have, with its 95 % interval, Fieller's, § Protocol; no "
                "finite interval where the headroom is not clear of zero): "
                + ", ".join(f"{p} {r.text(every=cell(idx, 'source-only', p).values)}" for p, r in shares)
                + "."
            )
    return lines


def sanity_verdicts(idx: Index) -> list[str]:
    """The domain gap, the within-dataset yardstick, the errors relative to the labels' spread, the headroom."""
    lines = []
    pairs = pairs_of(idx)
    gaps = _below_source_only(idx, pairs, "in-domain")
    if gaps:
        sentence = _gap_sentence(
            idx,
            "in-domain",
            gaps,
            "In-domain error (the base on held-out source persons) is below the cross-domain source-only error",
            ", by ",
            "NO domain gap",
        )
        no_gap = [p for p, gap, _ in gaps if gap <= 0]
        for source in sorted({split_pair(p)[0] for p in no_gap}):
            if IN_DOMAIN_CONDITION.get(source, True):
                continue
            # where the real data have no gap either (docs/calibration.md), say so beside it
            on = ", ".join(p for p in no_gap if split_pair(p)[0] == source)
            sentence += (
                f" On {on} the real data have none either: a model trained on {REAL_SOURCE_NAMES[source]} (what "
                f"{source} stands for) errs more on its held-out persons (about {REAL_IN_DOMAIN[source]:g}°) than "
                "across (docs/calibration.md)."
            )
        lines.append(sentence)
    own = _below_source_only(idx, pairs, "target-trained")
    if own:
        lines.append(
            _gap_sentence(
                idx,
                "target-trained",
                own,
                "The same model trained on other persons of the target world (the within-dataset yardstick of the "
                "gaze literature) is below the source model on the target's scored persons",
                ", by ",
                "NOT",
            )
        )
    return lines + _label_spread_sentence(idx) + _headroom_sentences(idx, pairs)


# ----------------------------------------------------------------------------- yaw and pitch; ablations


def parts_verdicts(idx: Index, methods: Sequence[str]) -> list[str]:
    """Where each method's change of error against source-only lies: yaw or pitch, scatter or bias."""
    pairs = pairs_of(idx)
    out = []
    compared: list[tuple[str, Diff]] = []
    for m in methods:
        if m == "source-only" or _parts_missing(idx, (m, "source-only"), pairs):
            continue
        total = diff(idx, m, "source-only", pairs)
        if total is None:
            continue
        compared.append((m, total))
        if m == "alfa":
            for key, what in (("yaw", "yaw error"), ("pitch", "pitch error"), ("pitch_bias", "absolute pitch bias")):
                d = diff(idx, m, "source-only", pairs, part(key))
                if d is not None:
                    out.append(f"Alfa − source-only, pooled over pairs{_on(d, seeds_of(idx))}: {what} {d.describe()}.")
    worse = [(m, d) for m, d in compared if d.mean > 0]
    if worse:
        gaps = [(m, diff(idx, m, "source-only", pairs, part_gap("pitch", "yaw"))) for m, _ in worse]
        led = [(m, g) for m, g in gaps if g is not None and g.mean > 0]
        text = (
            f"Of the yaw-and-pitch table's {len(compared)} rows compared with source-only, {len(worse)} end above it "
            f"({clear_count([d for _, d in worse])}); for {len(led)} of those the pitch error grew more than "
            f"the yaw error ({clear_count([g for _, g in led])})"
        )
        if led:
            text += "; change of pitch error − change of yaw error: " + "; ".join(
                f"{_name(m)} {g.compact()}{seeds_note(g.per_seed, seeds_of(idx))}" for m, g in led
            )
        out.append(text + ".")
    return out


def _parts_missing(idx: Index, methods: Sequence[str], pairs: Sequence[str]) -> bool:
    """Whether a record of ``methods`` on ``pairs`` lacks the yaw/pitch parts (scored before they were
    measured), or a method has none."""
    records = [r for (m, p, _), r in idx.items() if m in methods and p in pairs]
    return not records or any(not r.per_person_parts for r in records)


def ablation_verdicts(idx: Index, name: str, layout: Sequence[dict[str, Any]], pairs: Sequence[str]) -> list[str]:
    """Plain sentences for one ablation, pooled over its pairs (none for an ablation this alfa does not know)."""
    ablation = REGISTRY.get(name)
    return ablation.sentences(idx, layout, pairs) if ablation is not None else []
