import pytest

from alfa.bench.speed import measure, to_markdown
from alfa.cli import main
from alfa.example import run_example


def test_summary_command(capsys):
    assert main(["summary", "--rank", "64"]) == 0
    out = capsys.readouterr().out
    assert "11.178 M" in out and "2.285 M" in out and "left dense: conv1" in out


def test_example_runs_and_merges_exactly(capsys):
    result = run_example(rank=16, steps=3, image_size=32, batch=2)
    assert result["merged_params"] == result["truncated_params"] < result["dense_params"]
    assert result["merge_rel_diff"] < 1e-5
    assert result["losses"][-1] < result["losses"][0]
    assert "reloads onto the shared base: identical" in capsys.readouterr().out


def test_speed_measurement_is_consistent():
    r = measure(repeats=1, image_size=32, memory=False)
    assert r["params"]["merged alfa"] == r["params"]["truncated"] < r["params"]["dense"]
    assert r["params"]["trainable (head only)"] == 512 * 2 + 2
    assert set(r["step_seconds"]) == {"head only", "alfa", "full fine-tune"}
    text = to_markdown(r, "alfa speed")
    assert "| merged alfa | 2,285,122 |" in text and "`alfa speed`" in text


def test_cli_reports_bad_input_without_traceback(capsys):
    assert main(["summary", "--model", "nope"]) == 2
    assert "unknown model 'nope'" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["no-such-command"])
