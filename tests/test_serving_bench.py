"""The serving page's text from a measurement (the measurement itself takes minutes: `alfa serving`)."""

from alfa.study.bench.serving import DISTINCT, METHODS, serving_markdown


def _result(multi_64: float) -> dict:
    seconds = {}
    for m in METHODS:
        seconds[f"{m}: one merged model"] = 1.0
        for k in DISTINCT:
            seconds[f"{m}: multi-user, {k} users"] = multi_64 if k == max(DISTINCT) else 1.1
            seconds[f"{m}: switching merged models, {k} users"] = float(k)
    return {
        "batch": 64, "image_size": 64, "rank": 64, "rounds": 7, "threads": 2, "seconds": seconds,
        "seconds_quartiles": {n: [0.5 * t, 2.0 * t] for n, t in seconds.items()},
        "per_user": {m: {"multi_user_bytes": 229376, "merged_model_bytes": 9_000_000} for m in METHODS},
        "load_average_end": 0.5, "cpus": 2, "torch": "2.13.0", "date": "2026-12-01",
    }  # fmt: skip


def test_the_page_says_whether_the_goal_is_met():
    met = serving_markdown(_result(1.2), "alfa serving")
    assert "runs at 0.83× a single merged model's throughput (goal ≥ 0.8×: met)" in met
    assert "| alfa: switching merged models, 64 distinct users | 1 (0–2) | 0.02 |" in met
    assert "| alfa: one merged model (one user) | 64 (32–128) | 1.00 |" in met
    assert "1 distinct user |" in met and "224.0 KiB" in met
    assert "NOT met" in serving_markdown(_result(2.0), "alfa serving")
