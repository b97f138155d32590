"""``docs/data/bench-v2`` → ``docs/results-user-calibration.md``: what a few labels are worth (issue 25), from the
user-calibration rows of the benchmark (:mod:`alfa.study.bench.user_calibration`) beside its label-free rows and
the oracle. Never edit the output by hand; ``alfa pages --write`` makes it.

What the page answers, as docs/user-calibration.md §4–5 declared it: issue 25's pass criteria per pair (the
default calibration at ``k`` = 9 closes at least 60 % of the labelled headroom; at ``k`` = 1 it is never worse
than source-only beyond the interval), the error against ``k`` of every method (a table with 95 % intervals and
a figure), what each label-free row is worth in labelled images, random against spread draws, and the cost per
person. Every comparison here is descriptive: quoted with its 95 % interval (persons and seeds drawn,
:mod:`alfa.study.bench.stats`), never called clear. What has no record yet is named, and nothing is read from
its absence.
"""

from __future__ import annotations

import os
import statistics
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from ..timing import median_text
from .markdown import seeds_note, span, spans, usual_seeds
from .methods import (
    ADAPTER_KS,
    CALIBRATION_DRAWS,
    CALIBRATION_KS,
    CALIBRATION_ROW_METHODS,
    DEFAULT_CALIBRATION,
    FAZE_CALIBRATIONS,
    FIRST_SEEDS,
    PAIRS,
    REPLICATE_SEEDS,
    SHRUNK_AFFINE,
    calibration_draws,
    calibration_ks,
    calibration_label,
    calibration_rows,
)
from .names import SELECTED, display_name
from .ratios import Ratio, share
from .record import Record, as_records
from .stats import (
    Comparisons,
    Diff,
    Index,
    Measure,
    Stat,
    cell,
    cell_on,
    design_of,
    diff,
    index_records,
    pooled,
    seeds_of,
)
from .tta_report import LABEL_FREE_BASELINES

__all__ = [
    "user_calibration_page",
    "write_user_calibration_page",
    "default_choice",
    "HEADROOM_SHARE",
    "PASS_K",
    "SAFE_K",
]

HEADROOM_SHARE = 0.6
"""Issue 25: the default calibration at :data:`PASS_K` closes at least this share of source-only → oracle."""
PASS_K = 9
SAFE_K = 1
"""Issue 25: at this ``k`` the default calibration is never worse than source-only beyond the interval."""
LABEL_FREE = ("flip-tta", "roll-tta", "group-tta")
"""The label-free rows without training (``k`` = 0); the selected flip recipes (``*[selected]``) join them."""
# Issue 26's trained label-free rows (LABEL_FREE_BASELINES) are not in §4's list of k = 0 rows (declared before
# they existed): the worth table shows them beside those where they have records (descriptive, like the rest).
FIGURE = "error_vs_k.png"
FAZE_ROWS = {model: row for row, model in FAZE_CALIBRATIONS.items()}
RULE_CANDIDATES = (DEFAULT_CALIBRATION, "adapter-alfa", "adapter-lora")
"""docs/user-calibration.md §5.5: the declared default first, then the adapters that may replace it."""
RULE_SEEDS = (0, 1)
RULE_PAIRS = ("E→M", "E→D", "G→M", "G→D")
RULE_MARGIN = 0.10
"""By how much (a share of the headroom) an adapter's score must beat the declared default's to replace it."""


def _cal(method: str, k: int, draw: str = "random") -> str:
    return calibration_label(method, k, draw)


def _pairs(idx: Index) -> list[str]:
    """The pairs with any user-calibration record, in the benchmark's order."""
    rows = set(calibration_rows())
    return [p for p in PAIRS if any((m, p, s) in idx for m in rows for s in seeds_of(idx))]


def _seeds(idx: Index, labels: Sequence[str], pairs: Sequence[str]) -> set[int]:
    """The seeds on which every row of ``labels`` has every pair of ``pairs``."""
    return {s for s in seeds_of(idx) if all((m, p, s) in idx for m in labels for p in pairs)}


def _with_seeds(d: Diff, *notes: str) -> str:
    """A difference as a cell, with the seeds it pools (rows of this page have different seeds, and a difference
    is on those both rows have) and ``notes``: ``"+0.15 [0.01, 0.29] (seeds 3–4)"``; ``"(one seed: 0)"`` where it
    has one, whose interval draws persons only."""
    seeds = f"one seed: {spans(d.per_seed)}" if d.n == 1 else f"seeds {spans(d.per_seed)}"
    return f"{d.mean_interval_text()} ({'; '.join([seeds, *notes])})"


