"""User calibration: a gaze model fitted to one person from ``k`` labelled images (``alfa calibrate``).

"User calibration" is what a deployed gaze tracker asks of a new user (look at a few points on the screen);
it is not the *worlds'* calibration of ``docs/calibration.md``. Per person, from the first ``pool`` images in
dataset order (the calibration pool; the person's other images are the ones scored), ``k`` images are drawn
(:func:`draw_labelled`: ``random``, or ``spread`` over the person's gaze range as a 9-point screen calibration
does) and their labels read. The methods (:data:`USER_CALIBRATIONS`):

- ``offset`` (k ≥ 1): the mean error of the model on the ``k`` images, subtracted;
- ``affine`` (k ≥ 1; a full map from k ≥ 3): ``ŷ ↦ A ŷ + c`` on ``(yaw, pitch)``, ridge-regularized toward
  ``A = I`` (strength ``affine_ridge``) with ``c`` free, so that at k = 1 it is the offset;
- ``ridge`` (k ≥ 1): the head refitted by ridge regression on the penultimate features, toward the source
  head (strength ``feature_ridge`` times the features' mean squared norm), its bias free;
- ``last-layer`` (k ≥ 1): the head's weight and bias fine-tuned on the ``k`` images (AdamW; with ``flip_weight > 0``
  plus the flip loss on the pool's unlabelled images, as ``adapter``);
- ``adapter`` (k ≥ 1): any adapter method (``adapter_method``: Alfa, LoRA, DoRA, …) trained with the supervised
  loss on the ``k`` images, plus, with ``flip_weight > 0``, the flip loss on the pool's unlabelled images
  (semi-supervised);
- ``faze`` (k ≥ 1): PS-GEN, the meta-learned gaze MLP of a FAZE model adapted on the ``k`` images
  (:func:`alfa.gaze.faze.personalize_faze`, with the inner rate and steps its meta-training recorded).

The first four are one form, a correction ``(ΔW, Δb)`` of the model's linear head (the ``correction`` adapter
method), and ``faze`` is the same form on each linear layer of the gaze MLP, so a calibrated user is saved,
loaded, merged, exported and served per sample exactly like a personalized one, on a truncated base or a dense
one (:class:`alfa.serve.MultiUserModel` needs no factorization for corrections). Every file records, in its
``about``, the images whose labels it used; ``alfa evaluate`` refuses to score any of them. Recipes are the
declared defaults of :class:`CalibrateConfig`; the rule that may change them is written in
``docs/user-calibration.md`` (a labelled stand-in, never a target's labels).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn
from tqdm.auto import tqdm

from alfa.adapters import (
    METHODS,
    CorrectionConfig,
    adapter_parameters,
    adapter_state,
    attach,
    config_from_dict,
    detach,
    load_adapter,
    param_groups,
    read_adapter_metadata,
    save_adapter,
    tensor_checksum,
)
from alfa.fileio import settings_differences
from alfa.layers import FactorizedLinear, dense_matrix

from .data.base import GazeDataset, images_differ
from .evaluate import adapter_filename, load_examples, load_images, readable_failure
from .faze import personalize_faze
from .folder_record import RECORD_FILE, read_record, write_record
from .geometry import flip_yaw
from .losses import finite_or_raise, l1_per_image
from .personalize import listed_files, made_from_other_images

__all__ = [
    "CalibrateConfig",
    "DEFAULT_METHOD",
    "DRAWS",
    "USER_CALIBRATIONS",
    "UserCalibration",
    "calibrate_person",
    "calibrate_dataset",
    "earlier_run",
    "make_room",
    "refuse_a_pool_no_one_has",
    "RECORD_FILE",
    "draw_labelled",
    "draw_positions",
    "find_head",
    "fit_affine",
    "fit_feature_ridge",
    "estimate_offset_prior",
]

DRAWS = ("random", "spread")
DEFAULT_METHOD = "affine"
DEFAULT_REASON = (
    "the affine map is the default: it corrects what a person's anatomy shifts and scales (an offset of yaw and "
    "pitch, which the flip cannot see, and a gain), needs no training, has 6 parameters (stored as a correction "
    "of the model's head), and below 3 images its gain is fixed at the identity, the plain offset, so one "
    "default serves every k; with 1 image the offset also carries that image's scatter, which can cost more than "
    "it corrects (docs/results-user-calibration.md; --offset-prior shrinks it). It stayed the default under a rule "
    "declared before the adapters' rows ran (docs/user-calibration.md §5.5): at k = 9 a LoRA adapter closed more of "
    "the labelled headroom on its worst pair, but not the 10 points more its training and storage per user were "
    "asked to earn"
)


@dataclass(frozen=True)
class UserCalibration:
    """A calibration method: its name, the fewest labelled images it takes, and what it is."""

    name: str
    min_k: int
    description: str


USER_CALIBRATIONS: dict[str, UserCalibration] = {
    c.name: c
    for c in (
        UserCalibration("offset", 1, "the model's mean error on the k images, subtracted"),
        UserCalibration("affine", 1, "A·ŷ + c on (yaw, pitch), ridge toward A = I (the offset below k = 3)"),
        UserCalibration("ridge", 1, "the head refitted by ridge regression on the penultimate features"),
        UserCalibration("last-layer", 1, "the head's weight and bias fine-tuned on the k images"),
        UserCalibration("adapter", 1, "an adapter method trained on the k labels (+ flip loss, semi-supervised)"),
        UserCalibration("faze", 1, "PS-GEN: a FAZE model's meta-learned gaze MLP adapted on the k images"),
    )
}


@dataclass
class CalibrateConfig:
    """One user-calibration recipe; every value is declared before any run (docs/user-calibration.md).

    ``pool``: the first images of each person the ``k`` are drawn from (never scored); ``affine_ridge``: the
    penalty on ``‖A − I‖²`` in radians² (against the squared residuals summed over the ``k``);
    ``feature_ridge``: the penalty on ``‖W' − W‖²`` relative to the features' mean squared norm;
    ``offset_prior``: ``offset`` and ``affine`` shrink the offset (the correction at the images' mean
    prediction) toward zero by ``k / (k + κ)``, as if ``κ`` more labelled images had no error (0: the offset is
    free; :func:`estimate_offset_prior` gives the value the spread of persons' offsets implies); ``steps``,
    ``lr``, ``weight_decay``: the optimizer of ``last-layer`` and ``adapter`` (AdamW; ``lr_scale`` as in
    personalization); ``adapter_method`` and ``adapter_options``: the adapter of ``adapter``; ``flip_weight``:
    the weight of the flip loss on the pool's unlabelled images (``adapter`` and ``last-layer``; 0: supervised
    only). ``faze_lr``/``faze_steps``: PS-GEN's rate and steps (``None``: what meta-training recorded).
    ``every_image``: every image of each person is labelled and is the pool (``k``, ``pool`` and ``draw`` unused):
    a user's own calibration session (``alfa calibrate --k all``), which leaves no image to score."""

    method: str = DEFAULT_METHOD
    k: int = 9
    draw: str = "random"
    pool: int = 32
    seed: int = 0
    affine_ridge: float = 0.1
    feature_ridge: float = 1.0
    offset_prior: float = 0.0
    steps: int = 50
    lr: float = 1e-3
    weight_decay: float = 0.0
    lr_scale: dict[str, float] = dataclasses.field(default_factory=dict)
    adapter_method: str = "alfa"
    adapter_options: dict[str, Any] = dataclasses.field(default_factory=dict)
    flip_weight: float = 0.0
    faze_lr: float | None = None
    faze_steps: int | None = None
    every_image: bool = False

    def validate(self) -> None:
        if self.method not in USER_CALIBRATIONS:
            raise ValueError(f"unknown calibration method {self.method!r}; known: {', '.join(USER_CALIBRATIONS)}")
        low = USER_CALIBRATIONS[self.method].min_k
        if self.k < low:
            raise ValueError(f"{self.method} needs k >= {low}, got {self.k}")
        if self.draw not in DRAWS:
            raise ValueError(f"draw must be one of {DRAWS}, got {self.draw!r}")
        if self.pool < self.k and not self.every_image:
            raise ValueError(f"the pool ({self.pool} images) must hold the k = {self.k} labelled ones")
        for name in ("affine_ridge", "feature_ridge", "offset_prior", "weight_decay", "flip_weight"):
            value = getattr(self, name)
            if not (value >= 0 and math.isfinite(value)):
                raise ValueError(f"{name} must be a finite number >= 0, got {value}")
        if self.offset_prior > 0 and self.method not in ("offset", "affine"):
            raise ValueError(
                f"--offset-prior shrinks the offset of the offset and affine methods, not of {self.method}"
            )
        if self.steps < 1 or not self.lr > 0:
            raise ValueError(f"need steps >= 1 and lr > 0, got {self.steps}, {self.lr}")
        if self.method == "adapter" and self.adapter_method not in METHODS:
            raise ValueError(f"unknown adapter method {self.adapter_method!r}; known: {', '.join(sorted(METHODS))}")
        if self.method == "adapter" and self.adapter_method == "correction":
            # the head-only form the offset, affine, ridge and last-layer methods write; on every layer it
            # stores one dense update per layer (tens of MB a person) and exports only densified
            raise ValueError(
                "the correction adapter is what the offset, affine, ridge and last-layer methods write, on the head "
                "alone: choose one of them, or another adapter method"
            )
        if self.method == "adapter":  # an unknown or wrong option fails here once, not for every person
            config_from_dict(self.adapter_method, dict(self.adapter_options))


