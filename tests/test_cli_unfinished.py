"""A training run stopped before its last epoch leaves its model under the final name, its header saying
``"complete": false``: every command that takes it as an input refuses it in one line, how far it got and how to
finish it, before any data is made; a finished model passes."""

import json

import pytest

import alfa
import alfa.cli.gaze as gaze_cli
from alfa.cli import main

DATA = "synthetic:mpii?persons=2&images_per_person=4&size=32"


def _saved(folder, complete, stage="pretrain", epoch=1, epochs=6):
    model = alfa.models.create_model("resnet18_gaze")
    extra = {"stage": stage, "epoch": epoch, "complete": complete, "train_config": {"epochs": epochs}}
    folder.mkdir(parents=True, exist_ok=True)
    return alfa.checkpoint.save_model(
        folder / "model.safetensors", model, "resnet18_gaze", extra=extra, input_size=(32, 32)
    )


@pytest.fixture
def no_data(monkeypatch):
    monkeypatch.setattr(gaze_cli, "open_spec", lambda spec: pytest.fail("data was made before the refusal"))


@pytest.mark.parametrize(
    "command",
    [
        ("evaluate", "--data", DATA),
        ("personalize", "--data", DATA, "--out", "{tmp}/adapters"),
        ("truncate", "--data", DATA, "--rank", "4", "--out", "{tmp}/truncated"),
        ("export", "--out", "{tmp}/m.onnx", "--image-size", "32", "32"),
        ("serve", "--adapters", "{tmp}", "--port", "0"),
    ],
)
def test_an_unfinished_checkpoint_is_refused_with_how_to_finish_it(tmp_path, capsys, no_data, command):
    path = _saved(tmp_path / "run", complete=False)
    argv = [part.format(tmp=tmp_path) for part in command]
    assert main([argv[0], "--checkpoint", str(path), *argv[1:]]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1, err
    assert f"{path} is unfinished" in err and "epoch 1 of 6" in err, err
    assert "rerun the same alfa pretrain command" in err, err
    assert not (tmp_path / "m.onnx").exists() and not (tmp_path / "truncated").exists()


def test_a_truncations_unfinished_recovery_names_alfa_truncate(tmp_path):
    from alfa.cli.guards import check_finished

    path = _saved(tmp_path / "run", complete=False, stage="recover", epoch=2, epochs=3)
    with pytest.raises(ValueError, match="after epoch 2 of 3; rerun the same alfa truncate command"):
        check_finished(str(path))


def test_a_finished_checkpoint_and_one_without_the_flag_pass(tmp_path):
    from alfa.cli.guards import check_finished

    check_finished(str(_saved(tmp_path / "done", complete=True)))
    model = alfa.models.create_model("resnet18_gaze")
    check_finished(str(alfa.checkpoint.save_model(tmp_path / "plain.safetensors", model, "resnet18_gaze")))


def test_unfinished_meta_trained_prompts_are_refused(tmp_path, capsys, no_data):
    path = _saved(tmp_path / "run", complete=True)
    meta = tmp_path / "meta"
    meta.mkdir()
    (meta / "prompts.safetensors").write_bytes(b"not read: the record beside it says the run is unfinished")
    record = {"header": {"meta_config": {"epochs": 60}}, "epoch": 11, "complete": False}
    (meta / "meta_train.json").write_text(json.dumps(record))
    prompts = meta / "prompts.safetensors"
    argv = ["personalize", "--checkpoint", str(path), "--data", DATA, "--method", "tpgaze", "--init", str(prompts)]
    assert main([*argv, "--out", str(tmp_path / "adapters")]) == 2
    err = capsys.readouterr().err
    assert f"{prompts} is unfinished" in err and "epoch 11 of 60" in err, err
    assert "rerun the same alfa tpgaze meta-train command" in err and len(err.strip().splitlines()) == 1, err