def _usual(seed_sets: Sequence[tuple[str, set[int]]]) -> tuple[str, dict[str, str]]:
    """The seeds most of ``(column, seeds)`` have, as a *seeds* column's text, and the others' own as
    :func:`_with_seeds` says them (``{column: " (seeds 0–1)"}``, ``" (one seed: 0)"``), for the cells to name."""
    sets = [tuple(sorted(seeds)) for _, seeds in seed_sets]
    usual = usual_seeds(sets)
    odd = {
        c: f" ({'one seed: ' if len(seeds) == 1 else 'seeds '}{spans(seeds)})"
        for c, seeds in seed_sets
        if tuple(sorted(seeds)) != usual
    }
    return spans(usual), odd


def _share(idx: Index, pair: str, method: str = DEFAULT_CALIBRATION, among: set[int] | None = None) -> Ratio | None:
    """The share of the headroom the calibration at :data:`PASS_K` closes on ``pair``, the ratio of the means over
    the seeds (of ``among``, if given) that have source-only, the oracle and the row (docs/user-calibration.md §4:
    means over seeds), with its 95 % interval (:mod:`alfa.study.bench.ratios`); ``None`` where no seed has all
    three or the oracle's mean is not below source-only's."""
    got = share(idx, _cal(method, PASS_K), [pair], among)
    return got if got is not None and got.d > 0 else None


def _criteria_table(
    idx: Index,
    pairs: Sequence[str],
    method: str = DEFAULT_CALIBRATION,
    safe_method: str | None = None,
    every: Iterable[int] = FIRST_SEEDS,
) -> list[str]:
    """Issue 25's criteria per pair for ``method`` at :data:`PASS_K` and ``safe_method`` (default: ``method``)
    at :data:`SAFE_K`. ``every``: the seeds the section says it reads; a pair whose row has others names them
    (``E→M (seed 2)``), and a share or difference on other seeds than its pair's names its own."""
    safe_method = method if safe_method is None else safe_method
    default = display_name(_cal(method, PASS_K))
    lines = [
        f"| pair | source-only | oracle | {default} | headroom closed (≥ {HEADROOM_SHARE:.0%}) | "
        f"k = {SAFE_K} − source-only, 95 % interval | verdict |",
        "|---|---|---|---|---|---|---|",
    ]
    for pair in pairs:
        seeds = _seeds(idx, [_cal(method, PASS_K)], [pair])  # source-only and the oracle on the row's seeds
        cells = [cell_on(idx, m, [pair], seeds) for m in ("source-only", "oracle", _cal(method, PASS_K))]
        share = _share(idx, pair, method)
        safe = diff(idx, _cal(safe_method, SAFE_K), "source-only", [pair])
        verdicts = []
        if share is None:
            verdicts.append("headroom: no record")
        else:
            verdicts.append(f"headroom {'met' if (share.value or 0.0) >= HEADROOM_SHARE else 'missed'}")
        if safe is None or safe.interval is None:
            verdicts.append(f"k = {SAFE_K}: no interval")
        else:
            verdicts.append(f"k = {SAFE_K}: {'worse beyond the interval' if safe.interval[0] > 0 else 'not worse'}")
        share_text = "—" if share is None else share.text(every=seeds)
        safe_text = "—" if safe is None else safe.compact() if set(safe.per_seed) == seeds else _with_seeds(safe)
        lines.append(
            f"| {pair}{seeds_note(seeds, every) if seeds else ''} | "
            + " | ".join("—" if c is None else c.format() for c in cells)
            + f" | {share_text} | {safe_text} | {'; '.join(verdicts)} |"
        )
    return lines


def default_choice(idx: Index) -> tuple[str | None, dict[str, float | None]]:
    """docs/user-calibration.md §5.5's rule: per candidate, the smallest share of the headroom it closes at
    :data:`PASS_K` over :data:`RULE_PAIRS`, from the means over :data:`RULE_SEEDS`; the best adapter replaces the
    declared default only if its score beats the default's by :data:`RULE_MARGIN`. ``(None, scores)`` while a
    candidate lacks any of those seeds and pairs (the rule is not applied before)."""
    return _choice_of({method: _rule_score(idx, method) for method in RULE_CANDIDATES})


def _choice_of(lowest: dict[str, tuple[str, Ratio] | None]) -> tuple[str | None, dict[str, float | None]]:
    """:func:`default_choice` from each candidate's :func:`_rule_score` (read once by the page that prints them)."""
    scores = {method: None if low is None else low[1].value for method, low in lowest.items()}
    if any(v is None for v in scores.values()):
        return None, scores
    best = max(RULE_CANDIDATES[1:], key=lambda m: scores[m] or 0.0)
    declared = scores[DEFAULT_CALIBRATION] or 0.0
    return (best if (scores[best] or 0.0) >= declared + RULE_MARGIN else DEFAULT_CALIBRATION), scores


def _rule_score(idx: Index, method: str) -> tuple[str, Ratio] | None:
    """The pair of :data:`RULE_PAIRS` where ``method`` closes the smallest share of the headroom on
    :data:`RULE_SEEDS`, and that share; ``None`` while a pair lacks a share on all of those seeds."""
    shares = {pair: _share(idx, pair, method, set(RULE_SEEDS)) for pair in RULE_PAIRS}
    if any(r is None or set(r.seeds) != set(RULE_SEEDS) for r in shares.values()):
        return None
    return min(((p, r) for p, r in shares.items() if r is not None), key=lambda item: item[1].value or 0.0)


