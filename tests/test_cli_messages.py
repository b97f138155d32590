"""What the CLI says when it refuses: the valid choices where a name is wrong, the real reason where a guess
would mislead, and one line where every person would fail alike; found by an audit of the CLI's messages."""

from __future__ import annotations

import pytest
import tiny_models  # noqa: F401 — registers tiny_gaze_net
from tiny_models import one_error_line as _one_line
from tiny_models import tiny_checkpoints, truncated_tiny_gaze_net

import alfa
from alfa.checkpoint import save_model
from alfa.cli import main

TARGET = "synthetic:mpii?persons=2&images_per_person=8&size=16"


@pytest.fixture
def checkpoints(tmp_path):
    return tiny_checkpoints(tmp_path)


def test_an_unknown_option_lists_the_methods_options_and_the_closest(checkpoints, tmp_path, capsys):
    _, truncated = checkpoints
    argv = ["personalize", "--checkpoint", truncated, "--data", TARGET, "--out", str(tmp_path / "a"), "--quiet"]
    assert main([*argv, "--method", "lora", "--option", "dropout=5"]) == 2
    err = _one_line(capsys)
    assert "unknown LoraConfig options: dropout; the options are alpha, layers, modules_to_save," in err
    assert "did you mean" not in err  # nothing is close to dropout
    assert main([*argv, "--method", "lora", "--option", "rnak=2"]) == 2
    assert "'rnak': did you mean 'rank'?" in _one_line(capsys)
    assert not (tmp_path / "a").exists()


@pytest.mark.parametrize(
    ("row", "words"),
    [
        ("calibrate-affine[k=0]", "calibrate-affine[k=0]: calibrate-affine has rows at k = 1, 3, 5, 9, 16 only"),
        ("calibrate-affine[k=1000]", "has rows at k = 1, 3, 5, 9, 16 only, not k = 1000"),
        ("calibrate-adapter-lora[k=1]", "calibrate-adapter-lora has rows at k = 3, 9 only, not k = 1"),
        ("calibrate-adapter-lora-spread[k=3]", "calibrate-adapter-lora has rows of random draws only"),
    ],
)
def test_bench_says_which_k_a_calibration_row_takes(row, words, tmp_path, capsys):
    # they were refused as "unknown method(s)", listing every method name but not the k
    assert main(["bench", "--smoke", "--methods", row, "--dry-run", "--out", str(tmp_path / "b")]) == 2
    err = _one_line(capsys)
    assert words in err and "unknown method" not in err
    assert main(["bench", "--smoke", "--methods", "calibrate-bogus[k=3]", "--dry-run", "--out", str(tmp_path / "b")])
    assert "unknown method(s) ['calibrate-bogus[k=3]']" in _one_line(capsys)


def test_a_json_file_not_in_utf8_is_called_utf16_only_when_it_looks_like_it(tmp_path):
    from alfa.gaze.camera import load_camera

    text = '{"matrix": [[512, 0, 256], [0, 512, 256], [0, 0, 1]], "note": "caméra"}'
    (tmp_path / "latin1.json").write_bytes(text.encode("latin-1"))
    (tmp_path / "utf16le.json").write_bytes(text.encode("utf-16-le"))  # no byte-order mark: many NULs
    (tmp_path / "utf16.json").write_bytes(text.encode("utf-16"))  # with its byte-order mark
    with pytest.raises(ValueError) as refused:
        load_camera(tmp_path / "latin1.json")
    words = str(refused.value)
    assert (
        "is not UTF-8 text (byte 0xe9 at offset 66: saved in Latin-1 or another 8-bit encoding? save it as UTF-8)"
        in words
    )
    assert "UTF-16" not in words and words.endswith("save it as UTF-8)")
    for name in ("utf16le.json", "utf16.json"):
        with pytest.raises(ValueError, match=r"is not UTF-8 text \(saved as UTF-16\? save it as UTF-8\)"):
            load_camera(tmp_path / name)
    # a photo named where the JSON goes was "not UTF-8 text (... saved in Latin-1 ...?)"
    (tmp_path / "face.jpg").write_bytes(b"\xff\xd8\xff\xe0\x00\x10JFIF\x00" + bytes(range(128, 256)))
    with pytest.raises(ValueError, match=r"face.jpg is a JPEG image, not a JSON file$"):
        load_camera(tmp_path / "face.jpg")


