"""PnP-GA, the plug-and-play gaze adaptation of Liu et al., *Generalizing Gaze Estimation with Outlier-guided
Collaborative Adaptation* (ICCV 2021), as a baseline: an ensemble of source-trained models adapts to a person
from a handful of their unlabelled images.

What it does, as its authors' public scripts run it (read for the facts; our code is our own):

* **The ensemble.** ``K`` source models (their configuration lists ten), each a *student* with an EMA
  *teacher*, a copy that follows the student with decay ``α = 0.99`` (warmed up as ``min(1 − 1/(t+1), α)``,
  ``t`` their step counter). Their members are epoch snapshots of source trainings; here
  :func:`train_snapshot_members` keeps the last ``K`` epochs of one.
* **The outlier-guided loss** (:func:`outlier_loss`): for each image and each angle, the teachers' mean and
  (unbiased) standard deviation over the ensemble define a normal law; a student's prediction whose z-score
  lies beyond the 5 % threshold of either tail (``|z| > 1.645``, 10 % in both together) is penalized by ``|z|``
  (summed), plus ``γ = 0.01`` times the L1 distance of its CDF value from that of the mean (0.5). Applied in both
  directions (the teachers' predictions against the students' law as well), each weighted ``0.1`` (their script's
  default).
* **Feature consistency** (:func:`feature_consistency`): between each student's and its teacher's features
  (the input of the last linear layer), ``β = 0.01`` times half the sum of the two Kullback–Leibler
  divergences of their softmaxes: what their script computes under the name Jensen–Shannon.
* **Source supervision** (:func:`source_gaze_loss`): the L1 gaze loss of every student on labelled source
  images (their script reads the first ten of the source's label files).
* **Optimization**: Adam on every student parameter, lr ``1e-4``, betas ``(0.9, 0.95)``, batches of 4 target
  images zipped with batches of 4 source images, 10 epochs over the person's images, the models in eval mode
  (BatchNorm statistics frozen), no dropout.
* **What predicts**: their test script scores one adapted student, the third of the list (``net[2]``), at
  1× inference cost; :class:`PnPGAConfig` ``predict_with`` (``None``: the mean of the students).

:func:`adapt_person` runs it for one person; :func:`adaptation_cost` says what it costs.
"""

from __future__ import annotations

import copy
import dataclasses
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from alfa.checkpoint import load_model, read_checkpoint, save_model
from alfa.models import create_model

from .data.base import GazeDataset
from .evaluate import INPUT_SCALING, load_examples
from .losses import finite_or_raise
from .train import TrainConfig, input_size, train_source

__all__ = [
    "PUBLISHED",
    "PnPGAConfig",
    "AdaptedEnsemble",
    "PnPGACost",
    "outlier_loss",
    "feature_consistency",
    "source_gaze_loss",
    "ema_decay",
    "pnpga_loss",
    "adapt_person",
    "adaptation_cost",
    "source_examples",
    "snapshot_paths",
    "ensemble_trained",
    "snapshot_saver",
    "train_snapshot_members",
]


PUBLISHED = {"E→M": (8.767, 5.529), "E→D": (8.578, 5.867), "G→M": (7.662, 6.176), "G→D": (8.977, 7.922)}
"""The authors' README (github.com/DreamtaleCore/PnP-GA), ResNet-18 on the real datasets, degrees: (source-only,
PnP-GA) per pair, adapted on one person's images and scored on the whole target (their domain protocol).
Quoted beside the benchmark's domain-protocol line (kept here, with the method, so that the report need not
import the benchmark's runner); our pairs are synthetic worlds named after those datasets."""


