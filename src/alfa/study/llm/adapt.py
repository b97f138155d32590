"""Adapting the pretrained model to the held-out formats, one method at a time, and what each run measures.

The methods are the library's own (``alfa.attach``), on the **dense Linear layers of the transformer
blocks** (attention ``q/k/v/o`` and the MLP's ``gate/up/down``; not the embedding, which the output head
shares). The paper's LLaDA-8B setting (width 4096: LoRA and DoRA at rank 128, Alfa at rank 64 over an SVD
dictionary of rank 128 with 8 heads) is scaled by the model's width over 4096 (128/4096 = 1/32): LoRA and
DoRA at rank 4 (``alpha = 2r``, the library's default), Alfa at rank 2 over a dictionary of rank 4, with
the paper's 8 heads kept (a head count is not a width). :func:`scaled_rank` is that rule.
"""

from __future__ import annotations

import copy
import math
import random
import statistics
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn
from tqdm.auto import tqdm

import alfa
from alfa.adapters import AlfaConfig, DoraConfig, FullFinetuneConfig, LoraConfig

from .model import ModelConfig, encode_batch, generate, per_problem_loss, sequence_loss
from .tasks import Example, check_answer

__all__ = [
    "METHODS",
    "BLOCK_LINEARS",
    "scaled_rank",
    "method_config",
    "AdaptConfig",
    "adapt_and_score",
    "score",
    "interleaved_step_seconds",
    "STEP_ROUNDS",
]

METHODS = ("base", "full", "lora", "dora", "alfa")
"""``base``: the unadapted model; ``full``: every parameter trained (a reference)."""
BLOCK_LINEARS = r"layers\.\d+\.(self_attn|mlp)\.\w+_proj$"
PAPER_WIDTH = 4096  # LLaDA-8B's hidden size


def scaled_rank(paper_rank: int, width: int) -> int:
    """The paper's rank at width 4096 scaled to ``width`` (at least 1)."""
    return max(1, round(paper_rank * width / PAPER_WIDTH))


def method_config(method: str, width: int) -> Any:
    """The adapter config of ``method`` for a model of hidden size ``width`` (``None`` for ``base``)."""
    if method == "base":
        return None
    if method == "full":
        return FullFinetuneConfig()
    if method in ("lora", "dora"):
        rank = scaled_rank(128, width)
        cls = LoraConfig if method == "lora" else DoraConfig
        return cls(rank=rank, alpha=2.0 * rank, layers="dense", target=BLOCK_LINEARS)
    if method == "alfa":
        return AlfaConfig(
            heads=8,
            rank=scaled_rank(64, width),
            dense_rank=scaled_rank(128, width),
            layers="dense",
            target=BLOCK_LINEARS,
        )
    raise ValueError(f"unknown method {method!r}; the methods are {', '.join(METHODS)}")


@dataclass(frozen=True)
class AdaptConfig:
    """One adaptation run's schedule: the same for every method (only the rate differs)."""

    batch: int = 16
    epochs: int = 1
    warmup: int = 5
    decode_steps: int = 10  # unmasking rounds per answer (2 tokens a round for a 20-token answer)


def trainable_parameters(model: nn.Module) -> dict[str, nn.Parameter]:
    """The parameters the optimizer gets: every one that requires a gradient (each tied tensor once)."""
    seen: dict[int, str] = {}
    out = {}
    for name, p in model.named_parameters():
        if p.requires_grad and id(p) not in seen:
            seen[id(p)] = name
            out[name] = p
    return out


def _adapter_bytes(model: nn.Module, method: str) -> int:
    """Bytes of the per-task artifact: the adapter file (``alfa.save_adapter``); for ``full``, the same
    file holds every parameter."""
    if method == "base":
        return 0
    with tempfile.TemporaryDirectory() as folder:
        path = alfa.save_adapter(model, Path(folder) / "adapter.safetensors")
        return path.stat().st_size


def _step_memory(model: nn.Module, ids: torch.Tensor, answer: torch.Tensor, params: dict[str, nn.Parameter]) -> int:
    """A CPU stand-in for a step's peak memory beyond the frozen weights: the bytes autograd keeps for the
    backward pass of one step, plus the gradients and the two AdamW moments of the trainable parameters."""
    saved: list[int] = []

    def pack(t: torch.Tensor) -> torch.Tensor:
        saved.append(t.numel() * t.element_size())
        return t

    generator = torch.Generator().manual_seed(0)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = sequence_loss(model, ids, answer, generator)
    loss.backward()
    model.zero_grad(set_to_none=True)
    return sum(saved) + 3 * sum(p.numel() * p.element_size() for p in params.values())


def score(model: nn.Module, problems: Sequence[Example], config: ModelConfig, steps: int) -> dict[str, list[int]]:
    """Per task, 1 or 0 for each problem (in order): whether the model's answer is right."""
    model.eval()
    out: dict[str, list[int]] = {}
    for start in range(0, len(problems), 128):
        chunk = problems[start : start + 128]
        for problem, answer in zip(chunk, generate(model, chunk, config, steps), strict=True):
            out.setdefault(problem.task, []).append(int(check_answer(problem, answer)))
    return out


LOSS_DRAWS = 4  # mask draws per problem for the answer loss (the same draws for every method and seed)


