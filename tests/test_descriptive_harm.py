"""The per-pair harm sentence of a v2 page: its comparisons are outside the declared family (descriptive), so
none can be clear, and a sentence "clearly worse on: none" would hold whatever the data. It names the
comparisons whose own interval lies above zero instead, and gives no verdict."""

from __future__ import annotations

from alfa.study.bench.flip_report import _descriptive_harm, outside_family
from alfa.study.bench.stats import Diff


def _descriptive(a: str, pair: str, per_seed: dict[int, float], se: float, declared: bool = False) -> Diff:
    return Diff(
        a, "source-only", (pair,), "error", per_seed, se, len(per_seed) - 1, "persons and seeds drawn", 0, 0, 9,
        declared=declared,
    )  # fmt: skip


def test_a_harm_outside_the_declared_family_is_named_by_its_own_interval_and_never_called_clear():
    harm = _descriptive("alfa[selected]", "S→W", {0: 2.0, 1: 2.2, 2: 1.8}, 0.1)
    level = _descriptive("lora[selected]", "S→C", {0: 0.5, 1: -0.4, 2: 0.1}, 0.3)
    assert not harm.clear and harm.interval[0] > 0 and level.interval[0] < 0
    text = _descriptive_harm("its recipe selected on the stand-in", [harm, level])
    assert "of the 2 (method, pair) comparisons" in text and "none is judged" in text
    assert "on S→W (+2.00 [" in text and "S→C" not in text.split("on: ")[1]
    assert "clearly" not in text and "goal holds" not in text
    assert _descriptive_harm("x", [level]).endswith("on: none.")


def test_only_comparisons_outside_the_family_get_the_descriptive_sentence():
    # a first-protocol page declares every comparison: one of a single seed is unjudged for lack of seeds, and
    # keeps the verdict sentence (which says how large a harm the design detects), not the v2 wording
    one_seed = _descriptive("alfa[selected]", "E→M", {0: 0.3}, 0.1, declared=True)
    assert not one_seed.judged and not outside_family([one_seed])
    assert outside_family([_descriptive("alfa[selected]", "E→M", {0: 0.3, 1: 0.2}, 0.1)])
    assert not outside_family([one_seed, _descriptive("lora[selected]", "E→M", {0: 0.3, 1: 0.2}, 0.1)])
