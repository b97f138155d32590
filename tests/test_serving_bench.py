"""The serving page's text from a measurement (the measurement itself takes minutes: `alfa serving`)."""

from alfa.study.bench.serving import DISTINCT, METHODS, serving_markdown
from alfa.study.timing import paired_ratio

JITTER = [1.0, 1.02, 0.99, 1.01, 0.98, 1.0, 1.01]  # each configuration's own noise from round to round


def _result(multi_64: float, rounds: bool = True) -> dict:
    seconds = {}
    for m in METHODS:
        seconds[f"{m}: one merged model"] = 1.0
        for k in DISTINCT:
            seconds[f"{m}: multi-user, {k} users"] = multi_64 if k == max(DISTINCT) else 1.1
            seconds[f"{m}: switching merged models, {k} users"] = float(k)
    r = {
        "batch": 64, "image_size": 64, "rank": 64, "rounds": 7, "threads": 2, "seconds": seconds,
        "seconds_quartiles": {n: [0.5 * t, 2.0 * t] for n, t in seconds.items()},
        "per_user": {m: {"multi_user_bytes": 229376, "merged_model_bytes": 9_000_000} for m in METHODS},
        "load_average_end": 0.5, "cpus": 2, "torch": "2.13.0", "date": "2026-12-01",
    }  # fmt: skip
    if rounds:  # the merged model steady, the others jittering: the ratios have a width
        r["round_seconds"] = {n: [t * j for j in JITTER] for n, t in seconds.items()}
        for m in METHODS:
            r["round_seconds"][f"{m}: one merged model"] = [1.0] * len(JITTER)
    return r


def test_the_page_judges_the_goal_on_the_ratios_interval():
    met = serving_markdown(_result(1.2), "alfa serving")
    ratio = paired_ratio([1.0] * len(JITTER), [1.2 * j for j in JITTER])
    assert 0.8 < ratio.low < ratio.value < ratio.high and ratio.text() == "0.83 [0.82, 0.84]"
    assert "runs at 0.83 [0.82, 0.84]× a single merged model's throughput (goal ≥ 0.8×: met)" in met
    switching = paired_ratio([1.0] * len(JITTER), [64 * j for j in JITTER]).text()
    assert f"| alfa: switching merged models, 64 distinct users | 1 [1, 1] | {switching} |" in met
    assert "| alfa: one merged model (one user) | 64 [64, 64] | 1.00 |" in met
    # 64 images over 1.2 s × the jitter: the median round and, of 7 rounds, the fastest and the slowest (98.4 %)
    assert "| alfa: multi-user, 64 distinct users | 53 [52, 54] | 0.83 [0.82, 0.84] |" in met
    assert "× one merged model [95 % interval]" in met and "Every ratio is paired over the interleaved rounds" in met
    assert "1 distinct user |" in met and "224.0 KiB" in met
    assert "(goal ≥ 0.8×: NOT met)" in serving_markdown(_result(2.0), "alfa serving")
    assert "(goal ≥ 0.8×: not shown (the interval straddles it))" in serving_markdown(_result(1.25), "alfa serving")


def test_a_record_without_rounds_still_renders_and_says_so_in_one_line():
    old = serving_markdown(_result(1.2, rounds=False), "alfa serving --rounds 7 --out docs/serving.md")
    (line,) = [x for x in old.splitlines() if "no per-round timings" in x]
    assert "re-run `alfa serving --rounds 7 --out docs/serving.md` with two rounds or more for the intervals" in line
    assert "runs at 0.83× a single merged model's throughput (goal ≥ 0.8×: not judged without an interval)" in old
    assert "| alfa: switching merged models, 64 distinct users | 1 (0–2, the middle half) | 0.02 |" in old
    assert " [" not in old


def test_one_round_is_refused_at_the_option_before_any_measurement(capsys, monkeypatch):
    import functools

    import pytest

    import alfa.study.bench.serving as serving
    from alfa.cli import main

    @functools.wraps(serving.main)  # its defaults stay readable: the parser shows them
    def measured(*args, **kwargs):
        pytest.fail("measured before refusing --rounds 1")

    monkeypatch.setattr(serving, "main", measured)
    with pytest.raises(SystemExit) as e:
        main(["serving", "--rounds", "1", "--image-size", "32"])
    assert e.value.code == 2
    assert "argument --rounds: must be at least 2 (each ratio's 95 % interval" in capsys.readouterr().err


def test_the_page_reads_the_row_that_runs_the_same_model_as_a_control_of_the_measurement():
    """Switching merged models with one user runs the one merged model on a copy of the batch: the same work. The
    page says how far from 1 that ratio came (a rotated order of the rounds made it 1.14 [1.11, 1.17] for LoRA)."""
    r = _result(1.2)
    for m in METHODS:
        r["seconds"][f"{m}: switching merged models, 1 users"] = 1 / 1.14
        r["round_seconds"][f"{m}: switching merged models, 1 users"] = [1 / 1.14] * len(JITTER)
    text = serving_markdown(r, "alfa serving")
    assert "| lora: switching merged models, 1 distinct user | 73 [73, 73] | 1.14 [1.14, 1.14] |" in text
    (line,) = [x for x in text.splitlines() if x.startswith("A control of the measurement itself: ")]
    assert "lora: *switching merged models, 1 distinct user* runs the very model of *one merged model* on a " in line
    assert line.count("ran at 1.14 [1.14, 1.14]× its throughput, where the two should be equal") == len(METHODS)
