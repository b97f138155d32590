"""Training FAZE (``alfa faze train``, ``alfa faze meta-train``): DT-ED with its gaze MLP on pairs of one person's
images, then the MLP meta-learned with MAML over the source persons on the frozen DT-ED's gaze codes.

Both hold the training images in memory (the synthetic worlds and the real layouts' fixtures fit; a full real
dataset would need a streaming loader, which this does not have). Both write ``model.safetensors``
(:func:`alfa.checkpoint.save_model`) once, at the end; the meta-trained one records its inner rate and steps,
which ``alfa calibrate --method faze`` reuses as PS-GEN's.

Both resume. Every ``checkpoint_every`` steps the run's whole state (the model's tensors, the optimizer's moments,
the steps done) is one file, ``faze_state.safetensors`` (:func:`alfa.checkpoint.write_tagged`: safetensors with a
JSON header, written atomically), so a kill at any moment leaves the last state whole: a rerun of the same
command continues from it, and ``model.safetensors`` follows the state. The pairs (or tasks) of step ``s`` are
drawn from ``(seed, s)`` alone, so a resumed run ends with the same weights as an uninterrupted one. A state of
another run (other data, other images under the same data name, model, recipe or start checkpoint) is refused;
more ``steps`` extend a finished run.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import math
import os
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor
from tqdm.auto import tqdm

from alfa.adapters.io import refuse_non_finite
from alfa.checkpoint import (
    CheckpointError,
    load_optimizer_tensors,
    load_state,
    optimizer_tensors,
    read_checkpoint,
    read_tagged,
    save_model,
    write_tagged,
)
from alfa.fileio import not_a_file, settings_differences

from .data.base import GazeDataset
from .evaluate import load_images
from .faze import FazeGaze, MamlTask, adapt_mlp, angular_loss, apply_gradients, dted_losses, faze_gaze, maml_gradients
from .train_state import RECORDED_LATER, data_signatures, other_data

__all__ = [
    "FazeTrainConfig",
    "MODEL_FILE",
    "STATE_FILE",
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
    checkpoint_every: int = 100  # steps between two states written (no number depends on it)

    def validate(self) -> None:
        if self.checkpoint_every < 1:
            raise ValueError(f"checkpoint_every must be at least 1, got {self.checkpoint_every}")
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
    checkpoint_every: int = 100  # outer steps between two states written (no number depends on it)

    def validate(self) -> None:
        if min(self.steps, self.k, self.l, self.tasks, self.inner_steps, self.checkpoint_every) < 1:
            raise ValueError("steps, k, l, tasks, inner_steps and checkpoint_every must be at least 1")
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


# ----------------------------------------------------------------------------- the run's state

MODEL_FILE = "model.safetensors"
STATE_FILE = "faze_state.safetensors"
STATE_FORMAT = "alfa-faze-state"


def _step_generator(seed: int, step: int) -> torch.Generator:
    """The generator of step ``step``'s draws: a function of ``(seed, step)`` only, so a resumed run draws alike."""
    return torch.Generator().manual_seed(seed * 1_000_003 + step)


def _comparable(config: dict[str, Any]) -> dict[str, Any]:
    # More steps extend a run; how often its state is written changes no number.
    return {k: v for k, v in config.items() if k not in ("steps", "checkpoint_every")}


def _save_state(out: Path, model: FazeGaze, optimizer: torch.optim.Optimizer, meta: dict[str, Any]) -> None:
    """The model's tensors, the optimizer's state and ``meta`` (header, steps done, …) as one atomic file."""
    tensors = {f"model/{k}": v.detach().cpu().contiguous() for k, v in model.state_dict().items()}
    tensors.update(optimizer_tensors(optimizer, "optimizer"))
    refuse_non_finite(tensors, out / STATE_FILE)  # a diverged model stops the run; the last good state stays
    write_tagged(out / STATE_FILE, tensors, STATE_FORMAT, meta)


def _resume(
    out: Path, model: FazeGaze, optimizer: torch.optim.Optimizer, header: dict[str, Any], steps: int
) -> dict[str, Any]:
    """Load the state of this run from ``out`` into ``model`` and ``optimizer``; its meta (``{}``: none, start
    afresh). A ``model.safetensors`` without a state beside it is no file this run wrote: refused, not replaced."""
    state = out / STATE_FILE
    what = not_a_file(state)
    if what is not None:
        raise CheckpointError(
            f"{state} is {what}, not the state a run writes there; move it away, or use another output folder"
        )
    if not state.is_file():
        if (out / MODEL_FILE).exists():
            raise CheckpointError(_without_state(out, header["stage"]))
        return {}
    tensors, meta = read_tagged(state, STATE_FORMAT, "a FAZE training state")
    saved = meta.get("header", {})
    mine = json.loads(json.dumps(header))  # tuples become lists, as in the saved header
    compared = [key for key in mine if key != "config" and key not in RECORDED_LATER]  # those: where recorded
    problems = [f"{key} differs" for key in compared if saved.get(key) != mine[key]]
    problems += other_data(saved, mine)
    if (theirs := _comparable(saved.get("config", {}))) != (ours := _comparable(mine["config"])):
        problems.append(f"config (the checkpoint's vs this run's): {', '.join(settings_differences(theirs, ours))}")
    if problems:
        raise CheckpointError(
            f"{state} is the state of another run ({'; '.join(problems)}); use another output folder, or delete it "
            "to start over"
        )
    done = int(meta.get("step", 0))
    if done > steps:
        raise CheckpointError(f"{state}: this run has done {done} steps already, more than the {steps} asked")
    model_tensors = {k.removeprefix("model/"): v for k, v in tensors.items() if k.startswith("model/")}
    load_state(model, model_tensors, source=str(state))
    load_optimizer_tensors(optimizer, tensors, "optimizer")
    return meta


