"""The timing pages' ratios (``alfa.study.timing``): paired over interleaved rounds, a 95 % t-interval of
the mean log ratio, goals judged on the interval; and docs/speed.md with and without the rounds kept."""

import math

import pytest

from alfa.study.bench.speed import STEP_SETUPS, to_markdown
from alfa.study.timing import Ratio, cpu_name, goal_verdict, paired_ratio, ratio_cell

BATCHES = ("batch 1", "batch 10")
T_975_3 = 3.182446305284263  # Student's t, 3 degrees of freedom, 97.5 % quantile (printed tables)


def test_a_known_ratio_and_its_interval_by_hand():
    denominator = [1.0, 2.0, 3.0, 4.0]  # the machine's speed drifts from round to round: the pairs cancel it
    d = 0.05
    numerator = [2 * t * math.exp(e) for t, e in zip(denominator, [d, -d, d, -d])]
    r = paired_ratio(numerator, denominator)
    half = T_975_3 * d * math.sqrt(4 / 3) / math.sqrt(4)  # t · sd of the log ratios / √rounds
    assert r.rounds == 4 and r.value == pytest.approx(2.0, rel=1e-12)
    assert (r.low, r.high) == pytest.approx((2 * math.exp(-half), 2 * math.exp(half)), rel=1e-9)
    assert r.text() == f"2.00 [{2 * math.exp(-half):.2f}, {2 * math.exp(half):.2f}]"
    flipped = paired_ratio(denominator, numerator)  # the same interval whichever side is divided by
    assert (flipped.value, flipped.low, flipped.high) == pytest.approx((1 / r.value, 1 / r.high, 1 / r.low))
    exact = paired_ratio([3.0, 6.0, 9.0], [1.0, 2.0, 3.0])  # no noise within rounds: no width
    assert (exact.value, exact.low, exact.high) == pytest.approx((3.0, 3.0, 3.0))


def test_goals_are_judged_on_the_interval():
    straddles = paired_ratio([0.7, 0.9, 0.75, 0.88], [1.0] * 4)
    assert straddles.low < 0.8 < straddles.high
    assert goal_verdict(straddles, 0.8, at_least=True) == "not shown (the interval straddles it)"
    assert goal_verdict(straddles, 0.8, at_least=False) == "not shown (the interval straddles it)"
    # a median that clears the goal is not enough: the whole interval must
    assert straddles.value > 0.8 and goal_verdict(straddles, 0.8, at_least=True) != "met"
    assert goal_verdict(Ratio(0.87, 0.84, 0.90, 28), 0.8, at_least=True) == "met"
    assert goal_verdict(Ratio(0.76, 0.72, 0.79, 28), 0.8, at_least=True) == "NOT met"
    assert goal_verdict(Ratio(1.00, 0.99, 1.01, 40), 1.02, at_least=False) == "met"
    assert goal_verdict(Ratio(1.60, 1.55, 1.66, 9), 1.5, at_least=False) == "NOT met"
    assert goal_verdict(None, 0.8, at_least=True) == "not judged without an interval"


def test_too_few_or_unpaired_rounds():
    assert paired_ratio([1.0], [2.0]) is None  # one round: no spread, no interval
    assert ratio_cell(None, [1.0, 2.0], 0.876) == ("0.88", None)  # a record without rounds: the medians' ratio
    assert ratio_cell([1.0], [2.0], 0.5, 1, 100) == ("50.0", None)
    with pytest.raises(ValueError, match="as many rounds on each side, not 2 and 3"):
        paired_ratio([1.0, 2.0], [1.0, 2.0, 3.0])
    with pytest.raises(ValueError, match="positive"):
        paired_ratio([1.0, 0.0], [1.0, 2.0])


def _speed_record(rounds: bool) -> dict:
    seconds = {"head only": 0.3, "alfa": 0.5, "full fine-tune": 0.9}
    jitter = [1.0, 1.03, 0.98, 1.01]
    r = {
        "machine": {"cpu": "cpu", "torch": "2", "threads": 2},
        "image_size": 32,
        "repeats": 4,
        "params": {"dense": 9, "truncated": 5, "merged alfa": 5, **{f"trainable ({s})": 1 for s in STEP_SETUPS}},
        "step_seconds": seconds,
        "adapter_math_seconds": 0.025,
        "latency_seconds": {b: {"dense": 0.03, "truncated": 0.02, "merged alfa": 0.02} for b in BATCHES},
    }
    if rounds:
        r["step_round_seconds"] = {s: [t * j for j in jitter] for s, t in seconds.items()}
        r["step_round_seconds"]["head only"] = [0.3] * 4
        r["adapter_math_round_seconds"] = [0.025] * 4
        r["latency_round_seconds"] = {
            "batch 1": {"truncated": [0.02] * 8, "merged alfa": [0.02, 0.0201, 0.0199, 0.02] * 2, "dense": [0.03] * 8},
            "batch 10": {"truncated": [0.02] * 8, "merged alfa": [0.0204 * j for j in jitter * 2], "dense": [0.03] * 8},
        }
    return r


