"""Test-time augmentation distilled into the weights (issue 26, item 3): personalize a person's adapter on their
unlabelled images with the frozen base's group-TTA predictions as targets, so that one merged model, at one
forward pass, approaches group TTA at its six.

**Targets.** ``t = GroupTTA(base)(x)`` (:mod:`alfa.gaze.tta`, flip × roll) for each of the person's personalization
images, computed once, without gradient, before the adapter is attached: the base the person's adapter starts from,
frozen. **Loss.** The personalization batch is ``[originals | augmented copies | their flips]``
(:func:`alfa.gaze.personalize.build_batch`, 4·N rows): an augmented copy keeps its original's target (the
augmentation objective's assumption), a flipped image gets ``FlipYaw(t)``; the loss is the mean L1 distance over the
4·N rows, in radians, the norm of the flip loss.

**Registration.** The objective ``tta-distill`` (:data:`DISTILL_OBJECTIVE`, :mod:`alfa.gaze.objectives`) declares
:func:`tta_targets` as its ``targets``, which :func:`alfa.gaze.personalize.personalize` calls once per person before
``attach``, and :func:`distillation_loss` as its loss. **Cost.** The teacher's passes are :data:`TEACHER`'s
(``TTA_KINDS[TEACHER].passes``); the adapted model, merged, predicts in one (:func:`inference_cost`).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from .evaluate import EVAL_BATCH_SIZE, predict_images
from .geometry import flip_yaw
from .tta import tta_kind

__all__ = ["DISTILL_OBJECTIVE", "TEACHER", "DESCRIPTION", "tta_targets", "distillation_loss", "inference_cost"]

DISTILL_OBJECTIVE = "tta-distill"
"""The objective's name (``alfa personalize --loss tta-distill``) and the benchmark row's."""
TEACHER = "flip+roll"
"""The TTA kind whose predictions are the targets: group TTA, the kind with the most views."""
DESCRIPTION = "TTA distillation: every image gets the frozen base's flip×roll test-time-augmented gaze"


def tta_targets(base: nn.Module, images: Tensor, kind: str = TEACHER, batch_size: int = EVAL_BATCH_SIZE) -> Tensor:
    """The frozen ``base``'s test-time-augmented predictions (``kind``, :data:`alfa.gaze.tta.TTA_KINDS`) on
    ``images`` ``(N, 3, H, W)``: the targets of the distillation, ``(N, 2)`` radians, without gradient."""
    with torch.no_grad():
        return predict_images(tta_kind(kind).wrap(base), images, batch_size=batch_size)


def distillation_loss(pred: Tensor, targets: Tensor) -> Tensor:
    """Mean L1 distance of a personalization batch's ``4·N`` predictions to the ``N`` targets laid out as the batch
    is: ``[t | t | FlipYaw(t) | FlipYaw(t)]``."""
    n = targets.shape[0]
    if pred.shape != (4 * n, 2):
        raise ValueError(f"a batch of {n} images has 4·{n} predictions, got shape {tuple(pred.shape)}")
    t = targets.to(pred)
    return (pred - torch.cat([t, t, flip_yaw(t), flip_yaw(t)])).abs().sum(-1).mean()


def inference_cost(kind: str = TEACHER) -> dict[str, Any]:
    """What the distilled model saves at inference: forward passes per image of the teacher's TTA (``K``) and of
    the distilled model (1, the adapter merged into the weights), and their ratio ``K / 1``."""
    passes = tta_kind(kind).passes
    return {"teacher": kind, "teacher_passes": passes, "passes": 1, "cost_ratio": float(passes)}
