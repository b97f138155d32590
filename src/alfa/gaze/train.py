"""Source training: pre-training the gaze regressor, and truncation followed by recovery (spec §2).

Both stages run the same loop (:func:`train_source`): Adam on every parameter, the supervised L1
loss on ``(yaw, pitch)`` plus, optionally, TPGaze's left-right symmetry term (the prediction on the
horizontally flipped image, computed without gradient and in eval mode, mirrored by ``FlipYaw``),
with a constant learning rate. Validation is on held-out source persons, every epoch, for the record
only: the model kept is always the last epoch's.

Under ``torchrun`` (:mod:`alfa.gaze.distributed`) the same loop trains through DistributedDataParallel:
``batch_size`` stays the global batch, each process takes its shard of it, the loss is scaled so that the
averaged gradient is the global batch's, only rank 0 writes, and the validation persons are shared out.

Long runs are resumable. After every epoch the run's whole state (model, optimizer, epochs done, history, the
run's identity) is one atomic safetensors file, and ``model.safetensors`` is written from it; a run of one
process also writes the state every few minutes inside an epoch (:mod:`alfa.gaze.train_state`, which also
resumes the two-file checkpoints of earlier versions). The batch order of epoch ``e`` is drawn from ``seed`` and
``e`` alone, so a run killed at any moment and resumed gives the same numbers as an uninterrupted one.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import random
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn
from tqdm.auto import tqdm

from alfa.checkpoint import (
    CheckpointError,
    load_state,
    model_checksum,
    read_checkpoint,
    refuse_unregistered_model,
    save_model,
)
from alfa.fileio import settings_differences
from alfa.summary import parameter_summary
from alfa.truncate import DEFAULT_RANK, canonicalize, restore_structure, truncate

from . import distributed
from .data.base import GazeDataset, unit_images
from .data.registry import split_persons
from .evaluate import EVAL_BATCH_SIZE, INPUT_SCALING, load_images, load_raw_images, person_errors
from .losses import finite_or_raise, flip_symmetry_loss, supervised_l1_loss
from .precision import PRECISIONS, autocast, forward_precision, grad_scaler
from .train_state import (
    DENSE_KEY,
    INSIDE_EPOCH_EVERY_S,
    MODEL_FILE,
    RECORDED_LATER,
    STATE_FILE,
    Resumed,
    StateWriter,
    data_signatures,
    held_out_persons,
    other_data,
    other_dense,
    refuse_lone_state,
    resume_run,
)

__all__ = [
    "TrainConfig",
    "TruncateConfig",
    "TrainResult",
    "TruncationResult",
    "resolve_validation",
    "train_source",
    "truncate_and_recover",
    "mean_error",
    "held_out_persons",
    "MODEL_FILE",
    "STATE_FILE",
]

SCHEDULES = ("constant", "cosine")


@dataclass
class TrainConfig:
    """One source-training stage. The defaults are the paper's settings for real data
    (50 epochs of pre-training, Adam, lr 1e-4, batch 120; recovery uses the same with 25 epochs), plus
    TPGaze's symmetry term, which the paper's plain pre-training does not have (``symmetry_weight=0`` drops it).

    ``symmetry_weight`` weighs TPGaze's left-right symmetry term (0 turns it off); its target, the
    mirrored prediction on the flipped image, is computed without gradient with BatchNorm in
    ``symmetry_bn`` mode: ``"train"`` (batch statistics, the default) or ``"eval"`` (running statistics,
    as TPGaze's code does; that assumes statistics that are already meaningful, e.g. an ImageNet
    backbone, and makes training from scratch diverge). Without a separate
    validation set, ``val_fraction`` of the source persons are held out, drawn with ``seed``
    (:func:`alfa.gaze.data.registry.split_persons`, which keeps a subject's identities together).
    """

    epochs: int = 50
    batch_size: int = 120
    lr: float = 1e-4
    weight_decay: float = 0.0
    symmetry_weight: float = 1.0
    symmetry_bn: str = "train"
    val_fraction: float = 0.1
    seed: int = 0
    eval_batch_size: int = EVAL_BATCH_SIZE
    num_workers: int = 0
    precision: str = "fp32"  # bf16/fp16: the training forwards under autocast (the optimizer and the SVD stay fp32)
    # "constant" (the paper's) or "cosine": the rate decays from lr to 0 over the run, step by step (a function
    # of the step alone, so a resumed run continues on the same curve)
    schedule: str = "constant"

    def validate(self) -> None:
        for name in ("epochs", "batch_size", "eval_batch_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"TrainConfig.{name} must be at least 1, got {getattr(self, name)}")
        if self.symmetry_bn not in ("train", "eval"):
            raise ValueError(f"TrainConfig.symmetry_bn must be 'train' or 'eval', got {self.symmetry_bn!r}")
        if not 0.0 <= self.val_fraction < 1.0:
            raise ValueError(f"TrainConfig.val_fraction must be in [0, 1), got {self.val_fraction}")
        if self.num_workers < 0:
            raise ValueError(f"TrainConfig.num_workers must be non-negative, got {self.num_workers}")
        if self.schedule not in SCHEDULES:
            raise ValueError(f"TrainConfig.schedule must be one of {', '.join(SCHEDULES)}, got {self.schedule!r}")
        if self.precision not in PRECISIONS:
            raise ValueError(f"TrainConfig.precision must be one of {', '.join(PRECISIONS)}, got {self.precision!r}")
        if not self.lr > 0 or self.weight_decay < 0 or self.symmetry_weight < 0:
            raise ValueError(
                f"need lr > 0, weight_decay >= 0, symmetry_weight >= 0; got lr={self.lr}, "
                f"weight_decay={self.weight_decay}, symmetry_weight={self.symmetry_weight}"
            )

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        # the defaults of the later fields are left out: configs (and the cache keys hashed from them) read as before
        for name, default in (("precision", "fp32"), ("schedule", "constant")):
            if d[name] == default:
                del d[name]
        return d

    def rate(self, step: int, steps: int) -> float:
        """The learning rate of optimizer step ``step`` (0-based) of ``steps`` in the whole run."""
        if self.schedule == "constant":
            return self.lr
        return 0.5 * self.lr * (1.0 + math.cos(math.pi * step / steps))


def _recovery_default() -> TrainConfig:
    return TrainConfig(epochs=25)


@dataclass
class TruncateConfig:
    """Truncation at SVD rank ``rank`` (spec §2), then ``recovery`` fine-tuning on the source."""

    rank: int = DEFAULT_RANK
    recovery: TrainConfig = field(default_factory=_recovery_default)

    def to_dict(self) -> dict[str, Any]:
        return {"rank": self.rank, "recovery": self.recovery.to_dict()}


@dataclass
class TrainResult:
    """What :func:`train_source` did: per-epoch history and the person split it used."""

    checkpoint: Path
    history: list[dict[str, float]]
    train_persons: list[str]
    val_persons: list[str]
    resumed_from_epoch: int = 0

    @property
    def final_val_error(self) -> float:
        return self.history[-1]["val_error"] if self.history else float("nan")


@dataclass
class TruncationResult:
    """Validation error on held-out source persons before truncation, right after it, and after
    recovery, with the parameter counts."""

    checkpoint: Path
    rank: int
    errors: dict[str, float]
    params: dict[str, int]
    factorized_layers: int
    recovery_history: list[dict[str, float]]
    val_persons: list[str]
    canonicalize_max_change: float

    def format(self) -> str:
        e, p = self.errors, self.params
        lines = [
            f"truncation at rank {self.rank}: {self.factorized_layers} layers factorized, "
            f"{p['dense'] / 1e6:.2f} M -> {p['truncated'] / 1e6:.2f} M parameters",
            f"source validation error ({len(self.val_persons)} held-out "
            f"person{'' if len(self.val_persons) == 1 else 's'}, mean over persons):",
            f"  before truncation   {e['before_truncation']:.2f} deg",
            f"  after truncation    {e['after_truncation']:.2f} deg",
            f"  after recovery      {e['after_recovery']:.2f} deg",
        ]
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["checkpoint"] = str(self.checkpoint)
        return d


# ----------------------------------------------------------------------------- helpers


def resolve_validation(
    dataset: GazeDataset,
    config: TrainConfig,
    val_dataset: GazeDataset | None = None,
    val_persons: Sequence[str] | None = None,
) -> tuple[list[str], GazeDataset, list[str]]:
    """``(training persons, validation dataset, validation persons)``.

    With ``val_dataset`` (e.g. the synthetic source's ``val`` split) all of ``dataset`` trains and
    ``val_persons`` (default: all) of ``val_dataset`` validate. Without it, ``val_persons`` of
    ``dataset`` are held out, or ``config.val_fraction`` of them drawn with ``config.seed``.
    """
    if val_dataset is not None and val_dataset is not dataset:
        val_p = list(val_dataset.persons()) if val_persons is None else list(val_persons)
        missing = sorted(set(val_p) - set(val_dataset.persons()))
        if missing:
            raise ValueError(f"{val_dataset.name}: no validation person(s) {missing[:5]}")
        trained = sorted(set(val_p) & set(dataset.persons())) if val_dataset.name == dataset.name else []
        if trained:  # the same data opened twice: "held-out" persons that every epoch trains on
            raise ValueError(
                f"the validation data is the training data ({dataset.name}): its persons {trained[:3]} are trained "
                "on; validate on another split (a synthetic world's ?split=val), or leave the validation data out "
                "to hold persons out"
            )
        return list(dataset.persons()), val_dataset, val_p
    if val_persons is None:
        train_p, val_p = split_persons(dataset, config.val_fraction, config.seed)
    else:
        held = set(val_persons)
        missing = sorted(held - set(dataset.persons()))
        if missing:
            raise ValueError(f"{dataset.name}: no validation person(s) {missing[:5]}")
        train_p = [p for p in dataset.persons() if p not in held]
        val_p = [p for p in dataset.persons() if p in held]
    if not train_p:
        raise ValueError(f"{dataset.name}: no training person left after holding out {len(val_p)} for validation")
    return train_p, dataset, val_p


def mean_error(errors: dict[str, float]) -> float:
    """Unweighted mean over persons."""
    return sum(errors.values()) / len(errors) if errors else float("nan")


def _epoch_batches(indices: Sequence[int], batch_size: int, seed: int, epoch: int) -> list[list[int]]:
    """The shuffled batches of one epoch, a function of ``(seed, epoch)`` only. A last batch of one
    image is dropped (BatchNorm cannot train on it)."""
    g = torch.Generator().manual_seed(seed * 1_000_003 + epoch)
    perm = torch.randperm(len(indices), generator=g).tolist()
    shuffled = [indices[i] for i in perm]
    batches = [shuffled[s : s + batch_size] for s in range(0, len(shuffled), batch_size)]
    return [b for b in batches if len(b) > 1]


class _Batches(torch.utils.data.Dataset):
    """Index batches as a dataset, so a DataLoader with workers can load them in parallel."""

    def __init__(self, dataset: GazeDataset, batches: list[list[int]]) -> None:
        self.dataset, self.batches = dataset, batches

    def __len__(self) -> int:
        return len(self.batches)

    def __getitem__(self, i: int):
        return _raw_batch(self.dataset, self.batches[i])


def _raw_batch(dataset: GazeDataset, indices: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    return load_raw_images(dataset, indices), dataset.labels(indices)


def _iterate(dataset: GazeDataset, batches: list[list[int]], num_workers: int, pin_memory: bool = False):
    """The batches in order as ``(raw images, labels)``, loaded in ``num_workers`` worker processes (0: in this
    one); the same tensors either way. The images are as the dataset stores them (uint8 for 8-bit sources: a
    quarter of the bytes between processes and to the device); :func:`unit_images` converts them where they
    land. ``pin_memory`` (for a CUDA device) lets the copies to the device overlap the compute."""
    if num_workers == 0 and not pin_memory:
        return (_raw_batch(dataset, b) for b in batches)
    return torch.utils.data.DataLoader(
        _Batches(dataset, batches), batch_size=None, num_workers=num_workers, pin_memory=pin_memory
    )


def _seed_random_and_torch(seed: int) -> None:
    random.seed(seed)
    torch.manual_seed(seed)


def _device_of(model: nn.Module) -> torch.device:
    return next(model.parameters()).device


# ----------------------------------------------------------------------------- the loop


def train_source(
    model: nn.Module,
    dataset: GazeDataset,
    config: TrainConfig,
    out_dir: str | os.PathLike,
    *,
    model_name: str = "resnet18_gaze",
    model_kwargs: dict[str, Any] | None = None,
    stage: str = "pretrain",
    val_dataset: GazeDataset | None = None,
    val_persons: Sequence[str] | None = None,
    resume: bool = True,
    progress: bool = True,
    extra: dict[str, Any] | None = None,
    on_epoch: Callable[[int, nn.Module], None] = lambda epoch, model: None,
    inside_epoch_every_s: float | None = INSIDE_EPOCH_EVERY_S,
) -> TrainResult:
    """Train ``model`` (in place) on ``dataset`` with ``config``; checkpoints go to ``out_dir``.

    Validation persons come from :func:`resolve_validation` (recovery passes pre-training's, so they
    stay unseen). With ``resume`` (the default) a checkpoint in ``out_dir`` of the same stage, model,
    data and config is continued, and a finished one returned as is; a mismatching one is refused with
    a :class:`~alfa.checkpoint.CheckpointError` naming the difference. ``on_epoch(epoch, model)`` runs after
    each epoch (from 1) before its checkpoint is written (a crash between the two redoes both). A run of one
    process also writes its state inside an epoch every ``inside_epoch_every_s`` seconds (``None``: never).
    """
    config.validate()
    refuse_unregistered_model(model_name, "train_source")
    rank, world = distributed.rank_and_world()
    if world > 1 and config.batch_size < 2 * world:  # before anything is made
        raise ValueError(
            f"--batch-size {config.batch_size} is the global batch of {world} processes, at least 2 images each: "
            f"at least {2 * world}"
        )
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    train_p, val_ds, val_p = resolve_validation(dataset, config, val_dataset, val_persons)
    train_idx = [i for p in train_p for i in dataset.person_indices(p)]
    if len(train_idx) < 2:
        raise ValueError(f"{dataset.name}: {len(train_idx)} training images; need at least 2")

    device = _device_of(model)
    progress = progress and rank == 0
    if device.type == "cuda":
        # channels-last lets cuDNN pick its fastest convolutions; on the CPU the layout (and the numbers) stay
        model.to(memory_format=torch.channels_last)
    optimizer = torch.optim.Adam(model.parameters(), lr=config.lr, weight_decay=config.weight_decay)
    scaler = grad_scaler(device, config.precision)
    header = {
        "stage": stage,
        "train_config": config.to_dict(),
        "data": {"name": dataset.name, "images": len(dataset), "persons": len(dataset.persons())},
        "train_persons": train_p,
        "val_data": val_ds.name,
        "val_persons": val_p,
        **data_signatures(dataset, val_ds),  # same names and counts, other images: another run
        **(extra or {}),
    }
    size = input_size(dataset)  # recorded in every checkpoint of the run
    refuse_lone_state(out)  # only files a run itself wrote are replaced
    states = StateWriter(out, model, optimizer, scaler, header, model_name, model_kwargs, size,
                         inside_every_s=inside_epoch_every_s if world == 1 else None)  # fmt: skip
    resumed = _resume(states, config, progress, writer=rank == 0) if resume else Resumed()
    start_epoch, history = resumed.epoch, resumed.history
    _seed_random_and_torch(config.seed)

    with distributed.data_parallel(model, device) as net, _stops_when_non_finite(out, start_epoch) as epochs_done:
        for epoch in range(start_epoch, config.epochs):
            inside = resumed if epoch == start_epoch else Resumed()  # the steps of this epoch done before
            t0 = time.time() - inside.seconds
            net.train()
            batches = _epoch_global_batches(dataset, train_idx, config, epoch, world)
            _refuse_steps_that_do_not_fit(out, inside.steps, epoch, len(batches), world)
            desc = f"{stage} {epoch + 1}/{config.epochs}"
            first_step = epoch * len(batches)  # every epoch has the same number of batches
            steps = (first_step, config.epochs * len(batches))

            def after_step(done: int, sums: torch.Tensor, epoch: int = epoch, t0: float = t0) -> None:
                states.inside_epoch(epoch, history, done, sums, time.time() - t0)

            sums = _train_epoch(
                model, net, optimizer, scaler, dataset, batches, config, desc, progress, steps,
                start=(inside.steps, inside.sums), after_step=after_step if rank == 0 else None,
            )  # fmt: skip
            val_errors = _val_errors(model, val_ds, val_p, config.eval_batch_size) if val_p else {}
            record = _epoch_record(epoch, sums / len(batches), val_errors, time.time() - t0)
            history.append(record)
            if rank == 0:
                on_epoch(epoch + 1, model)
                states.after_epoch(epoch + 1, history, complete=epoch + 1 == config.epochs)
            if progress:  # said once the epoch is saved: a Ctrl-C after this line keeps it
                tqdm.write(
                    f"{stage} epoch {epoch + 1}/{config.epochs}: loss {record['train_loss']:.4f}, "
                    f"val error {record['val_error']:.2f} deg ({record['seconds']:.0f} s)"
                )
            distributed.barrier()  # nobody reads a checkpoint rank 0 is still writing
            epochs_done[0] = epoch + 1
    model.eval()
    return TrainResult(out / MODEL_FILE, history, train_p, val_p, resumed_from_epoch=start_epoch)


def _refuse_steps_that_do_not_fit(out: Path, steps: int, epoch: int, batches: int, world: int) -> None:
    """A state written after ``steps`` steps inside epoch ``epoch`` (from 0) continues only where those steps are
    this run's: in one process (a torchrun run's batches and loss sums are not one process's), within the epoch."""
    if steps and world > 1:
        raise CheckpointError(f"{out / STATE_FILE} was written inside epoch {epoch + 1} by a run of one process: "
                              "finish that epoch with one process, then go on under torchrun")  # fmt: skip
    if steps >= batches:
        raise CheckpointError(f"{out / STATE_FILE} says {steps} steps of epoch {epoch + 1} are done, of the "
                              f"{batches} it has; delete {out} to start over")  # fmt: skip


def _epoch_record(epoch: int, means: torch.Tensor, val_errors: dict[str, float], seconds: float) -> dict[str, float]:
    """Epoch ``epoch``'s (from 0) line of the history: its batches' mean loss terms, validation error and time."""
    terms = {f"train_{k}": float(v) for k, v in zip(("loss", "l1", "symmetry"), means)}
    return {"epoch": epoch + 1, **terms, "val_error": mean_error(val_errors), "seconds": seconds}


def _resume(states: StateWriter, config: TrainConfig, progress: bool, *, writer: bool) -> Resumed:
    """The run in ``states.out`` loaded into its model, optimizer and scaler (:func:`resume_run`), said."""
    out = states.out
    resumed = resume_run(out, states.model, states.optimizer, states.scaler, states.header, states.model_name,
                         model_kwargs=states.model_kwargs, size=states.size, writer=writer)  # fmt: skip
    distributed.barrier()  # nobody reads a model file rank 0 is still bringing up to date
    if resumed.steps and resumed.epoch >= config.epochs:
        # fewer epochs asked than the state went into: the model is the last whole epoch's, not the state's
        load_state(states.model, read_checkpoint(out / MODEL_FILE)[0], source=str(out / MODEL_FILE))
    if progress and (resumed.epoch or resumed.steps):
        where = f"epoch {resumed.epoch + 1}" + (f", after its step {resumed.steps}" if resumed.steps else "")
        done = "already complete" if resumed.epoch >= config.epochs else f"resuming at {where}"
        tqdm.write(f"{out}: {resumed.epoch} of {config.epochs} epochs found, {done}")
    return resumed


@contextlib.contextmanager
def _stops_when_non_finite(out: Path, start_epoch: int) -> Iterator[list[int]]:
    """Training that went non-finite stops with one error that says which checkpoint is kept (the caller puts
    the number of epochs whose checkpoint is written into the list yielded)."""
    done = [start_epoch]
    try:
        yield done
    except FloatingPointError as e:
        kept = f"the checkpoint of epoch {done[0]} in {out} is kept" if done[0] else "no checkpoint was written"
        raise FloatingPointError(f"{e}: stopped, {kept}") from None


def _epoch_global_batches(
    dataset: GazeDataset, train_idx: list[int], config: TrainConfig, epoch: int, world: int
) -> list[list[int]]:
    """The global batches of one epoch that every process of ``world`` can take its shard of."""
    batches = _epoch_batches(train_idx, config.batch_size, config.seed, epoch)
    if world > 1:
        # every process takes its shard of each global batch; a last batch too short to give each
        # process two images (BatchNorm's minimum) is dropped
        batches = [b for b in batches if len(b) >= 2 * world]
        if not batches:
            raise ValueError(
                f"{dataset.name}: {len(train_idx)} training images give no batch of 2 per process ({world})"
            )
    return batches


def _train_epoch(
    model: nn.Module,
    net: nn.Module,
    optimizer: torch.optim.Optimizer,
    scaler: torch.amp.GradScaler,
    dataset: GazeDataset,
    batches: list[list[int]],
    config: TrainConfig,
    desc: str,
    progress: bool,
    steps: tuple[int, int] = (0, 1),
    *,
    start: tuple[int, tuple[float, float, float]] = (0, (0.0, 0.0, 0.0)),
    after_step: Callable[[int, torch.Tensor], None] | None = None,
) -> torch.Tensor:
    """One optimizer step per global batch (this process's shard of it, through ``net``), the rate of each
    from the schedule (``steps``: the run's step at the epoch's start, and its number of steps); returns the
    float64 sums of the batches' mean loss, L1 and symmetry terms, over all processes. ``start``: the batches
    done before (a resumed run skips them) and their sums. ``after_step(batches done, sums)`` runs after each
    step but the last."""
    device = _device_of(model)
    rank, world = distributed.rank_and_world()
    done, todo = start[0], batches[start[0] :]
    bar = tqdm(
        _iterate(
            dataset,
            [distributed.shard(b, rank, world) for b in todo],
            config.num_workers,
            pin_memory=device.type == "cuda",
        ),
        total=len(batches),
        initial=done,
        desc=desc,
        disable=not progress,
        leave=False,
    )
    sums = torch.tensor(start[1], dtype=torch.float64)  # loss, l1, symmetry: each batch's mean, summed
    layout = torch.channels_last if device.type == "cuda" else torch.preserve_format
    for step, ((images, gaze), whole) in enumerate(zip(bar, todo), start=steps[0] + done):
        for group in optimizer.param_groups:
            group["lr"] = config.rate(step, steps[1])
        images = unit_images(images.to(device, non_blocking=True)).to(memory_format=layout)
        gaze = gaze.to(device, non_blocking=True)
        share = len(images) / len(whole)  # of the global batch (1 in one process)
        try:
            terms = _train_step(
                model,
                optimizer,
                images,
                gaze,
                config.symmetry_weight,
                config.symmetry_bn,
                config.precision,
                net=net,
                scaler=scaler,
                loss_scale=share * world,  # DDP averages over processes: this makes it the global mean
            )
            _refuse_non_finite_weights(model)  # a finite loss can still leave NaN weights (an overflowing step)
        except FloatingPointError as e:
            rate = optimizer.param_groups[0]["lr"]
            raise FloatingPointError(f"{e}, at step {step + 1} of {steps[1]} (learning rate {rate:g})") from None
        sums += share * torch.tensor([terms["loss"], terms["l1"], terms["symmetry"]], dtype=torch.float64)
        bar.set_postfix(loss=f"{terms['loss']:.4f}")
        if after_step is not None and step + 1 - steps[0] < len(batches):
            after_step(step + 1 - steps[0], sums)
    if world > 1:
        # one model on every process: DDP broadcasts rank 0's buffers before each forward, so after the
        # last step each process still holds its own shard's BatchNorm statistics
        for buffer in model.buffers():
            torch.distributed.broadcast(buffer, 0)
        reduced = sums.to(device)  # NCCL reduces CUDA tensors only
        torch.distributed.all_reduce(reduced)
        sums = reduced.cpu()
    return sums


def _refuse_non_finite_weights(model: nn.Module) -> None:
    finite = torch.stack([torch.isfinite(p).all() for p in model.parameters()])
    if not bool(finite.all()):
        bad = [n for (n, _), ok in zip(model.named_parameters(), finite.tolist()) if not ok]
        raise FloatingPointError(
            f"source training: the weights went NaN or infinite in {len(bad)} tensors ({', '.join(bad[:3])})"
        )


def _val_errors(model: nn.Module, dataset: GazeDataset, persons: Sequence[str], batch: int) -> dict[str, float]:
    """Per-person validation errors; in a process group each process scores its share of the persons and
    every process gets all of them (in ``persons``' order)."""
    rank, world = distributed.rank_and_world()
    # Scored in fp32 whatever the training precision or the caller's: a recorded history depends on neither.
    with forward_precision("fp32"):
        part = person_errors(model, dataset, distributed.shard(persons, rank, world), 0, batch)
    merged = distributed.gather_dicts(part)
    return {p: merged[p] for p in persons}


def input_size(dataset: GazeDataset) -> tuple[int, int]:
    """(height, width) of the dataset's images (its first; every loader yields one size per dataset)."""
    shape = load_images(dataset, [0]).shape
    return int(shape[-2]), int(shape[-1])


def check_input_size(checkpoint_config: dict[str, Any], dataset: GazeDataset, checkpoint: str | os.PathLike) -> None:
    """Refuse data of another image size than the checkpoint was trained on (a ResNet runs on any size and
    silently gives much worse predictions). Checkpoints written before the size was recorded pass."""
    scaling = checkpoint_config.get("input_scaling")
    if scaling is not None and scaling != INPUT_SCALING:
        raise ValueError(f"{checkpoint} was trained on pixels scaled as {scaling!r}; this alfa feeds {INPUT_SCALING!r}")
    trained = checkpoint_config.get("input_size")
    if trained is None:
        refuse_mixed_sizes(dataset)
        return
    for person, here in person_sizes(dataset).items():
        if list(here) != list(trained):
            raise ValueError(
                f"{checkpoint} was trained on {trained[0]}×{trained[1]} images, {dataset.name} has {here[0]}×{here[1]} "
                f"(person {person}'s first); use data of the training size (?size=N resizes every face to N×N)"
            )


def person_sizes(dataset: GazeDataset) -> dict[str, tuple[int, int]]:
    """Each person's first image's (height, width): a loader yields one size per person's folder or file, and a
    dataset whose persons differ (files of two releases mixed) would be scored or validated at the wrong size."""
    return {p: tuple(load_images(dataset, dataset.person_indices(p)[:1]).shape[-2:]) for p in dataset.persons()}


def refuse_mixed_sizes(*datasets: GazeDataset) -> None:
    """``ValueError`` naming the first person (of ``datasets``, training data then validation data) whose faces are
    of another size than the first person's: one model takes one size."""
    sizes = {(d.name, p): size for d in datasets for p, size in person_sizes(d).items()}
    if not sizes:  # no person: the run's own checks say so
        return
    (first_data, first), (h, w) = next(iter(sizes.items()))
    for (name, person), (ph, pw) in sizes.items():
        if (ph, pw) != (h, w):
            raise ValueError(
                f"{name}: person {person}'s faces are {ph}×{pw}, {first_data}'s {first}'s {h}×{w}: one model takes "
                "one size (?size=N resizes every face to N×N)"
            )


def _train_step(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    images: torch.Tensor,
    gaze: torch.Tensor,
    sym_w: float,
    sym_bn: str = "train",
    precision: str = "fp32",
    *,
    net: nn.Module | None = None,
    scaler: torch.amp.GradScaler | None = None,
    loss_scale: float = 1.0,
) -> dict[str, float]:
    """One optimizer step of ``model`` through ``net`` (its DDP wrapper; default: the model itself); the loss
    terms of this batch, unscaled. ``loss_scale`` multiplies the loss before the backward pass only; ``scaler``
    is fp16's gradient scaler (default: one for ``precision``, which a single step may as well make)."""
    net = model if net is None else net
    scaler = grad_scaler(images.device, precision) if scaler is None else scaler
    mirrored = None
    if sym_w > 0:
        # TPGaze's symmetry target: the flipped image's prediction, without gradient (through the model
        # itself: no gradient to synchronise).
        model.train(sym_bn == "train")
        with torch.no_grad(), autocast(images.device, precision):
            mirrored = model(torch.flip(images, dims=[-1])).float()
    net.train()
    with autocast(images.device, precision):
        pred = net(images).float()  # the losses in fp32
    l1 = supervised_l1_loss(pred, gaze)
    sym = flip_symmetry_loss(pred, mirrored) if mirrored is not None else torch.zeros((), device=pred.device)
    loss = finite_or_raise(l1 + sym_w * sym, "source training")
    optimizer.zero_grad(set_to_none=True)
    scaler.scale(loss * loss_scale if loss_scale != 1.0 else loss).backward()
    scaler.step(optimizer)  # with fp16, skips a step whose gradients overflowed (and lowers the scale)
    scaler.update()
    return {"loss": loss.item(), "l1": l1.item(), "symmetry": sym.item()}


# ----------------------------------------------------------------------------- truncation + recovery


def truncate_and_recover(
    model: nn.Module,
    dataset: GazeDataset,
    config: TruncateConfig,
    out_dir: str | os.PathLike,
    *,
    val_dataset: GazeDataset | None = None,
    val_persons: Sequence[str] | None = None,
    model_name: str = "resnet18_gaze",
    model_kwargs: dict[str, Any] | None = None,
    resume: bool = True,
    progress: bool = True,
    extra: dict[str, Any] | None = None,
) -> TruncationResult:
    """Truncate the trained dense ``model`` (in place) at ``config.rank``, fine-tune the factorized
    model on the source to recover, canonicalize it (``V = S_d V_dᵀ`` again) and save it as
    ``out_dir/model.safetensors``. The error on the held-out source persons (pass pre-training's
    ``val_dataset``/``val_persons`` so they stay unseen) is measured before truncation, right after
    it, and after recovery.

    If ``out_dir`` already holds a finished result of the same configuration, it is loaded instead
    of recomputed (the dense ``model`` is then replaced in place by the recovered weights).
    """
    out = Path(out_dir)
    final = out / MODEL_FILE
    train_p, val_ds, val_p = resolve_validation(dataset, config.recovery, val_dataset, val_persons)
    dense = model_checksum(model)  # which dense model: a result of another (more epochs, another file) is no result
    header = {
        "stage": "recovered",
        "truncate_config": config.to_dict(),
        "data": {"name": dataset.name, "images": len(dataset), "persons": len(dataset.persons())},
        "val_data": val_ds.name,
        "val_persons": val_p,
        **data_signatures(dataset, val_ds),
        DENSE_KEY: dense,
        **(extra or {}),
    }
    if resume and final.is_file():
        return _load_finished(model, final, header, model_name)

    batch = config.recovery.eval_batch_size
    dense_params = parameter_summary(model).total
    before = mean_error(_val_errors(model, val_ds, val_p, batch))
    report = truncate(model, config.rank)
    after_trunc = mean_error(_val_errors(model, val_ds, val_p, batch))
    if progress and distributed.is_main():
        tqdm.write(f"{report}\nvalidation error: {before:.2f} deg dense, {after_trunc:.2f} deg truncated")
    result = train_source(
        model,
        dataset,
        config.recovery,
        out / "recovery",
        model_name=model_name,
        model_kwargs=model_kwargs,
        stage="recover",
        val_dataset=val_ds,
        val_persons=val_p,
        resume=resume,
        progress=progress,
        extra={"rank": config.rank, DENSE_KEY: dense},  # a recovery begun from another dense model is not resumed
    )
    model.eval()
    probe = load_images(val_ds, [i for p in val_p for i in val_ds.person_indices(p)][:8])
    probe = probe.to(_device_of(model))
    with torch.no_grad():
        reference = model(probe)
        canonicalize(model)
        change = float((model(probe) - reference).abs().max())
    recovered = mean_error(_val_errors(model, val_ds, val_p, batch))
    outcome = TruncationResult(
        checkpoint=final,
        rank=config.rank,
        errors={"before_truncation": before, "after_truncation": after_trunc, "after_recovery": recovered},
        params={"dense": dense_params, "truncated": parameter_summary(model).total},
        factorized_layers=len(report.factorized),
        recovery_history=result.history,
        val_persons=val_p,
        canonicalize_max_change=change,
    )
    if distributed.is_main():
        save_model(
            final,
            model,
            model_name,
            model_kwargs,
            # the persons it trained on, for held_out_persons; outside the header that a resume compares, which
            # recovered models written before they were recorded do not have
            extra={**header, "train_persons": train_p, "result": outcome.to_dict()},
            input_size=input_size(dataset),
            input_scaling=INPUT_SCALING,
        )
    distributed.barrier()
    return outcome


def _load_finished(model: nn.Module, path: Path, header: dict[str, Any], model_name: str) -> TruncationResult:
    tensors, saved = read_checkpoint(path)
    extra = saved.get("extra", {})
    json_header = json.loads(json.dumps(header))  # tuples become lists, as in the saved header
    compared = {k: v for k, v in json_header.items() if k not in RECORDED_LATER}  # those only where recorded
    theirs = {"model": saved.get("model"), **{k: extra[k] for k in compared if k in extra}}
    differing = settings_differences(theirs, {"model": model_name, **compared})
    if differing or "result" not in extra:
        said = f" (the folder's vs this run's: {', '.join(differing)})" if differing else ""
        raise CheckpointError(
            f"{path} holds a recovered model of another configuration or data{said}; use another output folder, "
            "or delete it to start over"
        )
    problems = [p for p in (other_dense(extra, json_header), *other_data(extra, json_header)) if p is not None]
    if problems:
        raise CheckpointError(
            f"{path} holds a recovered model {'; '.join(problems)}; use another output folder, or delete it to "
            "start over"
        )
    restore_structure(model, {k: int(v) for k, v in saved.get("factorized", {}).items()})
    load_state(model, tensors, source=str(path))
    model.eval()
    fields = dict(extra["result"])
    fields["checkpoint"] = path
    return TruncationResult(**fields)
