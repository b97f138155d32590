"""Throughput of many users on one shared base (:class:`alfa.MultiUserModel`), measured on this machine.

ResNet-18 truncated at the default rank, batches of 64 face crops. Per batch, 1, 8 or 64 distinct users (Alfa
users and, separately, LoRA users, each with a random non-trivial adapter of the default size), against one
merged model running the whole batch (what a single user costs) and against switching merged models per
request (each user's own merged model on their share of the batch). Rounds are interleaved, so a slow drift of
the machine hits every configuration alike; each rate is a median over the rounds, each ratio is paired over the
rounds with its 95 % interval (:mod:`alfa.study.timing`), and every round's timing is kept in the record. Memory per
added user is the bytes of their terms in the multi-user model, against a merged model of their own.
"""

from __future__ import annotations

import copy
import json
import os
import statistics
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn

from alfa import attach, parameter_summary, truncate
from alfa.adapters import AlfaConfig, LoraConfig, adapter_parameters
from alfa.export import merged_copy
from alfa.fileio import write_text
from alfa.gaze.train import TruncateConfig
from alfa.models import resnet18_gaze
from alfa.serve import MultiUserModel
from alfa.study.timing import (
    goal_verdict,
    interval_note,
    load_average,
    load_text,
    median_interval,
    no_rounds_note,
    ratio_cell,
)

from .markdown import table
from .measure import interleaved_seconds, middle_half

__all__ = ["THREADS", "measure_serving", "serving_markdown", "serving_command", "main"]

BATCH = 64
GOAL = 0.8  # the multi-user model at 64 distinct users: at least 0.8× one merged model's throughput
DISTINCT = (1, 8, 64)
METHODS = {"alfa": AlfaConfig(), "lora": LoraConfig()}


def _users(base: nn.Module, method: str, n: int) -> list[nn.Module]:
    out = []
    for i in range(n):
        model = copy.deepcopy(base)
        torch.manual_seed(1000 + i)
        attach(model, METHODS[method])
        with torch.no_grad():
            for p in adapter_parameters(model).values():
                p.normal_(0, 0.01)
        out.append(model)
    return out


THREADS = 2
"""The torch threads the serving page is measured on (this project's 2-core machine), unless ``--threads`` says
otherwise; a measurement that records none was made on this many."""


@torch.no_grad()
def measure_serving(rounds: int = 28, image_size: int = 64, threads: int = THREADS, seed: int = 0) -> dict[str, Any]:
    """The measurements of the page (see the module docstring); seconds per batch of :data:`BATCH`."""
    torch.set_num_threads(threads)
    torch.manual_seed(seed)
    base = resnet18_gaze().eval()
    truncate(base, TruncateConfig().rank)
    x = torch.rand(BATCH, 3, image_size, image_size, generator=torch.Generator().manual_seed(seed))
    runs: dict[str, Any] = {}
    per_user: dict[str, dict[str, int]] = {}
    for method in METHODS:
        users = _users(base, method, max(DISTINCT))
        served = MultiUserModel(base)
        for i, u in enumerate(users):
            served.add_user(f"u{i}", u)
        merged = [merged_copy(u, "extend") for u in users]
        per_user[method] = {
            "multi_user_bytes": served.user_bytes("u0"),
            "merged_model_bytes": parameter_summary(merged[0]).total * 4,
        }
        runs[f"{method}: one merged model"] = lambda m=merged[0]: m(x)
        # the very same call under a second name: how far apart two rows read with no difference between them
        runs[f"{method}: one merged model, again"] = lambda m=merged[0]: m(x)
        for k in DISTINCT:
            ids = [f"u{i % k}" for i in range(BATCH)]
            runs[f"{method}: multi-user, {k} users"] = lambda s=served, ids=ids: s(x, ids)
            shares = [list(range(j, BATCH, k)) for j in range(k)]
            runs[f"{method}: switching merged models, {k} users"] = lambda shares=shares, ms=merged: [
                ms[j](x[idx]) for j, idx in enumerate(shares)
            ]
    times = interleaved_seconds(runs, rounds, desc=f"serving, {len(runs)} settings: rounds")
    return {
        "batch": BATCH,
        "image_size": image_size,
        "rank": TruncateConfig().rank,
        "rounds": rounds,
        "threads": threads,
        "seconds": {n: statistics.median(t) for n, t in times.items()},
        # the middle half of each configuration's rounds, for the spread the page prints
        "seconds_quartiles": {n: middle_half(t) for n, t in times.items()},
        # every round's timing (the i-th of each list from the same round): the pairs the ratios' intervals need
        "round_seconds": times,
        "per_user": per_user,
        "load_average_end": load_average(),
        "cpus": os.cpu_count(),
        "torch": torch.__version__,
        "date": time.strftime("%Y-%m-%d"),
    }


def serving_command(out: str | None, rounds: int, image_size: int, threads: int = THREADS) -> str:
    command = f"alfa serving --rounds {rounds} --image-size {image_size}" + (f" --out {out}" if out else "")
    return command + (f" --threads {threads}" if threads != THREADS else "")


