"""What the gaze commands do with a run they should not start or cannot finish as asked: refused in one line
before any work (each person would fail alike), or said plainly; found by a newcomer's audit of the CLI."""

from __future__ import annotations

import pytest
import tiny_models  # noqa: F401 — registers tiny_gaze_net
from tiny_models import one_error_line as _one_line
from tiny_models import tiny_checkpoints, truncated_tiny_gaze_net

import alfa
from alfa.cli import main
from alfa.gaze.data.registry import DatasetSpec, open_dataset

TARGET = "synthetic:mpii?persons=2&images_per_person=8&size=16"


@pytest.fixture
def checkpoints(tmp_path):
    return tiny_checkpoints(tmp_path)


def test_personalize_refuses_an_n_adapt_no_person_has_and_a_person_listed_twice(checkpoints, tmp_path, capsys):
    _, truncated = checkpoints
    argv = ["personalize", "--checkpoint", truncated, "--data", TARGET, "--out", str(tmp_path / "a"), "--quiet"]
    argv += ["--adapter-rank", "4"]  # the tiny net's d: a larger rank is refused first
    assert main([*argv, "--n-adapt", "20"]) == 2
    err = _one_line(capsys)
    assert "--n-adapt 20: a person needs those first images plus at least one to score" in err
    assert "the most any person of mpii/test has is 8; use --n-adapt 7 or less" in err
    assert not (tmp_path / "a").exists()
    assert main([*argv, "--persons", "p00,p00"]) == 2
    assert "--persons: 'p00' listed twice" in _one_line(capsys)


def test_personalize_on_an_untruncated_base_says_so_once(checkpoints, tmp_path, capsys):
    dense, truncated = checkpoints
    argv = ["--data", TARGET, "--steps", "1", "--quiet", "--adapter-rank", "4"]  # within the truncated net's d = 4
    assert main(["personalize", "--checkpoint", dense, *argv, "--out", str(tmp_path / "d")]) == 0
    err = capsys.readouterr().err
    assert err.count("is not truncated, so each person's alfa adapter adapts dense layers") == 1
    assert main(["personalize", "--checkpoint", truncated, *argv, "--out", str(tmp_path / "t")]) == 0
    assert "is not truncated" not in capsys.readouterr().err


@pytest.mark.parametrize("method", ["dora", "pissa"])
def test_a_method_alfa_serve_refuses_is_said_once_before_the_work(checkpoints, tmp_path, capsys, method):
    """DoRA, PiSSA and MiLoRA change the shared weight: their files were written without a word, on a truncated
    base, and refused by alfa serve only then. Both commands that write them now say it once, up front; a method
    alfa serve takes gets no note."""
    _, truncated = checkpoints
    common = ["--checkpoint", truncated, "--data", TARGET, "--steps", "1", "--quiet", "--option", "rank=2"]
    runs = {  # (PiSSA's rank must stay under the tiny net's rank 4)
        "personalize": ["personalize", "--method", method],
        "calibrate": ["calibrate", "--method", "adapter", "--adapter-method", method, "--k", "2", "--pool", "4"],
    }
    for command, argv in runs.items():
        assert main([*argv, *common, "--out", str(tmp_path / command)]) == 0
        err = capsys.readouterr().err
        assert err.count(f"alfa {command}: note: alfa serve refuses the {method} adapters this writes") == 1, err
        assert "changes the shared weight itself" in err and "a method it serves: alfa, " in err
    assert main(["personalize", "--method", "lora", *common, "--out", str(tmp_path / "lora")]) == 0
    assert "note" not in capsys.readouterr().err


def test_a_quiet_run_says_a_persons_failure_once(tmp_path, capsys):
    """Under --quiet (progress off) the failure is the command's summary line on stderr alone, not also stdout's."""
    import torch

    from alfa.gaze.data.base import InMemoryGazeDataset
    from alfa.gaze.personalize import PersonalizeConfig, personalize_dataset

    ids = torch.tensor([0] * 8 + [1] * 3)  # p1 has too few images to adapt on 5 and score one
    data = InMemoryGazeDataset(
        torch.randint(0, 256, (11, 3, 16, 16), dtype=torch.uint8), torch.zeros(11, 2), ids, ["p0", "p1"], name="toy"
    )
    run = personalize_dataset(
        truncated_tiny_gaze_net(), data, alfa.AlfaConfig(heads=2, rank=2), PersonalizeConfig(steps=1), tmp_path,
        progress=False,
    )  # fmt: skip
    assert run.failed.keys() == {"p1"}
    assert capsys.readouterr().out == ""


def test_a_dataset_spec_that_gives_an_option_twice_is_refused():
    for spec in ("synthetic:mpii?persons=3&persons=2", "synthetic:mpii?size=16&persons=3&size=32"):
        with pytest.raises(ValueError, match=r"option '(persons|size)' given twice"):
            open_dataset(spec)
        with pytest.raises(ValueError, match=r"option '(persons|size)' given twice"):
            DatasetSpec.parse(spec)


def test_pretrain_refuses_to_report_a_longer_run_as_the_one_asked(tmp_path, capsys):
    data = "synthetic:eth?persons=4&images_per_person=4&size=16"
    argv = ["pretrain", "--model", "tiny_gaze_net", "--data", data, "--batch-size", "8", "--out", str(tmp_path / "p")]
    assert main([*argv, "--epochs", "2", "--quiet"]) == 0
    before = (tmp_path / "p" / "model.safetensors").read_bytes()
    capsys.readouterr()
    assert main([*argv, "--epochs", "1", "--quiet"]) == 2
    assert "holds a run of 2 epochs, more than the 1 asked (kept as it is)" in _one_line(capsys)
    assert (tmp_path / "p" / "model.safetensors").read_bytes() == before


def test_evaluate_with_nobody_scored_prints_no_mean_of_nobody(checkpoints, tmp_path, capsys):
    """Every person's adapter fails on the base: the command refuses that in one line before scoring (see
    test_damaged_headers), and the table of such a run, as the library makes it, has no mean of nobody."""
    from alfa.checkpoint import load_model
    from alfa.gaze.evaluate import evaluate

    dense, truncated = checkpoints
    argv = ["--data", TARGET, "--quiet"]
    assert main(["personalize", "--checkpoint", dense, *argv, "--steps", "1", "--out", str(tmp_path / "d")]) == 0
    model = load_model(truncated)[0].eval()
    report = evaluate(model, open_dataset(TARGET), adapters=tmp_path / "d", progress=False)
    out = report.format_table()
    assert "no person was scored in every column: no mean and no comparison" in out
    assert "nan" not in out and "of 0 persons" not in out
