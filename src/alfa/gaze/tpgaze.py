"""TPGaze (AAAI 2024), the test-time-personalization rival: meta-training of the prompts, and its recipe.

The chain, after source pre-training with the symmetry term (:func:`alfa.gaze.train.train_source`,
``symmetry_weight=1``, exactly the reference's ``L1 + L_sym``):

1. :func:`meta_train_prompts`: attach TPGaze's prompts (:class:`alfa.adapters.prompt.TPGazeConfig`,
   Gaussian init) to the frozen source model and meta-train them, first-order. Per meta-step, on a
   *support* batch the prompts take an inner step on the unsupervised symmetry loss (no labels), giving
   adapted prompts ``p'``; on a *query* batch (by default the next batch, as in the reference code) the
   supervised L1 loss is evaluated at ``p'``; its gradient, taken at ``p'``, updates the prompts ``p``
   from where they were before the inner step (Adam). BatchNorm stays in eval mode throughout.
2. Per target person, :func:`personalize_tpgaze_dataset`: start from the meta-trained prompts and run
   the gaze stack's personalization (5 images + augmented copies, flip-symmetry loss, BN in eval mode,
   10 steps) with TPGaze's optimizer: Adam, lr 0.01, prompts only (:func:`tpgaze_recipe`).
3. :func:`alfa.gaze.evaluate.evaluate` scores the per-person prompt files like any other adapter:
   adaptation images excluded, last step reported, nothing picked on test labels.

Meta-training is checkpointed after every epoch in one safetensors file (prompts, both optimizers'
state, the history in its JSON header; written atomically), so an interrupted run resumes and gives
the numbers of an uninterrupted one. The meta-trained prompts are also written as an ordinary adapter
file (``prompts.safetensors``), checked against the base by fingerprint when loaded.
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import json
import os
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn
from tqdm.auto import tqdm

from alfa.adapters import adapter_parameters, adapter_state, attach, detach, load_adapter, save_adapter
from alfa.adapters.io import AdapterFileError, _compare_fingerprints, base_fingerprint, refuse_non_finite
from alfa.adapters.prompt import PromptedConv, TPGazeConfig
from alfa.adapters.state import adapted_layers
from alfa.checkpoint import CheckpointError, load_optimizer_tensors, optimizer_tensors, read_tagged, write_tagged
from alfa.fileio import settings_differences, write_json

from .data.base import GazeDataset
from .evaluate import EVAL_BATCH_SIZE, load_examples, load_images, person_errors
from .losses import finite_or_raise, flip_symmetry_loss, supervised_l1_loss
from .personalize import PersonalizationRun, PersonalizeConfig, personalize_dataset
from .precision import autocast, run_precision
from .train import TrainConfig, mean_error, resolve_validation
from .train_state import data_signatures, other_data

__all__ = [
    "MetaTrainConfig",
    "MetaTrainResult",
    "MetaStep",
    "symmetry_loss",
    "inner_adapt",
    "meta_step",
    "meta_train_prompts",
    "square_image_size",
    "tpgaze_recipe",
    "start_from",
    "tpgaze_method",
    "personalize_tpgaze_dataset",
]

STATE_FILE = "meta_state.safetensors"
PROMPTS_FILE = "prompts.safetensors"
RECORD_FILE = "meta_train.json"
STATE_FORMAT = "alfa-tpgaze-meta"
INNER_OPTIMIZERS = ("adam", "sgd")
QUERIES = ("next", "same")


@dataclass
class MetaTrainConfig:
    """Meta-training of the prompts. The defaults are the reference code's: batches of 20, Adam with
    lr 1e-4 for both the inner and the outer step, the inner Adam's moments carried over from one
    meta-step to the next, support and query two consecutive batches, 100 meta-steps per epoch
    (its 200 batches), 10 epochs.

    ``inner_optimizer="sgd"`` makes the inner step the textbook ``p' = p − inner_lr · ∇L_sym(p)``;
    ``inner_steps`` repeats it. ``query="same"`` evaluates the outer loss on the support batch itself.
    ``val_fraction``/``seed`` hold out source persons (:func:`alfa.gaze.train.resolve_validation`) whose
    error is recorded per epoch, for the record only: the last epoch is always the result.
    """

    epochs: int = 10
    steps_per_epoch: int = 100
    batch_size: int = 20
    outer_lr: float = 1e-4
    inner_lr: float = 1e-4
    inner_optimizer: str = "adam"
    inner_steps: int = 1
    query: str = "next"
    detach_flipped: bool = True
    val_fraction: float = 0.1
    seed: int = 0
    eval_batch_size: int = EVAL_BATCH_SIZE

    def validate(self) -> None:
        for name in ("epochs", "steps_per_epoch", "batch_size", "inner_steps", "eval_batch_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"MetaTrainConfig.{name} must be at least 1, got {getattr(self, name)}")
        if not (self.outer_lr > 0 and self.inner_lr > 0):
            raise ValueError(f"need outer_lr > 0 and inner_lr > 0, got {self.outer_lr}, {self.inner_lr}")
        if self.inner_optimizer not in INNER_OPTIMIZERS:
            raise ValueError(f"inner_optimizer must be one of {INNER_OPTIMIZERS}, got {self.inner_optimizer!r}")
        if self.query not in QUERIES:
            raise ValueError(f"query must be one of {QUERIES}, got {self.query!r}")
        if not 0.0 <= self.val_fraction < 1.0:
            raise ValueError(f"val_fraction must be in [0, 1), got {self.val_fraction}")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass
class MetaTrainResult:
    """What :func:`meta_train_prompts` did: the prompt file, the per-epoch history (source validation
    error with the prompts as they are, before any adaptation), and the person split."""

    prompts: Path
    history: list[dict[str, float]]
    train_persons: list[str]
    val_persons: list[str]
    initial_val_error: dict[str, float]  # "base": the source model itself; "init": with the initial prompts
    trainable_parameters: int
    resumed_from_epoch: int = 0


@dataclass
class MetaStep:
    """One meta-step's losses and the adapted prompts ``p'`` of its inner step (by parameter name)."""

    inner_loss: float
    outer_loss: float
    adapted: dict[str, Tensor] = field(repr=False)


# ----------------------------------------------------------------------------- the meta-step


def symmetry_loss(model: nn.Module, images: Tensor, detach_flipped: bool = True) -> Tensor:
    """The flip-symmetry loss of ``images`` (labels are not an argument): the images and their mirrors
    in one forward (in the run's precision), ``mean_k || f(I_k) − FlipYaw(f(flip I_k)) ||_1`` (in fp32)."""
    with autocast(images.device):
        pred = model(torch.cat([images, torch.flip(images, dims=[-1])])).float()
    n = images.shape[0]
    return flip_symmetry_loss(pred[:n], pred[n:], detach_flipped=detach_flipped)


def inner_adapt(
    model: nn.Module,
    prompts: Sequence[nn.Parameter],
    images: Tensor,
    config: MetaTrainConfig,
    inner_optimizer: torch.optim.Optimizer | None = None,
) -> float:
    """Move ``prompts`` in place by ``config.inner_steps`` steps on the symmetry loss of ``images``.

    Unsupervised by construction: nothing here can see a label. ``inner_optimizer`` (an Adam over
    ``prompts``, needed for ``inner_optimizer="adam"``) keeps its moments between calls, as in the
    reference code. Returns the loss before the first step.
    """
    first = None
    for _ in range(config.inner_steps):
        loss = finite_or_raise(symmetry_loss(model, images, config.detach_flipped), "TPGaze inner step")
        grads = torch.autograd.grad(loss, list(prompts))
        first = loss.item() if first is None else first
        if config.inner_optimizer == "sgd":
            with torch.no_grad():
                for p, g in zip(prompts, grads):
                    p.sub_(config.inner_lr * g)
        else:
            if inner_optimizer is None:
                raise ValueError("inner_optimizer='adam' needs the inner Adam optimizer")
            for p, g in zip(prompts, grads):
                p.grad = g
            inner_optimizer.step()
            inner_optimizer.zero_grad(set_to_none=True)
    return float(first)


def meta_step(
    model: nn.Module,
    prompts: dict[str, nn.Parameter],
    support: Tensor,
    query: Tensor,
    query_gaze: Tensor,
    outer_optimizer: torch.optim.Optimizer,
    config: MetaTrainConfig,
    inner_optimizer: torch.optim.Optimizer | None = None,
) -> MetaStep:
    """One first-order meta-step: inner step on ``support`` (unlabeled) gives ``p'``; the L1 loss of
    ``query`` against ``query_gaze`` at ``p'`` gives a gradient, applied by ``outer_optimizer`` to the
    prompts as they were before the inner step."""
    params = list(prompts.values())
    before = [p.detach().clone() for p in params]
    inner_loss = inner_adapt(model, params, support, config, inner_optimizer)
    adapted = {name: p.detach().clone() for name, p in prompts.items()}
    with autocast(query.device):
        pred = model(query).float()
    outer = finite_or_raise(supervised_l1_loss(pred, query_gaze), "TPGaze outer step")
    grads = torch.autograd.grad(outer, params)
    with torch.no_grad():
        for p, b in zip(params, before):
            p.copy_(b)
    for p, g in zip(params, grads):
        p.grad = g
    outer_optimizer.step()
    outer_optimizer.zero_grad(set_to_none=True)
    return MetaStep(inner_loss=inner_loss, outer_loss=outer.item(), adapted=adapted)


# ----------------------------------------------------------------------------- checkpoints


def _save_state(path: Path, prompts: dict[str, nn.Parameter], optimizers: dict[str, Any], meta: dict[str, Any]) -> None:
    tensors = {f"prompt/{n}": p.detach().cpu().contiguous() for n, p in prompts.items()}
    for prefix, opt in optimizers.items():
        tensors.update(optimizer_tensors(opt, prefix))
    refuse_non_finite(tensors, path)  # diverged prompts stop the meta-training; the last good state stays
    write_tagged(path, tensors, STATE_FORMAT, meta)


def _read_state(path: Path) -> tuple[dict[str, Tensor], dict[str, Any]]:
    return read_tagged(path, STATE_FORMAT, "a TPGaze meta-training state")


def _comparable(config: dict[str, Any]) -> dict[str, Any]:
    # More epochs extend a run; the evaluation batch size changes no number.
    return {k: v for k, v in config.items() if k not in ("epochs", "eval_batch_size")}


def _meta_record(folder: Path) -> dict[str, Any] | None:
    """``folder``'s meta-training record, ``None`` where there is none that reads as one (prompts kept alone)."""
    try:
        meta = json.loads((folder / RECORD_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return meta if isinstance(meta, dict) else None


def _finished_before(out: Path) -> bool:
    """Whether ``out``'s record says its meta-training finished (its prompts file is that run's result)."""
    return (_meta_record(out) or {}).get("complete") is True


def _resume(
    path: Path,
    model: nn.Module,
    prompts: dict[str, nn.Parameter],
    optimizers: dict[str, Any],
    header: dict[str, Any],
) -> tuple[int, list[dict[str, float]], dict[str, float]]:
    tensors, meta = _read_state(path)
    saved = meta.get("header", {})
    problems = [
        f"{key} differs"
        for key in ("stage", "prompt_config", "data", "train_persons", "val_data", "val_persons")
        if saved.get(key) != json.loads(json.dumps(header[key]))
    ]
    theirs, ours = _comparable(saved.get("meta_config", {})), _comparable(header["meta_config"])
    if theirs != ours:
        differing = ", ".join(settings_differences(theirs, ours))
        problems.append(f"meta-training config (the checkpoint's vs this run's): {differing}")
    problems += other_data(saved, json.loads(json.dumps(header)))  # a state from before the signatures passes
    problems += _compare_fingerprints(meta.get("fingerprint", {}), base_fingerprint(model))[:3]
    if problems:
        raise CheckpointError(
            f"{path} is the state of another meta-training run ({'; '.join(map(str, problems))}); "
            f"use another output folder, or delete it to start over"
        )
    missing = sorted(f"prompt/{n}" for n in prompts if f"prompt/{n}" not in tensors)
    if missing:
        raise CheckpointError(f"{path}: missing prompt tensors {missing[:4]}")
    with torch.no_grad():
        for n, p in prompts.items():
            p.copy_(tensors[f"prompt/{n}"])
    for prefix, opt in optimizers.items():
        load_optimizer_tensors(opt, tensors, prefix)
    return int(meta["epoch"]), list(meta.get("history", [])), dict(meta.get("initial_val_error", {}))


@torch.no_grad()
def _error_without_prompts(prompts: dict[str, nn.Parameter], measure) -> float:
    """The source model's own error: with every prompt at zero the prompted model is exactly the base."""
    saved = {n: p.detach().clone() for n, p in prompts.items()}
    for p in prompts.values():
        p.zero_()
    try:
        return measure()
    finally:
        for n, p in prompts.items():
            p.copy_(saved[n])


# ----------------------------------------------------------------------------- meta-training


def _epoch_batches(indices: Sequence[int], count: int, batch_size: int, seed: int, epoch: int) -> list[list[int]]:
    """``count`` batches for one epoch, from fresh permutations of ``indices`` as often as needed; a
    function of ``(seed, epoch)`` only, so a resumed run draws the same batches."""
    batches: list[list[int]] = []
    round_ = 0
    while len(batches) < count:
        g = torch.Generator().manual_seed((seed * 1_000_003 + epoch) * 1_009 + round_)
        perm = torch.randperm(len(indices), generator=g).tolist()
        full = len(perm) - batch_size + 1
        batches += [[indices[i] for i in perm[s : s + batch_size]] for s in range(0, full, batch_size)]
        round_ += 1
    return batches[:count]


def square_image_size(dataset: GazeDataset, index: int) -> int:
    """The side of ``dataset``'s image ``index``, refused unless square (TPGaze's prompts are sized for one)."""
    h, w = load_images(dataset, [index]).shape[-2:]
    if h != w:
        raise ValueError(f"{dataset.name}: images are {h}×{w}; TPGaze's prompts expect square images")
    return int(h)


def meta_train_prompts(
    model: nn.Module,
    source: GazeDataset,
    config: MetaTrainConfig,
    out_dir: str | os.PathLike,
    *,
    prompt: TPGazeConfig | None = None,
    val_dataset: GazeDataset | None = None,
    val_persons: Sequence[str] | None = None,
    resume: bool = True,
    progress: bool = True,
) -> MetaTrainResult:
    """Meta-train TPGaze's prompts on the frozen source ``model`` (dense or truncated, no adapter).

    ``prompt`` (default: ``TPGazeConfig`` at the source's image size) says where the prompts go.
    On return the meta-trained prompts are attached to ``model`` (``alfa.detach`` drops them) and
    saved as an adapter file, ``out_dir/prompts.safetensors``; ``out_dir/meta_train.json`` holds the
    history. A finished or interrupted run of the same configuration, data and base in ``out_dir`` is
    continued (``resume``); a different one is refused with a :class:`~alfa.checkpoint.CheckpointError`.

    The forwards run in the run's precision (:mod:`alfa.gaze.precision`), fp32 or bf16: fp16 is refused, its
    gradients would need a loss scaler, and the inner and outer gradients here are taken directly
    (``torch.autograd.grad``), outside any optimizer a ``GradScaler`` could unscale for.
    """
    config.validate()
    if run_precision() == "fp16":
        raise ValueError("TPGaze meta-training runs in fp32 or bf16, not fp16 (no gradient scaler for its inner steps)")
    if adapter_state(model) is not None:
        raise RuntimeError("meta_train_prompts expects the source model without an adapter (call alfa.detach)")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    split = TrainConfig(val_fraction=config.val_fraction, seed=config.seed)
    train_p, val_ds, val_p = resolve_validation(source, split, val_dataset, val_persons)
    train_idx = [i for p in train_p for i in source.person_indices(p)]
    if len(train_idx) < config.batch_size:
        raise ValueError(
            f"{source.name}: {len(train_idx)} training images, fewer than one batch of {config.batch_size}"
        )
    prompt = prompt or TPGazeConfig(image_size=square_image_size(source, train_idx[0]))

    device = next(model.parameters()).device
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        torch.manual_seed(config.seed)
        attach(model, prompt)
    try:
        result = _meta_train(model, source, config, out, prompt, train_p, train_idx, val_ds, val_p, resume, progress)
    except BaseException:
        detach(model)
        raise
    return result


def _meta_train(
    model: nn.Module,
    source: GazeDataset,
    config: MetaTrainConfig,
    out: Path,
    prompt: TPGazeConfig,
    train_p: list[str],
    train_idx: list[int],
    val_ds: GazeDataset,
    val_p: list[str],
    resume: bool,
    progress: bool,
) -> MetaTrainResult:
    device = next(model.parameters()).device
    prompts = adapter_parameters(model)
    outer_opt = torch.optim.Adam(prompts.values(), lr=config.outer_lr)
    inner_opt = torch.optim.Adam(prompts.values(), lr=config.inner_lr) if config.inner_optimizer == "adam" else None
    optimizers = {"outer": outer_opt, "inner": inner_opt}
    header = {
        "stage": "tpgaze-meta",
        "meta_config": config.to_dict(),
        "prompt_config": prompt.to_dict(),
        "data": {"name": source.name, "images": len(source), "persons": len(source.persons())},
        "train_persons": train_p,
        "val_data": val_ds.name,
        "val_persons": val_p,
        **data_signatures(source, val_ds),  # same names and counts, other images: another run
    }
    if run_precision() != "fp32":  # a resumed run must be the same precision; fp32 headers stay as they were
        header["precision"] = run_precision()
    trainable = sum(p.numel() for p in prompts.values())
    was_training = model.training
    model.eval()  # BatchNorm keeps the source statistics throughout, as in the reference code

    def val_error() -> float:
        return mean_error(person_errors(model, val_ds, val_p, 0, config.eval_batch_size)) if val_p else float("nan")

    state_path = out / STATE_FILE
    start_epoch, history = 0, []
    if resume and state_path.is_file():
        start_epoch, history, initial = _resume(state_path, model, prompts, optimizers, header)
        if start_epoch < config.epochs and _finished_before(out):
            warnings.warn(
                f"{out} holds a finished meta-training of {start_epoch} epoch{'s' * (start_epoch != 1)}: this run "
                f"goes on to {config.epochs} and replaces its {PROMPTS_FILE} (folders personalized from it will "
                "refuse the new one)",
                stacklevel=3,
            )
    else:
        initial = {"base": _error_without_prompts(prompts, val_error), "init": val_error()}
    per_step = 1 if config.query == "same" else 2
    for epoch in range(start_epoch, config.epochs):
        t0 = time.time()
        batches = _epoch_batches(train_idx, per_step * config.steps_per_epoch, config.batch_size, config.seed, epoch)
        sums = {"inner_symmetry": 0.0, "outer_l1": 0.0}
        bar = tqdm(range(config.steps_per_epoch), desc=f"tpgaze meta {epoch + 1}/{config.epochs}", disable=not progress)
        for step in bar:
            support_idx = batches[per_step * step]
            support = load_images(source, support_idx).to(device)
            if config.query == "same":
                query, gaze = support, load_examples(source, support_idx)[1].to(device)
            else:
                query, gaze = (t.to(device) for t in load_examples(source, batches[2 * step + 1]))
            result = meta_step(model, prompts, support, query, gaze, outer_opt, config, inner_opt)
            sums["inner_symmetry"] += result.inner_loss
            sums["outer_l1"] += result.outer_loss
            bar.set_postfix(l1=f"{result.outer_loss:.4f}", sym=f"{result.inner_loss:.4f}")
        record = {
            "epoch": epoch + 1,
            **{k: v / config.steps_per_epoch for k, v in sums.items()},
            "val_error": val_error(),
            "seconds": time.time() - t0,
        }
        history.append(record)
        meta = {"header": header, "epoch": epoch + 1, "history": history, "initial_val_error": initial}
        _save_state(state_path, prompts, optimizers, {**meta, "fingerprint": base_fingerprint(model)})
        save_adapter(model, out / PROMPTS_FILE)
        write_json(
            out / RECORD_FILE, {**meta, "trainable_parameters": trainable, "complete": epoch + 1 == config.epochs}
        )
        if progress:  # said once the epoch is saved: a Ctrl-C after this line keeps it
            tqdm.write(
                f"tpgaze meta epoch {epoch + 1}/{config.epochs}: outer L1 {record['outer_l1']:.4f}, "
                f"inner symmetry {record['inner_symmetry']:.4f}, val error {record['val_error']:.2f} deg"
            )
    # Also after a resumed finished run, or a crash between the two writes above: the file follows the state.
    save_adapter(model, out / PROMPTS_FILE)
    model.train(was_training)
    return MetaTrainResult(
        prompts=out / PROMPTS_FILE,
        history=history,
        train_persons=train_p,
        val_persons=val_p,
        initial_val_error=initial,
        trainable_parameters=trainable,
        resumed_from_epoch=start_epoch,
    )


# ----------------------------------------------------------------------------- personalization


TPGAZE_OPTIMIZER: dict[str, Any] = {"lr": 0.01, "weight_decay": 0.0, "lr_scale": {}}
"""TPGaze's personalization optimizer (spec §5): Adam, lr 0.01, prompts only. AdamW without weight decay is
Adam; the prompted layers are outside ResNet-18's layer3/4, so no per-stage scaling either. A training
recipe, so it lives here with the gaze stack, not with the adapter."""


def tpgaze_recipe(base: PersonalizeConfig | None = None, **changes: Any) -> PersonalizeConfig:
    """The gaze stack's personalization recipe (``base``, default :class:`PersonalizeConfig`) with
    TPGaze's optimizer: Adam (AdamW without weight decay), lr 0.01, no per-stage lr scaling; the
    other settings (5 images + augmented copies, flip symmetry, 10 steps, BN in eval mode) are shared
    with every method. ``changes`` override fields last."""
    defaults = copy.deepcopy(TPGAZE_OPTIMIZER)
    return dataclasses.replace(base or PersonalizeConfig(), **{**defaults, **changes})


@dataclass
class _StartedTPGazeConfig(TPGazeConfig):
    """A TPGaze config whose layers start from given prompt values instead of the Gaussian init.

    The values are keyed by the base layer objects of one model (``build`` gets only the layer), so
    the config works only with the model :func:`start_from` read them for; any other model is refused.
    Saved adapters record it as a plain ``tpgaze`` config (``init_from`` names the start).
    """

    start: dict[nn.Module, dict[str, Tensor]] = field(default_factory=dict, repr=False, compare=False)

    def __deepcopy__(self, memo: dict[int, Any]) -> _StartedTPGazeConfig:
        # attach keeps a copy of its config; the start stays keyed by this model's own layers, or it builds nowhere
        copied = copy.copy(self)
        for f in dataclasses.fields(self):
            if f.name != "start":
                setattr(copied, f.name, copy.deepcopy(getattr(self, f.name), memo))
        return copied

    def to_dict(self) -> dict[str, Any]:
        data = {f.name: getattr(self, f.name) for f in dataclasses.fields(TPGazeConfig)}
        return json.loads(json.dumps(data))

    def build(self, base: nn.Module) -> PromptedConv:
        if base not in self.start:
            raise ValueError(
                "these meta-trained prompts were read for another model instance; "
                "call alfa.gaze.tpgaze.start_from(model, path) with the model you personalize"
            )
        layer = PromptedConv(base, self)
        with torch.no_grad():
            for name, value in self.start[base].items():
                getattr(layer, name).copy_(value)
        return layer


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()[:16]


def _refuse_unfinished_meta_training(prompts: Path) -> None:
    """Meta-training rewrites its prompts after every epoch, its record beside them saying ``"complete": false``
    until the last: prompts whose run was stopped before are refused, with how far it got and how to finish it."""
    record = prompts.parent / RECORD_FILE
    meta = _meta_record(prompts.parent)
    if meta is None or meta.get("complete") is not False:  # no record: nothing says they are unfinished
        return
    epochs = (meta.get("header") or {}).get("meta_config", {}).get("epochs")
    raise ValueError(
        f"{prompts} is unfinished: its meta-training stopped after epoch {meta.get('epoch', '?')} of {epochs} "
        f"({record} says so); rerun the same alfa tpgaze meta-train command (same --out) to resume and finish it"
    )


def start_from(model: nn.Module, meta_prompts: str | os.PathLike) -> TPGazeConfig:
    """The method config for personalizing ``model`` from the meta-trained prompts in ``meta_prompts``
    (a ``prompts.safetensors`` written by :func:`meta_train_prompts` on this same base; checked by
    fingerprint). Attaching it gives every person the meta-trained prompts as the starting point.
    """
    path = Path(meta_prompts)
    _refuse_unfinished_meta_training(path)
    if adapter_state(model) is not None:
        raise RuntimeError("start_from expects the base model without an adapter (call alfa.detach)")
    if path.is_dir():  # load_adapter's word for a folder points to alfa personalize's files, not these
        there = " (it has none)" if not (path / PROMPTS_FILE).is_file() else ""
        raise AdapterFileError(
            f"{path} is a folder: meta-trained prompts are one file, {path / PROMPTS_FILE}{there}, "
            "what alfa tpgaze meta-train writes in its --out"
        )
    load_adapter(model, path, method=TPGazeConfig.method)
    try:
        config = adapter_state(model).config  # type: ignore[union-attr]
        start = {
            layer.base: {"prompt_tb": layer.prompt_tb.detach().clone(), "prompt_lr": layer.prompt_lr.detach().clone()}
            for layer in adapted_layers(model).values()
        }
    finally:
        detach(model)
    options = {f.name: getattr(config, f.name) for f in dataclasses.fields(TPGazeConfig)}
    options["init_from"] = f"meta:{_digest(path)}"
    return _StartedTPGazeConfig(**options, start=start)


def tpgaze_method(model: nn.Module, dataset: GazeDataset, meta_prompts: str | os.PathLike | None) -> TPGazeConfig:
    """The prompts every person starts from: the meta-trained ones of ``meta_prompts`` (:func:`start_from`), or
    Gaussian prompts sized to ``dataset``'s images for ``None`` (TPGaze without meta-training)."""
    if meta_prompts is not None:
        return start_from(model, meta_prompts)
    first = dataset.person_indices(dataset.persons()[0])[0]
    return TPGazeConfig(image_size=square_image_size(dataset, first))


def personalize_tpgaze_dataset(
    model: nn.Module,
    dataset: GazeDataset,
    meta_prompts: str | os.PathLike | None,
    out_dir: str | os.PathLike,
    config: PersonalizeConfig | None = None,
    *,
    persons: Sequence[str] | None = None,
    resume: bool = True,
    progress: bool = True,
    track: Callable[[str], Callable[[nn.Module], float]] | None = None,
) -> PersonalizationRun:
    """TPGaze personalization of every person of ``dataset``: one prompt file per person in ``out_dir``
    (:func:`alfa.gaze.personalize.personalize_dataset` with :func:`start_from`). ``config`` is the
    recipe, by default :func:`tpgaze_recipe`'s. ``meta_prompts=None`` starts every person from Gaussian
    prompts instead (TPGaze without meta-training)."""
    return personalize_dataset(
        model,
        dataset,
        tpgaze_method(model, dataset, meta_prompts),
        config or tpgaze_recipe(),
        out_dir,
        persons=persons,
        resume=resume,
        progress=progress,
        track=track,
    )