def _not_applied(idx: Index) -> str:
    """Why :func:`default_choice` chose nothing: missing records, or a rule pair without headroom (the oracle
    not below source-only on those seeds), where §5.5 defines no share."""
    rows = ("source-only", "oracle", *(_cal(m, PASS_K) for m in RULE_CANDIDATES))
    if all((row, pair, s) in idx for row in rows for pair in RULE_PAIRS for s in RULE_SEEDS):
        return (
            "Not applied: on a pair of the rule the oracle is not below source-only on those seeds, so no share of "
            "a headroom exists there, and §5.5 says nothing of that case."
        )
    return "Not applied yet: a candidate lacks some of those seeds and pairs."


def _index(records: Sequence[Record], results: dict[str, Any]) -> Index:
    """``records`` indexed for this page, whose comparisons are all descriptive (an empty declared family)."""
    return index_records(records, Comparisons(persons=design_of(results), declared=frozenset()))


def _held_out(records: Sequence[Record], results: dict[str, Any]) -> Index:
    """The records §5.5's rule never reads: every seed but :data:`RULE_SEEDS` on :data:`RULE_PAIRS`, every seed
    elsewhere."""
    kept = [r for r in records if r.pair not in RULE_PAIRS or int(r.seed) not in RULE_SEEDS]
    return _index(kept, results)


def _choice_section(idx: Index, records: Sequence[Record], results: dict[str, Any]) -> list[str]:
    lowest = {m: _rule_score(idx, m) for m in RULE_CANDIDATES}
    choice, _ = _choice_of(lowest)
    score_text = ", ".join(
        f"`{m}` " + ("—" if low is None else f"{low[1].text()} on {low[0]}") for m, low in lowest.items()
    )
    lines = [
        "## Whether the default changes (user-calibration.md §5.5)",
        "",
        f"The declared rule, on seeds {', '.join(map(str, RULE_SEEDS))} of {', '.join(RULE_PAIRS)} only: each "
        f"candidate's smallest share of the headroom closed at k = {PASS_K} over those pairs (the ratio of "
        f"the means, with its 95 % interval, on the pair where it is smallest) — {score_text}. "
        + (
            _not_applied(idx)
            if choice is None
            else f"An adapter replaces `{DEFAULT_CALIBRATION}` only if it beats it by {RULE_MARGIN * 100:.0f} "
            f"points: the rule's choice is **`{choice}`**"
            + (
                ""
                if choice == DEFAULT_CALIBRATION
                else f" from k = {min(ADAPTER_KS)} on (`{DEFAULT_CALIBRATION}` below)"
            )
            + "."
        ),
        "",
    ]
    held = _held_out(records, results)
    held_pairs = _pairs(held)
    if not held_pairs:
        lines += ["No record the rule never read exists yet (seed 2, S→W, S→C).", ""]
    else:
        lines += [
            f"Issue 25's criteria for {'the declared default' if choice is None else 'the rule’s choice'}, on the "
            f"records the rule never read (of seeds {span(FIRST_SEEDS)}: seeds other than "
            f"{', '.join(map(str, RULE_SEEDS))} on "
            f"{', '.join(RULE_PAIRS)}; every seed of the other pairs), computed as above (a pair names its seeds "
            f"where they are not all of {span(FIRST_SEEDS)}):",
            "",
            *_criteria_table(held, held_pairs, DEFAULT_CALIBRATION if choice is None else choice, DEFAULT_CALIBRATION),
            "",
        ]
    if choice in (None, DEFAULT_CALIBRATION):  # the first table reads the default on every pair and seed already
        return lines
    # §5.5 item 4: a chosen adapter is judged on every pair and seed too, beside the held-out reading
    return [
        *lines,
        f"The same criteria for the rule's choice on every pair and seed, as the first table reads "
        f"`{DEFAULT_CALIBRATION}` (k = {SAFE_K}: `{DEFAULT_CALIBRATION}`'s, the adapters having no row below "
        f"{min(ADAPTER_KS)}):",
        "",
        *_criteria_table(idx, _pairs(idx), choice, DEFAULT_CALIBRATION),
        "",
    ]


def _replicate_criteria(records: Sequence[Record], results: dict[str, Any]) -> list[str]:
    """Issue 25's criteria for the default on :data:`REPLICATE_SEEDS` alone, where they have records: a
    replicate of the declared reading, made on another kind of machine, shown beside it and never pooled into it
    (docs/flip-premise.md §7.2, amended 2026-12-04)."""
    kept = [r for r in records if int(r.seed) in REPLICATE_SEEDS]
    idx = _index(kept, results)
    pairs = _pairs(idx)
    if not pairs:
        return []
    return [
        f"The same criteria for the default on the replicate seeds {span(REPLICATE_SEEDS)} "
        f"alone (every row of seeds {span(FIRST_SEEDS)} declared again there when no machine of their kind was lent; "
        "descriptive, beside the declared reading above and not pooled into it):",
        "",
        *_criteria_table(idx, pairs, every=REPLICATE_SEEDS),
        "",
    ]


