"""Test-time augmentation distilled into the weights (issue 26, item 3): personalize a person's adapter on their
unlabelled images with the frozen base's group-TTA predictions as targets, so that one merged model, at one
forward pass, approaches group TTA at its six.

**Targets.** ``t = GroupTTA(base)(x)`` (:mod:`alfa.gaze.tta`, flip × roll) for each of the person's personalization
images, computed once, without gradient, before the adapter is attached: the base the person's adapter starts from,
frozen. **Loss.** The personalization batch is ``[originals | augmented copies | their flips]``
(:func:`alfa.gaze.personalize.build_batch`, 4·N rows): an augmented copy keeps its original's target (the
augmentation objective's assumption), a flipped image gets ``FlipYaw(t)``; the loss is the mean L1 distance over the
4·N rows, in radians, the norm of the flip loss.

**How it should be registered** (the objective registry, ``alfa.gaze.objectives``, passes a loss the batch's
predictions and the recipe only, and these targets need the base and the images): an ``Objective`` gains an optional
``targets(model, images) -> Tensor`` that :func:`alfa.gaze.personalize.personalize` calls before ``attach`` (here:
:func:`tta_targets`), and its ``loss`` then takes them (here: :func:`distillation_loss`); the objective is
``Objective("tta-distill", DESCRIPTION, ...)``. This module does not register it: the registry and the training loop
are another change's (issue 26's roll-consistency objective), and a loss that cannot reach its targets would be a
name ``--loss`` offers and cannot train.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from .evaluate import EVAL_BATCH_SIZE, predict_images
from .geometry import flip_yaw
from .tta import tta_kind

__all__ = ["DESCRIPTION", "tta_targets", "distillation_loss"]

DESCRIPTION = "TTA distillation: every image gets the frozen base's flip×roll test-time-augmented gaze"


def tta_targets(base: nn.Module, images: Tensor, kind: str = "flip+roll", batch_size: int = EVAL_BATCH_SIZE) -> Tensor:
    """The frozen ``base``'s test-time-augmented predictions (``kind``, :data:`alfa.gaze.tta.TTA_KINDS`) on
    ``images`` ``(N, 3, H, W)``: the targets of the distillation, ``(N, 2)`` radians, without gradient."""
    return predict_images(tta_kind(kind).wrap(base), images, batch_size=batch_size).detach()


def distillation_loss(pred: Tensor, targets: Tensor) -> Tensor:
    """Mean L1 distance of a personalization batch's ``4·N`` predictions to the ``N`` targets laid out as the batch
    is: ``[t | t | FlipYaw(t) | FlipYaw(t)]``."""
    n = targets.shape[0]
    if pred.shape != (4 * n, 2):
        raise ValueError(f"a batch of {n} images has 4·{n} predictions, got shape {tuple(pred.shape)}")
    t = targets.to(pred)
    return (pred - torch.cat([t, t, flip_yaw(t), flip_yaw(t)])).abs().sum(-1).mean()
