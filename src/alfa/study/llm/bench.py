"""``alfa llm bench``: pretrain (or reuse) the base, adapt it with every method, and write the records.

The protocol, fixed before the runs (docs/llm.md § Protocol says it in words, :data:`PROTOCOL` in code):

1. one adaptation set of exactly ``examples`` (1,000) problems in the **held-out** formats, the three tasks
   in turn; a validation split (``val_per_task`` per task) and a test split (``test_per_task`` per task),
   both held-out format, drawn apart from it and from each other (no prompt in two of them);
2. the unadapted model is scored once (its decoding is deterministic, so every seed gives the same answers);
3. every other method is trained at seed 0 with each rate of its grid and scored on the validation split;
   **its rate is the one with the highest validation exact-match (the mean of the three tasks), the smaller
   rate on a tie**; it is then trained at the other seeds at that rate; only test-split scores of the
   selected rate's runs are reported;
4. every run has the same steps, batch and data order for a given seed (the seed draws the adapter's
   init, the order and the masks).

The grids of all methods run first (Alfa, LoRA, DoRA, then full fine-tuning), then the other seeds, so
that a run cut short still holds the seed-0 comparison. Each run's record is written as soon as it ends
(``OUT/records/``, atomically), so an interrupted bench resumes where it stopped; ``OUT/bench.json`` gathers
them with the configs, the pretraining's record and the selection (rewritten after every run, with
``"complete": false`` until the last), and is what docs/llm.md is made from. Last, the methods' training steps
are timed in turn, every round kept (:func:`timing_record`); :func:`retime` (``alfa llm time``) times them again
into a finished record without the pretraining.
"""

from __future__ import annotations

import dataclasses
import json
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from alfa.fileio import read_kept_json, settings_differences, write_json
from alfa.study.timing import machine

from .adapt import METHODS, STEP_ROUNDS, AdaptConfig, adapt_and_score, interleaved_step_seconds
from .model import ModelConfig, build_model
from .pretrain import DEFAULT_CACHE, PretrainConfig, pretrained_model
from .tasks import TASKS, Example, make_example

__all__ = [
    "BenchConfig",
    "standard_config",
    "smoke_config",
    "run_bench",
    "split_problems",
    "select_rate",
    "timing_record",
    "config_from_dict",
    "retime",
]

DEFAULT_GRIDS = {"alfa": (3e-3, 1e-2), "lora": (3e-3, 1e-2), "dora": (3e-3, 1e-2), "full": (3e-4, 1e-3)}
"""Each method's rates, in the order the methods run (Alfa and its two rivals first, the reference last)."""


@dataclass(frozen=True)
class BenchConfig:
    """The whole experiment: the base's pretraining, the adaptation schedule, the splits, seeds and grids."""

    pretrain: PretrainConfig = field(default_factory=PretrainConfig)
    adapt: AdaptConfig = field(default_factory=AdaptConfig)
    examples: int = 1000
    val_per_task: int = 30
    test_per_task: int = 60
    seeds: tuple[int, ...] = (0, 1, 2)
    grids: dict[str, tuple[float, ...]] = field(default_factory=lambda: dict(DEFAULT_GRIDS))
    data_seed: int = 1
    name: str = "standard"

    def validate(self) -> None:
        self.pretrain.validate()
        if self.examples <= 0 or self.val_per_task <= 0 or self.test_per_task <= 0 or not self.seeds:
            raise ValueError("examples, the split sizes and the seeds must be positive / non-empty")
        unknown = sorted(set(self.grids) - set(METHODS))
        if unknown or any(not rates for rates in self.grids.values()):
            raise ValueError(f"every grid must name a method of {METHODS} and hold at least one rate: {self.grids}")


def standard_config() -> BenchConfig:
    return BenchConfig()


def smoke_config() -> BenchConfig:
    """A tiny model and schedule that run end to end in well under five minutes (a check, not a result)."""
    model = ModelConfig(hidden=32, layers=2, heads=2, intermediate=64)
    return BenchConfig(
        pretrain=PretrainConfig(model=model, steps=20, batch=16, warmup=5, checkpoint_every=10, probe_problems=4),
        adapt=AdaptConfig(batch=50, epochs=1, decode_steps=5),
        val_per_task=4,
        test_per_task=6,
        seeds=(0, 1),
        grids={m: rates[:1] for m, rates in DEFAULT_GRIDS.items()},
        name="smoke",
    )