@dataclass
class PnPGAConfig:
    """PnP-GA's settings, at its authors' values. ``members``: ``K``, the ensemble size; ``images``: ``N``, the
    person's unlabelled images it adapts on; ``source_images``: the labelled source images its L1 term sees;
    ``ema``: the teachers' decay ``α``; ``significance``: of the outlier test (one-sided on each side, so the
    threshold is ``|z| > 1.645``); ``gamma``: the CDF term's weight inside the outlier loss;
    ``outlier_weight``: each direction's weight; ``beta``: the feature-consistency weight; ``lr``, ``betas``:
    Adam's; ``batch_size``: of the target and of the source batches; ``epochs``: over the person's images;
    ``predict_with``: the index of the student that predicts (their script keeps the third), ``None`` for the
    mean of all students (``K``× the inference cost)."""

    members: int = 10
    images: int = 10
    source_images: int = 10
    ema: float = 0.99
    significance: float = 0.05
    gamma: float = 0.01
    outlier_weight: float = 0.1
    beta: float = 0.01
    lr: float = 1e-4
    betas: tuple[float, float] = (0.9, 0.95)
    batch_size: int = 4
    epochs: int = 10
    predict_with: int | None = 2

    def validate(self) -> None:
        if self.members < 2:
            raise ValueError(f"PnP-GA needs at least 2 ensemble members (a spread to test against), got {self.members}")
        if min(self.images, self.source_images, self.batch_size, self.epochs) < 1:
            raise ValueError(f"bad PnPGAConfig (images, source images, batch and epochs must be >= 1): {self}")
        if not (0 < self.ema < 1 and 0 < self.significance < 0.5 and self.lr > 0):
            raise ValueError(f"bad PnPGAConfig (need 0 < ema < 1, 0 < significance < 0.5, lr > 0): {self}")
        if self.predict_with is not None and not 0 <= self.predict_with < self.members:
            raise ValueError(f"predict_with {self.predict_with} is not a student of {self.members}")

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["betas"] = list(self.betas)
        return d


# ----------------------------------------------------------------------------- the losses


def outlier_loss(pred: Tensor, reference: Tensor, significance: float = 0.05, gamma: float = 0.01) -> Tensor:
    """The outlier-guided loss of ``pred`` against the ensemble ``reference``, both ``(batch, 2, K)``: per image
    and angle, the reference's mean and unbiased standard deviation over the ``K`` members define a normal
    law; every prediction with ``|z|`` beyond the ``1 − significance`` quantile adds ``|z|`` (a sum, as the
    authors' code), and ``gamma`` times the mean ``|CDF(pred) − 1/2|`` is added. A spread of exactly zero (all
    members equal) is held at 1e-12, so that an equal prediction scores 0 rather than NaN."""
    if pred.shape != reference.shape or pred.dim() != 3:
        raise ValueError(
            f"outlier_loss: pred {tuple(pred.shape)} and reference {tuple(reference.shape)} must be one (B, 2, K)"
        )
    mean = reference.mean(dim=2, keepdim=True)
    std = reference.std(dim=2, keepdim=True).clamp_min(1e-12)
    z = (pred - mean) / std
    threshold = statistics.NormalDist().inv_cdf(1 - significance)
    penalty = (z.abs() * (z.abs() > threshold)).sum()
    cdf = torch.distributions.Normal(mean, std).cdf(pred)
    return penalty + gamma * (cdf - 0.5).abs().mean()


def feature_consistency(student: Tensor, teacher: Tensor) -> Tensor:
    """Half the sum of ``KL(t‖s)`` and ``KL(s‖t)`` between the softmaxes of the features along their last
    dimension, averaged over every element (the authors' ``reduction='mean'``): what their code names the
    Jensen–Shannon term. 0 for equal features and symmetric in its two arguments."""
    log_s, log_t = torch.log_softmax(student, dim=-1), torch.log_softmax(teacher, dim=-1)
    kl_ts = (log_t.exp() * (log_t - log_s)).mean()
    kl_st = (log_s.exp() * (log_s - log_t)).mean()
    return 0.5 * (kl_ts + kl_st)


def source_gaze_loss(pred: Tensor, labels: Tensor) -> Tensor:
    """The mean absolute error of every member's ``(K, batch, 2)`` predictions against the ``(batch, 2)``
    source labels (radians)."""
    return (pred - labels.unsqueeze(0)).abs().mean()


def ema_decay(step: int, alpha: float) -> float:
    """The teachers' decay at step counter ``step``: ``min(1 − 1/(step + 1), alpha)`` (a short warm-up)."""
    return min(1.0 - 1.0 / (step + 1), alpha)


