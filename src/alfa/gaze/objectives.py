"""Label-free personalization objectives, one registry: what ``PersonalizeConfig.loss`` names.

An objective turns the model's predictions on one person's personalization batch into the loss the
adapter is trained on. The batch is always laid out the same way (:func:`alfa.gaze.personalize.build_batch`):
the ``N`` images, one augmented copy of each, then the horizontal flips of those ``2·N`` in the same order,
so ``pred`` has ``4·N`` rows ``[originals | augmented | flipped originals | flipped augmented]``.

Adding an objective is one :func:`register_objective` call: ``alfa personalize --loss`` offers it, the
recipe accepts it, and the benchmark's loss ablation gives it a row (``alfa[loss=<name>]``) on its page.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from torch import Tensor

from .losses import augmentation_consistency_loss, flip_symmetry_loss

__all__ = ["Objective", "ObjectiveSettings", "OBJECTIVES", "register_objective", "unregister_objective"]


class ObjectiveSettings(Protocol):
    """What an objective may read of the recipe (:class:`alfa.gaze.personalize.PersonalizeConfig`)."""

    detach_flipped: bool


@dataclass(frozen=True)
class Objective:
    """One objective: its name (the value of ``--loss``), a line saying what it asks of the model, and the
    loss of the ``4·N`` predictions of a personalization batch under the recipe's settings."""

    name: str
    description: str
    loss: Callable[[Tensor, ObjectiveSettings], Tensor]


OBJECTIVES: dict[str, Objective] = {}
"""Every registered objective by name, in registration order (``flip`` first: the default)."""


def register_objective(objective: Objective) -> Objective:
    """Add ``objective`` to :data:`OBJECTIVES` (a name may be registered once)."""
    if objective.name in OBJECTIVES:
        raise ValueError(f"objective {objective.name!r} is already registered")
    OBJECTIVES[objective.name] = objective
    return objective


def unregister_objective(name: str) -> None:
    """Remove an objective from :data:`OBJECTIVES` (tests register their own)."""
    del OBJECTIVES[name]


def _flip(pred: Tensor, settings: ObjectiveSettings) -> Tensor:
    half = pred.shape[0] // 2  # originals and augmented copies, then their flips
    return flip_symmetry_loss(pred[:half], pred[half:], detach_flipped=settings.detach_flipped)


def _augment(pred: Tensor, settings: ObjectiveSettings) -> Tensor:
    n = pred.shape[0] // 4  # originals, then their augmented copies; the flipped half is not used
    return augmentation_consistency_loss(pred[:n], pred[n : 2 * n])


register_objective(Objective("flip", "flip symmetry: a mirrored face gets the mirrored gaze", _flip))
register_objective(
    Objective("augment", "augmentation consistency: an augmented copy gets the original's gaze", _augment)
)