# ----------------------------------------------------------------------------- which images are labelled


def _seed(seed: int, person: str, purpose: str) -> int:
    digest = hashlib.sha256(f"{seed}\0{person}\0{purpose}".encode()).digest()
    return int.from_bytes(digest[:4], "little") & 0x7FFFFFFF


def draw_positions(gaze: Tensor | None, pool: int, k: int, draw: str, seed: int, person: str) -> list[int]:
    """The positions (sorted, in ``range(pool)``) of the ``k`` labelled images among a person's ``pool`` images,
    whose gaze labels are ``gaze`` (``(pool, 2)``; only ``spread`` reads them, ``random`` may pass ``None``).

    ``random``: ``k`` of the pool uniformly. ``spread``: farthest-point sampling of the pool's gaze labels
    (each next image the one farthest from those chosen), from a random first image: ``k`` points that cover
    the person's gaze range, as the targets of a screen calibration do. Depends on ``(seed, person)`` only."""
    if not 1 <= k <= pool:
        raise ValueError(f"cannot draw k = {k} labelled images from a pool of {pool}")
    g = torch.Generator().manual_seed(_seed(seed, person, f"draw-{draw}"))
    order = torch.randperm(pool, generator=g).tolist()
    if draw == "random":
        return sorted(order[:k])
    if gaze is None or len(gaze) != pool:
        raise ValueError(f"a spread draw needs the gaze labels of the pool's {pool} images")
    gaze = gaze.double()
    chosen = [order[0]]
    nearest = (gaze - gaze[order[0]]).norm(dim=1)
    nearest[order[0]] = -1.0  # a chosen image is never chosen again, even where other labels equal its own
    while len(chosen) < k:
        nxt = int(nearest.argmax())
        chosen.append(nxt)
        nearest = torch.minimum(nearest, (gaze - gaze[nxt]).norm(dim=1))
        nearest[chosen] = -1.0
    return sorted(chosen)


