"""Losses of the gaze stack: supervised L1, flip symmetry (spec §4) and augmentation consistency.

Every loss here has the same reduction: the L1 norm over the two angles ``(yaw, pitch)`` of each
image, then the mean over images, i.e. ``mean_k ||a_k − b_k||_1`` as the spec writes the flip loss.
(``F.l1_loss`` averages over the two angles as well, which is half of this; under Adam and AdamW the
factor does not change the updates, so the recipes are unaffected.)
"""

from __future__ import annotations

import torch
from torch import Tensor

from .geometry import flip_yaw

__all__ = [
    "l1_per_image",
    "supervised_l1_loss",
    "flip_symmetry_loss",
    "augmentation_consistency_loss",
    "finite_or_raise",
]


def _check_pair(a: Tensor, b: Tensor, what: str) -> None:
    if a.ndim != 2 or a.shape[-1] != 2:
        raise ValueError(f"{what}: predictions must be (N, 2) (yaw, pitch), got {tuple(a.shape)}")
    if a.shape != b.shape:
        raise ValueError(f"{what}: shapes differ: {tuple(a.shape)} vs {tuple(b.shape)}")
    if a.shape[0] == 0:
        raise ValueError(f"{what}: empty batch")


def l1_per_image(a: Tensor, b: Tensor) -> Tensor:
    """``||a_k − b_k||_1`` over the last dimension, one value per image."""
    return (a - b).abs().sum(-1)


def supervised_l1_loss(pred: Tensor, target: Tensor) -> Tensor:
    """``mean_k ||pred_k − target_k||_1`` on ``(yaw, pitch)`` in radians (source training)."""
    _check_pair(pred, target, "supervised_l1_loss")
    return l1_per_image(pred, target).mean()


def flip_symmetry_loss(pred: Tensor, pred_of_flipped: Tensor, detach_flipped: bool = True) -> Tensor:
    """``mean_k || f(I_k) − FlipYaw(f(flip(I_k))) ||_1`` (spec §4).

    ``pred`` are the predictions on the images, ``pred_of_flipped`` those on their horizontal
    flips, in the same order. By default the flipped branch is a fixed target (``detach``), as in the
    TPGaze reference code, so gradients reach the model only through ``pred``; with
    ``detach_flipped=False`` both branches are trained toward each other.
    """
    _check_pair(pred, pred_of_flipped, "flip_symmetry_loss")
    mirrored = flip_yaw(pred_of_flipped)
    if detach_flipped:
        mirrored = mirrored.detach()
    return l1_per_image(pred, mirrored).mean()


def augmentation_consistency_loss(
    pred_original: Tensor, pred_augmented: Tensor, detach_original: bool = True
) -> Tensor:
    """``mean_k || f(aug(I_k)) − f(I_k) ||_1``: an augmented copy should get the original's prediction.

    The alternative self-supervised signal for the loss ablation (spec §6 (d)). The original's
    prediction is the fixed target by default (``detach_original``). ColorJitter and blur leave the
    gaze unchanged; the small affine jitter changes it by a fraction of a degree, which is why the
    affine range of the personalization augmentation is kept small.
    """
    _check_pair(pred_original, pred_augmented, "augmentation_consistency_loss")
    target = pred_original.detach() if detach_original else pred_original
    return l1_per_image(pred_augmented, target).mean()


def finite_or_raise(loss: Tensor, what: str) -> Tensor:
    """The loss itself, or a clear error if it is NaN or infinite (instead of silently training on it)."""
    if not torch.isfinite(loss):
        raise FloatingPointError(f"{what}: the loss is {loss.item()} (NaN or infinite)")
    return loss
