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


def test_the_truncation_check_leaves_the_callers_random_stream_and_the_model_as_they_were():
    """``check_truncatable`` builds a copy's empty factorized layers, whose initial values torch draws from its global
    generator: the caller's stream goes on as if the check had not run (alfa truncate seeds after the check, but a
    check should not depend on that), and the model itself is left dense and unchanged."""
    import torch
    from tiny_models import TinyGazeNet

    from alfa.cli.guards import check_truncatable
    from alfa.truncate import factorized_ranks

    model = TinyGazeNet()
    weights = {k: v.clone() for k, v in model.state_dict().items()}
    torch.manual_seed(1)
    state = torch.get_rng_state()
    check_truncatable(model, 4)  # its convs would be truncated at rank 4
    assert torch.equal(torch.get_rng_state(), state)
    assert not factorized_ranks(model) and model.state_dict().keys() == weights.keys()
    assert all(torch.equal(v, weights[k]) for k, v in model.state_dict().items())
