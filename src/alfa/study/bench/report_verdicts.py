"""The benchmark report's verdicts: the sentences that turn the statistics of the records into judgements
(where Alfa is best and where not, what lies below source-only, how large the domain gap and the headroom are,
where the error goes), each computed from :mod:`alfa.study.bench.stats`.

How differences are judged (the report states it too): for two rows ``a`` and ``b``, per seed, the mean over
pairs of ``error(a) − error(b)`` on the same base; its mean over seeds ``Δ`` and the sample standard deviation
of those per-seed differences. A difference is *clear* when ``|Δ|`` exceeds that standard deviation and every
seed has the same sign; otherwise it is *within the spread*. With one seed there is no spread, and nothing is
called clear.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .ablations import REGISTRY
from .markdown import number as _num
from .names import DEFAULT, SELECTED
from .names import display_name as _name
from .report_tables import table1_rows
from .stats import Index, Stat, cell, diff, pairs_of, part, sanity_summary, signed

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
    if "alfa" not in methods or not pairs:
        return ["Alfa was not run; no verdict."]
    lines = _row_verdicts(idx, pairs, methods, "alfa", "lora")
    for suffix in (SELECTED, DEFAULT):
        if f"alfa{suffix}" in methods:
            lines += _row_verdicts(idx, pairs, methods, f"alfa{suffix}", f"lora{suffix}")
    if "source-only" in methods:
        lines.append(_below_source_only_sentence(idx, pairs, methods))
    return lines


def _below_source_only_sentence(idx: Index, pairs: Sequence[str], methods: Sequence[str]) -> str:
    """Which rows' pooled error is below source-only (with the difference, and whether it is clear)."""
    beating = []
    for m in methods:
        if m == "source-only":
            continue
        d = diff(idx, m, "source-only", pairs)
        if d is not None and d.mean < 0:
            beating.append((m, d))
    names = ", ".join(f"{_name(m)} ({signed(d.mean)}°{', clear' if d.clear else ''})" for m, d in beating)
    others = [m for m in methods if m != "source-only" and m not in {b for b, _ in beating}]
    text = f"Methods whose pooled error is below source-only: {names or 'none'}."
    if others:
        text += f" Not below source-only: {', '.join(_name(m) for m in others)}."
    return text


def _pair_standing(idx: Index, pair: str, ranked: list[tuple[Stat, str]], row: str) -> str:
    """One sentence on ``row``'s place on ``pair`` (``ranked``: the rows' stats, best first): how far it leads
    the runner-up, or where it stands behind the best."""
    me = _name(row)
    mine = next(s for s, m in ranked if m == row)
    best_stat, best = ranked[0]
    if best == row:
        runner_stat, runner = ranked[1]
        d = diff(idx, row, runner, [pair])
        return (
            f"On {pair} {me} ({mine.format()}°) leads the runner-up {_name(runner)} ({runner_stat.format()}°) "
            f"by {runner_stat.mean - mine.mean:.2f}°; {me} − {_name(runner)} = {d.describe() if d else 'n/a'}."
        )
    rank = 1 + [m for _, m in ranked].index(row)
    d = diff(idx, row, best, [pair])
    return (
        f"On {pair} {me} does not win: {_name(best)} is best ({best_stat.format()}°), {me} is "
        f"{_ordinal(rank)} of {len(ranked)} ({mine.format()}°); {me} − {_name(best)} = "
        f"{d.describe() if d else 'n/a'}."
    )


def _row_verdicts(idx: Index, pairs: Sequence[str], methods: Sequence[str], row: str, lora: str) -> list[str]:
    """Where the Alfa row ``row`` is best, where not, against source-only and against the LoRA row ``lora``."""
    me = _name(row)
    best_pairs = []
    per_pair: list[str] = []
    for pair in pairs:
        ranked = sorted(((cell(idx, m, pair), m) for m in methods if cell(idx, m, pair)), key=lambda t: t[0].mean)
        if not any(m == row for _, m in ranked) or len(ranked) == 1:
            continue
        if ranked[0][1] == row:
            best_pairs.append(pair)
        per_pair.append(_pair_standing(idx, pair, ranked, row))
    where = f" ({', '.join(best_pairs)})" if best_pairs else ""
    lines = [f"{me} has the lowest mean error on {len(best_pairs)} of {len(pairs)} pairs{where}.", *per_pair]
    if "source-only" in methods:
        helped = [p for p in pairs if cell(idx, row, p) and cell(idx, "source-only", p)]
        lower = [p for p in helped if cell(idx, row, p).mean < cell(idx, "source-only", p).mean]
        d = diff(idx, row, "source-only", pairs)
        text = (
            f"Against its own starting point (source-only), {me} lowers the mean error on "
            f"{len(lower)} of {len(helped)} pairs"
        )
        if len(lower) < len(helped):
            text += f"; it does not on {', '.join(p for p in helped if p not in lower)}"
        if d is not None:
            text += f". Pooled over pairs: {me} − source-only = {d.describe()}"
        lines.append(text + ".")
    if lora in methods:
        d = diff(idx, row, lora, pairs)
        how = {"lora": "same recipe, same steps", f"lora{SELECTED}": "its recipe selected by the same rule"}.get(
            lora, "its own shipped default recipe"
        )
        if d is not None:
            lines.append(f"Against {_name(lora)} ({how}), pooled over pairs: {me} − {_name(lora)} = {d.describe()}.")
    return lines


# ----------------------------------------------------------------------------- sanity: domain gap and headroom


def _range(values: Sequence[float], digits: int, unit: str) -> str:
    lo, hi = min(values), max(values)
    return (
        f"{lo:.{digits}f}{unit}"
        if f"{lo:.{digits}f}" == f"{hi:.{digits}f}"
        else f"{lo:.{digits}f}–{hi:.{digits}f}{unit}"
    )