def _curve_table(idx: Index, pairs: Sequence[str]) -> list[str]:
    """Error against ``k``, pooled over ``pairs`` (per seed the mean over them; a seed without every pair is
    left out), each cell with its 95 % interval over seeds."""
    head = "| row | seeds | k = 0 (source-only, the row's seeds) | " + " | ".join(f"k = {k}" for k in CALIBRATION_KS)
    lines = [head + " |", "|---|---|" + "---|" * (len(CALIBRATION_KS) + 1)]
    for method in CALIBRATION_ROW_METHODS:
        for draw in CALIBRATION_DRAWS:
            # one line of seeds: those with every k of the row on every pair, k = 0 (source-only) read on them too
            labels = [_cal(method, k, draw) for k in calibration_ks(method) if draw in calibration_draws(method)]
            seeds = _seeds(idx, labels, pairs)
            if not labels or not seeds:
                continue
            stats = [cell_on(idx, _cal(method, k, draw), pairs, seeds) for k in CALIBRATION_KS]
            base = cell_on(idx, "source-only", pairs, seeds)
            name = f"{method}{'' if draw == 'random' else ' (spread draws)'}"
            cells = ["—" if s is None else s.format() for s in [base, *stats]]
            lines.append(f"| {name} | {spans(seeds)} | " + " | ".join(cells) + " |")
    return lines


def _label_free(idx: Index) -> list[str]:
    present = {m for (m, _, _) in idx}
    selected = sorted(m for m in present if m.endswith(SELECTED))
    return [m for m in (*LABEL_FREE, *LABEL_FREE_BASELINES) if m in present] + selected


def _smallest(diffs: Sequence[tuple[int, Any]], reached: Any) -> str | None:
    """The smallest ``k`` whose difference ``reached`` holds, ``"> 16"`` where every ``k`` was read and none did;
    ``None`` where a smaller ``k`` has no record (or no interval) to read, so the smallest cannot be told."""
    for k, d in diffs:
        verdict = None if d is None else reached(d)
        if verdict is None:
            return None
        if verdict:
            return f"k = {k}"
    return f"> {CALIBRATION_KS[-1]}"


def _worth(idx: Index, pairs: Sequence[str]) -> list[str]:
    """Per label-free row and pair: the smallest ``k`` at which the default calibration's mean is at or below
    the row's, and the smallest at which the upper end of the difference's 95 % interval is; each read only
    where every smaller ``k`` has its record (a ``k`` without one is never skipped over). The row's *seeds*: those
    its differences are on (a pair on others names its own)."""
    rows = _label_free(idx)
    if not rows:
        return ["No label-free row has a record on these pairs yet."]
    lines = ["| label-free row | seeds | " + " | ".join(pairs) + " |", "|---|---|" + "---|" * len(pairs)]
    for row in rows:
        cells, seeds, ones = [], [], set()
        for pair in pairs:
            diffs = [(k, diff(idx, _cal(DEFAULT_CALIBRATION, k), row, [pair])) for k in CALIBRATION_KS]
            at_mean = _smallest(diffs, lambda d: d.mean <= 0)
            at_interval = _smallest(diffs, lambda d: None if d.interval is None else d.interval[1] <= 0)
            if at_mean is None and at_interval is None:
                cells.append("—")
            else:
                # a row of one seed so far: its interval draws persons only, narrower than the others'
                if all(d.n == 1 for _, d in diffs if d is not None):
                    ones.add(pair)
                seeds.append((pair, set().union(*(d.per_seed for _, d in diffs if d is not None))))
                cells.append(f"{at_mean or '—'} ({at_interval or '—'} by its interval)")
        usual, odd = _usual(seeds)  # a pair of other seeds names them, else "(one seed)" says a row of one
        cells = [c if c == "—" else c + odd.get(p, " (one seed)" if p in ones else "") for p, c in zip(pairs, cells)]
        lines.append(f"| {display_name(row)} | {usual} | " + " | ".join(cells) + " |")
    return lines


def _draws_table(idx: Index, pairs: Sequence[str]) -> list[str]:
    """Spread − random per method and ``k``, pooled over ``pairs``, on the seeds of the row's *seeds* column (a
    cell on others names its own)."""
    lines = ["| method | seeds | " + " | ".join(f"k = {k}" for k in CALIBRATION_KS) + " |"]
    lines.append("|---|---|" + "---|" * len(CALIBRATION_KS))
    for method in CALIBRATION_ROW_METHODS:
        diffs = [(f"k = {k}", diff(idx, _cal(method, k, "spread"), _cal(method, k), pairs)) for k in CALIBRATION_KS]
        usual, odd = _usual([(k, set(d.per_seed)) for k, d in diffs if d is not None])
        cells = ["—" if d is None else _with_seeds(d) if k in odd else d.compact() for k, d in diffs]
        if any(c != "—" for c in cells):
            lines.append(f"| {method} | {usual} | " + " | ".join(cells) + " |")
    return lines


