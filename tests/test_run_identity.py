"""What a resumed run is checked against: the images it was made from (a dataset of the same name and counts
with other images is another run), the dense checkpoint a truncation was made from, the base a calibration folder
was made on; and what a training folder holds in place of its state, said as it is. A state written before a
check's entry existed passes as it did (runs in progress are neither refused nor redone)."""

import json
import os

import torch
from safetensors import safe_open
from tiny_models import TinyGazeNet, truncated_tiny_gaze_net  # noqa: F401  (registers tiny_gaze_net)

from alfa.checkpoint import read_checkpoint, read_tagged, save_model, write_tagged
from alfa.cli import main
from alfa.fileio import write_safetensors

DATA = "synthetic:eth?persons=4&images_per_person=4&size=16"
OTHER = DATA + "&seed=5"  # the same name (eth/train), persons and counts: other images
LATER = ("data_signature", "val_data_signature", "dense_checksum")
FAZE = ["faze", "train", "--appearance", "4", "--batch-size", "4", "--quiet"]
FAZE_DATA = "synthetic:eth?persons=3&images_per_person=4&size=16"


def _err(capsys) -> str:
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err  # one line
    return err


def _strip_state(path, fmt) -> None:
    """``path``'s state as a version before the signatures wrote it: without their header entries."""
    tensors, meta = read_tagged(path, fmt, "a state")
    meta["header"] = {k: v for k, v in meta["header"].items() if k not in LATER}
    write_tagged(path, tensors, fmt, meta)


def _strip_model(path) -> None:
    with safe_open(str(path), framework="pt") as f:
        raw, tensors = dict(f.metadata()), {k: f.get_tensor(k) for k in f.keys()}
    config = json.loads(raw["config"])
    config["extra"] = {k: v for k, v in config["extra"].items() if k not in LATER}
    write_safetensors(path, tensors, {**raw, "config": json.dumps(config, sort_keys=True)})


def test_pretrain_and_truncate_refuse_other_images_of_the_same_name_and_an_old_state_resumes(tmp_path, capsys):
    torch.set_num_threads(1)
    pre = ["pretrain", "--model", "tiny_gaze_net", "--batch-size", "8", "--out", str(tmp_path / "p"), "--quiet"]
    assert main([*pre, "--data", DATA, "--epochs", "1"]) == 0
    model_file = tmp_path / "p" / "model.safetensors"
    before = model_file.read_bytes()
    capsys.readouterr()
    assert main([*pre, "--data", OTHER, "--epochs", "2"]) == 2
    err = _err(capsys)
    assert "state.safetensors is a checkpoint of another run" in err
    assert "made from other images than the data eth/train has now, person 'p00'" in err
    assert model_file.read_bytes() == before  # nothing trained over it
    truncate = ["truncate", "--checkpoint", str(model_file), "--batch-size", "8", "--epochs", "1", "--rank", "4"]
    truncate += ["--out", str(tmp_path / "r"), "--quiet"]
    assert main([*truncate, "--data", DATA]) == 0
    recovered = (tmp_path / "r" / "model.safetensors").read_bytes()
    capsys.readouterr()
    assert main([*truncate, "--data", OTHER]) == 2
    assert "holds a recovered model made from other images than the data eth/train has now" in _err(capsys)
    assert (tmp_path / "r" / "model.safetensors").read_bytes() == recovered
    # pre-training into truncate's folder: said as the other command's model (it listed a dozen settings that differ)
    assert main([*pre[: pre.index("--out")], "--out", str(tmp_path / "r"), "--quiet", "--data", DATA]) == 2
    said = f"{tmp_path / 'r' / 'model.safetensors'} is the model of alfa truncate's recovery, and this run is alfa "
    assert _err(capsys).startswith(f"alfa pretrain: error: {said}pretrain: use another output folder")
    assert (tmp_path / "r" / "model.safetensors").read_bytes() == recovered
    # another rank or recovery: the refusal names what differs (it said only "another configuration or data")
    other = [*truncate[: truncate.index("--rank")], "--rank", "2", *truncate[truncate.index("--rank") + 2 :]]
    other += ["--lr", "0.01"]
    assert main([*other, "--data", DATA]) == 2
    err = _err(capsys)
    assert (
        "(the folder's vs this run's: truncate_config.rank 4 vs 2, truncate_config.recovery.lr 0.0001 vs 0.01)" in err
    )
    assert (tmp_path / "r" / "model.safetensors").read_bytes() == recovered
    # a state and a model file from before the signatures: resumed as they were (here to a second epoch)
    _strip_state(tmp_path / "p" / "state.safetensors", "alfa-source-train-state")
    _strip_model(model_file)
    assert main([*pre, "--data", DATA, "--epochs", "2"]) == 0
    header = read_checkpoint(model_file, header_only=True)[1]["extra"]
    assert header["epoch"] == 2 and len(header["history"]) == 2 and "data_signature" in header