def test_the_speed_page_gives_every_ratio_its_interval_and_says_when_it_cannot():
    r = _speed_record(rounds=True)
    text = to_markdown(r, "alfa speed")
    alfa = paired_ratio(r["step_round_seconds"]["alfa"], r["step_round_seconds"]["head only"])
    assert f"| alfa | 1 | 0.500 | {alfa.text()} |" in text and "| head only | 1 | 0.300 | 1.00 |" in text
    share = paired_ratio(r["adapter_math_round_seconds"], r["step_round_seconds"]["alfa"])
    assert f"25.0 ms, {share.text(1, 100)} % of its step" in text
    # batch 1 clears the target, batch 10's interval straddles it: each judged on its own interval
    assert "(target ≤ 1.02: met at batch 1; not shown (the interval straddles it) at batch 10)" in text
    assert "Every ratio is paired over the interleaved rounds" in text and "no per-round timings" not in text
    old = to_markdown(_speed_record(rounds=False), "alfa speed --out docs/speed.md")
    line = next(x for x in old.splitlines() if "no per-round timings" in x)
    assert "re-run `alfa speed --out docs/speed.md` with two rounds or more for the intervals" in line
    assert "| alfa | 1 | 0.500 | 1.67 |" in old and "(target ≤ 1.02: not judged without an interval)" in old
    assert "[" not in old.split("## Memory")[0].split("## One")[1]  # no interval anywhere it has no rounds


def test_cpu_name_keeps_the_family_and_model_numbers_of_the_first_processor(tmp_path):
    info = tmp_path / "cpuinfo"
    block = "processor\t: {n}\ncpu family\t: 6\nmodel\t\t: {m}\nmodel name\t: Intel(R) Xeon(R) Processor\n"
    info.write_text(block.format(n=0, m=167) + "\n" + block.format(n=1, m=85))
    assert cpu_name(info) == "Intel(R) Xeon(R) Processor (family 6, model 167)"
    info.write_text("processor\t: 0\nmodel name\t: Some CPU\n")  # no numbers: the name alone
    assert cpu_name(info) == "Some CPU"
    assert cpu_name(tmp_path / "absent") != ""  # platform's answer or "unknown", never an exception


def test_a_medians_interval_covers_it_at_least_95_percent_of_the_time():
    import random

    from alfa.study.timing import median_cell, median_interval

    assert median_interval([5.0, 1.0, 3.0, 2.0, 4.0]) is None  # 5 rounds: [min, max] covers 93.75 %
    assert median_interval([6.0, 1.0, 3.0, 2.0, 4.0, 5.0]) == (3.5, 1.0, 6.0)  # 96.9 %
    assert median_interval(list(range(9))) == (4.0, 1.0, 7.0)  # k = 2: 1 − 2·10/512 = 96.1 %; k = 3 would be 82 %
    assert median_cell([5.0, 1.0, 3.0, 2.0, 4.0], 3.0) == "3" and median_cell(None, None) == "—"
    assert median_cell([6.0, 1.0, 3.0, 2.0, 4.0, 5.0], 3.5, digits=1) == "3.5 [1.0, 6.0]"
    # a skewed timing distribution (its true median ln 2 · 10 + 100): the interval holds it ≥ 95 % of the time
    rng = random.Random(0)
    for n in (6, 7, 9, 15):
        hits = 0
        for _ in range(4000):
            _, low, high = median_interval([100 + rng.expovariate(0.1) for _ in range(n)])
            hits += low <= 100 + 10 * math.log(2) <= high
        assert hits / 4000 >= 0.94, n  # ≥ 95 % up to the simulation's own noise (±0.7 %)


def test_interleaved_rounds_change_which_call_comes_before_each():
    """A call that leaves the caches cold slows whichever call runs next: rotating one order every round kept the
    same predecessor for each call. Each round now draws its own order from the seed (the same one again)."""
    from alfa.study.bench.measure import interleaved_seconds

    ran: list[str] = []
    names = ["a", "b", "c", "d", "e"]
    times = interleaved_seconds({n: lambda n=n: ran.append(n) for n in names}, rounds=12)
    assert all(len(t) == 12 for t in times.values()) and ran[:5] == names  # the warm-up, then 12 rounds
    rounds = [ran[5 + 5 * r : 10 + 5 * r] for r in range(12)]
    assert all(sorted(order) == names for order in rounds)  # every call once a round
    before = {n: {order[order.index(n) - 1] for order in rounds if order.index(n) > 0} for n in names}
    assert all(len(b) >= 3 for b in before.values()), before  # (rotated: one predecessor each)
    again: list[str] = []
    interleaved_seconds({n: lambda n=n: again.append(n) for n in names}, rounds=12)
    assert again == ran
