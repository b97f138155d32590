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