def draw_labelled(dataset: GazeDataset, person: str, k: int, pool: int, draw: str, seed: int) -> list[int]:
    """The dataset indices of the ``k`` labelled images of ``person``, drawn (:func:`draw_positions`) from their
    first ``pool`` images."""
    indices = dataset.person_indices(person)
    if len(indices) < pool + 1:
        raise ValueError(f"person {person!r} has {len(indices)} images: the pool of {pool} plus at least one to score")
    candidates = indices[:pool]
    gaze = None if draw == "random" else dataset.labels(candidates)  # the label table: no image is read to draw
    return [candidates[i] for i in draw_positions(gaze, pool, k, draw, seed, person)]


# ----------------------------------------------------------------------------- the head and its closed forms


def find_head(model: nn.Module, images: Tensor) -> tuple[str, Tensor, Tensor]:
    """The linear layer whose output is the model's output, its input (the penultimate features) and output on
    ``images``; a ``ValueError`` for a model whose prediction is not one linear layer's output."""
    seen: dict[str, tuple[Tensor, Tensor]] = {}
    handles = []
    for name, module in model.named_modules():
        if isinstance(module, (nn.Linear, FactorizedLinear)):

            def hook(_m: nn.Module, args: tuple, out: Tensor, name: str = name) -> None:
                seen[name] = (args[0], out)

            handles.append(module.register_forward_hook(hook))
    try:
        with torch.no_grad():
            out = model(images)
    finally:
        for h in handles:
            h.remove()
    for name, (features, output) in seen.items():
        if output is out and features.ndim == 2:
            return name, features, output
    raise ValueError(
        "the model's output is not the output of one linear layer, which the offset, affine, ridge and last-layer "
        "calibrations correct; use --method adapter"
    )