_COMMANDS = {"faze-train": ("alfa faze train", "faze"), "faze-meta-train": ("alfa faze meta-train", "maml")}
"""Per stage, its command and the record its model file's header holds."""


def _without_state(out: Path, stage: str) -> str:
    """Why a ``model.safetensors`` with no state beside it stops the run: a run of this stage wrote it and its state
    was removed since (the run can be neither checked nor extended), or it is no run's of this stage."""
    command, record = _COMMANDS[stage]
    try:
        extra = read_checkpoint(out / MODEL_FILE, header_only=True)[1].get("extra", {})
    except (OSError, ValueError):
        extra = {}
    ours = isinstance(extra, dict) and record in extra and (record == "maml" or "maml" not in extra)
    if ours:
        return (
            f"{out / STATE_FILE} is missing: {command} wrote the {MODEL_FILE} beside it, and the state that run kept "
            "was deleted or moved since, so it can be neither resumed nor checked against this run; put the state "
            f"back, or delete {out / MODEL_FILE} to train from the start, or use another output folder"
        )
    return (
        f"{out} already holds a {MODEL_FILE} but no {STATE_FILE}, so no run of this command wrote it; use another "
        "output folder"
    )


def _run_steps(
    out: Path,
    model: FazeGaze,
    optimizer: torch.optim.Optimizer,
    header: dict[str, Any],
    config: FazeTrainConfig | MetaTrainConfig,
    step_fn: Callable[[int], dict[str, float]],
    desc: str,
    progress: bool,
) -> dict[str, Any]:
    """Run ``step_fn(step)`` for the steps not done yet (resumed from ``out``'s state), writing the state every
    ``config.checkpoint_every`` steps and after the last; the final state's meta (``last``: the last step's
    values, ``seconds``: the run's time over all its sessions)."""
    out.mkdir(parents=True, exist_ok=True)
    meta = _resume(out, model, optimizer, header, config.steps)
    done, seconds = int(meta.get("step", 0)), float(meta.get("seconds", 0.0))
    if done < config.steps and (out / MODEL_FILE).is_file():  # the model is written once a run ends
        warnings.warn(
            f"{out} holds a finished run's {MODEL_FILE} of fewer steps: this run goes on from step {done} to "
            f"{config.steps} and replaces it (a meta-training made from it will refuse the new one)",
            stacklevel=3,
        )
    if progress and done:
        state = "complete" if done == config.steps else "resuming"
        tqdm.write(f"{out}: {done} of {config.steps} steps found, {state}")
    t0 = time.time()
    bar = tqdm(range(done, config.steps), desc=desc, disable=not progress, initial=done, total=config.steps)
    for step in bar:
        last = step_fn(step)
        if (step + 1) % config.checkpoint_every == 0 or step + 1 == config.steps:
            elapsed = seconds + time.time() - t0
            meta = {"header": header, "step": step + 1, "last": last, "seconds": elapsed}
            _save_state(out, model, optimizer, meta)
    return meta  # a finished run's own, when it had nothing left to do


# ----------------------------------------------------------------------------- DT-ED and its gaze MLP


