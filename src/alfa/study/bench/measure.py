"""What the benchmark measures besides the error: memory, parameter counts, latency, the costs of one saved
adapter, and the spread of a set's labels. Used by :mod:`alfa.study.bench.produce` for every record."""

from __future__ import annotations

import copy
import random
import statistics
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn
from tqdm.auto import tqdm

from alfa.adapters import (
    MergeError,
    adapter_parameters,
    adapter_state,
    has_compact_form,
    load_adapter,
    merge,
    merge_form,
    save_adapter,
)
from alfa.gaze.data.base import GazeDataset
from alfa.gaze.evaluate import load_examples
from alfa.gaze.geometry import angular_error

__all__ = ["adapter_costs", "constant_prediction_error", "interleaved_seconds", "middle_half"]


def _proc_status_mib(key: str) -> float | None:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1]) / 1024.0
    except OSError:
        pass
    return None


def _reset_peak_memory() -> float | None:
    """Reset the process's peak resident memory (Linux ``VmHWM``); returns the resident memory now (MiB)."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        return None
    return _proc_status_mib("VmRSS")


def constant_prediction_error(data: GazeDataset, persons: Sequence[str], n_adapt: int) -> float:
    """How spread the labels of a set are: the mean over persons of the error of always predicting the
    set's mean gaze (over the scored images). Errors on sets with narrow and wide gaze ranges are only
    comparable against this; it is a description of the labels, never used to choose anything."""
    per_person = {p: load_examples(data, data.person_indices(p)[n_adapt:])[1].double() for p in persons}
    mean = torch.cat(list(per_person.values())).mean(0)
    return statistics.fmean(float(angular_error(mean.expand_as(g), g).mean()) for g in per_person.values())


def _param_count(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def middle_half(values: Sequence[float]) -> list[float]:
    """``[first quartile, third quartile]`` of ``values``: the spread the timing pages print beside a median."""
    q = statistics.quantiles(values, n=4, method="inclusive")
    return [q[0], q[2]]


def interleaved_seconds(
    calls: Mapping[str, Callable[[], Any]], rounds: int, desc: str | None = None, seed: int = 0
) -> dict[str, list[float]]:
    """Per call, its wall time in each of ``rounds`` interleaved rounds after one warm-up call each. Each round
    runs the calls in an order of its own, drawn from ``seed``, so a slow drift of a shared machine hits every
    call alike, and no call always follows the same one (a call that leaves the caches cold slows whichever runs
    next: one order rotated every round kept each call's predecessor the same). With ``desc``, a progress bar of
    that name counts the rounds."""
    names = list(calls)
    for fn in calls.values():
        fn()
    times: dict[str, list[float]] = {n: [] for n in names}
    draw = random.Random(seed)
    for _ in tqdm(range(rounds), desc=desc, disable=desc is None, leave=False):
        for n in draw.sample(names, len(names)):
            t = time.perf_counter()
            calls[n]()
            times[n].append(time.perf_counter() - t)
    return times


@torch.no_grad()
def _latency_ms(models: Sequence[nn.Module], images: torch.Tensor, repeats: int) -> list[float]:
    """Median wall-clock ms of one forward of ``images`` through each model, timed in interleaved rounds."""
    images = images.to(next(models[0].parameters()).device)
    # a GPU returns before it is done
    sync = (lambda: torch.cuda.synchronize(images.device)) if images.is_cuda else (lambda: None)
    for m in models:
        m.eval()
        m(images)  # warm-up
    times: list[list[float]] = [[] for _ in models]
    for _ in range(repeats):
        for i, m in enumerate(models):
            sync()
            t = time.perf_counter()
            m(images)
            sync()
            times[i].append(1000.0 * (time.perf_counter() - t))
    return [statistics.median(ts) for ts in times]


def adapter_costs(base: nn.Module, adapter_file: Path, images: torch.Tensor, repeats: int) -> dict[str, Any]:
    """Costs of one saved per-user adapter on ``base``: trainable tensors, parameters after merging (the
    dense update of a LoRA-style method on a factorized layer is densified; prompts cannot be merged and
    stay attached), parameters of the exact compact merge (``merge(..., extend=True)``: rank ``d + r`` instead of
    dense), file bytes (and the compact ``d×d``-mix form of dictionary methods), and the latency of the
    merged model against ``base``."""
    model = copy.deepcopy(base)
    load_adapter(model, adapter_file)
    state = adapter_state(model)
    assert state is not None
    out: dict[str, Any] = {
        "trainable_params": sum(p.numel() for p in adapter_parameters(model).values()),
        "adapter_bytes": adapter_file.stat().st_size,
        "compact_bytes": None,
    }
    if has_compact_form(model):
        with tempfile.TemporaryDirectory() as tmp:  # only its size is kept; a kill leaves nothing among the adapters
            out["compact_bytes"] = save_adapter(model, Path(tmp) / "compact.safetensors", compact=True).stat().st_size
    total = _param_count(model)
    try:
        extended = copy.deepcopy(model)
        merge(extended, extend=True)
        compact_params = _param_count(extended)
    except MergeError:  # TPGaze's prompts: nothing to merge them into
        compact_params = total
    kind = merge_form(model)  # the adapter contract says how it merges; nothing is re-derived here
    if kind != "not mergeable (kept attached)":
        merge(model, densify=kind == "densified")
    out["merge"] = kind
    out["inference_params"] = _param_count(model)
    out["compact_merge_params"] = min(compact_params, out["inference_params"])
    out["latency_ms"], out["base_latency_ms"] = _latency_ms([model, base], images, repeats)
    return out