def fit_affine(pred: Tensor, gaze: Tensor, ridge: float, offset_prior: float = 0.0) -> tuple[Tensor, Tensor]:
    """``(A, c)`` of the correction ``ŷ ↦ A ŷ + c`` minimizing ``Σ‖A ŷ_i + c − g_i‖² + ridge·‖A − I‖² +
    offset_prior·‖m‖²``, where ``m = (A − I) ȳ + c`` is the correction at the images' mean prediction ``ȳ``: the
    least-squares fit of the centered residuals on the centered predictions, shrunk toward the identity, and the
    mean offset (the mean residual) shrunk by ``k / (k + offset_prior)``. Penalizing the offset at ``ȳ`` and not
    the intercept at ``ŷ = 0`` keeps the gain from carrying the offset past its prior.

    With no more images than outputs (k ≤ 2 for yaw and pitch) the gain is ``A = I``: the plain offset, as the
    method promises. Two images fix a gain along the line through their predictions alone, which the ridge would
    shrink but not remove (two images 0.2 apart whose labels are 0.4 apart would get a gain of 1.17 along it)."""
    pred, gaze = pred.double(), gaze.double()
    mp, mg = pred.mean(0), gaze.mean(0)
    p, r = pred - mp, (gaze - mg) - (pred - mp)
    eye = torch.eye(pred.shape[1], dtype=torch.float64)
    gram = p.T @ p + ridge * eye
    if len(pred) <= pred.shape[1]:
        delta = torch.zeros_like(eye)
    elif ridge == 0 and torch.linalg.matrix_rank(gram) < pred.shape[1]:
        raise ValueError(f"an unregularized affine map needs {pred.shape[1] + 1} images in general position")
    else:
        delta = torch.linalg.solve(gram, p.T @ r).T  # A − I
    a = eye + delta
    if offset_prior == 0:
        return a, mg - a @ mp
    shrink = len(pred) / (len(pred) + offset_prior)
    return a, mp + shrink * (mg - mp) - a @ mp  # A ȳ + c − ȳ = the shrunk mean residual


def estimate_offset_prior(residuals: Sequence[Tensor]) -> float:
    """The offset prior ``κ = σ² / τ²`` that the spread of persons' errors implies (a method-of-moments,
    empirical-Bayes estimate): ``residuals`` holds, per labelled person, the ``(n, m)`` errors ``g − ŷ`` of the
    uncalibrated model. ``σ²`` is the pooled variance of one image's error around its person's mean, ``τ²`` the
    mean square of a person's offset around zero (the domain's shift and the person's own), corrected for the
    noise in each person's mean. With this ``κ`` the offset estimated from ``k`` images is shrunk by
    ``k / (k + κ)``: little where persons' offsets dwarf one image's scatter, much where they do not. ``inf``
    where the persons show no offset beyond the scatter (no offset is then worth correcting)."""
    people = [r.double() for r in residuals if len(r) >= 2]
    if len(people) < 2:
        raise ValueError("estimating the offset prior needs at least two persons with two or more labelled images")
    within = sum(float(((r - r.mean(0)) ** 2).sum()) for r in people)
    dof = sum(len(r) - 1 for r in people)
    sigma2 = within / dof  # summed over the m components
    tau2 = statistics.fmean(float((r.mean(0) ** 2).sum()) - sigma2 / len(r) for r in people)
    return math.inf if tau2 <= 0 else sigma2 / tau2


def fit_feature_ridge(
    features: Tensor, gaze: Tensor, weight: Tensor, bias: Tensor, ridge: float
) -> tuple[Tensor, Tensor]:
    """``(ΔW, Δb)`` of the head ``(W, b)`` refitted by ``min Σ‖W' h_i + b' − g_i‖² + λ‖W' − W‖²`` with ``b'``
    free and ``λ = ridge · mean ‖h_i‖²`` (solved in the ``k×k`` dual form)."""
    h, g = features.double(), gaze.double()
    w, b = weight.double(), bias.double()
    mh, mg = h.mean(0), g.mean(0)
    hc = h - mh
    residual = (g - mg) - hc @ w.T
    lam = ridge * float((h * h).sum(1).mean()) + 1e-12
    dual = torch.linalg.solve(hc @ hc.T + lam * torch.eye(len(h), dtype=torch.float64), residual)
    delta_w = hc.T @ dual  # (n, m)
    new_w = w + delta_w.T
    return delta_w.T, (mg - new_w @ mh) - b


# ----------------------------------------------------------------------------- one person


def _set_correction(model: nn.Module, head: str, delta_w: Tensor, delta_b: Tensor) -> None:
    attach(model, CorrectionConfig(target=[head], layers="all"))
    params = adapter_parameters(model)
    with torch.no_grad():
        params[f"{head}.weight_update"].copy_(delta_w)
        if f"{head}.bias_update" in params:
            params[f"{head}.bias_update"].copy_(delta_b)
        elif delta_b.abs().max() > 0:
            detach(model)
            raise ValueError(f"the head {head} has no bias, so it cannot hold an offset")


