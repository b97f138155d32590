"""Damaged files the study commands keep, and options a newcomer mistypes: one line naming the file or the option,
never a traceback or a run that fills the machine (a newcomer's audit of the CRATE, LLM and data commands)."""

from __future__ import annotations

import os

import pytest
import tiny_models  # noqa: F401 — registers tiny_gaze_net
import torch

from alfa.cli import main
from alfa.fileio import read_kept_json


@pytest.mark.parametrize(("text", "why"), [("[]", r"a JSON list, not a dict"), ('{"step": ', r"Expecting value")])
def test_a_damaged_kept_record_is_named_with_what_to_do(tmp_path, text, why):
    path = tmp_path / "alfa_lr0.003_seed0.json"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(ValueError, match=rf"^{path}: damaged \({why}.*\); delete it to redo what it kept$"):
        read_kept_json(path)


def test_a_damaged_language_model_cache_is_named(tmp_path):
    from torch import nn

    from alfa.study.llm.pretrain import CHECKPOINT, _load_weights, _resume

    (tmp_path / "model.safetensors").write_bytes(b"\x00" * 1000)
    with pytest.raises(ValueError, match=rf"^{tmp_path / 'model.safetensors'}: damaged .*delete {tmp_path}"):
        _load_weights(tmp_path, nn.Linear(2, 2))
    (tmp_path / CHECKPOINT).write_bytes(b"\x00" * 1000)
    model = nn.Linear(2, 2)
    with pytest.raises(ValueError, match=rf"^{tmp_path}: damaged checkpoint .*use another --cache$"):
        _resume(tmp_path, model, torch.optim.AdamW(model.parameters()))


def test_llm_time_names_a_missing_record(tmp_path, capsys):
    assert main(["llm", "time", "--record", str(tmp_path / "nope.json")]) == 2
    assert f"--record {tmp_path / 'nope.json'}: no such file" in capsys.readouterr().err


def test_crate_toy_refuses_a_panel_listed_twice(capsys):
    assert main(["crate", "toy", "--panels", "a,a", "--seeds", "2"]) == 2  # its runs would count as 4 seeds
    assert "--panels: 'a' listed twice" in capsys.readouterr().err


@pytest.mark.parametrize("command", [["crate", "gaze"], ["costs"], ["bench"]])
def test_threads_beyond_the_machines_cpus_are_refused(command, capsys):
    # --help after it: were the option taken, the command would only print its help (exit 0), never run
    with pytest.raises(SystemExit) as stop:
        main([*command, "--threads", str(2 * len(os.sched_getaffinity(0)) + 1), "--help"])
    assert stop.value.code == 2
    assert f"at most twice the {len(os.sched_getaffinity(0))} CPUs this process may use" in capsys.readouterr().err


def test_a_face_size_beyond_any_release_and_a_bad_flag_are_one_clear_line():
    from alfa.gaze.data.registry import open_dataset

    with pytest.raises(ValueError, match=r"size must be at most 2048 \(pixels a side\), got 100000"):
        open_dataset("synthetic:mpii?size=100000")
    with pytest.raises(
        ValueError, match=r"option 'check_files=maybe': check_files must be true or false, got 'maybe'$"
    ):
        open_dataset("gazehub:mpiifacegaze:/nowhere?check_files=maybe")
    # the parser names its option itself (as the size's does), so its message says which one wherever it is read
    from alfa.gaze.data.registry import _OPTION_TYPES

    with pytest.raises(ValueError) as refused:
        _OPTION_TYPES["verify_3d"]("perhaps")
    assert str(refused.value) == "verify_3d must be true or false, got 'perhaps'"


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("{}", r"not the page's data \(no 'rounds', 'image_size'\)"),
        ("[]", r"not the page's data \(a JSON list, not an object\)"),
        ('{"rounds": ', r"not valid JSON \(Expecting value"),
    ],
)
def test_a_pages_damaged_data_file_is_named(tmp_path, text, why):
    """alfa pages read some 20 data files; an emptied one ended in a KeyError's traceback, a cut one in a parser's
    line that named no file."""
    from alfa.study.pages import _render_serving

    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "serving.json").write_text(text, encoding="utf-8")
    with pytest.raises(ValueError, match=rf"^{tmp_path / 'docs' / 'serving.json'}: {why}"):
        _render_serving(tmp_path, tmp_path / "out")


