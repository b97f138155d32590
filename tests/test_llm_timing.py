"""docs/llm.md's step times: each method's over LoRA's with its 95 % interval from the per-round times the record
keeps, the fallback wording for a record that keeps medians alone, and ``alfa llm time``, which times a finished
bench's steps again (every round kept) without its pretraining."""

from __future__ import annotations

import copy
import dataclasses
import json
import statistics
from pathlib import Path

import pytest

pytest.importorskip("transformers")

from alfa.cli import main  # noqa: E402
from alfa.study.llm.adapt import STEP_ROUNDS, AdaptConfig  # noqa: E402
from alfa.study.llm.bench import BenchConfig, config_from_dict  # noqa: E402
from alfa.study.llm.model import ModelConfig  # noqa: E402
from alfa.study.llm.pretrain import PretrainConfig  # noqa: E402
from alfa.study.llm.report import llm_page  # noqa: E402

COMMITTED = Path(__file__).resolve().parent.parent / "docs" / "data" / "llm" / "bench.json"
LORA = [0.20, 0.22, 0.21, 0.25]


def _committed() -> dict:
    return json.loads(COMMITTED.read_text(encoding="utf-8"))


def _with_rounds(result: dict) -> dict:
    """The committed record with hand-made per-round times: Alfa 1.05, 1.12, 1.08, 1.10 × LoRA round by round
    (geometric mean 1.0872, t interval over the 4 rounds [1.0406, 1.1359]); DoRA 1.2 × LoRA in every round (no
    spread: an interval of zero width); full fine-tuning 0.8 ×."""
    rounds = {
        "alfa": [t * r for t, r in zip(LORA, (1.05, 1.12, 1.08, 1.10))],
        "lora": LORA,
        "dora": [1.2 * t for t in LORA],
        "full": [0.8 * t for t in LORA],
    }
    timed = copy.deepcopy(result)
    timed["step_seconds"] = {m: statistics.median(v) for m, v in rounds.items()}
    timed["step_round_seconds"] = rounds
    timed["step_timing"] = {
        "weights": {"kind": "random", "seed": 0},
        "rounds": len(LORA),
        "machine": {"cpu": "Test CPU", "torch": "2.x", "threads": 1, "python": "3.x"},
        "command": "alfa llm time --record data.json --replace",
    }
    return timed


def test_the_page_prints_the_step_ratio_with_its_interval_from_the_rounds():
    page = llm_page(_with_rounds(_committed()), "data.json")
    assert "and a training step 1.09 [1.04, 1.14]× LoRA's on one CPU core. On the graded" in page
    assert "| Alfa | 19,712 | 2.47 % | 92.2 KiB | 237 ms | 1.09 [1.04, 1.14] | 550 ms |" in page
    assert "| DoRA | 44,352 | 5.56 % | 185.8 KiB | 258 ms | 1.20 [1.20, 1.20] |" in page
    assert "| LoRA | 39,040 | 4.89 % | 162.3 KiB | 215 ms | (reference) |" in page
    assert "| full fine-tune | 797,952 | 100.00 % | 3122.7 KiB | 172 ms | 0.80 [0.80, 0.80] |" in page
    assert (
        "The step times were taken by `alfa llm time --record data.json --replace` on the bench's architecture "
        "built from its config with random weights (seed 0;" in page
    )
    assert "4 rounds after a warm-up round, the batch of the adaptation's first step, on Test CPU (1 thread" in page
    assert "no interval" not in page and "keeps the medians" not in page


def test_a_record_without_rounds_keeps_the_ratio_of_medians_and_says_it_has_no_interval():
    result = _with_rounds(_committed())  # as a bench made before the rounds were kept: the medians alone
    del result["step_round_seconds"], result["step_timing"]
    page = llm_page(result, "data.json")
    # Alfa's median 0.2366 s over LoRA's 0.215 s
    assert "and a training step 1.10× LoRA's on one CPU core (no interval: re-time). On the graded" in page
    assert "| Alfa | 19,712 | 2.47 % | 92.2 KiB | 237 ms | 1.10 | 550 ms |" in page
    assert "| LoRA | 39,040 | 4.89 % | 162.3 KiB | 215 ms | (reference) |" in page
    assert (
        "so × LoRA is the ratio of the medians, with no 95 % interval: `alfa llm time --record data.json --replace "
        "--markdown docs/llm.md` times the steps again" in page
    )
    one_round = _with_rounds(_committed())  # a single round has no spread to judge: the same fallback
    one_round["step_round_seconds"] = {m: v[:1] for m, v in one_round["step_round_seconds"].items()}
    assert "1.10× LoRA's on one CPU core (no interval: re-time)" in llm_page(one_round, "data.json")