def test_truncate_refuses_a_result_or_a_recovery_made_from_another_dense_checkpoint(tmp_path, capsys):
    """alfa pretrain resumed to more epochs in the same --out: alfa truncate returned the recovered model of the
    first epoch's weights, exit 0."""
    torch.set_num_threads(1)
    pre = ["pretrain", "--model", "tiny_gaze_net", "--data", DATA, "--batch-size", "8", "--out", str(tmp_path / "p")]
    assert main([*pre, "--epochs", "1", "--quiet"]) == 0
    truncate = ["truncate", "--checkpoint", str(tmp_path / "p" / "model.safetensors"), "--data", DATA]
    truncate += ["--batch-size", "8", "--epochs", "1", "--rank", "4", "--out", str(tmp_path / "r"), "--quiet"]
    assert main(truncate) == 0
    final = tmp_path / "r" / "model.safetensors"
    recovered = final.read_bytes()
    assert main([*pre, "--epochs", "2", "--quiet"]) == 0  # the dense checkpoint changes
    capsys.readouterr()
    assert main(truncate) == 2
    err = _err(capsys)
    assert f"{final} holds a recovered model made from another dense checkpoint (checksum" in err
    assert "use another output folder, or delete it to start over" in err and final.read_bytes() == recovered
    final.unlink()  # the recovery's state is there: not resumed from the other dense model's truncation either
    assert main(truncate) == 2
    assert "recovery/state.safetensors is a checkpoint of another run (made from another dense checkpoint" in _err(
        capsys
    )
    # a recovery state from before the checksum was recorded: resumed as it was (finished: read, and written out)
    _strip_state(tmp_path / "r" / "recovery" / "state.safetensors", "alfa-source-train-state")
    assert main(truncate) == 0 and final.is_file()


def test_a_folder_or_a_link_loop_in_place_of_the_training_state_is_named(tmp_path, capsys):
    """state.safetensors a folder or a loop of links: "is there without the training state" was said of the model."""
    pre = ["pretrain", "--model", "tiny_gaze_net", "--data", DATA, "--batch-size", "8", "--out", str(tmp_path / "p")]
    assert main([*pre, "--epochs", "1", "--quiet"]) == 0
    state, model_file = tmp_path / "p" / "state.safetensors", tmp_path / "p" / "model.safetensors"
    before = model_file.read_bytes()
    state.unlink()
    state.mkdir()
    capsys.readouterr()
    assert main([*pre, "--epochs", "2", "--quiet"]) == 2
    err = _err(capsys)
    assert f"{state} is a folder, not the file a training run writes there; move it away" in err, err
    state.rmdir()
    os.symlink(state.name, state)  # a link to itself
    assert main([*pre, "--epochs", "2", "--quiet"]) == 2
    assert f"{state} is a symbolic link that points back into itself, not the file" in _err(capsys)
    assert model_file.read_bytes() == before and state.is_symlink()


def test_faze_train_refuses_other_images_and_resumes_an_old_state(tmp_path, capsys):
    torch.set_num_threads(1)
    out = tmp_path / "f"
    train = [*FAZE, "--out", str(out)]
    assert main([*train, "--data", FAZE_DATA, "--steps", "1"]) == 0
    before = (out / "model.safetensors").read_bytes()
    capsys.readouterr()
    assert main([*train, "--data", FAZE_DATA + "&seed=5", "--steps", "2"]) == 2
    err = _err(capsys)
    assert "faze_state.safetensors is the state of another run" in err
    assert "made from other images than the data eth/train has now" in err
    assert (out / "model.safetensors").read_bytes() == before
    _strip_state(out / "faze_state.safetensors", "alfa-faze-state")  # from before the signatures: resumed
    assert main([*train, "--data", FAZE_DATA, "--steps", "2"]) == 0
    assert (out / "model.safetensors").read_bytes() != before


