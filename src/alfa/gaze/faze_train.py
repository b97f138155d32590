"""Training FAZE (``alfa faze train``, ``alfa faze meta-train``): DT-ED with its gaze MLP on pairs of one person's
images, then the MLP meta-learned with MAML over the source persons on the frozen DT-ED's gaze codes.

Both hold the training images in memory (the synthetic worlds and the real layouts' fixtures fit; a full real
dataset would need a streaming loader, which this does not have). Both write one checkpoint
(``model.safetensors``, :func:`alfa.checkpoint.save_model`) atomically at the end; the meta-trained one records
its inner rate and steps, which ``alfa calibrate --method faze`` reuses as PS-GEN's.
"""

from __future__ import annotations

import copy
import dataclasses
import math
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor
from tqdm.auto import tqdm

from alfa.checkpoint import save_model

from .data.base import GazeDataset
from .evaluate import load_examples
from .faze import FazeGaze, MamlTask, adapt_mlp, angular_loss, apply_gradients, dted_losses, faze_gaze, maml_gradients

__all__ = [
    "FazeTrainConfig",
    "MetaTrainConfig",
    "fit_mlp_plainly",
    "gaze_codes",
    "head_poses",
    "meta_train_faze",
    "post_adaptation_loss",
    "train_faze",
]


@dataclass
class FazeTrainConfig:
    """DT-ED and its gaze MLP, trained jointly. ``weights`` are ``(λ_recon, λ_EC, λ_gaze)``; the review gives no
    values, these are our defaults (the reconstruction and consistency terms shape the codes, the gaze term is
    small beside them). ``batch_size`` pairs per step, Adam at ``lr``."""

    steps: int = 2000
    batch_size: int = 32
    lr: float = 1e-3
    weights: tuple[float, float, float] = (1.0, 2.0, 0.1)
    seed: int = 0

    def validate(self) -> None:
        if self.steps < 1 or self.batch_size < 2:
            raise ValueError(f"need steps >= 1 and batch_size >= 2, got {self.steps}, {self.batch_size}")
        if not self.lr > 0 or any(not (w >= 0 and math.isfinite(w)) for w in self.weights) or len(self.weights) != 3:
            raise ValueError(f"need lr > 0 and three non-negative loss weights, got {self.lr}, {self.weights}")


@dataclass
class MetaTrainConfig:
    """AdaGEN's MAML: per task one source person, ``k`` calibration and ``l`` validation samples; ``inner_steps``
    steps of rate ``inner_lr`` (α); ``tasks`` persons per outer step, ``steps`` outer steps of rate ``outer_lr``
    (η) with ``outer_optimizer`` ``"sgd"`` (the review's ``θ ← θ − η ∇``) or ``"adam"``; ``first_order`` drops
    the second-order term."""

    steps: int = 1000
    k: int = 9
    l: int = 9  # noqa: E741 (the review's name)
    tasks: int = 4
    inner_lr: float = 0.05
    inner_steps: int = 5
    outer_lr: float = 1e-3
    outer_optimizer: str = "adam"
    first_order: bool = False
    seed: int = 0

    def validate(self) -> None:
        if min(self.steps, self.k, self.l, self.tasks, self.inner_steps) < 1:
            raise ValueError("steps, k, l, tasks and inner_steps must be at least 1")
        if not (self.inner_lr > 0 and self.outer_lr > 0):
            raise ValueError(f"need positive rates, got inner {self.inner_lr}, outer {self.outer_lr}")
        if self.outer_optimizer not in ("sgd", "adam"):
            raise ValueError(f"outer_optimizer must be 'sgd' or 'adam', got {self.outer_optimizer!r}")


