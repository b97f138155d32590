"""Valid JSON of the wrong kind, where a file's header or a results file expects an object, a list or a number:
refused when read, with one line naming the file and the key, never met later as a traceback."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file
from tiny_models import TinyGazeNet

import alfa
from alfa.checkpoint import CheckpointError, read_checkpoint, save_model
from alfa.cli import main
from alfa.study.bench.record import Record
from alfa.study.bench.results import load_results


def _rewrite_header(path, key: str, value: str) -> None:
    """``path`` again with one header entry replaced (the tensors as they were)."""
    with safe_open(str(path), framework="pt") as f:
        meta, tensors = dict(f.metadata()), {k: f.get_tensor(k) for k in f.keys()}
    save_file(tensors, str(path), metadata={**meta, key: value})


def test_a_checkpoint_whose_config_is_not_an_object_is_refused_by_name(tmp_path, capsys):
    path = tmp_path / "m.safetensors"
    save_model(path, TinyGazeNet(), "tiny_gaze_net")
    _rewrite_header(path, "config", "[]")
    with pytest.raises(CheckpointError, match="damaged checkpoint header .its config is not a JSON object"):
        read_checkpoint(path)
    assert main(["export", "--checkpoint", str(path), "--out", str(tmp_path / "m.onnx")]) == 2
    err = capsys.readouterr().err
    assert "its config is not a JSON object" in err and "Traceback" not in err and err.count("\n") == 1


@pytest.mark.parametrize(("key", "value"), [("about", "[]"), ("config", "3"), ("targets", "{}")])
def test_an_adapter_whose_header_holds_the_wrong_kind_is_refused_by_name(tmp_path, key, value):
    torch.manual_seed(0)
    model = TinyGazeNet()
    alfa.attach(model, alfa.LoraConfig(rank=2, layers="dense"))
    path = alfa.save_adapter(model, tmp_path / "p00.safetensors")
    _rewrite_header(path, key, value)
    with pytest.raises(alfa.AdapterFileError, match=f"damaged adapter header .its '{key}' is not a JSON"):
        alfa.read_adapter_metadata(path)


DATA = "synthetic:mpii?size=16&persons=2&images_per_person=6"  # persons p00 and p01, 16×16 px


def _one_line(capsys, message: str) -> None:
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err and err.count("\n") == 1, err


@pytest.mark.parametrize(
    ("key", "value", "command", "message"),
    [
        ("factorized", [1, 2], ["evaluate"], "its 'factorized' is not a JSON object of layer names to ranks"),
        ("factorized", {"fc": "x"}, ["evaluate"], "its 'factorized' is not a JSON object of layer names to ranks"),
        ("tied", [1], ["evaluate"], "its 'tied' is not a JSON object of tensor names to tensor names"),
        ("tied", {"a": [1]}, ["evaluate"], "its 'tied' is not a JSON object of tensor names to tensor names"),
        ("input_size", "x", ["personalize", "--out", "{out}"], "its 'input_size' is not [height, width] in pixels"),
        ("input_size", "x", ["truncate", "--out", "{out}"], "its 'input_size' is not [height, width] in pixels"),
        ("extra", [1], ["truncate", "--out", "{out}"], "its 'extra' is not a JSON object"),
    ],
)
def test_a_checkpoint_entry_of_the_wrong_kind_is_refused_by_name(tmp_path, capsys, key, value, command, message):
    path = save_model(tmp_path / "m.safetensors", TinyGazeNet(), "tiny_gaze_net", input_size=(16, 16))
    config = json.loads(_header(path)["config"])
    _rewrite_header(path, "config", json.dumps({**config, key: value}))
    with pytest.raises(CheckpointError, match=re.escape(f"{path}: damaged checkpoint header ({message})")):
        read_checkpoint(path, header_only=True)
    out = tmp_path / "out"
    argv = [command[0], "--checkpoint", str(path), "--data", DATA, *(a.format(out=out) for a in command[1:])]
    assert main(argv) == 2
    _one_line(capsys, message)
    assert not out.exists()


def _adapted(folder):
    """A dense tiny base trained (nominally) on 16×16 px and a LoRA adapter of it for persons p00 and p01."""
    model = TinyGazeNet().eval()
    base = save_model(folder / "base.safetensors", model, "tiny_gaze_net", input_size=(16, 16))
    alfa.attach(model, alfa.LoraConfig(rank=2, layers="dense"))
    return base, [alfa.save_adapter(model, folder / "ad" / f"{p}.safetensors") for p in ("p00", "p01")]


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("targets", "[1]", "its 'targets' is not a JSON list of names"),
        ("modules_to_save", '[["fc"]]', "its 'modules_to_save' is not a JSON list of names"),
        ("rest_fingerprint", '{"bn1": 5}', "its rest fingerprint of 'bn1' is not a list of signatures"),
        ("rest_fingerprint", "[]", "its 'rest_fingerprint' is not a JSON object"),
        ("rest_dtypes", '{"bn1": 5}', "its 'rest_dtypes' is not a JSON object of module names to dtypes"),
        ("fingerprint", '{"fc.weight": {"shape": ["x"], "sig": [1, 2]}}', "its fingerprint of 'fc.weight' is not a"),
    ],
)
def test_an_adapter_entry_of_the_wrong_kind_is_refused_by_name(tmp_path, capsys, key, value, message):
    base, (path, _) = _adapted(tmp_path)
    _rewrite_header(path, key, value)
    with pytest.raises(alfa.AdapterFileError, match=re.escape(f"{path}: damaged adapter header ({message}")):
        alfa.read_adapter_metadata(path)
    out = tmp_path / "m.onnx"
    assert main(["export", "--checkpoint", str(base), "--adapter", str(path), "--out", str(out)]) == 2
    _one_line(capsys, message)
    assert not out.exists()


@pytest.mark.parametrize(
    ("key", "value", "why"),
    [
        ("targets", "[1]", "{path}: damaged adapter header (its 'targets' is not a JSON list of names)"),
        ("rest_fingerprint", '{"bn1": 5}', "{path}: damaged adapter header (its rest fingerprint of 'bn1' is not"),
        ("about", '{"labelled": [[1]]}', "its record of the labelled images ('labelled') is not a list of image"),
    ],
)
def test_evaluate_marks_the_person_of_a_damaged_adapter_failed_and_scores_the_others(tmp_path, capsys, key, value, why):
    base, (damaged, _) = _adapted(tmp_path)
    _rewrite_header(damaged, key, value)
    argv = ["evaluate", "--checkpoint", str(base), "--data", DATA, "--adapters", str(damaged.parent), "--quiet"]
    assert main(argv) == 2  # an evaluation that could not score everyone is an error a script sees
    captured = capsys.readouterr()
    assert "1 of 2 persons could not be scored" in captured.err and "Traceback" not in captured.err
    assert f"FAILED p00: adapter {damaged} does not load: {why.format(path=damaged)}" in captured.err
    assert "FAILED" not in captured.out  # stdout is the table (the person's row says failed)
    assert main([*argv, "--allow-partial"]) == 0
    assert "FAILED p01" not in capsys.readouterr().out


@pytest.mark.parametrize("damage", ["[]", "outcome: []", "outcome: losses 'x'"])
def test_a_sidecar_of_the_wrong_kind_redoes_its_person_on_resume(tmp_path, capsys, damage):
    model = alfa.models.create_model("tiny_gaze_net").eval()
    alfa.truncate(model, 4)
    base, out = save_model(tmp_path / "base.safetensors", model, "tiny_gaze_net", input_size=(16, 16)), tmp_path / "ad"
    argv = ["personalize", "--checkpoint", str(base), "--data", DATA, "--out", str(out), "--steps", "1", "--quiet"]
    argv += ["--adapter-rank", "4"]  # within the base's d = 4
    assert main(argv) == 0
    sidecar = out / "p00.json"
    record = json.loads(sidecar.read_text(encoding="utf-8"))
    outcome = {"[]": None, "outcome: []": [], "outcome: losses 'x'": {**record["outcome"], "losses": "x"}}[damage]
    sidecar.write_text("[]" if outcome is None else json.dumps({**record, "outcome": outcome}), encoding="utf-8")
    capsys.readouterr()
    assert main(argv) == 0  # the sidecar only caches the outcome: its person is personalized again
    assert "1 done, 1 already there, 0 failed" in capsys.readouterr().out
    assert json.loads(sidecar.read_text(encoding="utf-8"))["outcome"]["person"] == "p00"


def test_a_truncated_adapter_on_resume_is_redone_not_called_another_base(tmp_path, capsys):
    model = alfa.models.create_model("tiny_gaze_net").eval()
    alfa.truncate(model, 4)
    base, out = save_model(tmp_path / "base.safetensors", model, "tiny_gaze_net", input_size=(16, 16)), tmp_path / "ad"
    argv = ["personalize", "--checkpoint", str(base), "--data", DATA, "--out", str(out), "--steps", "1", "--quiet"]
    argv += ["--adapter-rank", "4"]  # within the base's d = 4
    assert main(argv) == 0
    first = out / "p00.safetensors"  # the first person's file, the one resuming once asked about the base
    first.write_bytes(first.read_bytes()[:-20])
    capsys.readouterr()
    assert main(argv) == 0
    captured = capsys.readouterr()
    assert "another base" not in captured.err and "1 done, 1 already there, 0 failed" in captured.out
    assert alfa.read_adapter_metadata(first)["method"] == "alfa"


@pytest.mark.parametrize(("n_adapt", "found"), [("x", "str"), (0, "0"), (True, "true"), (2.5, "2.5"), ([5], "list")])
def test_a_personalization_record_whose_n_adapt_is_no_count_is_refused_by_name(tmp_path, capsys, n_adapt, found):
    base, _ = _adapted(tmp_path)
    record = tmp_path / "ad" / "personalization.json"
    record.write_text(json.dumps({"config": {"n_adapt": n_adapt}}), encoding="utf-8")
    argv = ["evaluate", "--checkpoint", str(base), "--data", DATA, "--adapters", str(record.parent), "--quiet"]
    assert main(argv) == 2  # 0 would score the images the adapters were made from
    reason = f"the adaptation images per person, must be a whole number of at least 1, not {found})"
    _one_line(capsys, f"{record}: damaged personalization record (its config's 'n_adapt', {reason}")


def _header(path) -> dict:
    with safe_open(str(path), framework="pt") as f:
        return dict(f.metadata())


def _record(**changes) -> dict:
    fields = dict(id="a|E→M|seed0", config_hash="h", method="a", group="main", ablation=None, kind="adapter")
    fields |= dict(pair="E→M", source="E", target="M", seed=0, base="truncated", steps=1, failed={})
    fields |= dict(trainable_params=1, inference_params=1, compact_merge_params=1, merge="exact", adapter_bytes=1)
    fields |= dict(compact_bytes=1, seconds_per_user=1.0, cpu_seconds_per_user=1.0, peak_rss_mib=1.0)
    fields |= dict(peak_rss_increase_mib=0.0, latency_ms=1.0, base_latency_ms=1.0, persons=1)
    fields |= dict(per_person={"p00": 9.5}, error_deg=9.5, wall_s=1.0, cpu_s=1.0, finished="2026-12-05T00:00:00")
    return fields | changes


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"error_deg": "abc"}, "'error_deg' must be float or None, not str"),
        ({"per_person": 5}, "'per_person' must be dict, not int"),
        ({"per_person": {"p00": "x"}}, "'per_person' must map to numbers (or null), not at 'p00'"),
        ({"seed": True}, "'seed' must be int, not bool"),
        ({"ablation": []}, "'ablation' must be dict or None, not list"),
    ],
)
def test_a_record_of_the_wrong_kinds_is_refused_by_name(changes, message):
    assert Record.from_dict(_record()).error_deg == 9.5  # the fixture itself reads
    assert Record.from_dict(_record(error_deg=None, seed=3)).seed == 3  # an int where a float goes, null where allowed
    with pytest.raises(ValueError, match=re.escape(f"record 'a|E→M|seed0': {message}")):
        Record.from_dict(_record(**changes))


def test_a_results_file_whose_parts_are_the_wrong_kind_is_refused_by_name(tmp_path, capsys):
    from alfa.study.bench.schema import FORMAT, VERSION

    base = {"format": FORMAT, "version": VERSION, "records": [_record()], "config": {}, "sources": {}, "runs": []}
    (tmp_path / "results.json").write_text(json.dumps(base), encoding="utf-8")
    assert len(load_results(tmp_path)["records"]) == 1
    for key, value in (("config", []), ("sources", 3), ("runs", {})):
        (tmp_path / "results.json").write_text(json.dumps({**base, key: value}), encoding="utf-8")
        with pytest.raises(ValueError, match=f"'{key}' must be a"):
            load_results(tmp_path)
    (tmp_path / "results.json").write_text(json.dumps({**base, "config": []}), encoding="utf-8")
    assert main(["report", "--results", str(tmp_path), "--out", str(tmp_path / "page.md")]) == 2
    err = capsys.readouterr().err
    assert "'config' must be a JSON object, not list" in err and "Traceback" not in err


def test_an_unreadable_checkpoint_is_called_unreadable_not_missing(tmp_path, monkeypatch, capsys):
    import alfa.checkpoint as checkpoint

    path = tmp_path / "m.safetensors"
    save_model(path, TinyGazeNet(), "tiny_gaze_net")
    # as root every file reads, so the permission is taken away where the check asks for it
    real = checkpoint.os.access
    monkeypatch.setattr(checkpoint.os, "access", lambda p, mode, **kw: Path(p) != path and real(p, mode, **kw))
    assert main(["export", "--checkpoint", str(path), "--out", str(tmp_path / "m.onnx")]) == 2
    err = capsys.readouterr().err
    assert f"checkpoint {path}: not readable (permission denied)" in err and "No such file" not in err


@pytest.mark.parametrize(
    ("part", "message"),
    [
        ({"runs": [{"wall_s": "x"}]}, "run 0: 'wall_s' must be a number, not str"),
        ({"runs": [{"load_average_end": "1.2"}]}, "run 0: 'load_average_end' must be a number or null, not str"),
        ({"runs": [{"cpu_s": 1.0}, {"cpus": True}]}, "run 1: 'cpus' must be a whole number or null, not bool"),
        ({"runs": [{"selection": []}]}, "run 0: 'selection' must be a JSON object, not list"),
        ({"runs": [3]}, "run 0 is not a JSON object"),
        ({"sources": {"E|seed0": 3}}, "source 'E|seed0' is not a JSON object"),
        (
            {"sources": {"E|seed0": {"recorded_train_seconds": "x"}}},
            "source 'E|seed0': 'recorded_train_seconds' must be a number or null, not str",
        ),
    ],
)
def test_a_results_file_whose_runs_or_sources_are_the_wrong_kind_is_refused_by_name(tmp_path, capsys, part, message):
    from alfa.study.bench.schema import FORMAT, VERSION

    base = {"format": FORMAT, "version": VERSION, "records": [_record()], "config": {}, "sources": {}, "runs": []}
    path = tmp_path / "results.json"
    run = {"command": None, "started": "2026-12-05T00:00:00", "wall_s": 1.0, "cpu_s": 1, "cpus": None, "finished": True}
    run["load_average_start"] = None  # a system that keeps no load average (Windows)
    path.write_text(json.dumps({**base, "runs": [run], "sources": {"E|seed0": {"seconds": {}}}}), encoding="utf-8")
    assert len(load_results(tmp_path)["runs"]) == 1  # a library call's run (no command), a whole number of seconds
    path.write_text(json.dumps({**base, **part}), encoding="utf-8")
    with pytest.raises(ValueError, match=re.escape(f"{path}: {message}")):
        load_results(tmp_path)
    assert main(["report", "--results", str(tmp_path), "--out", str(tmp_path / "page.md")]) == 2
    _one_line(capsys, message)
    assert not (tmp_path / "page.md").exists()


def test_a_run_without_a_command_is_a_library_call_on_the_page(tmp_path):
    """The runner records a library call's run with the command null: the first worlds' page reads every run's
    command (for --standard), and says which run it was."""
    from alfa.study.bench.report_page import render_report
    from alfa.study.bench.schema import FORMAT, VERSION

    run = {"command": None, "started": "2026-12-05T00:00:00", "wall_s": 60.0, "cpu_s": 60.0, "finished": True}
    base = {"format": FORMAT, "version": VERSION, "records": [_record()], "config": {}, "sources": {}, "runs": [run]}
    (tmp_path / "results.json").write_text(json.dumps(base), encoding="utf-8")
    assert "`(library call)`" in render_report(load_results(tmp_path))


def test_a_checkpoint_extras_held_out_persons_and_meta_training_record_of_the_wrong_kind_are_named():
    """Checked below the top level of `extra`: `val_persons: 5` crashed truncate and tpgaze, and a `maml` record of
    another kind crashed calibrate after it had made room in --out (with --replace: after removing files)."""
    from types import SimpleNamespace

    from alfa.cli.calibrate import _meta_training_recipe
    from alfa.gaze.train import held_out_persons

    data = SimpleNamespace(name="eth/train", persons=lambda: ["p00", "p01"])
    for persons in (5, "p01", [1, 2]):
        with pytest.raises(ValueError, match=r"^m.safetensors: damaged checkpoint header \(its held-out 'val_persons'"):
            held_out_persons({"extra": {"val_data": "eth/train", "val_persons": persons}}, data, "m.safetensors")
    assert held_out_persons({"extra": {"val_data": "eth/train", "val_persons": ["p01"]}}, data) == ["p01"]
    assert held_out_persons({"extra": {"val_data": "other", "val_persons": ["p01"]}}, data) is None
    # another split of the same name (GazeHub names Gaze360's val split gaze360 too): "no validation person(s) [...]"
    with pytest.raises(ValueError, match=r"^m.st validated on persons that eth/train here does not hold \(r5/0\): an"):
        held_out_persons({"extra": {"val_data": "eth/train", "val_persons": ["r5/0"]}}, data, "m.st")
    for maml in ([], {"config": []}, {"config": {"inner_lr": "x", "inner_steps": 5}}, {"config": {"inner_lr": 0.1}}):
        with pytest.raises(ValueError, match=r"^m.safetensors: damaged checkpoint header \(its meta-training record"):
            _meta_training_recipe({"extra": {"maml": maml}}, "m.safetensors")
    recorded = {"extra": {"maml": {"config": {"inner_lr": 0.01, "inner_steps": 5}}}}
    assert _meta_training_recipe(recorded, "m") == (0.01, 5)
    assert _meta_training_recipe({"extra": {}}, "m") is None


def test_evaluate_refuses_in_one_line_before_scoring_where_no_file_fits_the_base(tmp_path, capsys):
    """A newcomer scored FAZE calibrations with a ResNet: the base's column was scored, then every person failed
    in turn with the same words. Where no file fits, one line says so before any scoring."""
    _, (path, _) = _adapted(tmp_path)
    torch.manual_seed(1)
    other = save_model(tmp_path / "other.safetensors", TinyGazeNet().eval(), "tiny_gaze_net", input_size=(16, 16))
    argv = ["evaluate", "--checkpoint", str(other), "--data", DATA, "--adapters", str(path.parent), "--quiet"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"--adapters {path.parent}: no file there fits --checkpoint {other}" in err
    assert "p00.safetensors: " in err and "FAILED" not in err
