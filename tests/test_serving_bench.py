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


def test_the_same_call_timed_twice_is_the_pages_control():
    """The rows of one merged model and of switching merged models with one user seemed the same work, yet read
    1.14 [1.11, 1.17] apart (the rotated order of the rounds), and then 0.85 (the batch's gather by index). The
    page times one merged model's very call twice, under two names, and says how far apart the two read."""
    r = _result(1.2)
    for m in METHODS:
        r["seconds"][f"{m}: one merged model, again"] = 1 / 1.05
        r["round_seconds"][f"{m}: one merged model, again"] = [1 / 1.05] * len(JITTER)
    text = serving_markdown(r, "alfa serving")
    assert "| lora: the same call again (a control) | 67 [67, 67] | 1.05 [1.05, 1.05] |" in text
    (line,) = [x for x in text.splitlines() if x.startswith("*The same call again* times one merged model's")]
    assert "against itself it read alfa 1.05 [1.05, 1.05]×, lora 1.05 [1.05, 1.05]×, where the truth is 1." in line
    assert "The same call again" not in serving_markdown(_result(1.2), "alfa serving")  # an earlier record: none


def test_a_system_without_a_load_average_loses_no_timing_and_the_page_says_unknown(monkeypatch):
    """Windows has no os.getloadavg: the record keeps null there (after minutes of timings, an AttributeError would
    have lost them), and the page says the load is unknown."""
    import os

    from alfa.study.timing import load_average

    assert isinstance(load_average(), float)  # this system keeps one
    monkeypatch.delattr(os, "getloadavg")
    assert load_average() is None
    r = _result(1.2)
    r["load_average_end"] = load_average()
    assert "; load average unknown at the end)." in serving_markdown(r, "alfa serving")


def test_a_page_named_json_is_told_to_be_named_md(tmp_path, capsys):
    """--out x.json: the page's data (x.json) would replace the page; the refusal said the data went to x.json,
    "which is also this command's --out x.json", and not what to do."""
    from alfa.cli import main

    for command in ("serving", "throughput"):
        out = tmp_path / "page.json"
        assert (
            main([command, "--out", str(out), *(["--data", "synthetic:eth"] if command == "throughput" else [])]) == 2
        )
        err = capsys.readouterr().err
        assert (
            err.strip()
            == f"alfa {command}: error: --out {out}: the page's data goes beside it as .json; name the page .md"
        )
        assert not out.exists()