def split_problems(config: BenchConfig) -> tuple[list[Example], list[Example], list[Example]]:
    """(adaptation set, validation split, test split), every one in the held-out formats, no prompt twice."""
    import random

    rng = random.Random(config.data_seed)
    seen: set[str] = set()

    def draw(count: int, task_of: Any) -> list[Example]:
        out: list[Example] = []
        while len(out) < count:
            example = make_example(task_of(len(out)), "heldout", rng)
            if example.prompt not in seen:
                seen.add(example.prompt)
                out.append(example)
        return out

    train = draw(config.examples, lambda i: TASKS[i % len(TASKS)])
    val = draw(config.val_per_task * len(TASKS), lambda i: TASKS[i // config.val_per_task])
    test = draw(config.test_per_task * len(TASKS), lambda i: TASKS[i // config.test_per_task])
    return train, val, test


def select_rate(runs: Sequence[dict[str, Any]]) -> float:
    """The declared rule: the rate of the highest mean validation exact-match over tasks; the smaller on a tie."""

    def validation(run: dict[str, Any]) -> float:
        scores = run["scores"]["val"]
        return sum(sum(v) / len(v) for v in scores.values()) / len(scores)

    return min(runs, key=lambda run: (-validation(run), run["lr"]))["lr"]


def _record_path(out: Path, method: str, lr: float, seed: int) -> Path:
    return out / "records" / f"{method}_lr{lr:g}_seed{seed}.json"


def _run(out: Path, key: tuple[str, float, int], work: Any, progress: bool, splits: Sequence[str]) -> dict[str, Any]:
    path = _record_path(out, *key)
    if path.is_file():
        return _kept_run(path, key, splits)
    if progress:
        print(f"  adapting: {key[0]} at rate {key[1]:g}, seed {key[2]}", flush=True)
    record = work()
    write_json(path, record)
    return record


def _damaged(path: Path, what: str) -> ValueError:
    return ValueError(f"{path}: damaged ({what}); delete it to redo what it kept")


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _per_task(value: Any) -> bool:
    """Each task's per-problem values, as a run's ``scores`` of a split and its ``answer_loss`` hold them."""
    return isinstance(value, dict) and all(
        isinstance(value.get(t), list) and value[t] and all(map(_number, value[t])) for t in TASKS
    )


def _kept_run(path: Path, key: tuple[str, float, int], splits: Sequence[str]) -> dict[str, Any]:
    """A run's kept record, checked for what the rate selection, ``bench.json`` and the page read of it: valid
    JSON that is not this run's record (cut short, edited, another run's) is named here, not met as a KeyError in
    the selection or copied into ``bench.json``."""
    record = read_kept_json(path)
    method, lr, seed = key
    numbers = ["lr", "seed", "trainable", "adapter_bytes"]
    numbers += [] if method == "base" else ["step_seconds", "step_memory_bytes"]  # the base trains nothing
    missing = [k for k in ["method", "scores", *numbers] if k not in record]
    if missing:
        raise _damaged(path, f"no {', '.join(map(repr, missing))}")
    if not all(_number(record[k]) for k in numbers):
        raise _damaged(path, f"{', '.join(map(repr, numbers))} must be numbers")
    if (record["method"], record["lr"], record["seed"]) != key:
        raise _damaged(path, f"the record of {record['method']!r} at rate {record['lr']}, seed {record['seed']}")
    scores = record["scores"]
    for split in splits:
        if not (isinstance(scores, dict) and _per_task(scores.get(split))):
            raise _damaged(path, f"no {split} scores of every task")
    # records made before the answer loss was kept have none (the report reads it where it is): only a kept one
    # that is not per task is damaged
    if "test" in splits and "answer_loss" in record and not _per_task(record["answer_loss"]):
        raise _damaged(path, "an answer loss that is not one per task")
    return record


def run_bench(config: BenchConfig, out: Path, cache: Path = DEFAULT_CACHE, progress: bool = True,
              command: str = "") -> dict[str, Any]:  # fmt: skip
    """Run (or finish) the bench of ``config`` in ``out``; returns what it writes to ``out/bench.json``. A folder
    holding another configuration's bench is refused before anything runs: its records would be taken as this one's."""
    config.validate()
    _refuse_another_bench(Path(out), config)
    torch.set_num_threads(1)
    base, pretraining = pretrained_model(config.pretrain, cache, progress)
    train, val, test = split_problems(config)
    model_config, schedule = config.pretrain.model, config.adapt

    def work(method: str, lr: float, seed: int, splits: dict[str, list[Example]]) -> Any:
        return lambda: adapt_and_score(base, method, lr, seed, train, splits, model_config, schedule)

    first = config.seeds[0]
    runs: list[dict[str, Any]] = []
    selected: dict[str, float] = {}

    def result(complete: bool) -> dict[str, Any]:
        return {
            "name": config.name,
            "command": command,
            "complete": complete,
            "config": dataclasses.asdict(config),
            "pretrain_digest": config.pretrain.digest(),
            "pretraining": pretraining,
            "base_parameters": sum(p.numel() for p in base.parameters()),
            "selected_rates": selected,
            "splits": {"train": len(train), "val": len(val), "test": len(test)},
            "test_problems": [{"task": p.task, "prompt": p.prompt, "answer": p.answer} for p in test],
            "runs": runs,
        }

    def add(key: tuple[str, float, int], splits: dict[str, list[Example]]) -> dict[str, Any]:
        runs.append(_run(out, key, work(*key, splits), progress, list(splits)))
        write_json(out / "bench.json", result(complete=False))  # what is done so far, readable at any time
        return runs[-1]

    write_json(out / "bench.json", result(complete=False))  # first: what the records below belong to
    add(("base", 0.0, first), {"val": val, "test": test})
    for method, rates in config.grids.items():  # every grid first: the seed-0 comparison is complete early
        selected[method] = select_rate([add((method, lr, first), {"val": val, "test": test}) for lr in rates])
    for seed in config.seeds[1:]:
        for method in config.grids:
            add((method, selected[method], seed), {"test": test})
    final = result(complete=True)
    final.update(_step_timing(out, base, list(config.grids), train, config, progress, command))
    write_json(out / "bench.json", final)
    return final


def _refuse_another_bench(out: Path, config: BenchConfig) -> None:
    """Refuse ``out`` if it holds the records of another configuration (records are found by method, rate and seed
    alone, and a smoke bench's names are a standard one's), or records without the ``bench.json`` that says which."""
    summary = out / "bench.json"
    if not summary.is_file():
        if (out / "records").is_dir() and any((out / "records").glob("*.json")) or (out / "timing.json").is_file():
            raise ValueError(
                f"{out} holds bench records but no bench.json saying which configuration made them; use another --out"
            )
        return
    try:
        stored = json.loads(summary.read_text(encoding="utf-8"))["config"]
        if not isinstance(stored, dict):
            raise TypeError("its config is no mapping")
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise ValueError(f"{summary}: not a bench summary this command wrote ({err}); use another --out") from None
    mine = json.loads(json.dumps(dataclasses.asdict(config)))
    if stored != mine:
        differ = settings_differences(stored, mine)
        raise ValueError(
            f"{out} holds the bench of another configuration (the folder's vs this run's: {', '.join(differ)}); its "
            "records would be taken as this one's: use another --out"
        )


def timing_record(round_seconds: dict[str, list[float]], weights: dict[str, Any], command: str) -> dict[str, Any]:
    """What a bench record keeps of an interleaved step timing: each method's median step (``step_seconds``),
    every round's step per method (``step_round_seconds``, the i-th of each list from the same round: the pairs
    the page's ratio intervals need), and what the timing ran on (``step_timing``: the weights, the rounds, the
    batch, the machine, the command)."""
    rounds = {len(v) for v in round_seconds.values()}
    if len(rounds) != 1:
        raise ValueError(f"every method needs the same number of rounds, got {sorted(rounds)}")
    return {
        "step_seconds": {m: statistics.median(v) for m, v in round_seconds.items()},
        "step_round_seconds": round_seconds,
        "step_timing": {"weights": weights, "rounds": rounds.pop(), "machine": machine(), "command": command},
    }


def _step_timing(out: Path, base: Any, methods: list[str], train: list[Example], config: BenchConfig,
                 progress: bool, command: str) -> dict[str, Any]:  # fmt: skip
    """The methods' step times measured in turn (:func:`interleaved_step_seconds`), kept in ``OUT/timing.json``
    (:func:`timing_record`; one written before the rounds were kept holds the medians alone, and is read as such)."""
    path = out / "timing.json"
    if path.is_file():
        return _kept_timing(path, methods)
    if progress:
        print("  timing the training steps of " + ", ".join(methods) + " in turn", flush=True)
    seconds = interleaved_step_seconds(base, methods, train, config.pretrain.model, config.adapt, progress=progress)
    timing = timing_record(seconds, {"kind": "pretrained", "digest": config.pretrain.digest()}, command)
    write_json(path, timing)
    return timing


def _kept_timing(path: Path, methods: list[str]) -> dict[str, Any]:
    """``timing.json`` as kept (:func:`_step_timing`), checked for a step time of every method (and, in the form
    with rounds, every round of each): one without them would leave the page the runs' own times, silently."""
    kept = read_kept_json(path)
    timing = kept if "step_seconds" in kept else {"step_seconds": kept}
    seconds = timing["step_seconds"]
    if not (isinstance(seconds, dict) and all(_number(seconds.get(m)) for m in methods)):
        raise _damaged(path, f"no step time of each of {', '.join(methods)}")
    if "step_seconds" in kept:
        rounds = kept.get("step_round_seconds")
        if not (isinstance(rounds, dict) and all(isinstance(rounds.get(m), list) for m in methods)):
            raise _damaged(path, f"no rounds of each of {', '.join(methods)}")
        if len({len(rounds[m]) for m in methods}) > 1 or not all(_number(x) for m in methods for x in rounds[m]):
            raise _damaged(path, "its rounds are not the same number of step times for every method")
        if not isinstance(kept.get("step_timing"), dict):
            raise _damaged(path, "no 'step_timing'")
    return timing


def config_from_dict(fields: dict[str, Any]) -> BenchConfig:
    """The :class:`BenchConfig` a bench record keeps as ``config`` (``dataclasses.asdict``), rebuilt."""
    try:
        pretrain = dict(fields["pretrain"])
        pretrain["model"] = ModelConfig(**pretrain["model"])
        config = BenchConfig(
            **{
                **fields,
                "pretrain": PretrainConfig(**pretrain),
                "adapt": AdaptConfig(**fields["adapt"]),
                "seeds": tuple(fields["seeds"]),
                "grids": {m: tuple(rates) for m, rates in fields["grids"].items()},
            }
        )
    except (KeyError, TypeError, AttributeError) as e:
        raise ValueError(f"not a bench config alfa llm bench wrote ({type(e).__name__}: {e})") from None
    config.validate()
    return config


def retime(
    result: dict[str, Any], command: str, rounds: int = STEP_ROUNDS, seed: int = 0, progress: bool = True
) -> dict[str, Any]:
    """The interleaved step timing of the bench ``result``'s methods again (:func:`timing_record`), on the same
    architecture, batch and rounds, but built from the config with random weights (``seed``) instead of the
    pretrained ones: a step's time depends on the shapes, not on the weights' values, so the timing needs neither
    the pretraining nor its cache."""
    config = config_from_dict(result["config"])
    torch.set_num_threads(1)  # the bench's one core
    model = build_model(config.pretrain.model, seed)
    model.tie_weights()
    train = split_problems(config)[0]
    grids = list(config.grids)
    seconds = interleaved_step_seconds(model, grids, train, config.pretrain.model, config.adapt, rounds, progress)
    return timing_record(seconds, {"kind": "random", "seed": seed}, command)