def head_poses(dataset: GazeDataset, indices: list[int]) -> Tensor:
    """The ``(N, 2)`` head poses ``(yaw, pitch)`` of ``indices``; a clear error where the dataset carries none
    (DT-ED turns its head code by the labelled head rotation, so it cannot train without one)."""
    table = getattr(dataset, "head", None)  # every loader holds its labels as a tensor; images stay unread
    if isinstance(table, Tensor):
        head = table[torch.as_tensor(indices, dtype=torch.long)].float()
    else:
        head = torch.stack([dataset[i]["head"] for i in indices]) if indices else torch.zeros(0, 2)
    missing = (~torch.isfinite(head)).any(-1).nonzero().flatten().tolist()
    if missing:
        i = indices[missing[0]]
        where = dataset.source_line(i) if hasattr(dataset, "source_line") else f"image {i}"
        raise ValueError(
            f"{dataset.name}: {len(missing)} of {len(indices)} images have no head pose (the first: {where}); "
            "FAZE's DT-ED needs the head pose of every training image (Gaze360's labels, for one, carry none)"
        )
    return head


def _person_ids(dataset: GazeDataset, persons: list[str]) -> tuple[list[int], Tensor]:
    indices, ids = [], []
    for n, p in enumerate(persons):
        own = dataset.person_indices(p)
        if len(own) >= 2:  # a pair needs two images
            indices += own
            ids += [n] * len(own)
    if not indices:
        raise ValueError(f"{dataset.name}: no person has two images to pair")
    return indices, torch.tensor(ids)


def _pairs(ids: Tensor, batch: int, g: torch.Generator) -> tuple[Tensor, Tensor]:
    """``batch`` pairs of positions ``(a, b)`` of one person each (``a ≠ b``)."""
    a = torch.randint(len(ids), (batch,), generator=g)
    b = torch.empty_like(a)
    for n, i in enumerate(a.tolist()):
        same = (ids == ids[i]).nonzero().flatten()
        same = same[same != i]
        b[n] = same[torch.randint(len(same), (1,), generator=g)]
    return a, b


def train_faze(
    dataset: GazeDataset,
    config: FazeTrainConfig,
    out_dir: str | os.PathLike,
    *,
    model_kwargs: dict[str, Any] | None = None,
    progress: bool = True,
) -> tuple[FazeGaze, dict[str, Any]]:
    """Train DT-ED and its gaze MLP on every person of ``dataset``; write ``out_dir/model.safetensors``."""
    config.validate()
    persons = dataset.persons()
    indices, ids = _person_ids(dataset, persons)
    images, gaze = load_examples(dataset, indices)
    head = head_poses(dataset, indices)
    size = images.shape[-1]
    kwargs = {"image_size": size, **(model_kwargs or {})}
    torch.manual_seed(config.seed)
    model = faze_gaze(**kwargs)
    optimizer = torch.optim.Adam(model.parameters(), lr=config.lr)
    g = torch.Generator().manual_seed(config.seed)
    model.train()
    t0, last = time.time(), {}
    for _ in tqdm(range(config.steps), desc="faze train", disable=not progress):
        a, b = _pairs(ids, config.batch_size, g)
        pair = (images[a], images[b], gaze[a], gaze[b], head[a], head[b], ids[a])
        losses = dted_losses(model, pair, config.weights)
        if not torch.isfinite(losses.total):
            raise FloatingPointError(f"faze train: the loss is {float(losses.total)} (NaN or infinite)")
        optimizer.zero_grad(set_to_none=True)
        losses.total.backward()
        optimizer.step()
        last = {f.name: float(getattr(losses, f.name).detach()) for f in dataclasses.fields(losses)}
    model.eval()
    record = {
        "stage": "faze-train",
        "data": dataset.name,
        "persons": len(persons),
        "config": dataclasses.asdict(config),
    }
    record.update({"final_losses": last, "seconds": time.time() - t0})
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    save_model(out / "model.safetensors", model, "faze_gaze", kwargs, extra={"faze": record}, input_size=(size, size))
    return model, record


@torch.no_grad()
def gaze_codes(model: FazeGaze, dataset: GazeDataset, persons: list[str]) -> dict[str, tuple[Tensor, Tensor]]:
    """Per person, the frozen DT-ED's flattened gaze codes and the gaze labels of all their images."""
    model.eval()
    out = {}
    for p in persons:
        images, gaze = load_examples(dataset, dataset.person_indices(p))
        out[p] = (model.gaze_code(images), gaze)
    return out


