"""Pretraining the small model on the pretraining formats of every task, cached and resumable.

The weights live in ``CACHE/<digest>/`` (``runs/llm/pretrain`` by default, gitignored), where the digest
hashes the whole :class:`PretrainConfig` (network, layout, steps, rates, seed) and the task generator's
version: a changed config or task is a different folder, so stale weights are never reused, and a missing
folder is simply trained again. Every ``checkpoint_every`` steps the weights, the AdamW moments and the
step are written atomically into one safetensors file (its state in the metadata); an interrupted run
resumes from the last one and, because each step's batch is drawn from ``(seed, step)`` alone, ends with the
same weights as an uninterrupted one. A finished run leaves ``model.safetensors`` and ``state.json``. Runs that
share a cache make each base once: the first holds ``<digest>.lock`` beside its folder while it trains, the others
wait for it (:func:`pretrain`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import random
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from alfa.fileio import read_kept_json, write_json, write_safetensors
from alfa.locks import locked

from .model import ModelConfig, build_model, encode_batch, generate, sequence_loss
from .tasks import TASKS, make_example, make_examples

__all__ = ["PretrainConfig", "TASKS_VERSION", "pretrained_model", "pretrain", "cache_folder"]

TASKS_VERSION = 1  # bump when a task generator changes what it draws: the cached weights become stale
TRAINING_VERSION = 2  # bump when the loss or the masking changes (2: k of A answer tokens masked, t = k/A)
DEFAULT_CACHE = Path("runs/llm/pretrain")


@dataclass(frozen=True)
class PretrainConfig:
    """How the base model is pretrained (about 10 minutes of one free core at the default)."""

    model: ModelConfig = field(default_factory=ModelConfig)
    steps: int = 1200
    batch: int = 32
    lr: float = 2e-3
    warmup: int = 60
    weight_decay: float = 0.01
    seed: int = 0
    checkpoint_every: int = 100
    probe_problems: int = 60  # per task and format, scored once at the end

    def validate(self) -> None:
        self.model.validate()
        if self.steps <= 0 or self.batch <= 0 or self.checkpoint_every <= 0:
            raise ValueError("steps, batch and checkpoint_every must be positive")
        if not self.lr > 0:
            raise ValueError(f"lr must be positive, got {self.lr}")

    def digest(self) -> str:
        fields = dataclasses.asdict(self)
        fields.pop("checkpoint_every")  # when it saves does not change what it trains
        fields.pop("probe_problems")
        fields["tasks_version"] = TASKS_VERSION
        fields["training_version"] = TRAINING_VERSION
        return hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()[:12]


def cache_folder(config: PretrainConfig, cache: Path = DEFAULT_CACHE) -> Path:
    return Path(cache) / config.digest()


def _rate(config: PretrainConfig, step: int) -> float:
    if step < config.warmup:
        return config.lr * (step + 1) / config.warmup
    progress = (step - config.warmup) / max(1, config.steps - config.warmup)
    return config.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))


def _batch(config: PretrainConfig, step: int) -> list[Any]:
    rng = random.Random(config.seed * 1_000_003 + step)
    return [make_example(rng.choice(TASKS), "pretrain", rng) for _ in range(config.batch)]


CHECKPOINT = "checkpoint.safetensors"
"""A run's checkpoint: the weights (``model.*``), the AdamW moments (``optimizer.*``) and the state (step, losses,
seconds) in its metadata, one file written atomically, so that a kill while saving leaves the previous checkpoint
whole (separate files for the three would leave a mix of two steps)."""


def _save(folder: Path, model: nn.Module, optimizer: torch.optim.Optimizer, state: dict[str, Any]) -> None:
    tensors = {f"model.{k}": v.detach().contiguous().clone() for k, v in _weights(model).items()}
    for index, values in optimizer.state_dict()["state"].items():
        for key, value in values.items():
            shape = -1 if key == "step" else value.shape
            tensors[f"optimizer.{index}.{key}"] = torch.as_tensor(value).detach().clone().reshape(shape)
    write_safetensors(folder / CHECKPOINT, tensors, {"state": json.dumps(state)})


def _weights(model: nn.Module) -> dict[str, torch.Tensor]:
    # the output layer is tied to the embedding: saved once, as the embedding
    return {k: v for k, v in model.state_dict().items() if k != "lm_head.weight"}


def _fit(model: nn.Module, weights: dict[str, torch.Tensor], where: Path) -> None:
    missing, unexpected = model.load_state_dict(weights, strict=False)
    if unexpected or [k for k in missing if k != "lm_head.weight"]:
        raise ValueError(f"{where}: the cached weights do not fit the model (stale cache?): {missing or unexpected}")


def _load_weights(folder: Path, model: nn.Module) -> None:
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    path = folder / "model.safetensors"
    try:
        weights = load_file(str(path))
    except (SafetensorError, OSError) as e:
        raise ValueError(
            f"{path}: damaged ({e}); delete {folder} to pretrain it again, or use another --cache"
        ) from None
    _fit(model, weights, folder)


def _resume(folder: Path, model: nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any] | None:
    """The state to go on from, with ``model`` and ``optimizer`` at its step: a finished run's (nothing loaded), the
    last checkpoint's, or ``None`` to start. A cache from before the one-file checkpoint (``model.safetensors``,
    ``optimizer.safetensors`` and an unfinished ``state.json``) resumes from those."""
    from safetensors import SafetensorError, safe_open
    from safetensors.torch import load_file

    record = folder / "state.json"
    state = read_kept_json(record) if record.is_file() else None
    if state is not None and state.get("done"):
        return state
    try:
        if (folder / CHECKPOINT).is_file():
            with safe_open(str(folder / CHECKPOINT), "pt") as f:
                state = json.loads(f.metadata()["state"])
            tensors = load_file(str(folder / CHECKPOINT))
            weights = {k.removeprefix("model."): v for k, v in tensors.items() if k.startswith("model.")}
            moments = {k.removeprefix("optimizer."): v for k, v in tensors.items() if k.startswith("optimizer.")}
        elif state is not None:
            weights = load_file(str(folder / "model.safetensors"))
            moments = load_file(str(folder / "optimizer.safetensors"))
        else:
            return None
    except (SafetensorError, OSError, KeyError, TypeError, ValueError) as e:  # a file cut short, a header without state
        raise ValueError(
            f"{folder}: damaged checkpoint ({e}); delete the folder to pretrain again, or use another --cache"
        ) from None
    _fit(model, weights, folder)
    full = optimizer.state_dict()
    for name, value in moments.items():
        index, key = name.split(".", 1)
        full["state"].setdefault(int(index), {})[key] = value.reshape(()) if key == "step" else value
    optimizer.load_state_dict(full)
    return state


def probe(model: nn.Module, config: PretrainConfig) -> dict[str, dict[str, float]]:
    """Exact-match accuracy per task of the pretraining and the held-out format (fresh problems)."""
    from .tasks import check_answer

    model.eval()
    scores: dict[str, dict[str, float]] = {}
    for form in ("pretrain", "heldout"):
        problems = make_examples(TASKS, form, config.probe_problems * len(TASKS), seed=10_000 + config.seed)
        answers = generate(model, problems, config.model, steps=config.model.answer_length // 2)
        for task in TASKS:
            hits = [check_answer(p, a) for p, a in zip(problems, answers, strict=True) if p.task == task]
            scores.setdefault(form, {})[task] = sum(hits) / len(hits)
    return scores


def pretrain(config: PretrainConfig, cache: Path = DEFAULT_CACHE, progress: bool = True) -> Path:
    """Train (or finish training) the base model of ``config``; returns its folder.

    Several runs may share one cache (two benches into other ``--out`` folders): the base is made holding
    ``<digest>.lock`` beside its folder, so a second run that needs it waits (saying so on stderr), then finds it
    finished, instead of training it beside the first one into the same files. Every file is written atomically
    and a finished base is never written again, so a model read from the cache is always whole."""
    config.validate()
    folder = cache_folder(config, cache)

    def say_waiting(holder: str) -> None:
        print(f"waiting for {holder} pretraining {folder}", file=sys.stderr, flush=True)

    with locked(folder, on_wait=say_waiting):
        _train(config, folder, progress)
    return folder


def _train(config: PretrainConfig, folder: Path, progress: bool) -> None:
    """:func:`pretrain`'s work, under its lock."""
    from tqdm import tqdm

    model = build_model(config.model, config.seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=config.lr, weight_decay=config.weight_decay)
    state = _resume(folder, model, optimizer) or {"step": 0, "losses": [], "seconds": 0.0}
    if state.get("done"):
        return
    write_json(folder / "config.json", {"digest": config.digest(), **dataclasses.asdict(config)})
    generator = torch.Generator().manual_seed(config.seed)
    model.train()
    bar = tqdm(range(state["step"], config.steps), desc="pretrain", disable=not progress, initial=state["step"])
    window: list[float] = []
    for step in bar:
        generator.manual_seed(config.seed * 7919 + step)  # the masks of a step depend on the step alone (resume)
        for group in optimizer.param_groups:
            group["lr"] = _rate(config, step)
        started = time.perf_counter()
        ids, answer = encode_batch(_batch(config, step), config.model)
        loss = sequence_loss(model, ids, answer, generator)
        if not torch.isfinite(loss):
            raise FloatingPointError(f"pretraining loss is {loss.item()} at step {step}")
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        state["seconds"] += time.perf_counter() - started
        window.append(loss.item())
        bar.set_postfix(loss=f"{sum(window[-50:]) / len(window[-50:]):.3f}")
        if (step + 1) % config.checkpoint_every == 0 or step + 1 == config.steps:
            state["losses"].append([step + 1, sum(window) / len(window)])
            window = []
            state["step"] = step + 1
            _save(folder, model, optimizer, state)
    state["probe"] = probe(model, config)
    state["done"] = True
    write_safetensors(
        folder / "model.safetensors", {k: v.detach().contiguous().clone() for k, v in _weights(model).items()}
    )
    write_json(folder / "state.json", state)  # last: a finished run is one whose state.json says so
    (folder / CHECKPOINT).unlink(missing_ok=True)
    (folder / "optimizer.safetensors").unlink(missing_ok=True)  # a cache from before the one-file checkpoint


def pretrained_model(
    config: PretrainConfig, cache: Path = DEFAULT_CACHE, progress: bool = True
) -> tuple[nn.Module, dict]:
    """The pretrained base (trained first when missing or unfinished, :func:`pretrain`) and its ``state.json``."""
    folder = pretrain(config, cache, progress)
    model = build_model(config.model, config.seed)
    _load_weights(folder, model)
    model.tie_weights()
    return model.eval(), read_kept_json(folder / "state.json")