def test_summary_refuses_a_rank_that_saves_nothing_before_printing_and_briefly(capsys):
    assert main(["summary", "--model", "tiny_gaze_net", "--rank", "100000"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""  # no dense table above the error
    assert "no layer can be truncated at rank 100000 (" in captured.err and len(captured.err) < 400


def test_bench_refuses_a_cache_dir_that_is_a_file_before_anything(tmp_path, capsys):
    afile = tmp_path / "afile"
    afile.touch()
    argv = ["bench", "--smoke", "--out", str(tmp_path / "out"), "--seeds", "0", "--pairs", "E-M"]
    assert main([*argv, "--methods", "source-only", "--ablations", "none", "--cache-dir", str(afile), "--dry-run"]) == 2
    assert f"--cache-dir {afile} is a file, not a folder" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_tpgaze_names_a_model_without_the_convs_its_prompts_go_before(tmp_path, capsys):
    from alfa.checkpoint import save_model
    from alfa.models import create_model

    path = save_model(tmp_path / "faze.safetensors", create_model("faze_gaze"), "faze_gaze")
    argv = ["tpgaze", "meta-train", "--checkpoint", str(path), "--data", "synthetic:eth?persons=2&size=16"]
    assert main([*argv, "--out", str(tmp_path / "m"), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert f"{path} is a FazeGaze: TPGaze puts its prompts before a ResNet's first convolutions" in err
    assert "no layer to adapt" not in err and not (tmp_path / "m").exists()


def test_a_bad_spec_option_lists_the_options_of_that_kind():
    from alfa.gaze.data.registry import open_dataset

    with pytest.raises(ValueError, match=r"bad option 'bogus=1'; options are split, size, check_files, verify_3d, "):
        open_dataset("gazehub:mpiifacegaze:/nowhere?bogus=1")  # not seed, which only a synthetic world takes
    with pytest.raises(
        ValueError, match=r"bad option 'bogus=1'; options are split, size, seed, images_per_person, persons$"
    ):
        open_dataset("synthetic:mpii?bogus=1")


@pytest.mark.parametrize(
    "argv, words",
    [
        # an image classifier of the registry failed inside the loss: after truncating, or once the rounds began
        (["costs", "--model", "vit_tiny", "--image-size", "32"], "--model vit_tiny is not a gaze model"),
        (["throughput", "--fixture", "mpiifacegaze", "--image-size", "32", "--model", "vit_tiny"], "not a gaze model"),
        (["throughput", "--fixture", ""], "--fixture '': expected one or more of"),  # it named a dataset spec 'None'
        (["throughput", "--fixture", "mpiifacegaze,mpiifacegaze"], "--fixture: 'mpiifacegaze' listed twice"),
        (["throughput", "--fixture", "mpiifacegaze", "--workers", "0,0"], "--workers: 0 listed twice"),
        (["speed", "--transformers", "--repeats", "3"], "--repeats sets the gaze sections; --transformers measures"),
        (["speed", "--transformers", "--image-size", "32"], "--image-size sets the gaze sections"),
        (["speed", "--out", "page.json"], "--out page.json: the page's data goes beside it as .json"),
    ],
)
def test_study_commands_refuse_what_would_fail_late_or_do_nothing(argv, words, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert words in err and err.count("\n") == 1, err
    assert list(tmp_path.iterdir()) == []


def test_speed_takes_two_rounds_or_more(capsys):
    # one gave ratios without an interval, on a page advising to re-run the same command for them
    with pytest.raises(SystemExit):
        main(["speed", "--repeats", "1"])
    assert "must be at least 2 (each ratio's 95 % interval is taken over the rounds)" in capsys.readouterr().err


def test_speed_reads_the_transformer_section_beside_its_page_before_measuring(tmp_path, capsys, monkeypatch):
    from alfa.study.bench import speed

    monkeypatch.setattr(speed, "measure", lambda **kw: pytest.fail("measured before the page's data was read"))
    (tmp_path / "sp-transformers.json").write_text("precious\n")
    assert main(["speed", "--out", str(tmp_path / "sp.md"), "--repeats", "2", "--replace"]) == 2
    err = capsys.readouterr().err
    assert f"{tmp_path / 'sp-transformers.json'}: not the transformer section's measurement alfa speed writes" in err
    assert (tmp_path / "sp-transformers.json").read_text() == "precious\n"


def test_the_speed_and_serving_pages_repeat_the_threads_given(monkeypatch):
    from alfa.study.bench.serving import serving_command
    from alfa.study.bench.speed import speed_command

    assert speed_command("p.md", 20, 224) == "alfa speed --out p.md"
    assert speed_command("p.md", 4, 32, 1) == "alfa speed --out p.md --repeats 4 --image-size 32 --threads 1"
    assert serving_command(None, 28, 64) == "alfa serving --rounds 28 --image-size 64"
    assert serving_command(None, 28, 64, 1).endswith("--threads 1")
