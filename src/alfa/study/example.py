"""The library tour in one run: truncate ResNet-18, attach Alfa, train a few steps, save, merge.

It uses random images and the flip-symmetry loss, so it shows the mechanics and costs, not
accuracy (the gaze demo, ``alfa demo``, does that on the synthetic gaze worlds).
"""

from __future__ import annotations

import copy
import functools
import statistics
import tempfile
import time
from pathlib import Path

import torch

from alfa import attach, load_adapter, merge, param_groups, parameter_summary, save_adapter, truncate
from alfa.adapters import AlfaConfig
from alfa.gaze.losses import flip_symmetry_loss
from alfa.models import resnet18_gaze
from alfa.truncate import DEFAULT_RANK

from .bench.markdown import byte_size
from .bench.measure import interleaved_seconds, middle_half


def _flip_loss(model: torch.nn.Module, images: torch.Tensor) -> torch.Tensor:
    both = model(torch.cat([images, images.flip(-1)]))  # one forward: the attention runs once
    return flip_symmetry_loss(*both.chunk(2))


def run_example(
    rank: int = DEFAULT_RANK, steps: int = 5, image_size: int = 224, batch: int = 10, seed: int = 0
) -> dict:
    """Run the tour and print what happens; returns the numbers it printed."""
    for name, value, least in (
        ("rank", rank, 1),
        ("steps", steps, 1),
        ("batch", batch, 1),
        ("image size", image_size, 32),
    ):
        if value < least:  # ResNet-18 halves the image five times: below 32 pixels there is nothing left
            raise ValueError(f"{name} must be at least {least}, got {value}")
    torch.manual_seed(seed)
    model = resnet18_gaze().eval()
    dense_params = parameter_summary(model).total
    print(f"ResNet-18 gaze regressor: {dense_params / 1e6:.2f} M parameters (dense)")

    t = time.perf_counter()
    report = truncate(model, rank=rank)
    print(f"\n{report}\n(took {time.perf_counter() - t:.2f} s)\n")
    print(f"{parameter_summary(model)}\n")
    base = copy.deepcopy(model)

    names = attach(model, AlfaConfig())
    print(f"Alfa attached to {len(names)} factorized layers; everything else is frozen:\n")
    print(f"{parameter_summary(model)}\n")

    images = torch.rand(batch, 3, image_size, image_size)
    opt = torch.optim.AdamW(param_groups(model, lr=1e-4, lr_scale={r"^layer[34]\.": 10.0}))
    step_times, losses = [], []
    for _ in range(steps):
        t = time.perf_counter()
        opt.zero_grad()
        loss = _flip_loss(model, images)
        loss.backward()
        opt.step()
        step_times.append(time.perf_counter() - t)
        losses.append(loss.item())
    print(f"{steps} personalization steps (batch {batch} + flips, {image_size}×{image_size}):")
    print("  flip loss: " + " → ".join(f"{v:.4f}" for v in losses))
    print(f"  median step time: {statistics.median(step_times):.3f} s\n")

    x = images[:1]
    with tempfile.TemporaryDirectory() as tmp:
        path = save_adapter(model, Path(tmp) / "user.safetensors")
        size = path.stat().st_size
        compact = save_adapter(model, Path(tmp) / "user-compact.safetensors", compact=True).stat().st_size
        reloaded = copy.deepcopy(base)
        load_adapter(reloaded, path)
        with torch.no_grad():
            same = torch.equal(reloaded(x), model(x))
    verdict = "identical" if same else "DIFFERENT"
    print(f"per-user adapter file: {byte_size(size)} (reloads onto the shared base: {verdict})")
    print(f"  compact form (one d×d mixing matrix per layer, for inference): {byte_size(compact)}")

    with torch.no_grad():
        unmerged_out = model(x)
    merge(model)
    with torch.no_grad():
        merged_out = model(x)
    rel = float((merged_out - unmerged_out).norm() / unmerged_out.norm().clamp_min(1e-12))
    merged_params = parameter_summary(model).total
    print(
        f"merged: {merged_params / 1e6:.3f} M parameters (truncated base: {parameter_summary(base).total / 1e6:.3f} M)"
    )
    print(f"  merged vs unmerged output, relative difference: {rel:.1e}\n")

    dense = resnet18_gaze().eval()
    forwards = {n: functools.partial(m, x) for n, m in (("dense", dense), ("truncated", base), ("merged", model))}
    with torch.no_grad():
        times = interleaved_seconds(forwards, rounds=15)
    lat = {name: statistics.median(t) for name, t in times.items()}
    ratios = [m / t for m, t in zip(times["merged"], times["truncated"])]
    (lo, hi), mid = middle_half(ratios), statistics.median(ratios)
    rounds = len(ratios)
    print(
        f"inference latency, batch 1 (median of {rounds} interleaved rounds): "
        + ", ".join(f"{k} {v * 1e3:.1f} ms" for k, v in lat.items())
    )
    print(f"  merged / truncated, per round: median {mid:.2f} (middle half {lo:.2f}–{hi:.2f}; 1 = no overhead)")
    return {
        "dense_params": dense_params,
        "truncated_params": parameter_summary(base).total,
        "merged_params": merged_params,
        "losses": losses,
        "step_seconds": step_times,
        "adapter_bytes": size,
        "compact_adapter_bytes": compact,
        "merge_rel_diff": rel,
        "latency_s": lat,
        "merged_over_truncated": {"median": mid, "q1": lo, "q3": hi, "rounds": rounds},
    }
