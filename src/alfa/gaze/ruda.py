"""RUDA, rotation-enhanced unsupervised domain adaptation for gaze (Bao, Liu, Wang and Lu, CVPR 2022), per person.

What RUDA does (from the paper's abstract and its published description): rolling a face image about the
camera axis by ``θ`` rolls its gaze by ``θ`` (the rotation consistency). Unlabelled target images are rolled by
several angles; the *relative* rotation between two rolled copies is known, and it is the copies'
"sub-label": rolled back by its own angle, every copy's prediction must give the same gaze. Its distribution
loss asks exactly that of the set of rolled-back predictions: their spread (standard deviation) goes to zero.
The whole gaze network is adapted.

Here, as a method of the per-person protocol (one person's ``n_adapt`` unlabelled images, as every row of the
benchmark's Table 1):

* **faithful**: the rotation-consistency objective with the relative-rotation sub-labels and the distribution
  loss (:func:`alfa.gaze.losses.rotation_distribution_loss`, the objective ``"ruda"`` of
  :mod:`alfa.gaze.objectives`): per image, the predictions on it rolled by −8°, 0° and +8°, each
  rolled back by its own angle, and the standard deviation of those three estimates (per angle, summed over
  yaw and pitch, averaged over the images); nothing detached. What is adapted: every parameter of the network
  (:class:`alfa.FullFinetuneConfig`), as RUDA adapts the whole gaze network (here the benchmark's ResNet-18,
  every layer of it).
* **declared, not the paper's**: the angles (±8° and 0°: the same declared roll as the roll objective's,
  :data:`alfa.gaze.views.ROLL_DEGREES`, from the worlds' head-roll spread); the images are rolled inside their
  inscribed disc, the corners kept (the law holds only in the disc: :mod:`alfa.gaze.views` says why this way);
  no labelled source batch during adaptation (the per-person protocol: nothing but the person's
  images, unlike the paper's domain-level setting); no rotation-enhanced pre-training of the source model (the
  paper's first stage: every row here adapts the same source model); the optimizer and steps are the shared
  recipe's (AdamW, 10 steps, BatchNorm statistics frozen) with one learning rate of 1e-4 on every parameter,
  without the recipe's ×10 on ``layer3``/``layer4`` (the oracle's finding for full fine-tuning:
  :class:`alfa.study.bench.config.OracleConfig`).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Sequence
from typing import Any

from torch import Tensor, nn

from alfa.adapters import FullFinetuneConfig

from .data.base import GazeDataset
from .personalize import PersonalizationRun, PersonalizeConfig, PersonalizeResult, personalize, personalize_dataset

__all__ = ["RUDA_RECIPE", "ruda_method", "ruda_recipe", "personalize_ruda", "personalize_ruda_dataset"]

RUDA_RECIPE: dict[str, Any] = {"loss": "ruda", "lr": 1e-4, "lr_scale": {}}
"""RUDA's changes to the shared personalization recipe: its objective, one learning rate on every parameter."""


def ruda_method() -> FullFinetuneConfig:
    """What RUDA adapts: every parameter of the network."""
    return FullFinetuneConfig()


def ruda_recipe(base: PersonalizeConfig | None = None, **changes: Any) -> PersonalizeConfig:
    """The personalization recipe ``base`` (default :class:`PersonalizeConfig`) with :data:`RUDA_RECIPE`'s
    changes; ``changes`` override fields last."""
    return dataclasses.replace(base or PersonalizeConfig(), **{**RUDA_RECIPE, **changes})


def personalize_ruda(
    model: nn.Module, images: Tensor, config: PersonalizeConfig | None = None, *, seed: int | None = None
) -> PersonalizeResult:
    """RUDA on one person's unlabelled ``images`` ``(N, 3, H, W)``: the full fine-tune adapter attached to
    ``model`` and trained with :func:`ruda_recipe` of ``config``; it is **left attached**, as
    :func:`alfa.gaze.personalize.personalize` leaves an adapter."""
    return personalize(model, images, ruda_method(), ruda_recipe(config), seed=seed)


def personalize_ruda_dataset(
    model: nn.Module,
    dataset: GazeDataset,
    out_dir: str | os.PathLike,
    config: PersonalizeConfig | None = None,
    *,
    persons: Sequence[str] | None = None,
    resume: bool = True,
    progress: bool = True,
    track: Callable[[str], Callable[[nn.Module], float]] | None = None,
) -> PersonalizationRun:
    """RUDA on every person of ``dataset``: one adapter file (the whole network's weights) per person in
    ``out_dir`` (:func:`alfa.gaze.personalize.personalize_dataset` with :func:`ruda_method` and
    :func:`ruda_recipe` of ``config``)."""
    return personalize_dataset(
        model,
        dataset,
        ruda_method(),
        ruda_recipe(config),
        out_dir,
        persons=persons,
        resume=resume,
        progress=progress,
        track=track,
    )
