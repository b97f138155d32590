"""Source training's state on disk: one file from which a run killed at any moment resumes.

After every epoch :func:`alfa.gaze.train.train_source` writes the run's whole state as one file,
``state.safetensors`` (:func:`alfa.checkpoint.write_tagged`: safetensors with a JSON header, written atomically):
the model's tensors, Adam's moments and step counts, fp16's gradient scaler, the epochs done with their history,
and the run's identity (stage, model, data and its images' signatures, person split, training config). Then it
derives ``model.safetensors`` from it (:func:`alfa.checkpoint.save_model`), the file users and ``alfa truncate``
read, in the format it always had. A kill leaves the last state whole whatever moment it comes at; a resumed run
loads it and rewrites a model file that lags it (a kill between the two writes).

An epoch of a benchmark's source model is a quarter of an hour on two cores, and a session that ends mid-epoch
would lose it: a run of one process also writes the state inside an epoch, every :data:`INSIDE_EPOCH_EVERY_S`
seconds, with the steps of the epoch done and the sums of their loss terms (``epoch_steps``, ``epoch_sums``,
``epoch_seconds`` in its header). That state alone: the model file stays the last whole epoch's, the one users
read. A resumed run skips the steps done, and ends the epoch with the weights and history of a run never killed.

Runs of earlier versions wrote two files per epoch instead: ``state.pt`` (the optimizer state, a pickle-based
``torch.save`` file) and then ``model.safetensors``. This alfa never unpickles, so ``state.pt`` is never read: a
finished pair is read from its model file alone (a finished run needs no optimizer state), and an unfinished one
is refused in one line (no exact continuation exists without its optimizer state).
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

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

from .data.base import GazeDataset, data_signature, data_signature_mismatch
from .evaluate import INPUT_SCALING

__all__ = [
    "held_out_persons",
    "MODEL_FILE",
    "STATE_FILE",
    "LEGACY_STATE_FILE",
    "STATE_FORMAT",
    "save_state",
    "StateWriter",
    "Resumed",
    "resume_run",
    "refuse_lone_state",
    "data_signatures",
    "other_data",
    "other_dense",
    "DENSE_KEY",
    "RECORDED_LATER",
]

MODEL_FILE = "model.safetensors"
STATE_FILE = "state.safetensors"
LEGACY_STATE_FILE = "state.pt"  # what versions before the one-file state wrote; never read (a pickle)
STATE_FORMAT = "alfa-source-train-state"
INSIDE_EPOCH_EVERY_S = 300.0
"""Seconds of training between two states written inside an epoch (a run of one process): at most this much of an
epoch is lost to a kill, for one more state file written (a ResNet-18's is 134 MB, well under a second)."""
_IDENTITY = ("stage", "data", "train_persons", "val_data", "val_persons")
STAGE_WORDS = {
    "pretrain": "alfa pretrain",
    "recover": "alfa truncate's recovery",
    "recovered": "alfa truncate's recovery",
}
"""A training stage, as a refusal names it: the command whose run it was."""
DENSE_KEY = "dense_checksum"  # recovery's: the checksum of the dense model it truncated (checkpoint.model_checksum)
RECORDED_LATER = ("data_signature", "val_data_signature", DENSE_KEY)
"""Header entries headers written before them lack: compared by :func:`other_data` and :func:`other_dense`, which
pass a header without them, never by equality."""


def data_signatures(
    dataset: GazeDataset, val_dataset: GazeDataset | None = None, persons: list[str] | None = None
) -> dict[str, Any]:
    """The header entries that name the images a run is made from: ``data_signature`` (of ``persons`` of
    ``dataset``, default all) and, where validation is on other data, ``val_data_signature``
    (:func:`~alfa.gaze.data.base.data_signature`). Compared on resume by :func:`other_data`."""
    entries: dict[str, Any] = {"data_signature": data_signature(dataset, persons)}
    if val_dataset is not None and val_dataset is not dataset:
        entries["val_data_signature"] = data_signature(val_dataset)
    return entries


def other_data(saved: dict[str, Any], mine: dict[str, Any]) -> list[str]:
    """What says that a run's saved header (``saved``) was made from other images than this run's (``mine``, both
    with :func:`data_signatures`' entries), naming the data; ``[]`` where they match. A header without an entry
    passes: it was written before the signatures existed (runs in progress resume as they did)."""
    data = mine.get("data")
    named = {
        "data_signature": f"the data {data.get('name') if isinstance(data, dict) else data}",
        "val_data_signature": f"the validation data {mine.get('val_data')}",
    }
    problems = []
    for key, what in named.items():
        why = data_signature_mismatch(saved.get(key), mine[key]) if key in mine else None
        if why is not None:
            problems.append(f"made from other images than {what} has now, {why}")
    return problems


def other_dense(saved: dict[str, Any], mine: dict[str, Any]) -> str | None:
    """Why a recovery's saved header was made from another dense checkpoint than this run's (their
    :data:`DENSE_KEY`); ``None`` where they match or ``saved`` has none (written before it was recorded)."""
    theirs, ours = saved.get(DENSE_KEY), mine.get(DENSE_KEY)
    if theirs is None or theirs == ours:
        return None
    return f"made from another dense checkpoint (checksum {str(theirs)[:12]}…, this one's {str(ours)[:12]}…)"


def _comparable(config: dict[str, Any]) -> dict[str, Any]:
    # Everything but the epoch count must match to resume (more epochs extend a run).
    return {k: v for k, v in config.items() if k not in ("epochs", "num_workers", "eval_batch_size")}


def save_state(
    out: Path,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    scaler: torch.amp.GradScaler,
    meta: dict[str, Any],
    model_kwargs: dict[str, Any] | None,
    size: tuple[int, int],
    *,
    model_file: bool = True,
) -> None:
    """The run's state after ``meta["epoch"]`` epochs as one atomic file, then ``model.safetensors`` from it.
    ``meta`` holds ``header`` (the run's identity and what else the model file records), ``model`` (its
    registered name), ``epoch``, ``history`` and ``complete``. Nothing is written if a tensor is not finite
    (``FloatingPointError``: the last good state stays as it was). ``model_file=False``: the state alone (a
    legacy pair's model file is already this state's)."""
    model_tensors = {k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()}
    refuse_non_finite(model_tensors, out / MODEL_FILE)
    tensors = {f"model/{k}": v for k, v in model_tensors.items()}
    tensors.update(optimizer_tensors(optimizer, "optimizer"))
    refuse_non_finite(tensors, out / STATE_FILE)  # Adam's moments too: the resumed run would start from them
    meta = {**meta, "grad_scaler": scaler.state_dict()} if scaler.is_enabled() else meta
    write_tagged(out / STATE_FILE, tensors, STATE_FORMAT, meta)
    # Written: what an earlier version's run left is superseded (a kill before this line leaves it, still valid).
    with contextlib.suppress(FileNotFoundError):
        (out / LEGACY_STATE_FILE).unlink()
    if model_file:
        _derive_model(out, model, meta, model_kwargs, size)


def _derive_model(
    out: Path, model: nn.Module, meta: dict[str, Any], model_kwargs: dict[str, Any] | None, size: tuple[int, int]
) -> None:
    extra = {**meta["header"], "epoch": meta["epoch"], "history": meta["history"], "complete": meta["complete"]}
    save_model(
        out / MODEL_FILE,
        model,
        meta["model"],
        model_kwargs,
        extra=extra,
        input_size=size,
        input_scaling=INPUT_SCALING,
    )


@dataclass
class Resumed:
    """Where a run picks up: the epochs done and their history; for a state written inside an epoch, also the steps
    of the next epoch done, the float64 sums of their loss terms (loss, L1, symmetry) and the seconds they took."""

    epoch: int = 0
    history: list[dict[str, float]] = field(default_factory=list)
    steps: int = 0
    sums: tuple[float, float, float] = (0.0, 0.0, 0.0)
    seconds: float = 0.0


@dataclass
class StateWriter:
    """Writes one run's states into ``out``: after each epoch (the state, then the model file) and, where
    ``inside_every_s`` is not ``None``, inside an epoch once that many seconds passed since the last state
    (the state alone). ``header``, ``model_name``, ``model_kwargs`` and ``size`` are :func:`save_state`'s."""

    out: Path
    model: nn.Module
    optimizer: torch.optim.Optimizer
    scaler: torch.amp.GradScaler
    header: dict[str, Any]
    model_name: str
    model_kwargs: dict[str, Any] | None
    size: tuple[int, int]
    inside_every_s: float | None = INSIDE_EPOCH_EVERY_S
    _last: float = field(default_factory=time.monotonic, init=False)

    def _meta(self, epoch: int, history: list[dict[str, float]], complete: bool) -> dict[str, Any]:
        meta = {"header": self.header, "model": self.model_name, "epoch": epoch, "history": history}
        return {**meta, "complete": complete}

    def after_epoch(self, epoch: int, history: list[dict[str, float]], complete: bool) -> None:
        """The state after ``epoch`` whole epochs, then the model file from it."""
        meta = self._meta(epoch, history, complete)
        save_state(self.out, self.model, self.optimizer, self.scaler, meta, self.model_kwargs, self.size)
        self._last = time.monotonic()

    def inside_epoch(
        self, epoch: int, history: list[dict[str, float]], steps: int, sums: torch.Tensor, seconds: float
    ) -> None:
        """The state after ``steps`` steps of the epoch that follows ``epoch`` whole ones, if one is due."""
        if self.inside_every_s is None or time.monotonic() - self._last < self.inside_every_s:
            return
        meta = self._meta(epoch, history, False)
        meta.update(epoch_steps=steps, epoch_sums=[float(x) for x in sums.tolist()], epoch_seconds=seconds)
        save_state(self.out, self.model, self.optimizer, self.scaler, meta, self.model_kwargs, self.size,
                   model_file=False)  # fmt: skip
        self._last = time.monotonic()


def _inside_epoch(path: Path, meta: dict[str, Any]) -> tuple[int, tuple[float, float, float], float]:
    """The steps, loss sums and seconds of a state written inside an epoch (``(0, zeros, 0)`` for one written after
    an epoch), each checked: a header that says otherwise is named, not trusted."""
    steps, sums, seconds = meta.get("epoch_steps", 0), meta.get("epoch_sums", [0.0] * 3), meta.get("epoch_seconds", 0)
    numbers = isinstance(sums, list) and len(sums) == 3
    numbers = numbers and all(isinstance(x, (int, float)) and math.isfinite(x) for x in [*sums, seconds])
    if type(steps) is not int or steps < 0 or not numbers or isinstance(seconds, bool):
        raise CheckpointError(
            f"{path}: its header's epoch_steps, epoch_sums or epoch_seconds is not what a training run writes "
            f"({steps!r}, {sums!r}, {seconds!r}); delete {path.parent} to start over"
        )
    return steps, (float(sums[0]), float(sums[1]), float(sums[2])), float(seconds)


def refuse_lone_state(out: Path) -> None:
    """A ``state.pt`` with no model beside it is no run's of this folder (a run of an earlier version wrote it with
    its model): it is not replaced, and the run is refused (the new state, carrying its identity, needs no such
    check). A folder or a link to nothing where the state or the model goes is refused by name."""
    for name in (STATE_FILE, MODEL_FILE):
        what = not_a_file(out / name)
        if what is not None:  # no run wrote it: named, not taken for a missing or damaged file
            raise CheckpointError(
                f"{out / name} is {what}, not the file a training run writes there; move it away, or choose another "
                "output folder"
            )
    if (out / LEGACY_STATE_FILE).exists() and not (out / STATE_FILE).is_file() and not (out / MODEL_FILE).is_file():
        raise CheckpointError(
            f"{out / LEGACY_STATE_FILE} is there without the {MODEL_FILE} a run writes with it, so it is not this "
            "run's to replace; move it away or choose another output folder"
        )


def _check_identity(
    path: Path, saved_model: Any, saved: dict[str, Any], header: dict[str, Any], model_name: str
) -> None:
    mine = json.loads(json.dumps(header))  # tuples become lists, as in a saved header
    if saved.get("stage") != mine["stage"]:  # another command's folder: the rest of the differences would be noise
        theirs, ours = (STAGE_WORDS.get(str(x), f"stage {x!r}") for x in (saved.get("stage"), mine["stage"]))
        raise CheckpointError(
            f"{path} is the model of {theirs}, and this run is {ours}: use another output folder, or delete it to "
            "start over"
        )
    problems = []
    if saved_model != model_name:
        problems.append(f"model {saved_model!r} vs {model_name!r}")
    problems += [f"{key} differs" for key in _IDENTITY if saved.get(key) != mine[key]]
    problems += other_data(saved, mine)
    dense = other_dense(saved, mine)
    if dense is not None:
        problems.append(dense)
    theirs, ours = _comparable(saved.get("train_config", {})), _comparable(mine["train_config"])
    if theirs != ours:  # only what differs: the whole config is a dozen keys the reader would have to compare
        differing = settings_differences(theirs, ours, absent="its default")  # a later field is left out at it
        problems.append(f"training config (the checkpoint's vs this run's): {', '.join(differing)}")
    if problems:
        raise CheckpointError(
            f"{path} is a checkpoint of another run ({'; '.join(problems)}); "
            f"use another output folder, or delete it to start over"
        )


def resume_run(
    out: Path,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    scaler: torch.amp.GradScaler,
    header: dict[str, Any],
    model_name: str,
    *,
    model_kwargs: dict[str, Any] | None,
    size: tuple[int, int],
    writer: bool,
) -> Resumed:
    """Load the run's state from ``out`` into ``model``, ``optimizer`` and ``scaler``; where it picks up
    (:class:`Resumed`; its defaults if there is none). A state (or a legacy pair) of another run is refused. The
    ``writer`` (rank 0) brings the folder up to date: the model file of a state it lags."""
    if (out / STATE_FILE).is_file():
        return _resume_state(out, model, optimizer, scaler, header, model_name, model_kwargs, size, writer)
    if not (out / MODEL_FILE).is_file():
        return Resumed()
    try:
        return Resumed(*_resume_legacy(out, model, header, model_name))
    except (FileNotFoundError, CheckpointError):
        # Another process (a benchmark piece on the same source) may have written its first epoch meanwhile: its
        # state is written before its model file, so a model file seen without a state has its state now.
        if not (out / STATE_FILE).is_file():
            raise
        return _resume_state(out, model, optimizer, scaler, header, model_name, model_kwargs, size, writer)


def _resume_state(
    out: Path,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    scaler: torch.amp.GradScaler,
    header: dict[str, Any],
    model_name: str,
    model_kwargs: dict[str, Any] | None,
    size: tuple[int, int],
    writer: bool,
) -> Resumed:
    path = out / STATE_FILE
    tensors, meta = read_tagged(path, STATE_FORMAT, "a source-training state")
    _check_identity(path, meta.get("model"), meta.get("header", {}), header, model_name)
    steps, sums, seconds = _inside_epoch(path, meta)
    model_tensors = {k.removeprefix("model/"): v for k, v in tensors.items() if k.startswith("model/")}
    load_state(model, model_tensors, source=str(path))
    load_optimizer_tensors(optimizer, tensors, "optimizer")
    if scaler.is_enabled() and "grad_scaler" in meta:
        scaler.load_state_dict(meta["grad_scaler"])
    epoch = int(meta.get("epoch", 0))
    # Killed between the state and the model file: the model follows. Not from a state inside an epoch, whose
    # weights are no whole epoch's (the last whole epoch's model file was written before it).
    if writer and steps == 0 and _model_epoch(out) != epoch:
        _derive_model(out, model, meta, model_kwargs, size)
    return Resumed(epoch, list(meta.get("history", [])), steps, sums, seconds)


def _model_epoch(out: Path) -> int | None:
    try:
        return int(read_checkpoint(out / MODEL_FILE, header_only=True)[1].get("extra", {}).get("epoch", -1))
    except (OSError, ValueError):  # missing or damaged: the state has what it needs to be written again
        return None


def _resume_legacy(
    out: Path, model: nn.Module, header: dict[str, Any], model_name: str
) -> tuple[int, list[dict[str, float]]]:
    """An earlier version's pair: ``model.safetensors`` (weights, epoch, history) and ``state.pt`` (the optimizer
    state, a pickle, which this alfa never loads). A run with the epochs asked for needs no optimizer state: it is
    read from its model file alone, as finished. One that would train on cannot continue exactly without it, so it
    is refused."""
    path = out / MODEL_FILE
    tensors, saved = read_checkpoint(path)
    extra = saved.get("extra", {})
    _check_identity(path, saved.get("model"), extra, header, model_name)
    state_path = out / LEGACY_STATE_FILE
    if not state_path.is_file():
        raise CheckpointError(
            f"{path} is there without the training state a run writes before it ({STATE_FILE}, or {state_path.name} "
            f"of an earlier version), so it cannot be resumed; delete {out} to start over"
        )
    epoch, wanted = int(extra.get("epoch", 0)), header.get("train_config", {}).get("epochs")
    if not isinstance(wanted, int) or epoch < wanted:  # it would train on, and only its optimizer state can
        raise CheckpointError(
            f"{out} holds a run of an earlier version at epoch {epoch} of the {wanted} asked for, whose optimizer "
            f"state ({state_path.name}) is a pickle, which this alfa never loads; delete {out} to start over, or "
            "finish the run with the alfa that wrote it"
        )
    load_state(model, tensors, source=str(path))
    return epoch, list(extra.get("history", []))


def held_out_persons(
    checkpoint_config: dict[str, Any], dataset: GazeDataset, checkpoint: str | os.PathLike = "the checkpoint"
) -> list[str] | None:
    """The source persons the checkpoint's training held out, when ``dataset`` is the data it trained on: a later
    stage on that data validates on them, still unseen. ``None`` when it is other data or none were held out. A
    ``ValueError`` where it trained on ``dataset``'s persons and validated on other data (``--val-data``): persons
    drawn from ``dataset`` would be ones it saw. A record of them that is no list of names is damage, named with
    ``checkpoint``."""
    extra = checkpoint_config.get("extra", {})
    persons = extra.get("val_persons")
    if persons is not None and not (isinstance(persons, list) and all(isinstance(p, str) for p in persons)):
        raise ValueError(
            f"{checkpoint}: damaged checkpoint header (its held-out 'val_persons' are not a list of names)"
        )
    if extra.get("val_data") == dataset.name and persons:
        missing = sorted(set(persons) - set(dataset.persons()))
        if not missing:
            return list(persons)
        # another split or folder of the same dataset (GazeHub's Gaze360 names its val split gaze360 too)
        raise ValueError(
            f"{checkpoint} validated on persons that {dataset.name} here does not hold ({missing[0]}"
            f"{', ...' if len(missing) > 1 else ''}): another split or folder of that data; pass --val-data with it (a "
            "source's validation split: ?split=val)"
        )
    trained = extra.get("train_persons")
    if trained is None and extra.get("stage") == "recovered":
        # written before recovered models recorded them: recovery trained on every person of its data, as its
        # validation was elsewhere (where it held persons of that data out, the branch above answered)
        trained = list(dataset.persons())
    seen = set(trained) & set(dataset.persons()) if isinstance(trained, list) else set()
    if extra.get("data", {}).get("name") == dataset.name and seen:
        # persons drawn from this data to validate on would be ones the model was trained on
        raise ValueError(
            f"{checkpoint} was trained on {len(seen)} of {dataset.name}'s persons and validated on "
            f"{extra.get('val_data')!r}: pass --val-data with that data, so that validation is on persons it never saw"
        )
    return None