def _task(codes: tuple[Tensor, Tensor], k: int, l: int, g: torch.Generator) -> MamlTask:  # noqa: E741
    z, gaze = codes
    order = torch.randperm(len(z), generator=g)
    c, v = order[:k], order[k : k + l]
    return MamlTask(z[c], gaze[c], z[v], gaze[v])


def meta_train_faze(
    model: FazeGaze,
    saved: dict[str, Any],
    dataset: GazeDataset,
    config: MetaTrainConfig,
    out_dir: str | os.PathLike,
    *,
    progress: bool = True,
) -> dict[str, Any]:
    """MAML of ``model.gaze_mlp`` (in place) over the persons of ``dataset`` on the frozen DT-ED's gaze codes;
    write ``out_dir/model.safetensors`` recording the inner rate and steps. ``saved`` is the trained model's
    checkpoint config (its model arguments and input size are kept)."""
    config.validate()
    if not isinstance(model, FazeGaze):
        raise ValueError(f"meta-training needs a FAZE checkpoint (alfa faze train), not a {type(model).__name__}")
    need = config.k + config.l
    persons = [p for p in dataset.persons() if len(dataset.person_indices(p)) >= need]
    if len(persons) < config.tasks:
        raise ValueError(f"{dataset.name}: {len(persons)} persons have k + l = {need} images; need {config.tasks}")
    codes = gaze_codes(model, dataset, persons)
    mlp = model.gaze_mlp
    adam = torch.optim.Adam(mlp.parameters(), lr=config.outer_lr) if config.outer_optimizer == "adam" else None
    g = torch.Generator().manual_seed(config.seed)
    t0, losses = time.time(), []
    for _ in tqdm(range(config.steps), desc="faze meta-train", disable=not progress):
        chosen = torch.randperm(len(persons), generator=g)[: config.tasks].tolist()
        tasks = [_task(codes[persons[i]], config.k, config.l, g) for i in chosen]
        grads, loss = maml_gradients(mlp, tasks, config.inner_lr, config.inner_steps, config.first_order)
        if not math.isfinite(loss):
            raise FloatingPointError(f"faze meta-train: the loss is {loss} (NaN or infinite)")
        if adam is None:
            apply_gradients(mlp, grads, config.outer_lr)
        else:
            for n, p in mlp.named_parameters():
                p.grad = grads[n]
            adam.step()
        losses.append(loss)
    record = {"stage": "faze-meta-train", "data": dataset.name, "persons": len(persons)}
    record.update({"config": dataclasses.asdict(config), "final_loss_deg": math.degrees(losses[-1])})
    record["seconds"] = time.time() - t0
    extra = {**saved.get("extra", {}), "maml": record}
    size = saved.get("input_size")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    save_model(
        out / "model.safetensors",
        model,
        "faze_gaze",
        saved.get("model_kwargs", {}),
        extra=extra,
        input_size=tuple(size) if size else None,
    )
    return record


def fit_mlp_plainly(mlp: torch.nn.Module, codes: list[tuple[Tensor, Tensor]], steps: int, lr: float) -> None:
    """The same MLP trained without meta-learning: Adam on the angular loss of every person's codes at once (the
    comparison FAZE's claim is about)."""
    z = torch.cat([c[0] for c in codes])
    gaze = torch.cat([c[1] for c in codes])
    optimizer = torch.optim.Adam(mlp.parameters(), lr=lr)
    for _ in range(steps):
        optimizer.zero_grad(set_to_none=True)
        angular_loss(mlp(z), gaze).backward()
        optimizer.step()


def post_adaptation_loss(mlp: torch.nn.Module, tasks: list[MamlTask], lr: float, steps: int) -> float:
    """Mean validation angle (radians) over ``tasks`` after adapting a copy of ``mlp`` on each task's ``k``."""
    total = 0.0
    for task in tasks:
        own = copy.deepcopy(mlp)
        adapt_mlp(own, task.z_c, task.g_c, lr, steps)
        with torch.no_grad():
            total += float(angular_loss(own(task.z_v), task.g_v))
    return total / len(tasks)