def _throughput_ratio(r: dict[str, Any], single: str, name: str) -> tuple[str, str]:
    """``name``'s throughput against ``single``'s: its table cell and the goal's verdict. Paired over the rounds
    with its interval where the record keeps them, else the ratio of the medians, judged against no goal."""
    rounds = r.get("round_seconds") or {}
    # one merged model's time over this configuration's, round by round: this one's throughput in × of that one's
    cell, paired = ratio_cell(rounds.get(single), rounds.get(name), r["seconds"][single] / r["seconds"][name])
    return cell, goal_verdict(paired, GOAL, at_least=True)


def serving_markdown(r: dict[str, Any], command: str) -> str:
    """The page (docs/serving.md) from a measurement."""
    s, q, b = r["seconds"], r["seconds_quartiles"], r["batch"]

    kept = {name: median_interval((r.get("round_seconds") or {}).get(name) or []) for name in s}

    def rate(name: str) -> str:
        # images per second is batch / seconds, a monotone map: the median round and the rounds bounding its
        # distribution-free interval map to the rate's median and interval
        if kept[name] is not None:
            _, fast, slow = kept[name]
            return f"{b / s[name]:,.0f} [{b / slow:,.0f}, {b / fast:,.0f}]"
        slow, fast = q[name][1], q[name][0]
        return f"{b / s[name]:,.0f} ({b / slow:,.0f}–{b / fast:,.0f}, the middle half)"

    # every rate has its interval only where every configuration kept enough rounds (six: median_interval)
    intervals = all(v is not None for v in kept.values())
    rows, verdicts, controls = [], [], []
    for method in METHODS:
        single = f"{method}: one merged model"
        rows.append([f"{method}: one merged model (one user)", rate(single), "1.00"])
        again = f"{method}: one merged model, again"
        if again in s:  # an earlier record has no control
            against_itself = _throughput_ratio(r, single, again)[0]
            rows.append([f"{method}: the same call again (a control)", rate(again), against_itself])
            controls.append(f"{method} {against_itself}×")
        for k in DISTINCT:
            for kind in ("multi-user", "switching merged models"):
                name = f"{method}: {kind}, {k} users"
                who = f"{k} distinct user{'s' if k > 1 else ''}"
                rows.append([f"{method}: {kind}, {who}", rate(name), _throughput_ratio(r, single, name)[0]])
        cell, verdict = _throughput_ratio(r, single, f"{method}: multi-user, {max(DISTINCT)} users")
        verdicts.append(
            f"{method}: at {max(DISTINCT)} distinct users per batch of {b}, the multi-user model runs at "
            f"{cell}× a single merged model's throughput (goal ≥ {GOAL}×: {verdict})."
        )
    paired = bool(r.get("round_seconds")) and r["rounds"] >= 2
    how, column = (
        (interval_note(), "× one merged model [95 % interval]")
        if paired
        else (no_rounds_note(command), "× one merged model (of the medians)")
    )
    mem = [
        [m, f"{v['multi_user_bytes'] / 1024:,.1f} KiB", f"{v['merged_model_bytes'] / 2**20:,.2f} MiB"]
        for m, v in r["per_user"].items()
    ]
    return "\n".join(
        [
            "# Serving many users on one shared base",
            "",
            f"<!-- Generated by `{command}`. Do not edit by hand: re-run the command. -->",
            "",
            f"Generated by `{command}` on {r['date']} ({r['cpus']} CPUs, {r['threads']} torch threads, torch "
            f"{r['torch']}; load average {load_text(r['load_average_end'])} at the end). ResNet-18 truncated at rank "
            f"{r['rank']}, batches of {b} images of {r['image_size']}×{r['image_size']}; images / s: the median over "
            f"{r['rounds']} interleaved rounds with its distribution-free 95 % interval (a record without six rounds "
            "of each: the middle half of them, in parentheses). Alfa users: "
            "`AlfaConfig()`; LoRA users: `LoraConfig()`; each with its own random adapter. *Switching merged "
            "models*: each user's own merged model on their share of the batch.",
            "",
            how,
            "",
            table(["configuration", "images / s [95 % interval]" if intervals else "images / s", column], rows),
            "",
            *(f"- {v}" for v in verdicts),
            "",
            *(
                [
                    "*The same call again* times one merged model's very call under a second name, in its own place "
                    f"in each round: against itself it read {', '.join(controls)}, where the truth is 1. *Switching "
                    "merged models, 1 distinct user* is not that control: it also gathers the batch by index (a copy) "
                    "before the same model runs on it.",
                    "",
                ]
                if controls
                else []
            ),
            "Memory a user adds:",
            "",
            table(["method", "in the multi-user model (its terms)", "a merged model of its own"], mem),
            "",
            "The multi-user model's outputs equal each user's own merged model (tests/test_serve.py).",
            "",
        ]
    )


def main(out: str | None = None, rounds: int = 28, image_size: int = 64, threads: int = THREADS) -> dict[str, Any]:
    result = measure_serving(rounds=rounds, image_size=image_size, threads=threads)
    text = serving_markdown(result, serving_command(out, rounds, image_size, threads))
    print(text)
    if out:
        path = Path(out)
        write_text(path.with_suffix(".json"), json.dumps(result, indent=2))
        write_text(path, text)
    return result