@torch.no_grad()
def answer_loss(model: nn.Module, problems: Sequence[Example], config: ModelConfig) -> dict[str, list[float]]:
    """Per task, each problem's reference-answer loss (the training loss, nats per answer token), averaged
    over :data:`LOSS_DRAWS` fixed mask draws: a graded measure of how well the model has learned the format
    and the task where exact match is all or nothing."""
    model.eval()
    out: dict[str, list[float]] = {}
    for start in range(0, len(problems), 128):
        chunk = problems[start : start + 128]
        ids, answer = encode_batch(chunk, config)
        generator = torch.Generator().manual_seed(start)
        total = torch.zeros(len(chunk))
        for _ in range(LOSS_DRAWS):
            total += per_problem_loss(model, ids, answer, generator)
        for problem, value in zip(chunk, (total / LOSS_DRAWS).tolist(), strict=True):
            out.setdefault(problem.task, []).append(round(value, 5))
    return out


def _train(model: nn.Module, params: dict[str, nn.Parameter], data: Sequence[Example], lr: float, seed: int,
           model_config: ModelConfig, schedule: AdaptConfig) -> tuple[list[float], list[float]]:  # fmt: skip
    """AdamW on ``params`` over ``data`` in the seed's order; returns (losses per step, seconds per step)."""
    optimizer = torch.optim.AdamW(list(params.values()), lr=lr, weight_decay=0.0)
    order_rng = random.Random(seed)
    per_epoch = math.ceil(len(data) / schedule.batch)
    total = per_epoch * schedule.epochs
    generator = torch.Generator().manual_seed(seed)
    losses, seconds = [], []
    model.train()
    for epoch in range(schedule.epochs):
        order = list(range(len(data)))
        order_rng.shuffle(order)
        for b in range(per_epoch):
            step = epoch * per_epoch + b
            factor = (
                (step + 1) / schedule.warmup if step < schedule.warmup else 0.5 * (1 + math.cos(math.pi * step / total))
            )
            for group in optimizer.param_groups:
                group["lr"] = lr * factor
            started = time.perf_counter()
            ids, answer = encode_batch(
                [data[i] for i in order[b * schedule.batch : (b + 1) * schedule.batch]], model_config
            )
            loss = sequence_loss(model, ids, answer, generator)
            if not torch.isfinite(loss):
                raise FloatingPointError(f"adaptation loss is {loss.item()} at step {step} (rate {lr})")
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            seconds.append(time.perf_counter() - started)
            losses.append(loss.item())
    return losses, seconds


def adapt_and_score(base: nn.Module, method: str, lr: float, seed: int, data: Sequence[Example],
                    evaluate: dict[str, Sequence[Example]], model_config: ModelConfig,
                    schedule: AdaptConfig) -> dict[str, Any]:  # fmt: skip
    """Adapt a copy of ``base`` with ``method`` at rate ``lr`` (seed: the adapter's init, the data order,
    the masks) and score it on each split of ``evaluate``: the run's record."""
    model = copy.deepcopy(base)
    config = method_config(method, model_config.hidden)
    torch.manual_seed(seed)
    if config is not None:
        alfa.attach(model, config)
        params = trainable_parameters(model)
    else:
        for p in model.parameters():
            p.requires_grad_(False)
        params = {}
    record: dict[str, Any] = {
        "method": method,
        "lr": lr,
        "seed": seed,
        "config": None if config is None else config.to_dict(),
        "trainable": sum(p.numel() for p in params.values()),
        "adapter_bytes": _adapter_bytes(model, method),
    }
    if params:
        probe_ids, probe_answer = encode_batch(data[: schedule.batch], model_config)
        record["step_memory_bytes"] = _step_memory(model, probe_ids, probe_answer, params)
        losses, seconds = _train(model, params, data, lr, seed, model_config, schedule)
        record["losses"] = [round(x, 5) for x in losses]
        record["step_seconds"] = statistics.median(seconds[3:] or seconds)
    record["scores"] = {
        split: score(model, problems, model_config, schedule.decode_steps) for split, problems in evaluate.items()
    }
    if "test" in evaluate:
        record["answer_loss"] = answer_loss(model, evaluate["test"], model_config)
    return record


STEP_ROUNDS = 15
"""Rounds of :func:`interleaved_step_seconds` (after one warm-up round): the bench's and ``alfa llm time``'s."""


def interleaved_step_seconds(
    base: nn.Module,
    methods: Sequence[str],
    data: Sequence[Example],
    model_config: ModelConfig,
    schedule: AdaptConfig,
    rounds: int = STEP_ROUNDS,
    progress: bool = True,
) -> dict[str, list[float]]:
    """Seconds of one training step (forward, backward, AdamW) per method in every round, the methods' steps
    taken in turn, round after round, on the same batch (the i-th time of each method from the same round): on a
    machine shared with other jobs, a slow spell then falls on every method alike instead of on whichever run it
    happened to meet, and the ratio of two methods can be paired round by round (:mod:`alfa.study.timing`)."""
    if rounds < 1:
        raise ValueError(f"the timing needs at least one round, not {rounds}")
    ids, answer = encode_batch(list(data[: schedule.batch]), model_config)
    steps = {}
    for method in methods:
        model = copy.deepcopy(base)
        torch.manual_seed(0)
        alfa.attach(model, method_config(method, model_config.hidden))
        params = trainable_parameters(model)
        model.train()
        steps[method] = (model, torch.optim.AdamW(list(params.values()), lr=1e-4))
    seconds: dict[str, list[float]] = {m: [] for m in methods}
    for turn in tqdm(range(rounds + 1), desc="step timing: rounds (the first warms up)", disable=not progress):
        # each round starts with another method, so none is always the one timed first
        order = list(methods[turn % len(methods) :]) + list(methods[: turn % len(methods)])
        for method in order:
            model, optimizer = steps[method]
            started = time.perf_counter()
            loss = sequence_loss(model, ids, answer, torch.Generator().manual_seed(turn))
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            if turn:  # the first round warms up
                seconds[method].append(time.perf_counter() - started)
    return seconds