def test_faze_train_says_its_state_is_missing_or_what_is_in_its_place(tmp_path, capsys):
    """faze_state.safetensors deleted by hand: "so no run of this command wrote it" was said of the model it wrote."""
    torch.set_num_threads(1)
    out = tmp_path / "f"
    train = [*FAZE, "--out", str(out), "--data", FAZE_DATA]
    assert main([*train, "--steps", "1"]) == 0
    before = (out / "model.safetensors").read_bytes()
    (out / "faze_state.safetensors").unlink()
    capsys.readouterr()
    assert main([*train, "--steps", "2"]) == 2
    err = _err(capsys)
    assert f"{out / 'faze_state.safetensors'} is missing: alfa faze train wrote the model.safetensors" in err
    assert "no run of this command wrote it" not in err and "put the state back" in err
    (out / "faze_state.safetensors").mkdir()
    assert main([*train, "--steps", "2"]) == 2
    assert "faze_state.safetensors is a folder, not the state a run writes there" in _err(capsys)
    assert (out / "model.safetensors").read_bytes() == before


def test_tpgaze_meta_training_refuses_other_images_and_resumes_an_old_state(tmp_path, capsys):
    save_model(tmp_path / "base.safetensors", truncated_tiny_gaze_net(), "tiny_gaze_net")
    source = "synthetic:eth?size=32&persons=3&images_per_person=8"
    argv = ["tpgaze", "meta-train", "--checkpoint", str(tmp_path / "base.safetensors"), "--out", str(tmp_path / "m")]
    argv += ["--steps-per-epoch", "1", "--batch-size", "4", "--quiet"]
    assert main([*argv, "--data", source, "--epochs", "1"]) == 0
    capsys.readouterr()
    assert main([*argv, "--data", source + "&seed=5", "--epochs", "2"]) == 2
    err = _err(capsys)
    assert "meta_state.safetensors is the state of another meta-training run" in err
    assert "made from other images than the data eth/train has now" in err
    _strip_state(tmp_path / "m" / "meta_state.safetensors", "alfa-tpgaze-meta")
    assert main([*argv, "--data", source, "--epochs", "2"]) == 0
    assert len(json.loads((tmp_path / "m" / "meta_train.json").read_text())["history"]) == 2


def test_calibrate_refuses_a_folder_made_on_another_base_unless_replace(tmp_path, capsys):
    """An --out of another base's calibration was recalibrated and every file overwritten without --replace."""
    first = save_model(tmp_path / "a.safetensors", truncated_tiny_gaze_net(), "tiny_gaze_net")
    second = save_model(tmp_path / "b.safetensors", truncated_tiny_gaze_net(seed=7), "tiny_gaze_net")
    out = tmp_path / "c"
    argv = ["calibrate", "--data", "synthetic:mpii?persons=2&images_per_person=8&size=16", "--out", str(out)]
    argv += ["--k", "2", "--pool", "4", "--quiet"]
    assert main([*argv, "--checkpoint", str(first)]) == 0
    files = {p.name: p.read_bytes() for p in out.iterdir()}
    capsys.readouterr()
    assert main([*argv, "--checkpoint", str(second)]) == 2
    err = _err(capsys)
    assert "holds an earlier run (its files were made on another base (" in err and "--replace" in err
    assert {p.name: p.read_bytes() for p in out.iterdir()} == files
    p00 = out / "p00.safetensors"  # a damaged file says nothing of the base: the same base redoes it
    p00.write_bytes(files["p00.safetensors"][:-20])
    assert main([*argv, "--checkpoint", str(first)]) == 0
    assert "1 done, 1 already there" in capsys.readouterr().out
    assert main([*argv, "--checkpoint", str(second), "--replace"]) == 0
    assert p00.read_bytes() != files["p00.safetensors"]


def test_settings_differences_name_each_setting_that_differs_with_both_values():
    """The one way a refusal says why a folder holds another run: each differing setting by its dotted name, the
    file's value first; a setting one side lacks is "not set" there (or "its default", where defaults are left out),
    which differs even from a None; a value too long for a line only "differs"; nothing where nothing differs."""
    from alfa.fileio import settings_differences

    saved = {"lr": 0.01, "recovery": {"steps": 3, "persons": list(range(30))}, "seed": None, "same": [1]}
    mine = {"lr": 0.5, "recovery": {"steps": 3, "persons": list(range(1, 31))}, "precision": "bf16", "same": [1]}
    assert settings_differences(saved, mine) == [
        "lr 0.01 vs 0.5",
        "precision not set vs 'bf16'",
        "recovery.persons differs",
        "seed None vs not set",
    ]
    assert settings_differences(saved, mine, absent="its default")[1] == "precision its default vs 'bf16'"
    assert settings_differences({"dataset": "a"}, {"dataset": "b"}) == ["dataset 'a' vs 'b'"]
    assert settings_differences(saved, saved) == [] and settings_differences({}, {"k": None}) == ["k not set vs None"]