def _closed_form(model: nn.Module, images: Tensor, gaze: Tensor, config: CalibrateConfig) -> None:
    head, features, pred = find_head(model, images)
    features, pred, gaze = features.cpu(), pred.cpu(), gaze.cpu()  # small closed forms: on the CPU, in float64
    layer = model.get_submodule(head)
    weight = dense_matrix(layer).detach().cpu()
    bias = layer.bias.detach().cpu() if layer.bias is not None else torch.zeros(pred.shape[1])
    if config.method == "ridge":
        delta_w, delta_b = fit_feature_ridge(features, gaze, weight, bias, config.feature_ridge)
    else:
        if config.method == "offset":
            a = torch.eye(pred.shape[1], dtype=torch.float64)
            residual = (gaze - pred).double()
            c = residual.mean(0) if config.offset_prior == 0 else residual.sum(0) / (len(pred) + config.offset_prior)
        else:
            a, c = fit_affine(pred, gaze, config.affine_ridge, config.offset_prior)
        eye = torch.eye(pred.shape[1], dtype=torch.float64)
        delta_w = (a - eye) @ weight.double()
        delta_b = (a - eye) @ bias.double() + c
    if not (torch.isfinite(delta_w).all() and torch.isfinite(delta_b).all()):
        # a NaN label (or prediction) would pass through the closed forms into the saved correction
        raise ValueError(f"the {config.method} calibration is not finite: a labelled image's gaze or prediction is NaN")
    _set_correction(model, head, delta_w.to(weight.dtype), delta_b.to(weight.dtype))


def _trained(model: nn.Module, images: Tensor, gaze: Tensor, unlabelled: Tensor, config: CalibrateConfig) -> None:
    """``last-layer`` or ``adapter``: AdamW on the supervised L1 loss (+ the weighted flip loss). ``last-layer``
    trains the head on the penultimate features computed once: the layers below it are frozen and in eval mode,
    so every step would compute the same features again."""
    both = torch.cat([unlabelled, unlabelled.flip(-1)]) if config.flip_weight else None
    if config.method == "last-layer":
        head, features, _ = find_head(model, images)
        both_features = find_head(model, both)[1] if both is not None else None
        attach(model, CorrectionConfig(target=[head], layers="all"))
        layer = model.get_submodule(head)  # the head with its correction attached
        predict_labelled, predict_both = partial(layer, features), partial(layer, both_features)
    else:
        attach(model, config_from_dict(config.adapter_method, dict(config.adapter_options)))
        predict_labelled, predict_both = partial(model, images), partial(model, both)
    try:
        groups = param_groups(model, config.lr, lr_scale=config.lr_scale, weight_decay=config.weight_decay)
        optimizer = torch.optim.AdamW(groups, lr=config.lr, weight_decay=config.weight_decay)
        for _ in range(config.steps):
            loss = l1_per_image(predict_labelled(), gaze).mean()
            if both is not None:
                pred, pred_flipped = predict_both().split(len(unlabelled))
                loss = loss + config.flip_weight * l1_per_image(pred, flip_yaw(pred_flipped).detach()).mean()
            finite_or_raise(loss, "user calibration")
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
    except BaseException:
        detach(model)
        raise


def calibrate_person(
    model: nn.Module,
    images: Tensor,
    gaze: Tensor,
    config: CalibrateConfig,
    unlabelled: Tensor | None = None,
    faze_defaults: tuple[float, int] | None = None,
) -> None:
    """Calibrate ``model`` (the shared base, in eval mode) to one person from ``k`` labelled ``images`` and their
    ``gaze``: the person's adapter is **left attached** (save it with :func:`alfa.save_adapter`). ``unlabelled``:
    the pool's images, for the flip term. ``faze_defaults``: PS-GEN's ``(rate, steps)`` from meta-training."""
    config.validate()
    if adapter_state(model) is not None:
        raise RuntimeError("calibration expects the base model without an adapter attached (call alfa.detach)")
    model.eval()  # BatchNorm keeps the source statistics
    if config.method in ("offset", "affine", "ridge"):
        _closed_form(model, images, gaze, config)
    elif config.method == "faze":
        lr, steps = faze_defaults or (None, None)
        lr, steps = config.faze_lr or lr, config.faze_steps or steps
        if lr is None or steps is None:
            raise ValueError("--method faze: the checkpoint records no meta-training; give --faze-lr and --faze-steps")
        personalize_faze(model, images, gaze, lr, steps)
    else:
        _trained(model, images, gaze, images if unlabelled is None else unlabelled, config)