def _on_pairs_with_both(idx: Index, a: str, b: str, pairs: Sequence[str]) -> str:
    """While the run is under way, ``a − b`` on the pairs both rows have (named), so that a reader need not wait
    for the last pair; "—" where that is every pair (the pooled column says it) or none."""
    have = [p for p in pairs if diff(idx, a, b, [p]) is not None]
    part = diff(idx, a, b, have) if have and len(have) < len(pairs) else None
    return "—" if part is None else _with_seeds(part, ", ".join(have))


def _adapters_table(idx: Index, pairs: Sequence[str]) -> list[str]:
    """Alfa − LoRA as the calibration adapter, supervised and semi-supervised, at each ``k`` of the adapters."""
    lines = [
        "| loss | k | Alfa − LoRA | on the pairs that have both rows so far | trainable numbers (Alfa, LoRA) |",
        "|---|---|---|---|---|",
    ]
    for loss, (alfa, lora) in (
        ("supervised", ("adapter-alfa", "adapter-lora")),
        ("supervised, LoRA at Alfa's trainable count (§5.6)", ("adapter-alfa", "adapter-lora-matched")),
        ("+ flip loss (semi-supervised)", ("adapter-alfa-semi", "adapter-lora-semi")),
    ):
        for k in ADAPTER_KS:
            d = diff(idx, _cal(alfa, k), _cal(lora, k), pairs)
            part_text = _on_pairs_with_both(idx, _cal(alfa, k), _cal(lora, k), pairs)
            sizes = []
            for method in (alfa, lora):
                found = [r.trainable_params for (m, _, _), r in idx.items() if m == _cal(method, k)]
                sizes.append(f"{found[0]:,}" if found else "—")
            cells = [loss, str(k), "—" if d is None else _with_seeds(d), part_text, ", ".join(sizes)]
            lines.append("| " + " | ".join(cells) + " |")
    return lines


UNCALIBRATED = Measure("error before calibration", lambda record: (record.calibration["uncalibrated_deg"], {}))
"""A calibration record's model before calibration (k = 0), on the same images."""


def _uncalibrated(idx: Index, label: str, pairs: Sequence[str], seeds: Iterable[int] | None = None) -> str:
    """The row's model's error before calibration (k = 0) on those of ``pairs`` it has: per seed (of ``seeds``, if
    given) the mean over them, then the mean over the seeds that have them all, with its 95 % t-interval
    (:meth:`Stat.format`)."""
    kept = set(seeds_of(idx) if seeds is None else seeds)
    present = [p for p in pairs if any((label, p, s) in idx for s in kept)]
    stat = pooled(idx, label, present, UNCALIBRATED) if present else None
    values = {s: v for s, v in stat.values.items() if s in kept} if stat else {}
    return Stat(values).format() if values else "—"


def _faze_table(idx: Index, pairs: Sequence[str]) -> list[str]:
    meta, plain = FAZE_ROWS["meta"], FAZE_ROWS["plain"]
    lines = [
        "| k | meta − plain | on the pairs that have both rows so far | meta-learned, before calibration | plain, "
        "before calibration |"
    ]
    lines.append("|---|---|---|---|---|")
    for k in CALIBRATION_KS:
        d = diff(idx, _cal(meta, k), _cal(plain, k), pairs)
        part = _on_pairs_with_both(idx, _cal(meta, k), _cal(plain, k), pairs)
        # before calibration on the difference's seeds, where it has some: the same images
        before = [_uncalibrated(idx, _cal(m, k), pairs, d.per_seed if d else None) for m in (meta, plain)]
        lines.append(f"| {k} | {'—' if d is None else _with_seeds(d)} | {part} | {before[0]} | {before[1]} |")
    return lines