def _deg_range(items: Sequence[tuple[str, float, float]]) -> str:
    """``"0.8–2.1°"``: the range of the differences over ``(pair, difference, reference)`` items."""
    return _range([d for _, d, _ in items], 2, "°")


def _share_range(items: Sequence[tuple[str, float, float]]) -> str:
    """``"12–30 %"``: the range of ``difference / reference`` over ``(pair, difference, reference)`` items."""
    return _range([100 * d / ref for _, d, ref in items], 0, " %")


def _below_source_only(idx: Index, pairs: Sequence[str], method: str) -> list[tuple[str, float, float]]:
    """``(pair, source-only − method, source-only)`` for every pair where both rows exist."""
    out = []
    for p in pairs:
        ref, other = cell(idx, "source-only", p), cell(idx, method, p)
        if ref and other:
            out.append((p, ref.mean - other.mean, ref.mean))
    return out


def _gap_sentence(items: list[tuple[str, float, float]], subject: str, by: str, missing: str) -> str:
    """ "<subject> on k of n pairs, <by> <range> (<share>); <missing> on <pairs>." for gaps that should be > 0."""
    below = [g for g in items if g[1] > 0]
    text = f"{subject} on {len(below)} of {len(items)} pairs"
    if below:
        text += f"{by}{_deg_range(below)} ({_share_range(below)} of the source-only error)"
    if len(below) < len(items):
        text += f"; {missing} on {', '.join(g[0] for g in items if g[1] <= 0)}"
    return text + "."


def _label_spread_sentence(idx: Index) -> list[str]:
    """The in-domain and cross-domain errors as shares of a constant prediction's (none without those)."""
    ratios = []
    for pair, s in sanity_summary(idx.values()).items():
        ind, src = s["in_domain"], s["source_only"]
        if ind and src and s.get("in_domain_constant_deg") and s.get("target_constant_deg"):
            ratios.append((pair, ind["mean"] / s["in_domain_constant_deg"], src["mean"] / s["target_constant_deg"]))
    if not ratios:
        return []
    worse = [p for p, a, b in ratios if b > a]
    return [
        "Relative to the spread of the labels (the error of always predicting the set's mean gaze), the "
        "in-domain error is "
        + ", ".join(f"{100 * a:.0f} %" for _, a, _ in ratios)
        + " of a constant prediction's and the cross-domain error "
        + ", ".join(f"{100 * b:.0f} %" for _, _, b in ratios)
        + f" ({', '.join(p for p, _, _ in ratios)}): relatively worse across domains on {len(worse)} of "
        f"{len(ratios)} pairs."
    ]


def _headroom_sentences(idx: Index, pairs: Sequence[str]) -> list[str]:
    """The oracle's headroom below source-only, and the share of it Alfa recovers (none without an oracle)."""
    rooms = _below_source_only(idx, pairs, "oracle")
    if not rooms:
        return []
    lines = [
        _gap_sentence(
            rooms,
            "The oracle (per-person supervised fine-tuning) is below source-only",
            ": headroom ",
            "NO headroom",
        )
    ]
    if "alfa" in {m for (m, _, _) in idx}:
        shares = []
        for p, room, _ in rooms:
            a, s = cell(idx, "alfa", p), cell(idx, "source-only", p)
            if a and s and room > 0:
                shares.append((p, (s.mean - a.mean) / room))
        if shares:
            lines.append(
                "Share of the headroom Alfa recovers (source-only − Alfa, over source-only − oracle): "
                + ", ".join(f"{p} {_num(100 * v, 0)} %" for p, v in shares)
                + "."
            )
    return lines


def sanity_verdicts(idx: Index) -> list[str]:
    """The domain gap, the within-dataset yardstick, the errors relative to the labels' spread, the headroom."""
    lines = []
    pairs = pairs_of(idx)
    gaps = _below_source_only(idx, pairs, "in-domain")
    if gaps:
        lines.append(
            _gap_sentence(
                gaps,
                "In-domain error (the base on held-out source persons) is below the cross-domain source-only error",
                ", by ",
                "NO domain gap",
            )
        )
    own = _below_source_only(idx, pairs, "target-trained")
    if own:
        lines.append(
            _gap_sentence(
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
    worse, pitch_led = [], []
    for m in methods:
        if m == "source-only":
            continue
        total = diff(idx, m, "source-only", pairs)
        dy, dp = (diff(idx, m, "source-only", pairs, part(k)) for k in ("yaw", "pitch"))
        if total is None or dy is None or dp is None:
            continue
        if total.mean > 0:
            worse.append(_name(m))
            if dp.mean > dy.mean:
                pitch_led.append(_name(m))
        if m == "alfa":
            db = diff(idx, m, "source-only", pairs, part("pitch_bias"))
            out.append(f"Alfa − source-only, pooled over pairs: yaw error {dy.describe()}.")
            out.append(f"Alfa − source-only, pooled over pairs: pitch error {dp.describe()}.")
            if db is not None:
                out.append(f"Alfa − source-only, pooled over pairs: absolute pitch bias {db.describe()}.")
    if worse:
        out.append(
            f"Of the {len(worse)} method(s) whose error ends above source-only, the pitch error grew more than the yaw "
            f"error for {len(pitch_led)}" + (f" ({', '.join(pitch_led)})" if pitch_led else "") + "."
        )
    return out


def ablation_verdicts(idx: Index, name: str, layout: Sequence[dict[str, Any]], pairs: Sequence[str]) -> list[str]:
    """Plain sentences for one ablation, pooled over its pairs (none for an ablation this alfa does not know)."""
    ablation = REGISTRY.get(name)
    return ablation.sentences(idx, layout, pairs) if ablation is not None else []