def pnpga_loss(
    students: Sequence[nn.Module],
    teachers: Sequence[nn.Module],
    target: Tensor,
    source: Tensor,
    source_labels: Tensor,
    config: PnPGAConfig,
) -> tuple[Tensor, dict[str, float]]:
    """PnP-GA's loss on one target batch and one labelled source batch, and its parts. Gradients reach the
    students only: the teachers run without gradient, and the images are data."""
    n = target.shape[0]
    gaze, feats, source_gaze = [], [], []
    for student in students:
        out, feat = _with_features(student, torch.cat([target, source]))  # eval mode: one batch or two is the same
        gaze.append(out[:n])
        feats.append(feat[:n])
        source_gaze.append(out[n:])
    with torch.no_grad():
        teacher_out = [_with_features(t, target) for t in teachers]
    student_gaze, teacher_gaze = torch.stack(gaze, dim=2), torch.stack([g for g, _ in teacher_out], dim=2)
    forward = outlier_loss(student_gaze, teacher_gaze, config.significance, config.gamma)
    backward = outlier_loss(teacher_gaze, student_gaze, config.significance, config.gamma)
    consistency = feature_consistency(torch.stack(feats), torch.stack([f for _, f in teacher_out]))
    supervised = source_gaze_loss(torch.stack(source_gaze), source_labels)
    loss = config.outlier_weight * (forward + backward) + config.beta * consistency + supervised
    parts = {"outlier": forward.item(), "outlier_reverse": backward.item(), "consistency": consistency.item()}
    return loss, {**parts, "source_l1": supervised.item(), "loss": loss.item()}


def _last_linear(model: nn.Module) -> nn.Linear:
    linears = [m for m in model.modules() if isinstance(m, nn.Linear)]
    if not linears:
        raise ValueError(
            f"PnP-GA reads features at the input of the last linear layer; {type(model).__name__} has none"
        )
    return linears[-1]


def _with_features(model: nn.Module, images: Tensor) -> tuple[Tensor, Tensor]:
    """The model's gaze and its features (what enters its last linear layer) on ``images``."""
    seen: list[Tensor] = []
    handle = _last_linear(model).register_forward_pre_hook(lambda _, args: seen.append(args[0]))
    try:
        out = model(images)
    finally:
        handle.remove()
    return out, seen[-1].flatten(1)


# ----------------------------------------------------------------------------- one person


class AdaptedEnsemble(nn.Module):
    """The adapted students and their teachers; calling it predicts as PnP-GA does (``predict_with``: one
    student, or the mean of them all). ``losses``: per step, the loss and its parts."""

    def __init__(self, students: list[nn.Module], teachers: list[nn.Module], predict_with: int | None) -> None:
        super().__init__()
        self.students, self.teachers = nn.ModuleList(students), nn.ModuleList(teachers)
        self.predict_with = predict_with
        self.losses: list[dict[str, float]] = []
        self.seconds = 0.0

    @property
    def predictor(self) -> nn.Module:
        """What predicts: one student, or this ensemble (the mean of the students)."""
        return self if self.predict_with is None else self.students[self.predict_with]

    def forward(self, images: Tensor) -> Tensor:
        if self.predict_with is not None:
            return self.students[self.predict_with](images)
        return torch.stack([s(images) for s in self.students]).mean(0)


def source_examples(source: GazeDataset, count: int) -> tuple[Tensor, Tensor]:
    """The labelled source images PnP-GA's L1 term sees: the first ``count`` of the dataset in its order, as the
    authors' script reads the first lines of the source's label files."""
    if len(source) < count:
        raise ValueError(f"{source.name}: {len(source)} source images, PnP-GA asks for {count}")
    return load_examples(source, list(range(count)))


def _batches(n: int, size: int, generator: torch.Generator) -> list[Tensor]:
    return list(torch.randperm(n, generator=generator).split(size))


