"""What a horizontal flip can see of a gaze model's error: flip test-time augmentation and the split of the
error into its flip-visible and flip-invisible parts (docs/flip-premise.md §1).

For an image ``I`` with label ``y`` and a model ``f``, flip test-time augmentation predicts

    ĝ(I) = ½ [f(I) + FlipYaw(f(flip I))]

and the error splits exactly as ``f − y = (f − ĝ) + (ĝ − y)``:

- ``f − ĝ = ½ [f(I) − FlipYaw(f(flip I))]``, the **flip-visible** part: half the residual the flip-symmetry
  loss measures (``||f(I) − FlipYaw(f(flip I))||₁ = 2 ||f − ĝ||₁``), zero for a flip-equivariant model;
- ``ĝ − y``, the **flip-invisible** part: a model that agrees with its mirror image still makes it, so no
  flip-based signal can see it (a pitch offset shared by an image and its flip is of this kind).

Flip-TTA removes the visible part and keeps the other; it is the ceiling of any purely flip-based correction
of the predictions, and costs two forward passes instead of one. Everything here works on ``(yaw, pitch)``
in radians; the summaries are in degrees.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass

import torch
from torch import Tensor, nn

from .data.base import GazeDataset
from .evaluate import EVAL_BATCH_SIZE, eval_indices, load_examples, predict_images
from .geometry import angular_error
from .tta import FlipTTA, flip_tta_from  # defined with the other kinds of test-time augmentation

__all__ = [
    "FlipParts",
    "FlipTTA",
    "flip_tta",
    "flip_tta_from",
    "flip_parts",
    "person_flip_parts",
    "predict_with_flip",
]

_DEG = 180.0 / math.pi


@torch.no_grad()
def predict_with_flip(model: nn.Module, images: Tensor, batch_size: int = EVAL_BATCH_SIZE) -> tuple[Tensor, Tensor]:
    """``(f(I), f(flip I))`` for ``images`` ``(N, 3, H, W)``: the model's predictions on the images and on
    their horizontal flips (the model is put in eval mode, as for any evaluation)."""
    pred = predict_images(model, images, batch_size=batch_size)
    return pred, predict_images(model, torch.flip(images, dims=[-1]), batch_size=batch_size)


def flip_tta(model: nn.Module, images: Tensor, batch_size: int = EVAL_BATCH_SIZE) -> Tensor:
    """Flip test-time augmentation: ``½ [f(I) + FlipYaw(f(flip I))]`` for each image, no training."""
    return flip_tta_from(*predict_with_flip(model, images, batch_size=batch_size))


@dataclass(frozen=True)
class FlipParts:
    """How one set of predictions (e.g. one person's scored images) splits under a flip, in degrees.

    ``error``: mean angular error of the model; ``tta_error``: of flip-TTA on the same images.
    ``mse``: mean over images of ``||f − y||²`` (squared degrees, on the (yaw, pitch) components);
    ``visible_share`` and ``invisible_share``: the shares of ``mse`` of ``||f − ĝ||²`` and ``||ĝ − y||²``;
    ``cross_share``: of ``2⟨f − ĝ, ĝ − y⟩`` (the three add up to 1). ``flip_loss``: the flip-symmetry loss
    of these predictions, ``mean ||f(I) − FlipYaw(f(flip I))||₁`` in degrees (the personalization loss,
    without augmented copies). ``visible_yaw``/``visible_pitch``: the mean visible part per component
    (signed; a model-wide offset shows here), ``invisible_pitch``: the mean invisible pitch part (signed).
    """

    error: float
    tta_error: float
    mse: float
    visible_share: float
    invisible_share: float
    cross_share: float
    flip_loss: float
    visible_yaw: float
    visible_pitch: float
    invisible_pitch: float

    def to_dict(self) -> dict[str, float]:
        return asdict(self)


def flip_parts(pred: Tensor, pred_of_flipped: Tensor, labels: Tensor) -> FlipParts:
    """Split the error of ``pred`` (``(N, 2)`` radians, on ``N`` images) against ``labels`` into its
    flip-visible and flip-invisible parts, given the predictions on the flipped images."""
    if pred.ndim != 2 or pred.shape[-1] != 2 or pred.shape[0] == 0:
        raise ValueError(f"predictions must be (N, 2) with N >= 1, got {tuple(pred.shape)}")
    if labels.shape != pred.shape:
        raise ValueError(f"labels {tuple(labels.shape)} do not match predictions {tuple(pred.shape)}")
    pred, pred_of_flipped, labels = (t.detach().double() for t in (pred, pred_of_flipped, labels))
    tta = flip_tta_from(pred, pred_of_flipped)
    visible, invisible = (pred - tta) * _DEG, (tta - labels) * _DEG
    mse = float(((visible + invisible) ** 2).sum(-1).mean())
    share = (lambda x: float(x.mean()) / mse) if mse > 0 else (lambda x: float("nan"))
    return FlipParts(
        error=float(angular_error(pred, labels).mean()),
        tta_error=float(angular_error(tta, labels).mean()),
        mse=mse,
        visible_share=share((visible**2).sum(-1)),
        invisible_share=share((invisible**2).sum(-1)),
        cross_share=share(2 * (visible * invisible).sum(-1)),
        flip_loss=float((2 * visible).abs().sum(-1).mean()),
        visible_yaw=float(visible[:, 0].mean()),
        visible_pitch=float(visible[:, 1].mean()),
        invisible_pitch=float(invisible[:, 1].mean()),
    )


def person_flip_parts(
    model: nn.Module, dataset: GazeDataset, persons: Sequence[str], n_adapt: int, batch_size: int = EVAL_BATCH_SIZE
) -> dict[str, FlipParts]:
    """:class:`FlipParts` of ``model`` per person, over the person's scored images (those after the first
    ``n_adapt``, the images every error of the benchmark is measured on)."""
    out: dict[str, FlipParts] = {}
    for person in persons:
        images, labels = load_examples(dataset, eval_indices(dataset, person, n_adapt))
        out[person] = flip_parts(*predict_with_flip(model, images, batch_size=batch_size), labels)
    return out