# ----------------------------------------------------------------------------- a dataset


def _key(config: CalibrateConfig) -> dict[str, Any]:
    recipe = dataclasses.asdict(config)
    if recipe["offset_prior"] == 0.0:  # added later: at its neutral value, runs made before it still resume
        del recipe["offset_prior"]
    if config.every_image:  # the counts and the draw choose among images: with every image, they choose nothing
        for unused in ("k", "pool", "draw"):
            del recipe[unused]
    else:  # added later too
        del recipe["every_image"]
    return {"user_calibration": recipe}


DONE = ("ok", "skipped")  # a person whose file is whole: made by this run, or found made by an earlier one


def _fresh_record(dataset: GazeDataset, config: CalibrateConfig) -> dict[str, Any]:
    record: dict[str, Any] = {"dataset": dataset.name, "method": f"calibrate:{config.method}", "persons": {}}
    # n_adapt: the images alfa evaluate leaves out of each person's, all of them with every_image (it refuses those)
    record["config"] = {"n_adapt": None if config.every_image else config.pool, **_key(config)}
    return json.loads(json.dumps(record))  # as it reads back from the file


def earlier_run(
    out_dir: str | Path, dataset: GazeDataset, config: CalibrateConfig, model: nn.Module | None = None
) -> str | None:
    """Why ``out_dir``'s record is of another run than ``config`` on ``dataset`` and, given, the base ``model``
    (another dataset, method, recipe, images or base; or no record of ours), ``None`` if there is no record or it is
    of this run (which then resumes)."""
    try:
        before = read_record(out_dir)
    except ValueError as e:
        return str(e)
    if before is None:
        return None
    persons = before["persons"]
    if not _anyone_calibrated(persons):
        return None  # a run that calibrated nobody (every person failed) holds no one's file: a new run replaces it
    mine = _fresh_record(dataset, config)
    for what in ("dataset", "method", "config"):
        if before.get(what) != mine[what]:
            theirs, ours = ({what: _without_the_pools_second_name(r.get(what))} for r in (before, mine))
            differing = ", ".join(settings_differences(theirs, ours))
            return f"its files were made with other settings, the folder's vs this run's: {differing}"
    other = _other_images(Path(out_dir), dataset, persons)
    return other if other is not None or model is None else _another_base(model, Path(out_dir), persons)


def _another_base(model: nn.Module, out: Path, persons: dict[str, Any]) -> str | None:
    """Why the files of ``persons`` (a record's entries) in ``out`` were made on another base than ``model``: the
    first whose tensors read whole is loaded onto it (a damaged file says nothing of the base: the run redoes it)."""
    for person, entry in persons.items():
        path = out / adapter_filename(person)
        if not (isinstance(entry, dict) and entry.get("status") in DONE and path.is_file() and _whole(path)):
            continue
        try:
            load_adapter(model, path)  # the layers and the base's fingerprint
        except (ValueError, RuntimeError) as e:
            return f"its files were made on another base ({e})"
        detach(model)
        return None
    return None


def _whole(path: Path) -> bool:
    """Whether the adapter file at ``path`` reads, its tensors matching the checksum it was saved with."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    try:
        saved = read_adapter_metadata(path).get("checksum")
        return saved is None or tensor_checksum(load_file(str(path))) == saved
    except (ValueError, OSError, RuntimeError, SafetensorError):  # a damaged file, which the run redoes
        return False


def make_room(
    out_dir: str | Path, dataset: GazeDataset, config: CalibrateConfig, replace: bool, model: nn.Module | None = None
) -> None:
    """Before a run of ``config`` on the base ``model`` into ``out_dir``: a record of another run there is refused
    (``ValueError``) unless ``replace``, which removes that record and the files it lists (and only those); a record
    of this run is left to resume (``replace`` redoes it)."""
    out = Path(out_dir)
    if not (out / RECORD_FILE).is_file():
        return
    try:  # the files a calibration or personalization run there listed; a record of neither is not ours to replace
        listed = listed_files(out)
    except ValueError as e:
        raise ValueError(f"--out {out}: {e}") from None
    if not replace:
        other = earlier_run(out, dataset, config, model)
        if other is not None:
            raise ValueError(f"--out {out}: holds an earlier run ({other}); use another --out, or --replace")
        return
    written = set((read_record(out) or {}).get("written", ()))
    for name in sorted(listed):
        if _an_earlier_runs_file(out / name, written):
            (out / name).unlink(missing_ok=True)


def _an_earlier_runs_file(path: Path, written: set[str]) -> bool:
    """Whether a file an earlier run's record implies is that run's: its adapters and record are; a ``<person>.json``
    only where the record lists it or it is a personalization's sidecar (a calibration writes none, and a file of
    the user's of that name stays)."""
    if path.suffix != ".json" or path.name == RECORD_FILE or path.name in written:
        return True
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(data, dict) and {"key", "outcome"} <= set(data)