def train_faze(
    dataset: GazeDataset,
    config: FazeTrainConfig,
    out_dir: str | os.PathLike,
    *,
    model_kwargs: dict[str, Any] | None = None,
    progress: bool = True,
) -> tuple[FazeGaze, dict[str, Any]]:
    """Train DT-ED and its gaze MLP on every person of ``dataset``; write ``out_dir/model.safetensors``. Resumes
    from ``out_dir``'s state (see the module's docstring)."""
    config.validate()
    persons = dataset.persons()
    indices, ids = _person_ids(dataset, persons)
    gaze, head = dataset.labels(indices), head_poses(dataset, indices)
    size = load_images(dataset, indices[:1]).shape[-1]

    def images(positions: Tensor) -> Tensor:  # a step's images, read when it needs them: a real source's
        return load_images(dataset, [indices[i] for i in positions.tolist()])  # faces do not fit in memory at once

    kwargs = {"image_size": size, **(model_kwargs or {})}
    torch.manual_seed(config.seed)
    model = faze_gaze(**kwargs)
    optimizer = torch.optim.Adam(model.parameters(), lr=config.lr)
    data = {"name": dataset.name, "images": len(dataset), "persons": len(persons)}
    header = {"stage": "faze-train", "data": data, "model_kwargs": kwargs, "config": dataclasses.asdict(config)}
    header.update(data_signatures(dataset, persons=persons))  # same names and counts, other images: another run
    model.train()

    def step(s: int) -> dict[str, float]:
        a, b = _pairs(ids, config.batch_size, _step_generator(config.seed, s))
        pair = (images(a), images(b), gaze[a], gaze[b], head[a], head[b], ids[a])
        losses = dted_losses(model, pair, config.weights)
        if not torch.isfinite(losses.total):
            raise FloatingPointError(f"faze train: the loss is {float(losses.total)} (NaN or infinite) at step {s + 1}")
        optimizer.zero_grad(set_to_none=True)
        losses.total.backward()
        optimizer.step()
        return {f.name: float(getattr(losses, f.name).detach()) for f in dataclasses.fields(losses)}

    meta = _run_steps(Path(out_dir), model, optimizer, header, config, step, "faze train", progress)
    model.eval()
    record = {"stage": "faze-train", "data": dataset.name, "persons": len(persons)}
    record.update({"config": dataclasses.asdict(config), "final_losses": meta["last"], "seconds": meta["seconds"]})
    out = Path(out_dir)
    save_model(out / MODEL_FILE, model, "faze_gaze", kwargs, extra={"faze": record}, input_size=(size, size))
    return model, record


@torch.no_grad()
def gaze_codes(model: FazeGaze, dataset: GazeDataset, persons: list[str]) -> dict[str, tuple[Tensor, Tensor]]:
    """Per person, the frozen DT-ED's flattened gaze codes and the gaze labels of all their images."""
    model.eval()
    out = {}
    for p in persons:
        indices = dataset.person_indices(p)
        # a batch of at most _CODE_BATCH images at a time: a person of a real dataset has thousands of faces (the
        # synthetic worlds' persons fit one batch, as they always did)
        codes = [
            model.gaze_code(load_images(dataset, indices[s : s + _CODE_BATCH]))
            for s in range(0, len(indices), _CODE_BATCH)
        ]
        out[p] = (torch.cat(codes), dataset.labels(indices))
    return out


_CODE_BATCH = 1024


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
    checkpoint config (its model arguments and input size are kept; its checksum names the start, so a state
    begun from another checkpoint is refused). Resumes from ``out_dir``'s state (see the module's docstring)."""
    config.validate()
    if not isinstance(model, FazeGaze):
        raise ValueError(f"meta-training needs a FAZE checkpoint (alfa faze train), not a {type(model).__name__}")
    need = config.k + config.l
    persons = [p for p in dataset.persons() if len(dataset.person_indices(p)) >= need]
    if len(persons) < config.tasks:
        raise ValueError(
            f"{dataset.name}: {len(persons)} persons have k + l = {need} images, fewer than the {config.tasks} tasks "
            f"(persons) each outer step draws: lower --tasks, --k or --l"
        )
    codes = gaze_codes(model, dataset, persons)
    mlp = model.gaze_mlp
    # SGD without momentum is the review's θ ← θ − η ∇ (and has no state to keep)
    optimizer_class = torch.optim.Adam if config.outer_optimizer == "adam" else torch.optim.SGD
    optimizer = optimizer_class(mlp.parameters(), lr=config.outer_lr)
    data = {"name": dataset.name, "images": len(dataset), "persons": len(persons)}
    header = {"stage": "faze-meta-train", "data": data, "start": saved.get("checksum")}
    header.update(data_signatures(dataset, persons=persons))
    header["config"] = dataclasses.asdict(config)

    def step(s: int) -> dict[str, float]:
        g = _step_generator(config.seed, s)
        chosen = torch.randperm(len(persons), generator=g)[: config.tasks].tolist()
        tasks = [_task(codes[persons[i]], config.k, config.l, g) for i in chosen]
        grads, loss = maml_gradients(mlp, tasks, config.inner_lr, config.inner_steps, config.first_order)
        if not math.isfinite(loss):
            raise FloatingPointError(f"faze meta-train: the loss is {loss} (NaN or infinite) at step {s + 1}")
        apply_gradients(mlp, grads, optimizer)
        return {"loss": loss}

    meta = _run_steps(Path(out_dir), model, optimizer, header, config, step, "faze meta-train", progress)
    model.eval()
    record = {"stage": "faze-meta-train", "data": dataset.name, "persons": len(persons)}
    record.update({"config": dataclasses.asdict(config), "final_loss_deg": math.degrees(meta["last"]["loss"])})
    record["seconds"] = meta["seconds"]
    extra = {**saved.get("extra", {}), "maml": record}
    size = saved.get("input_size")
    save_model(
        Path(out_dir) / MODEL_FILE,
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