def _costs_table(idx: Index) -> list[str]:
    lines = [
        f"| method (k = {PASS_K}) | seconds per calibration (median, 95 % interval) | "
        "the row's CPU seconds per calibration (median, 95 % interval) | numbers stored | file bytes | merges | "
        "records | seeds |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for method in CALIBRATION_ROW_METHODS:
        records = [r for (m, _, _), r in idx.items() if m == _cal(method, PASS_K)]
        if not records:
            continue
        wall = [float(r.seconds_per_user) for r in records if r.seconds_per_user is not None]
        cpu = [float(r.cpu_seconds_per_user) for r in records if r.cpu_seconds_per_user is not None]
        seconds, cpu_seconds = (median_text(t, 3) for t in (wall, cpu))
        numbers = statistics.median(r.trainable_params for r in records)
        size = statistics.median(float(r.adapter_bytes or 0) for r in records)
        seeds = spans(int(r.seed) for r in records)
        lines.append(
            f"| {method} | {seconds} | {cpu_seconds} | {int(numbers):,} | {int(size):,} | {records[0].merge} | "
            f"{len(records)} | {seeds} |"
        )
    return lines


def _plot(idx: Index, pairs: Sequence[str], path: Path) -> Path:
    """Error against k, one panel per pair (three to a row): a method keeps its colour in every panel, the draw is
    the line's style, and one legend below the panels says both (on a panel it hid the lines)."""
    from matplotlib.lines import Line2D

    from alfa.study.plotted import save_figure

    from .figures import DPI, _plt

    plt = _plt()
    columns = min(3, len(pairs))
    rows = -(-len(pairs) // columns)
    fig, axes = plt.subplots(rows, columns, figsize=(4.2 * columns, 3.4 * rows), squeeze=False)
    tab20 = plt.get_cmap("tab20").colors  # more methods than tab10 has colours: its ten, then their light twins
    palette = [*tab20[0::2], *tab20[1::2]]
    colour = {m: palette[i % len(palette)] for i, m in enumerate(CALIBRATION_ROW_METHODS)}
    dash = {"random": "-", "spread": "--"}
    references = {"flip-tta": ":", "oracle": "-."}
    xs = [0, *CALIBRATION_KS]
    for ax, pair in zip(axes.flat, pairs):
        for method in CALIBRATION_ROW_METHODS:
            for draw in (d for d in CALIBRATION_DRAWS if d in calibration_draws(method)):
                ks = calibration_ks(method)
                seeds = _seeds(idx, [_cal(method, k, draw) for k in ks], [pair])  # seeds with the whole line
                base = cell_on(idx, "source-only", [pair], seeds)
                points = [(0, base)] + [(k, cell_on(idx, _cal(method, k, draw), [pair], seeds)) for k in ks]
                # one seed: no bar (its interval is over persons only, and the table marks it)
                points = [(x, s.mean, s.seed_half_width or 0.0) for x, s in points if s is not None]
                if len(points) > 1:
                    xs_, ys_, errs = zip(*points)
                    ax.errorbar(
                        xs_,
                        ys_,
                        yerr=errs,
                        ls=dash[draw],
                        color=colour[method],
                        marker="o",
                        markersize=3,
                        capsize=2,
                        linewidth=1,
                        label=f"{method} {draw}",
                    )
        for row, style in references.items():
            s = cell(idx, row, pair)
            if s is not None:
                ax.axhline(s.mean, linestyle=style, color="black", linewidth=1, label=display_name(row))
        ax.set_xscale("symlog", linthresh=1)
        ax.set_xticks(xs, [str(x) for x in xs], fontsize=7)
        ax.set_title(pair, fontsize=9)
        ax.set_xlabel("labelled images k (0: source-only)", fontsize=8)
        ax.set_ylabel("error (°), mean over seeds", fontsize=8)
        ax.tick_params(axis="y", labelsize=7)
    for ax in list(axes.flat)[len(pairs) :]:
        ax.set_visible(False)
    handles = [Line2D([], [], color=colour[m], marker="o", markersize=3, label=m) for m in CALIBRATION_ROW_METHODS]
    handles += [Line2D([], [], color="gray", ls=dash[d], label=f"{d} draw") for d in CALIBRATION_DRAWS]
    handles += [Line2D([], [], color="black", ls=style, label=display_name(r)) for r, style in references.items()]
    fig.legend(handles=handles, loc="lower center", ncol=5, fontsize=7, frameon=False)
    fig.suptitle(
        "User calibration: error against the number of labelled images per person (bars: 95 % interval over seeds)",
        fontsize=9,
    )
    fig.tight_layout(rect=(0, 0.16 if rows == 1 else 0.1, 1, 1))
    return save_figure(fig, path, dpi=DPI)


PROTOCOL = "user-calibration.md"
"""The protocol's page, beside this page in docs/."""


def _header(
    records: Sequence[Record],
    pairs: Sequence[str],
    data: str,
    command: str,
    design: str,
    beside_protocol: bool,
    preset: str | None,
) -> list[str]:
    """The page's title, provenance, what its intervals draw (``design``: how the persons meet the seeds,
    :func:`~alfa.study.bench.stats.design_of`) and how much of the declared rows the records hold (of a smoke or
    quick ``preset``, only how many it has: they are not the declared run's rows); the protocol is a link where the
    page lies beside it, else its path in the repository."""
    return [
        "# Results: what a few labels are worth (user calibration, issue 25)",
        "",
        f"Generated by `{command}` from `{data}`. Do not edit by hand. The protocol is "
        + (f"[{PROTOCOL}]({PROTOCOL})" if beside_protocol else f"docs/{PROTOCOL}")
        + " (§4, and §5 for how the benchmark runs it), declared before "
        "these rows ran. Every comparison on this page is descriptive, and none is called clear: its 95 % interval "
        + (
            "draws the seeds, each with its own persons (drawn afresh per seed, so a seed's mean already holds its "
            "persons' scatter)."
            if design == "nested"
            else "draws persons and seeds (the same persons in every seed)."
        ),
        "",
        _records_line(records, pairs, preset),
        "",
    ]


def _records_line(records: Sequence[Record], pairs: Sequence[str], preset: str | None) -> str:
    """How much of the declared rows the records hold; a smoke or quick run's records are not the declared run's
    rows, whatever their names: how many it has."""
    if preset != "standard":
        calibrations = sum(r.kind == "calibration" for r in records)
        return (
            f"**Records:** {calibrations} user-calibration record{'s' * (calibrations != 1)} of preset `{preset}`, "
            "a check that every row runs, not the declared run (whose page is docs/results-user-calibration.md); "
            "every sentence below that judges a difference is about noise."
        )
    rows = calibration_rows()
    held = {r.id for r in records if r.kind == "calibration"}
    seeds = (*FIRST_SEEDS, *REPLICATE_SEEDS)  # seeds 0–2 and their replicates (docs/flip-premise.md §7.2, 2026-12-04)
    declared = [f"{m}|{p}|seed{s}" for m in rows for p in PAIRS for s in seeds]
    return (
        f"**Records:** {sum(i in held for i in declared)} of the {len(declared)} user-calibration rows declared on "
        f"seeds {span(FIRST_SEEDS)} and on their replicates, seeds {span(REPLICATE_SEEDS)} ({len(rows)} rows × "
        f"{len(PAIRS)} pairs × {len(seeds)} seeds); pairs with any: "
        f"{', '.join(pairs) if pairs else 'none'}. On each pair, every row (source-only, the label-free rows, the "
        "oracle) is read only on seeds with user-calibration records there, and each table says which seeds its "
        "cells share. Every method of the protocol has its rows. A row without a record is shown as —, and "
        "nothing is read from its absence."
    )


def _criteria_section(same_seeds: Sequence[Record], results: dict[str, Any]) -> list[str]:
    """Issue 25's pass criteria on the seeds they were declared on (:data:`FIRST_SEEDS`), the replicate seeds'
    reading beside them, and §5.5's choice of the default."""
    # the criteria read the seeds they were declared on; the replicate seeds get their own table, beside them
    first_records = [r for r in same_seeds if int(r.seed) in FIRST_SEEDS]
    first = _index(first_records, results)
    return [
        "## Issue 25's pass criteria",
        "",
        f"Per pair, on seeds {span(FIRST_SEEDS)} (those the criteria were declared on; the "
        f"replicate seeds {span(REPLICATE_SEEDS)} have a table of their own below), means over "
        "the seeds that have the row (each cell: mean [95 % interval over seeds]): the "
        f"default calibration ({DEFAULT_CALIBRATION}) at k = {PASS_K} must close at least {HEADROOM_SHARE:.0%} of "
        f"the headroom from source-only to the oracle ((source-only − calibrated) / (source-only − oracle) of the "
        f"means over the seeds that have all three, judged on the means as declared; beside it Fieller's 95 % "
        f"interval of that ratio, none finite where the headroom is not clear of zero: `alfa.study.bench.ratios`; "
        f"source-only and the oracle are read on the row's seeds), "
        f"and at k = {SAFE_K} it must not be worse than source-only beyond the 95 % "
        "interval of the difference (its lower end above zero). A pair whose row has other seeds names them, and a "
        "share or difference on others than its pair's names its own.",
        "",
        *_criteria_table(first, _pairs(first)),
        "",
        f"The same criteria for `{SHRUNK_AFFINE}`, the affine map with its offset shrunk by the prior the stand-in's "
        "persons imply (user-calibration.md §5.1: added after the first affine rows showed k = 1 worse than "
        "source-only on E→M; not the default, and not what issue 25 is judged on here):",
        "",
        *_criteria_table(first, _pairs(first), SHRUNK_AFFINE),
        "",
        *_replicate_criteria(same_seeds, results),
        *_choice_section(first, first_records, results),
    ]


def user_calibration_page(
    results: dict[str, Any],
    data: str,
    command: str,
    figure_dir: Path | None = None,
    figure_link: str = "",
    beside_protocol: bool = True,
) -> str:
    """The page's markdown from the v2 results (and its figure into ``figure_dir``, linked as ``figure_link``);
    ``beside_protocol``: the page is written beside docs/user-calibration.md, so links to it."""
    records = as_records(results.get("records", []))
    # every row on a pair is read on the seeds with user-calibration records there, so that k = 0, the
    # label-free rows and the oracle are the same seeds' as the calibrated points beside them
    calibrated = {(r.pair, int(r.seed)) for r in records if r.kind == "calibration" and r.error_deg is not None}
    same_seeds = [r for r in records if (r.pair, int(r.seed)) in calibrated]
    idx = _index(same_seeds, results)
    pairs = _pairs(idx)
    lines = _header(records, pairs, data, command, design_of(results), beside_protocol, results.get("preset"))
    if not pairs:
        return "\n".join([*lines, "No user-calibration record yet.", ""])
    lines += [
        *_criteria_section(same_seeds, results),
        "## Error against k",
        "",
        f"Pooled over {', '.join(pairs)} (per seed the mean over these pairs), mean [95 % interval over seeds]; "
        "each row (and its k = 0) on the seeds of its *seeds* column, those that have all of its k on all of these "
        "pairs, so that its points are the same seeds'; a person's error at k is the mean over the draws of the k "
        "images. The figure does the same per pair.",
        "",
        *_curve_table(idx, pairs),
        "",
    ]
    if figure_dir is not None:
        _plot(idx, pairs, figure_dir / FIGURE)
        lines += [f"![error against k]({figure_link}{FIGURE})", ""]
    lines += [
        "## What a label-free row is worth in labelled images",
        "",
        f"Per pair: the smallest k at which the default calibration's mean error is at or below the label-free "
        f"row's, and in brackets the smallest at which the upper end of the 95 % interval of the difference is "
        f'(how docs/user-calibration.md §4\'s "smallest k whose error interval is at or below its own" is read '
        f'here); "> {CALIBRATION_KS[-1]}" where no k of the protocol gets there. Beside §4\'s label-free rows, '
        f"the trained label-free baselines of issue 26 (RUDA, the distilled TTA, PnP-GA) where they have records. "
        "*seeds*: those the two rows were compared on (a pair on others names its own).",
        "",
        *_worth(idx, pairs),
        "",
        "## Alfa against LoRA as the calibration adapter",
        "",
        "Each adapter at the benchmark's settings, trained on the k labelled images with the supervised loss and "
        "the declared recipe (user-calibration.md §5.2: three draws per person). Alfa − LoRA, pooled over the "
        "pairs above, and, while the run is under way, over the pairs that have both rows (descriptive, those "
        "pairs named), each on the seeds that have both rows on all of its pairs (named), with each one's "
        "trainable numbers (negative: Alfa is better):",
        "",
        *_adapters_table(idx, pairs),
        "",
        "## Meta-learning against plain fine-tuning (FAZE's own claim)",
        "",
        "PS-GEN on the meta-learned gaze MLP (AdaGEN) against the same steps on the MLP `alfa faze train` left, "
        "each FAZE model trained on the source's data (user-calibration.md §5.3). Meta − plain, pooled over the "
        "pairs above and, while the run is under way, over the pairs that have both rows (descriptive, named; "
        "negative: meta-learning helps), each on the seeds both rows have (named), and each model before "
        "calibration on the same images (the pooled difference's seeds):",
        "",
        *_faze_table(idx, pairs),
        "",
        "## Spread against random draws",
        "",
        "Spread − random, pooled over the pairs above, on the seeds of the row's *seeds* column (a cell on others "
        "names its own): the difference [95 % interval] (negative: the spread draws of a screen calibration do "
        "better).",
        "",
        *_draws_table(idx, pairs),
        "",
        "## Cost per person",
        "",
        "Each calibration's seconds include the forward pass of its k images and the fit, on the machine each "
        "record was made on (its device is in the record's hash), in wall seconds, which depend on what else ran "
        "beside the record (the lanes share two cores); the row's CPU seconds per calibration depend on that less "
        "but count all of its work (the persons' images read and scored, too); "
        "a calibrated user is one safetensors file, and *merges* says how it folds into the model for export. "
        "The medians are over the row's records at that k, on any pair: *records* counts them, *seeds* names "
        "their seeds.",
        "",
        *_costs_table(idx),
        "",
    ]
    return "\n".join(lines)


def write_user_calibration_page(
    results_path: str | os.PathLike, out_md: str | os.PathLike, command: str, loaded: dict[str, Any] | None = None
) -> Path:
    """``alfa report --user-calibration``: the page of a results file's user-calibration rows written to ``out_md``
    (atomically), its figure in ``figures/<out_md's stem>`` beside it; ``command`` is what its header names;
    ``loaded``: the file as :func:`~.results.load_results` read it already."""
    from alfa.fileio import write_text

    from .results import load_results

    out_md = Path(out_md)
    figures = out_md.parent / "figures" / out_md.stem
    figures.mkdir(parents=True, exist_ok=True)
    beside = (out_md.parent / PROTOCOL).is_file()  # a link to a page that is not there leads nowhere
    results = load_results(results_path) if loaded is None else loaded
    text = user_calibration_page(results, str(results_path), command, figures,
                                 f"figures/{out_md.stem}/", beside)  # fmt: skip
    write_text(out_md, text)
    return out_md
