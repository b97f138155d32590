"""``alfa export`` writes its ONNX file and its ``--program`` together, once both are made (an interrupted run left
the ONNX file alone, and its rerun was refused for it); and it refuses an ``--image-size`` other than the one
the checkpoint was trained on, and says when a checkpoint records none to check it against."""

import pytest
import tiny_models  # noqa: F401 - registers micro_gaze_net

import alfa
import alfa.export
from alfa.cli import main

pytest.importorskip("onnxruntime")


def _base(tmp_path):
    model = alfa.models.create_model("micro_gaze_net")
    return alfa.checkpoint.save_model(tmp_path / "base.safetensors", model, "micro_gaze_net", input_size=(32, 32))


def test_an_interrupted_export_leaves_neither_file_and_its_rerun_finishes(tmp_path, monkeypatch, capsys):
    onnx, program = tmp_path / "m.onnx", tmp_path / "m.pt2"
    argv = ["export", "--checkpoint", str(_base(tmp_path)), "--out", str(onnx), "--program", str(program)]
    real = alfa.export.export_program

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(alfa.export, "export_program", interrupted)
    assert main(argv) != 0
    assert not onnx.exists() and not program.exists()
    monkeypatch.setattr(alfa.export, "export_program", real)
    capsys.readouterr()
    assert main(argv) == 0, capsys.readouterr().err
    assert onnx.is_file() and program.is_file()


@pytest.mark.parametrize("side", ["1", "16", "64"])
def test_another_image_size_than_the_trained_one_is_refused(tmp_path, capsys, side):
    out = tmp_path / "m.onnx"
    argv = ["export", "--checkpoint", str(_base(tmp_path)), "--out", str(out), "--image-size", side, side]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert f"--image-size {side} {side}:" in err and "trained on 32×32 images" in err, err
    assert "leave --image-size out" in err and len(err.strip().splitlines()) == 1, err
    assert not out.exists()


def test_the_trained_size_given_again_is_taken(tmp_path, capsys):
    out = tmp_path / "m.onnx"
    assert main(["export", "--checkpoint", str(_base(tmp_path)), "--out", str(out), "--image-size", "32", "32"]) == 0
    assert out.is_file()
    assert capsys.readouterr().err == ""  # checked against the record: nothing to say


def test_a_size_no_record_can_check_is_taken_with_a_note(tmp_path, capsys):
    # a checkpoint without its training size took any --image-size without a word, while one with it refused all
    # others: the user could not tell the size had not been checked
    model = alfa.models.create_model("micro_gaze_net")
    base = alfa.checkpoint.save_model(tmp_path / "base.safetensors", model, "micro_gaze_net")
    out = tmp_path / "m.onnx"
    assert main(["export", "--checkpoint", str(base), "--out", str(out), "--image-size", "24", "24"]) == 0
    assert out.is_file()
    captured = capsys.readouterr()
    assert captured.out.startswith(f"wrote {out}")
    assert captured.err == (
        f"alfa export: note: {base} does not record the image size it was trained on, so --image-size 24 24 could "
        "not be checked against it (a model predicts much worse on another size)\n"
    )