def test_meta_prompts_given_as_a_folder_point_to_the_prompts_file(checkpoints, tmp_path, capsys):
    # the folder was answered with "(alfa personalize writes <person>.safetensors)", a file of another command
    _, truncated = checkpoints
    (tmp_path / "tp1").mkdir()
    common = ["--checkpoint", truncated, "--data", TARGET, "--steps", "1", "--quiet", "--out", str(tmp_path / "o")]
    runs = (
        ["tpgaze", "personalize", "--meta", str(tmp_path / "tp1")],
        ["personalize", "--method", "tpgaze", "--init", str(tmp_path / "tp1")],
    )
    for argv in runs:
        assert main([*argv, *common]) == 2
        err = _one_line(capsys)
        assert f"is a folder: meta-trained prompts are one file, {tmp_path / 'tp1' / 'prompts.safetensors'}" in err
        assert "what alfa tpgaze meta-train writes" in err and "alfa personalize writes" not in err


def test_a_prompt_file_as_a_users_adapter_is_answered_with_why_it_cannot_be_served(service_world, tmp_path):
    # the answer said "does not load onto this base" (a wrong base) while the log had the reason: prompts
    import shutil

    import numpy as np

    from alfa.adapters.prompt import TPGazeConfig
    from alfa.checkpoint import load_model
    from alfa.gaze.service import GazeService
    from alfa.gaze.service.limits import ServiceError
    from alfa.gaze.service.selftest import png_bytes

    adapters = tmp_path / "adapters"
    shutil.copytree(service_world / "adapters", adapters)
    model, _ = load_model(service_world / "base.safetensors")
    alfa.attach(model, TPGazeConfig(image_size=16))
    alfa.save_adapter(model, adapters / "tia.safetensors", about={"person": "tia"})
    notes: list[str] = []
    service = GazeService(service_world / "base.safetensors", adapters, note=notes.append)
    face = np.random.default_rng(0).integers(0, 256, (16, 16, 3), dtype=np.uint8)
    with pytest.raises(ServiceError) as caught:
        service.predict("tia", png_bytes(face))
    words = str(caught.value)
    assert caught.value.status == 404 and "does not load onto this base" not in words
    assert words.startswith("user 'tia': their adapter cannot be served here: tpgaze's prompts pad each adapted")
    assert "cannot be merged" in words and str(tmp_path) not in words  # the reason, not the server's paths
    assert notes == [f"alfa serve: {words}"]  # the log says it once


def test_an_alfa_file_given_as_checkpoint_is_named_with_the_option_that_takes_it(checkpoints, tmp_path, capsys):
    # each was "not an alfa checkpoint (no 'alfa-checkpoint' header)", though the header says what the file is
    import torch

    from alfa.adapters.prompt import TPGazeConfig
    from alfa.checkpoint import write_tagged

    _, truncated = checkpoints
    model = truncated_tiny_gaze_net()
    alfa.attach(model, alfa.AlfaConfig(heads=2, rank=2))
    alfa.save_adapter(model, tmp_path / "adapter.safetensors")
    alfa.detach(model)
    alfa.attach(model, TPGazeConfig(image_size=16))
    alfa.save_adapter(model, tmp_path / "prompts.safetensors")
    run = tmp_path / "run"
    run.mkdir()
    save_model(run / "model.safetensors", truncated_tiny_gaze_net(), "tiny_gaze_net")
    for fmt in ("alfa-source-train-state", "alfa-faze-state", "alfa-tpgaze-meta"):
        write_tagged(run / f"{fmt}.safetensors", {"x": torch.zeros(1)}, fmt, {"header": {}})
    expected = {
        tmp_path / "adapter.safetensors": "it is a person's alfa adapter: give it to --adapter (alfa predict",
        tmp_path / "prompts.safetensors": "it holds TPGaze prompts, an adapter: meta-trained ones go to alfa tpgaze "
        "personalize --meta",
        run / "alfa-source-train-state.safetensors": "it is the resumable training state of alfa pretrain or alfa "
        f"truncate, kept to resume the run; its model, for --checkpoint, is {run / 'model.safetensors'})",
        run / "alfa-faze-state.safetensors": "it is the resumable training state of alfa faze train or alfa faze "
        "meta-train",
        run / "alfa-tpgaze-meta.safetensors": "it is the resumable state of alfa tpgaze meta-train, kept to resume the "
        "run)",  # no prompts.safetensors beside it here: none named
    }
    for path, words in expected.items():
        assert main(["evaluate", "--checkpoint", str(path), "--data", TARGET, "--quiet"]) == 2
        err = _one_line(capsys)
        assert f"{path}: not an alfa checkpoint ({words}" in err and "no 'alfa-checkpoint' header" not in err, err
    write_tagged(tmp_path / "other.safetensors", {"x": torch.zeros(1)}, "something-else", {})
    assert main(["evaluate", "--checkpoint", str(tmp_path / "other.safetensors"), "--data", TARGET]) == 2
    assert "not an alfa checkpoint (no 'alfa-checkpoint' header)" in _one_line(capsys)