def refuse_a_pool_no_one_has(dataset: GazeDataset, persons: Sequence[str] | None, config: CalibrateConfig) -> None:
    """One ``ValueError`` before any work for a pool no person has images for (every person would fail alike); a
    pool only some persons lack stays their own failure."""
    if config.every_image:  # no pool: every image a person has is labelled
        return
    counts = {p: len(dataset.person_indices(p)) for p in persons or dataset.persons()}
    if counts and max(counts.values()) < config.pool + 1:
        raise ValueError(
            f"--pool {config.pool}: every person needs the pool plus one image to score, and the most any person of "
            f"{dataset.name} has is {max(counts.values())}; use --pool {max(counts.values()) - 1} or less, or --k all "
            "to fit every image (and score none)"
        )


def _other_images(out: Path, dataset: GazeDataset, persons: dict[str, Any]) -> str | None:
    """Why the files of ``persons`` (a record's entries) in ``out`` were made from other images than this
    ``dataset``'s persons of those names (a dataset of the same name: another folder, another world)."""
    here = set(dataset.persons())
    for person, entry in persons.items():
        path = out / adapter_filename(person)
        if person not in here or not (isinstance(entry, dict) and entry.get("status") in DONE and path.is_file()):
            continue
        try:
            about = read_adapter_metadata(path).get("about", {})
        except (ValueError, OSError):
            continue  # a file that does not read is no one's: this run redoes that person
        mismatch = made_from_other_images(about, dataset, person, "calibration")
        if mismatch is not None:
            return mismatch
    return None


def _anyone_calibrated(persons: dict[str, Any]) -> bool:
    return any(isinstance(entry, dict) and entry.get("status") in DONE for entry in persons.values())


def _without_the_pools_second_name(recipe: Any) -> Any:
    """A calibration recipe without ``n_adapt``, its pool under the name alfa evaluate reads: a message names the
    pool once."""
    if isinstance(recipe, dict) and "user_calibration" in recipe:
        return {k: v for k, v in recipe.items() if k != "n_adapt"}
    return recipe


def _ours(path: Path, about: dict[str, Any], dataset: GazeDataset) -> bool:
    """Whether the adapter file at ``path`` records exactly ``about`` (dataset, person, labelled images, recipe)
    and was made from that person's images in ``dataset`` (its signature, within its tolerance; a file from before
    signatures has none): one a run of this recipe wrote (also one killed before its record listed the file)."""
    try:
        saved = read_adapter_metadata(path).get("about")
    except (ValueError, OSError):
        return False
    if not isinstance(saved, dict):
        return False
    saved = dict(saved)
    signature = saved.pop("data", None)
    return saved == json.loads(json.dumps(about)) and images_differ(signature, dataset, about["person"]) is None


def _finished(
    model: nn.Module, path: Path, entry: dict[str, Any] | None, about: dict[str, Any], dataset: GazeDataset
) -> bool:
    """A person the record lists as done, whose file is there, made by this recipe from these images, and fits
    the base."""
    if entry is None or entry.get("status") not in DONE or not path.is_file() or not _ours(path, about, dataset):
        return False
    try:
        load_adapter(model, path)  # the layers, the base's fingerprint, the checksum
    except (ValueError, RuntimeError, OSError):
        return False
    detach(model)
    return True


