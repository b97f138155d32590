"""What ``alfa llm bench`` resumes from: a kept run record or ``timing.json`` that is valid JSON but not what the
bench wrote (``{}``, another run's, cut by hand) is named in one line with what to do, never a KeyError from the
rate selection, nor copied into bench.json, nor taken as a timing of nothing."""

from __future__ import annotations

import dataclasses
import json

import pytest

pytest.importorskip("transformers")

from alfa.study.llm import bench  # noqa: E402
from alfa.study.llm.adapt import AdaptConfig  # noqa: E402
from alfa.study.llm.model import ModelConfig, build_model  # noqa: E402
from alfa.study.llm.pretrain import PretrainConfig  # noqa: E402
from alfa.study.llm.tasks import TASKS  # noqa: E402

TINY = ModelConfig(hidden=16, layers=1, heads=2, intermediate=32)
CONFIG = bench.BenchConfig(
    pretrain=PretrainConfig(model=TINY, steps=2, batch=4, warmup=1, checkpoint_every=1, probe_problems=1),
    adapt=AdaptConfig(batch=8, epochs=1, warmup=1, decode_steps=4),
    examples=12,
    val_per_task=1,
    test_per_task=2,
    seeds=(0,),
    grids={"lora": (1e-3,)},
    name="tiny",
)


def _record(method: str, lr: float) -> dict:
    per_task = {t: [1.0] for t in TASKS}
    trained = {} if method == "base" else {"step_seconds": 0.1, "step_memory_bytes": 1024}
    return {"method": method, "lr": lr, "seed": 0, "trainable": 10, "adapter_bytes": 40, **trained,
            "scores": {"val": per_task, "test": per_task}, "answer_loss": per_task}  # fmt: skip


TIMING = {"step_seconds": {"lora": 0.1}, "step_round_seconds": {"lora": [0.1, 0.1]}, "step_timing": {}}


def _bench(tmp_path, monkeypatch, base=None, lora=None, timing=TIMING):  # noqa: ANN001, ANN202
    """Run the bench over kept files alone (nothing trains: every run and the timing are kept)."""
    out = tmp_path / "out"
    (out / "records").mkdir(parents=True)
    (out / "bench.json").write_text(json.dumps({"config": dataclasses.asdict(CONFIG)}))
    if base is None:
        base = _record("base", 0.0)
    if lora is None:
        lora = _record("lora", 1e-3)
    kept = {"base_lr0_seed0.json": base, "lora_lr0.001_seed0.json": lora}
    for name, record in kept.items():
        (out / "records" / name).write_text(json.dumps(record))
    (out / "timing.json").write_text(json.dumps(timing))
    monkeypatch.setattr(bench, "pretrained_model", lambda *args, **kwargs: (build_model(TINY, 0), {}))
    return bench.run_bench(CONFIG, out, tmp_path / "cache", progress=False, command="test")


@pytest.mark.parametrize(
    ("base", "lora", "timing", "file", "why"),
    [
        ({}, None, TIMING, "base_lr0_seed0.json", "no 'method', 'scores', 'lr', 'seed', 'trainable', 'adapter_bytes'"),
        ({"x": 1}, None, TIMING, "base_lr0_seed0.json", "no 'method'"),
        (None, {}, TIMING, "lora_lr0.001_seed0.json", "no 'method', 'scores'"),  # was KeyError: 'scores'
        (None, {**_record("lora", 1e-3), "scores": {"test": {}}}, TIMING, "lora_lr0.001_seed0.json", "no val scores"),
        (None, _record("alfa", 1e-3), TIMING, "lora_lr0.001_seed0.json", "the record of 'alfa' at rate 0.001"),
        (None, None, {}, "timing.json", "no step time of each of lora"),
        (None, None, {"step_seconds": {"lora": 0.1}}, "timing.json", "no rounds of each of lora"),
    ],
)
def test_a_kept_file_that_is_not_the_benchs_own_is_named_with_what_to_do(
    tmp_path, monkeypatch, base, lora, timing, file, why
):
    with pytest.raises(ValueError) as caught:
        _bench(tmp_path, monkeypatch, base, lora, timing)
    message = str(caught.value)
    assert message.startswith(str(tmp_path / "out")) and f"{file}: damaged ({why}" in message, message
    assert message.endswith("; delete it to redo what it kept") and "\n" not in message
    assert '"x"' not in (tmp_path / "out" / "bench.json").read_text()  # nothing of it copied


def test_kept_files_of_the_bench_are_taken_as_they_are(tmp_path, monkeypatch):
    result = _bench(tmp_path, monkeypatch)
    assert [r["method"] for r in result["runs"]] == ["base", "lora"] and result["step_seconds"] == {"lora": 0.1}
    old = _bench(tmp_path / "old", monkeypatch, timing={"lora": 0.2})  # the form before rounds were kept
    assert old["step_seconds"] == {"lora": 0.2}
