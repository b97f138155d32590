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


def test_truncate_refuses_a_rank_that_saves_nothing_before_any_data(tmp_path, capsys, no_data, checkpoint):
    argv = ["truncate", "--checkpoint", checkpoint, "--data", "synthetic:eth", "--rank", "100000"]
    assert main([*argv, "--out", str(tmp_path / "run"), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "no layer can be truncated at rank 100000" in err and len(err.strip().splitlines()) == 1, err


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """One checkpoint for the module's 33 refusals (each of which reads it, none of which writes it): building a
    ResNet-18 for each took a third of a second."""
    model = alfa.models.create_model("resnet18_gaze")
    path = tmp_path_factory.mktemp("checkpoint") / "dense.safetensors"
    return str(alfa.checkpoint.save_model(path, model, "resnet18_gaze", input_size=(32, 32)))


BAD_VAL_DATA = [  # (--val-data, what the one line says): each was refused only after --data was made, a minute here
    ("synthetic:bogus", "--val-data: dataset spec 'synthetic:bogus': unknown synthetic domain 'bogus'; known: eth,"),
    ("bogus", "--val-data: dataset spec 'bogus': expected one of synthetic:<domain>, "),
    ("nope:x", "--val-data: dataset spec 'nope:x': unknown kind 'nope'"),
    ("synthetic:eth?sise=3", "--val-data: dataset spec 'synthetic:eth?sise=3': bad option 'sise=3'"),
    ("synthetic:eth?split=tset", "--val-data: dataset spec 'synthetic:eth?split=tset': domain 'eth' has no split"),
    ("gazehub:mpii:/no/such/root", "--val-data: /no/such/root: no such folder (a GazeHub root)"),
    ("gazehub:mpiii:/no/such/root", "--val-data: unknown GazeHub dataset 'mpiii'"),
    ("xgaze-h5:/no/such/file.h5", "--val-data: /no/such/file.h5: no such file or folder"),
    ("", "--val-data is empty: name a dataset spec, or leave the option out"),  # was taken as no option
    ("synthetic:eth", "--val-data synthetic:eth is --data itself: its persons are trained on"),
    ("Synthetic:eth", "--val-data Synthetic:eth is --data itself: its persons are trained on"),  # the kind's case
]


@pytest.mark.parametrize("command", ["pretrain", "truncate", "tpgaze meta-train"])
@pytest.mark.parametrize(("val_data", "said"), BAD_VAL_DATA)
def test_a_bad_val_data_is_refused_before_any_data(
    tmp_path, capsys, monkeypatch, no_data, checkpoint, command, val_data, said
):
    import alfa.cli.tpgaze as tpgaze_cli

    monkeypatch.setattr(tpgaze_cli, "open_spec", lambda spec: pytest.fail("data was made before the refusal"))
    given = [] if command == "pretrain" else ["--checkpoint", checkpoint]
    argv = [*command.split(), *given, "--data", "synthetic:eth", "--val-data", val_data]
    assert main([*argv, "--out", str(tmp_path / "run"), "--quiet", "--device", "cpu"]) == 2
    err = capsys.readouterr().err
    assert said in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "run").exists()


def test_a_good_val_data_passes_the_check_without_being_made(monkeypatch, tmp_path):
    # the check reads the spec (and a real dataset's label folder), never renders nor reads the data
    import argparse

    import alfa.gaze.data.synthetic.domains as domains
    from alfa.cli.guards import check_val_data
    from alfa.gaze.data.fixtures import write_gazehub_fixture

    monkeypatch.setattr(domains, "render_person", lambda *a, **k: pytest.fail("rendered"))
    write_gazehub_fixture(tmp_path / "gh", "mpiifacegaze", images_per_person=2, size=16, write_eyes=False)
    for spec in ("synthetic:eth?split=val", "synthetic:eth?split=val&persons=2&size=32", f"gazehub:mpii:{tmp_path}/gh"):
        check_val_data(argparse.Namespace(val_data=spec, data="synthetic:eth"))
    check_val_data(argparse.Namespace(val_data=None, data="synthetic:eth"))


def test_val_data_written_otherwise_than_data_is_still_data_itself(tmp_path):
    """--data's own spec written another way (an alias of its kind, the kind in capitals, the options in another
    order, a number written otherwise) is refused as --data itself; another split, world or file is not, nor an
    option written out that --data leaves to its default (the registry fills in no defaults: it is not judged)."""
    import argparse

    from alfa.cli.guards import check_val_data

    h5, other = tmp_path / "data.h5", tmp_path / "other.h5"
    h5.touch()
    other.touch()
    same = [
        (f"xgaze-h5:{h5}", f"xgaze_h5:{h5}"),
        (f"xgaze-h5:{h5}", f"ETH-XGaze-H5:{h5}"),
        ("synthetic:eth?split=val&persons=2", "SYNTHETIC:eth?persons=2&split=val"),
        ("synthetic:eth?size=32&seed=1", "synthetic:eth?seed=01&size=32"),
    ]
    for data, val_data in same:
        with pytest.raises(ValueError, match="--val-data .* is --data itself"):
            check_val_data(argparse.Namespace(val_data=val_data, data=data))
    different = [
        (f"xgaze-h5:{h5}", f"xgaze_h5:{other}"),
        ("synthetic:eth?split=val&persons=2", "synthetic:eth?split=val&persons=3"),
        ("synthetic:eth", "synthetic:eth?split=val"),
        ("synthetic:eth", "synthetic:eth?split=train"),  # perhaps the same data, but not by the registry's reading
        ("bogus", "synthetic:eth"),  # a bad --data is refused by its own opening, not here
    ]
    for data, val_data in different:
        check_val_data(argparse.Namespace(val_data=val_data, data=data))


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