def calibrate_dataset(
    model: nn.Module,
    dataset: GazeDataset,
    config: CalibrateConfig,
    out_dir: str | Path,
    *,
    persons: Sequence[str] | None = None,
    faze_defaults: tuple[float, int] | None = None,
    progress: bool = True,
    on_error: Callable[[str, str], None] | None = None,
) -> dict[str, Any]:
    """Calibrate every person of ``dataset`` and write ``out_dir/<person>.safetensors`` (its ``about`` names the
    labelled images) and ``out_dir/personalization.json`` (the record ``alfa evaluate`` reads: the pool is its
    ``n_adapt``, so only images after the pool are scored). A failed person is recorded and the run goes on.

    Resumes: each file is written atomically and the record after each person, so after a kill a rerun keeps
    every person already done (status ``"skipped"``: listed, file there, made by this recipe, fitting the base)
    and calibrates the rest (the draws and the initial weights come from ``(seed, person)``, so the files are
    those of a run never killed). A record of another run (:func:`earlier_run`) is refused with a ``ValueError``,
    and so is a person's file there that no run of this recipe wrote: only this run's own files are replaced."""
    config.validate()
    if adapter_state(model) is not None:
        raise RuntimeError("calibration expects the base model without an adapter attached (call alfa.detach)")
    out = Path(out_dir)
    persons = list(dataset.persons() if persons is None else persons)
    names = [adapter_filename(p) for p in persons]
    if len(set(names)) != len(names):
        raise ValueError(f"{dataset.name}: person ids collide once made file-safe: {names}")
    other = earlier_run(out, dataset, config, model)  # another base's files too: never silently made over
    if other is not None:
        raise ValueError(f"{out} holds an earlier calibration run: {other}; use another folder")
    record = _fresh_record(dataset, config)
    if (earlier := read_record(out)) is not None and _anyone_calibrated(earlier["persons"]):
        record["persons"] = earlier["persons"]  # else a run that made nothing, maybe of another recipe: start afresh
    labelled = {p: _labelled_or_error(dataset, p, config) for p in persons}
    about = {p: {"dataset": dataset.name, "person": p, "labelled": labelled[p], **_key(config)} for p in persons}
    foreign = [
        n
        for p, n in zip(persons, names)
        if (out / n).exists() and p not in record["persons"] and not _ours(out / n, about[p], dataset)
    ]
    if foreign:
        raise ValueError(
            f"{out} holds {', '.join(foreign[:3])}{' and more' if len(foreign) > 3 else ''}, which no calibration run "
            "there wrote: alfa replaces only its own files; move them, or choose another folder"
        )
    out.mkdir(parents=True, exist_ok=True)
    for person in tqdm(persons, desc=f"calibrate {dataset.name}", disable=not progress):
        path = out / adapter_filename(person)
        if _finished(model, path, record["persons"].get(person), about[person], dataset):
            record["persons"][person]["status"] = "skipped"
            continue
        entry = _calibrate_one(model, dataset, person, config, labelled[person], about[person], path, faze_defaults)
        if entry["status"] != "ok" and on_error is not None:
            on_error(person, entry["error"])
        record["persons"][person] = entry
        write_record(out, record)
    write_record(out, record)
    return record


def _labelled_or_error(dataset: GazeDataset, person: str, config: CalibrateConfig) -> list[int] | str:
    """The person's labelled images, or the error that makes their calibration fail (recorded, not raised)."""
    if config.every_image:
        return list(dataset.person_indices(person))
    try:
        return draw_labelled(dataset, person, config.k, config.pool, config.draw, config.seed)
    except (ValueError, KeyError) as e:
        return readable_failure(e)


def _calibrate_one(
    model: nn.Module,
    dataset: GazeDataset,
    person: str,
    config: CalibrateConfig,
    labelled: list[int] | str,
    about: dict[str, Any],
    path: Path,
    faze_defaults: tuple[float, int] | None,
) -> dict[str, Any]:
    """Calibrate one person and write their file; their record entry (``"ok"``, or ``"failed"`` with the error)."""
    t0 = time.perf_counter()
    if isinstance(labelled, str):  # too few images for the pool and one to score
        path.unlink(missing_ok=True)
        return {"status": "failed", "error": labelled}
    try:
        about = {**about, "data": dataset.person_signature(person)}  # the file records which images it was made from
        device = next(model.parameters()).device
        images, gaze = (t.to(device) for t in load_examples(dataset, labelled))
        pool = dataset.person_indices(person)
        pool = load_images(dataset, pool if config.every_image else pool[: config.pool]).to(device)
        torch.manual_seed(_seed(config.seed, person, "init"))
        calibrate_person(model, images, gaze, config, pool, faze_defaults)
        try:
            save_adapter(model, path, about=about)
        finally:
            detach(model)
    except (ValueError, RuntimeError, FloatingPointError, KeyError, OSError) as e:
        if adapter_state(model) is not None:
            detach(model)
        path.unlink(missing_ok=True)  # a file of an earlier run of this recipe must not stand in for a failure
        return {"status": "failed", "error": readable_failure(e)}
    entry = {"status": "ok", "labelled": labelled, "seconds": time.perf_counter() - t0}
    entry["bytes"] = path.stat().st_size
    return entry