def test_evaluate_refuses_what_would_fail_every_person_in_one_line_up_front(checkpoints, tmp_path, capsys):
    # each printed a table of failed persons, their FAILED lines on stdout, then an error
    _, truncated = checkpoints
    argv = ["evaluate", "--checkpoint", truncated, "--data", TARGET, "--quiet"]
    assert main([*argv, "--n-adapt", "100"]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.count("\n") == 1  # no table of nobody
    err = captured.err
    assert "--n-adapt 100: a person needs those first images plus at least one to score" in err
    assert "the most any person of mpii/test has is 8; use --n-adapt 7 or less" in err
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "notes.txt").write_text("no adapters here")
    assert main([*argv, "--adapters", str(tmp_path / "empty")]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.count("\n") == 1
    assert "--adapters " + str(tmp_path / "empty") + ": no adapter file of any person of mpii/test" in captured.err
    assert "p00.safetensors" in captured.err


def test_evaluate_says_who_failed_on_stderr_and_keeps_stdout_the_table(checkpoints, tmp_path, capsys):
    dense, truncated = checkpoints
    common = ["--data", TARGET, "--quiet", "--adapter-rank", "4", "--steps", "1"]
    assert main(["personalize", "--checkpoint", truncated, *common, "--out", str(tmp_path / "a")]) == 0
    (tmp_path / "a" / "p01.safetensors").unlink()  # one person has no adapter: they fail, the other is scored
    capsys.readouterr()
    argv = ["evaluate", "--checkpoint", truncated, "--data", TARGET, "--adapters", str(tmp_path / "a"), "--quiet"]
    assert main(argv) == 2
    captured = capsys.readouterr()
    assert "FAILED" not in captured.out and "p01" in captured.out and "failed" in captured.out
    assert f"FAILED p01: no adapter file {tmp_path / 'a' / 'p01.safetensors'}" in captured.err
    assert "1 of 2 persons could not be scored" in captured.err


def test_evaluate_says_once_a_reason_every_person_failed_for(checkpoints, tmp_path, capsys):
    """Adapters of other data, scored: every person failed alike, each said on a line of its own (16 lines for
    15 persons); now one line, with the first person's reason. Reasons that differ are still listed."""
    _, truncated = checkpoints
    common = ["--data", TARGET, "--quiet", "--adapter-rank", "4", "--steps", "1"]
    assert main(["personalize", "--checkpoint", truncated, *common, "--out", str(tmp_path / "a")]) == 0
    other = TARGET.replace("mpii", "eyediap")
    argv = ["evaluate", "--checkpoint", truncated, "--adapters", str(tmp_path / "a"), "--quiet"]
    assert main([*argv, "--data", other]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "FAILED" not in err, err
    assert "no person could be scored (2 of 2 failed, each alike; the first, p00: " in err and "'p00'" in err
    (tmp_path / "a" / "p01.safetensors").write_bytes(b"not an adapter")  # another reason: each on its line
    assert main([*argv, "--data", other]) == 2
    err = capsys.readouterr().err
    assert "FAILED p00: " in err and "FAILED p01: " in err and "(2 of 2 failed, listed above)" in err


def test_personalize_says_a_reason_every_person_failed_for_once(checkpoints, tmp_path, capsys):
    _, truncated = checkpoints
    argv = ["personalize", "--checkpoint", truncated, "--data", TARGET, "--out", str(tmp_path / "a"), "--quiet"]
    assert main([*argv, "--adapter-rank", "4", "--lr", "1e30", "--steps", "3"]) == 2
    err = _one_line(capsys)
    assert "personalization failed for every person (2), each alike: FloatingPointError: personalization: the " in err
    assert "FAILED" not in err


def test_faces_smaller_than_the_size_asked_are_noted_once_and_tiny_ones_refused(tmp_path):
    # a 1×1 face in a ?size=32 dataset was upscaled and scored without a word
    import warnings

    from PIL import Image

    from alfa.gaze.data.fixtures import write_gazehub_fixture, write_xgaze_h5_dir
    from alfa.gaze.data.gazehub import DatasetFormatError, GazeHubDataset
    from alfa.gaze.data.xgaze import XGazeH5Dataset

    write_gazehub_fixture(tmp_path / "gh", "mpiifacegaze", images_per_person=3, size=16, write_eyes=False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        data = GazeHubDataset(tmp_path / "gh", "mpiifacegaze", size=32)  # 16 -> 32: upscaled twice a side
        for _ in range(2):  # every face, twice (two epochs)
            images = data.raw_images(list(range(len(data))))
    assert images.shape[-2:] == (32, 32)
    notes = [str(w.message) for w in caught]
    assert notes == [
        f"mpiifacegaze: {len(data)} face(s) are smaller than 32×32, the smallest 16×16: upscaled to ?size=32, "
        "which blurs them (said once for the dataset)"
    ]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        GazeHubDataset(tmp_path / "gh", "mpiifacegaze", size=16).raw_images([0, 1])  # the stored size: no note
    assert caught == []
    face = data.image_path(1)
    Image.new("RGB", (1, 1)).save(face)  # one face of 1×1
    with pytest.raises(DatasetFormatError) as refused:  # on reading face 0, which is upscaled: before any score
        GazeHubDataset(tmp_path / "gh", "mpiifacegaze", size=32).raw_images([0])
    assert f"{face} (listed at " in str(refused.value)
    assert "the face is 1×1, too small to resize to 32×32 (more than 4× a side" in str(refused.value)

    write_xgaze_h5_dir(tmp_path / "h5", images=3, size=10)  # the h5 files' faces: their sizes known up front
    with pytest.warns(UserWarning, match=r"eth-xgaze: \d+ face\(s\) are smaller than 16×16, the smallest 10×10"):
        XGazeH5Dataset(tmp_path / "h5", size=16)
    with pytest.raises(DatasetFormatError, match="face_patch: the face is 10×10, too small to resize to 48×48"):
        XGazeH5Dataset(tmp_path / "h5", size=48)


def test_a_warning_while_a_command_runs_is_one_line_as_the_commands_own_are(tmp_path):
    # the note of upscaled faces came as Python shows a warning: the file and line that warned, then that line of
    # code; a person running alfa sees "alfa <command>: warning: ...", as alfa serve's and alfa predict's own
    import os
    import subprocess
    import sys

    from alfa.gaze.data.fixtures import write_gazehub_fixture

    write_gazehub_fixture(tmp_path / "gh", "mpiifacegaze", images_per_person=7, size=16, write_eyes=False)
    model = alfa.models.create_model("resnet18_gaze")
    checkpoint = save_model(tmp_path / "m.safetensors", model, "resnet18_gaze", input_size=(32, 32))
    argv = ["-m", "alfa", "evaluate", "--checkpoint", str(checkpoint), "--data", f"gazehub:mpii:{tmp_path}/gh?size=32"]
    env = {k: v for k, v in os.environ.items() if k != "PYTHONWARNINGS"}
    said = (
        "mpiifacegaze: 21 face(s) are smaller than 32×32, the smallest 16×16: upscaled to ?size=32, which blurs them "
        "(said once for the dataset)"
    )
    run = subprocess.run([sys.executable, *argv, "--quiet"], capture_output=True, text=True, env=env)
    assert run.returncode == 0, run.stderr
    assert run.stderr == f"alfa evaluate: warning: {said}\n"
    # Python's own warning options keep Python's form, with the place that warned
    run = subprocess.run([sys.executable, "-W", "default", *argv, "--quiet"], capture_output=True, text=True, env=env)
    assert run.returncode == 0, run.stderr
    assert "gazehub.py:" in run.stderr and f"UserWarning: {said}\n" in run.stderr


def test_one_line_warnings_says_the_first_line_and_is_undone_after(monkeypatch):
    import sys
    import warnings

    from alfa.cli.errors import one_line_warnings

    monkeypatch.setattr(sys, "warnoptions", [])  # (pytest itself may run under -W)
    before = warnings.formatwarning
    with one_line_warnings("alfa x"):
        line = warnings.formatwarning(UserWarning("first\nsecond"), UserWarning, "f.py", 3, "code()")
        assert line == "alfa x: warning: first (...)\n"
        with warnings.catch_warnings(record=True) as caught:  # a recorded warning is recorded as it was
            warnings.simplefilter("always")
            warnings.warn("kept", UserWarning, stacklevel=1)
        assert [str(w.message) for w in caught] == ["kept"]
        # said once per command: attach's note of a rank above a layer's size came once per calibrated person
        assert warnings.formatwarning(UserWarning("first\nsecond"), UserWarning, "g.py", 9, None) == ""
        assert warnings.formatwarning(UserWarning("other"), UserWarning, "f.py", 3, None) == "alfa x: warning: other\n"
    assert warnings.formatwarning is before
    with one_line_warnings("alfa x"):  # the next command says it again
        assert warnings.formatwarning(UserWarning("first"), UserWarning, "f.py", 3, None) == "alfa x: warning: first\n"


def test_export_verbose_keeps_pythons_form_of_a_warning(monkeypatch):
    """``alfa export --verbose`` is asked for to read the exporter's own words: its warnings keep their category and
    place, not the one line every other command gives."""
    import sys
    import warnings

    from alfa.cli.errors import one_line_warnings

    monkeypatch.setattr(sys, "warnoptions", [])
    with one_line_warnings("alfa export", keep_python_form=True):
        line = warnings.formatwarning(FutureWarning("deprecated\nmore"), FutureWarning, "f.py", 3, "code()")
    assert line.startswith("f.py:3: FutureWarning: deprecated\nmore") and "alfa export" not in line
