"""A training command refuses a wrong cheap option (an unknown model, a rank that saves nothing) before it makes
any data: rendering or reading the data takes minutes on real settings."""

import pytest

import alfa
import alfa.cli.gaze as gaze_cli
from alfa.cli import main


@pytest.fixture
def no_data(monkeypatch):
    monkeypatch.setattr(gaze_cli, "open_spec", lambda spec: pytest.fail("data was made before the refusal"))


def test_pretrain_refuses_an_unknown_model_before_any_data(tmp_path, capsys, no_data):
    argv = ["pretrain", "--data", "synthetic:eth", "--model", "bogus", "--out", str(tmp_path / "run"), "--quiet"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "unknown model 'bogus'" in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "run").exists()


def test_truncate_refuses_a_rank_that_saves_nothing_before_any_data(tmp_path, capsys, no_data):
    model = alfa.models.create_model("resnet18_gaze")
    path = alfa.checkpoint.save_model(tmp_path / "dense.safetensors", model, "resnet18_gaze", input_size=(32, 32))
    argv = ["truncate", "--checkpoint", str(path), "--data", "synthetic:eth", "--rank", "100000"]
    assert main([*argv, "--out", str(tmp_path / "run"), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "no layer can be truncated at rank 100000" in err and len(err.strip().splitlines()) == 1, err
