"""Losses of the gaze stack: supervised L1, flip symmetry (spec §4), augmentation consistency, roll consistency
and RUDA's rotation distribution loss.

Every loss here has the same reduction: the L1 norm over the two angles ``(yaw, pitch)`` of each
image, then the mean over images, i.e. ``mean_k ||a_k − b_k||_1`` as the spec writes the flip loss.
(``F.l1_loss`` averages over the two angles as well, which is half of this; under Adam and AdamW the
factor does not change the updates, so the recipes are unaffected.)
"""

from __future__ import annotations

import torch
from torch import Tensor

from .geometry import flip_yaw, roll_gaze

__all__ = [
    "l1_per_image",
    "supervised_l1_loss",
    "flip_symmetry_loss",
    "augmentation_consistency_loss",
    "roll_consistency_loss",
    "rotation_distribution_loss",
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


def roll_consistency_loss(
    pred: Tensor, pred_of_rolled: Tensor, angle: float | Tensor, detach_rolled: bool = False
) -> Tensor:
    """``mean_k || f(I_k) − Roll_{−θ}(f(roll_θ(I_k))) ||_1``: the prediction on an image rolled by ``angle``
    (radians, :func:`alfa.gaze.geometry.roll_images`), rolled back, should be the prediction on the image.

    The flip loss's analogue for the roll about the camera axis. Unlike the flip, it sees a constant offset
    ``b`` in pitch as well as in yaw: the residual is ``b − Roll_{−θ}(b) ≠ 0``. Both branches are trained by
    default, unlike the flip's: a pitch offset shows first in the *yaw* residual (``≈ θ·b``), and only the
    rolled-back branch turns that into a pull on the pitch; with that branch a fixed target (``detach_rolled``)
    a pitch offset is pulled back only through its pitch residual, which is second order (``(1 − cos θ)·b``),
    and an image rolled both ways (±θ) gets two targets whose L1 pulls on its yaw cancel."""
    _check_pair(pred, pred_of_rolled, "roll_consistency_loss")
    target = roll_gaze(pred_of_rolled, -torch.as_tensor(angle, dtype=pred_of_rolled.dtype))
    if detach_rolled:
        target = target.detach()
    return l1_per_image(pred, target).mean()


def rotation_distribution_loss(preds: Tensor, angles: Tensor) -> Tensor:
    """RUDA's rotation-consistency loss. ``preds`` ``(K, N, 2)``: the predictions on ``K`` rotations of ``N``
    images, the ``k``-th rolled by ``angles[k]`` (radians). Each prediction rolled back by its own angle is an
    estimate of the unrolled image's gaze (the relative rotation between two views is their sub-label: view
    ``j`` must predict view ``i``'s gaze rolled by ``angles[j] − angles[i]``); the loss is the spread of those
    ``K`` estimates, the standard deviation over the views of each angle, summed over yaw and pitch and averaged
    over the images. Nothing is detached: the estimates are pulled together, toward no fixed target."""
    if preds.ndim != 3 or preds.shape[-1] != 2 or preds.shape[0] < 2 or preds.shape[1] == 0:
        shape = tuple(preds.shape)
        raise ValueError(f"rotation_distribution_loss: predictions must be (K >= 2, N >= 1, 2), got {shape}")
    angles = torch.as_tensor(angles, dtype=preds.dtype, device=preds.device)
    if angles.shape != (preds.shape[0],):
        raise ValueError(f"rotation_distribution_loss: need one angle per view, got {tuple(angles.shape)}")
    back = roll_gaze(preds, -angles[:, None])  # (K, N, 2): every view's estimate of the unrolled gaze
    # the standard deviation as the root of the variance plus a tiny floor: its gradient stays finite where the
    # estimates coincide exactly (std's own backward divides by the spread)
    return (back.var(dim=0, unbiased=False) + 1e-12).sqrt().sum(-1).mean()


def finite_or_raise(loss: Tensor, what: str) -> Tensor:
    """The loss itself, or a clear error if it is NaN or infinite (instead of silently training on it)."""
    if not torch.isfinite(loss):
        raise FloatingPointError(f"{what}: the loss is {loss.item()} (NaN or infinite)")
    return loss