def _tiny_record(path: Path, **changes) -> dict:
    config = BenchConfig(
        pretrain=PretrainConfig(model=ModelConfig(hidden=16, layers=1, heads=2, intermediate=32), steps=2, batch=4),
        adapt=AdaptConfig(batch=8, epochs=1, warmup=1, decode_steps=4),
        examples=12,
        val_per_task=1,
        test_per_task=2,
        seeds=(0,),
        grids={"lora": (1e-3,), "alfa": (1e-2,)},
        name="tiny",
    )
    record = {"name": "tiny", "command": "test", "complete": True, "config": dataclasses.asdict(config), "runs": []}
    record.update(changes)
    path.write_text(json.dumps(record), encoding="utf-8")
    return json.loads(json.dumps(record))  # as the file holds it (tuples as lists)


def test_alfa_llm_time_writes_every_round_and_refuses_to_replace_a_timing_unasked(tmp_path, capsys):
    path = tmp_path / "bench.json"
    before = _tiny_record(path)
    capsys.readouterr()
    assert main(["llm", "time", "--record", str(path), "--quiet"]) == 0
    assert capsys.readouterr().err == ""  # --quiet: no progress bar either
    written = json.loads(path.read_text(encoding="utf-8"))
    rounds = written["step_round_seconds"]
    assert list(rounds) == ["lora", "alfa"] and all(len(v) == STEP_ROUNDS and min(v) > 0 for v in rounds.values())
    assert written["step_seconds"] == {m: statistics.median(v) for m, v in rounds.items()}
    timing = written["step_timing"]
    assert timing["weights"] == {"kind": "random", "seed": 0} and timing["rounds"] == STEP_ROUNDS
    assert timing["command"] == f"alfa llm time --record {path}" and timing["machine"]["threads"] == 1
    assert {k: v for k, v in written.items() if not k.startswith("step_")} == before  # the rest is untouched
    assert config_from_dict(written["config"]).pretrain.model.hidden == 16

    capsys.readouterr()
    text = path.read_text(encoding="utf-8")
    assert main(["llm", "time", "--record", str(path), "--quiet"]) == 2
    assert (
        f"--record {path}: holds the step timing of `alfa llm time --record {path}`; --replace times the "
        "steps again" in capsys.readouterr().err
    )
    assert path.read_text(encoding="utf-8") == text
    assert main(["llm", "time", "--record", str(path), "--replace", "--quiet"]) == 0
    again = json.loads(path.read_text(encoding="utf-8"))
    assert again["step_timing"]["command"].endswith(" --replace") and again["step_round_seconds"] != rounds


def test_alfa_llm_time_refuses_an_unfinished_bench_and_a_file_that_is_not_one(tmp_path, capsys):
    path = tmp_path / "bench.json"
    _tiny_record(path, complete=False)
    assert main(["llm", "time", "--record", str(path), "--quiet"]) == 2
    assert "an unfinished bench; finishing it (alfa llm bench) times the steps" in capsys.readouterr().err
    path.write_text('{"runs": []}', encoding="utf-8")
    assert main(["llm", "time", "--record", str(path), "--quiet"]) == 2
    assert "not a bench record alfa llm bench wrote (no config and runs)" in capsys.readouterr().err
    assert path.read_text(encoding="utf-8") == '{"runs": []}'


def test_the_lead_s_command_re_times_the_committed_record_and_writes_its_page(tmp_path, monkeypatch):
    """``alfa llm time --record docs/data/llm/bench.json --replace --markdown docs/llm.md`` on a copy, with the
    timing itself stood in by hand-made rounds (the real one times the standard model)."""
    import alfa.study.llm.bench as bench
    from alfa.study.llm.bench import timing_record

    record, page = tmp_path / "bench.json", tmp_path / "llm.md"
    record.write_text(COMMITTED.read_text(encoding="utf-8"), encoding="utf-8")
    rounds = _with_rounds(_committed())["step_round_seconds"]
    made = {}

    def stand_in(result: dict, command: str, progress: bool = True) -> dict:
        made["command"], made["progress"] = command, progress
        return timing_record(rounds, {"kind": "random", "seed": 0}, command)

    monkeypatch.setattr(bench, "retime", stand_in)
    assert main(["llm", "time", "--record", str(record), "--replace", "--markdown", str(page), "--quiet"]) == 0
    assert made["command"] == f"alfa llm time --record {record} --replace --markdown {page}"
    assert made["progress"] is False  # --quiet
    written = json.loads(record.read_text(encoding="utf-8"))
    assert written["step_round_seconds"] == rounds and written["runs"] == _committed()["runs"]
    text = page.read_text(encoding="utf-8")
    assert text == llm_page(written, str(record)) and "a training step 1.09 [1.04, 1.14]× LoRA's" in text