def adapt_person(
    models: Sequence[nn.Module],
    person_images: Tensor,
    source_dataset: GazeDataset | tuple[Tensor, Tensor],
    config: PnPGAConfig,
    seed: int,
) -> AdaptedEnsemble:
    """Adapt the ensemble ``models`` (the ``K`` source members, left untouched) to one person from
    ``person_images`` (unlabelled, ``(N, 3, H, W)``), with the labelled source images of ``source_dataset``
    (the first ``config.source_images``, or the ``(images, labels)`` given). Each epoch shuffles the person's
    images and the source images (with ``seed``) into batches of ``config.batch_size`` and steps on the pairs
    (the shorter list sets the count, as the authors' ``zip``). Deterministic for a seed on the CPU."""
    config.validate()
    if len(models) != config.members:
        raise ValueError(f"PnP-GA is configured for {config.members} members, got {len(models)} models")
    if person_images.dim() != 4 or person_images.shape[0] < 1:
        raise ValueError(f"person_images must be (N, 3, H, W) with N >= 1, got {tuple(person_images.shape)}")
    t0 = time.time()
    device = next(models[0].parameters()).device
    if isinstance(source_dataset, tuple):
        src_images, src_labels = source_dataset
    else:
        src_images, src_labels = source_examples(source_dataset, config.source_images)
    src_images, src_labels, target = src_images.to(device), src_labels.to(device), person_images.to(device)
    students = [copy.deepcopy(m).eval() for m in models]
    teachers = [copy.deepcopy(m).eval().requires_grad_(False) for m in models]
    for s in students:
        s.requires_grad_(True)
    optimizer = torch.optim.Adam([p for s in students for p in s.parameters()], lr=config.lr, betas=config.betas)
    ensemble = AdaptedEnsemble(students, teachers, config.predict_with)
    generator = torch.Generator().manual_seed(seed)
    per_epoch = min(-(-target.shape[0] // config.batch_size), -(-src_images.shape[0] // config.batch_size))
    total = per_epoch * config.epochs
    for epoch in range(1, config.epochs + 1):
        pairs = zip(
            _batches(target.shape[0], config.batch_size, generator),
            _batches(len(src_images), config.batch_size, generator),
        )
        for i, (t_idx, s_idx) in enumerate(pairs):
            loss, parts = pnpga_loss(students, teachers, target[t_idx], src_images[s_idx], src_labels[s_idx], config)
            optimizer.zero_grad(set_to_none=True)
            finite_or_raise(loss, "PnP-GA").backward()
            optimizer.step()
            # the teachers' warm-up counts steps as the authors' script does: epoch (from 1) times the run's
            # number of steps, plus the batch index, so it is nearly over at the first step
            _ema_update(students, teachers, ema_decay(epoch * total + i, config.ema))
            ensemble.losses.append(parts)
    ensemble.seconds = time.time() - t0
    return ensemble


@torch.no_grad()
def _ema_update(students: Sequence[nn.Module], teachers: Sequence[nn.Module], decay: float) -> None:
    for student, teacher in zip(students, teachers):
        for s, t in zip(student.parameters(), teacher.parameters()):
            t.mul_(decay).add_(s, alpha=1.0 - decay)


# ----------------------------------------------------------------------------- its cost


@dataclass
class PnPGACost:
    """What adapting one person with PnP-GA costs. ``seconds``: measured; ``training_param_bytes``: the
    parameters held while adapting (``K`` students, ``K`` teachers, the students' gradients and Adam's two
    moments: ``5·K·P`` floats); ``shipped_model_bytes``: the ``K`` source models the device must hold;
    ``shipped_source_bytes``: the labelled source images and labels it must hold too (float32, as used);
    ``inference_params``: what predicts afterwards (one member, or ``K`` for the mean)."""

    seconds: float
    members: int
    params_per_member: int
    training_param_bytes: int
    shipped_model_bytes: int
    shipped_source_bytes: int
    source_images: int
    inference_params: int
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def adaptation_cost(
    models: Sequence[nn.Module], source: tuple[Tensor, Tensor], config: PnPGAConfig, seconds: float
) -> PnPGACost:
    """The cost of one person's adaptation (``seconds`` as measured by :func:`adapt_person`) for ``models``
    and the labelled ``source`` (images, labels) it needed."""
    per_member = sum(p.numel() for p in models[0].parameters())
    bytes_per = next(models[0].parameters()).element_size()
    k = len(models)
    images, labels = source
    return PnPGACost(
        seconds=seconds,
        members=k,
        params_per_member=per_member,
        training_param_bytes=5 * k * per_member * bytes_per,
        shipped_model_bytes=k * per_member * bytes_per,
        shipped_source_bytes=images.numel() * images.element_size() + labels.numel() * labels.element_size(),
        source_images=images.shape[0],
        inference_params=per_member if config.predict_with is not None else k * per_member,
        notes=["the device needs the labelled source data and all K source models to adapt"],
    )


# ----------------------------------------------------------------------------- the members


def snapshot_paths(folder: str | Path, members: int, epochs: int) -> list[Path]:
    """Where the snapshots of the last ``members`` of ``epochs`` epochs (all of them if fewer) lie in ``folder``,
    oldest first."""
    first = max(1, epochs - members + 1)
    return [Path(folder) / f"epoch-{e:03d}.safetensors" for e in range(first, epochs + 1)]


def ensemble_trained(folder: str | Path, members: int, epochs: int) -> bool:
    """Whether ``folder`` holds a finished ensemble: every snapshot of :func:`snapshot_paths` and, beside them, a
    pre-training that says it is complete (its ``model.safetensors`` is rewritten every epoch, so being there is
    not enough: a run stopped between its last snapshot and its checkpoint is not finished)."""
    out = Path(folder)
    model = out / "pretrain" / "model.safetensors"
    if not all(p.is_file() for p in snapshot_paths(out, members, epochs)) or not model.is_file():
        return False
    return bool(read_checkpoint(model, header_only=True)[1].get("extra", {}).get("complete"))


def snapshot_saver(
    folder: str | Path, model_name: str, members: int, epochs: int, size: tuple[int, int]
) -> Callable[[int, nn.Module], None]:
    """The ``on_epoch`` hook of a source training that keeps the ensemble's snapshots (:func:`snapshot_paths`)
    in ``folder``. Given to the source model's own pre-training (:func:`~alfa.gaze.pipeline.build_source_model`'s
    ``on_pretrain_epoch``), it makes the ensemble without training the source a second time."""
    kept = {int(p.stem.removeprefix("epoch-")): p for p in snapshot_paths(folder, members, epochs)}

    def snapshot(epoch: int, model: nn.Module) -> None:
        if epoch in kept:
            save_model(
                kept[epoch], model, model_name, extra={"epoch": epoch}, input_size=size, input_scaling=INPUT_SCALING
            )

    return snapshot


def train_snapshot_members(
    model_name: str,
    seed: int,
    source: GazeDataset,
    val: GazeDataset | None,
    pretrain: TrainConfig,
    folder: str | Path,
    members: int,
    *,
    progress: bool = False,
    device: torch.device | str = "cpu",
) -> list[nn.Module]:
    """The ensemble as the authors built theirs: epoch snapshots of a source training. One training of
    ``model_name`` from the initial weights of ``seed`` with ``pretrain`` (the same as
    :func:`~alfa.gaze.pipeline.build_source_model`'s pre-training, so its last snapshot is that model) keeps
    the weights after each of its last ``members`` epochs (all of them if it has fewer) in ``folder``;
    resumable, and a finished folder (``pretrain/model.safetensors`` beside every snapshot, however they were
    made) is read back. Returned oldest first."""
    out = Path(folder)
    kept = snapshot_paths(out, members, pretrain.epochs)
    if not ensemble_trained(out, members, pretrain.epochs):
        torch.manual_seed(seed)  # the initial weights, as build_source_model draws them
        model = create_model(model_name).to(device)
        train_source(
            model,
            source,
            pretrain,
            out / "pretrain",
            model_name=model_name,
            val_dataset=val,
            progress=progress,
            on_epoch=snapshot_saver(out, model_name, members, pretrain.epochs, input_size(source)),
        )
        missing = [p.name for p in kept if not p.is_file()]
        if missing:  # a run finished before this folder kept snapshots
            raise RuntimeError(f"{out}: snapshots {', '.join(missing)} are missing; delete the folder to train again")
    snapshots = []
    for path in kept:
        model, _ = load_model(path, expect_model=model_name)
        snapshots.append(model.to(device).eval())
    return snapshots
