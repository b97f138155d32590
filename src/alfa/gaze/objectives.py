"""Label-free personalization objectives, one registry: what ``PersonalizeConfig.loss`` names.

An objective turns the model's predictions on one person's personalization batch into the loss the
adapter is trained on. It declares the views the batch holds (:mod:`alfa.gaze.views`), in order, and
:func:`alfa.gaze.personalize.build_batch` stacks them, ``N`` rows each. The flip objectives' views are
:data:`~alfa.gaze.views.FLIP_VIEWS`: the ``N`` images, one augmented copy of each, then the horizontal flips
of those ``2·N`` in the same order, so ``pred`` has ``4·N`` rows ``[originals | augmented | flipped originals
| flipped augmented]`` (the one layout before views existed: those batches and numbers are unchanged).

The roll objective (``roll``) asks the same of a roll about the camera axis: the prediction on the image
rolled by ±:data:`~alfa.gaze.views.ROLL_DEGREES` inside its inscribed disc, rolled back, should be the
prediction on the image. ``flip+roll`` is the sum of the two losses. ``ruda`` is RUDA's rotation distribution
loss (:mod:`alfa.gaze.ruda` is the method that trains with it).

An objective may also declare ``targets(model, images)``: per-person targets that
:func:`alfa.gaze.personalize.personalize` computes **once**, from the base, before it attaches the adapter, and
hands to the loss as its third argument. ``tta-distill`` (:mod:`alfa.gaze.distill`) is one: its targets are the
frozen base's group-TTA (flip × roll) predictions, so that the adapted model learns, at one forward pass, what
the base predicts at six.

Adding an objective is one :func:`register_objective` call: ``alfa personalize --loss`` offers it, the
recipe accepts it, and the benchmark's loss ablation gives it a row (``alfa[loss=<name>]``) on its page
unless it says ``ablation=False``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import torch
from torch import Tensor, nn

from .distill import DESCRIPTION as DISTILL_DESCRIPTION
from .distill import DISTILL_OBJECTIVE, distillation_loss, tta_targets
from .losses import (
    augmentation_consistency_loss,
    flip_symmetry_loss,
    roll_consistency_loss,
    rotation_distribution_loss,
)
from .views import FLIP_VIEWS, ROLL_DEGREES, roll_angle, roll_view_name, view_rows

__all__ = [
    "Objective",
    "ObjectiveSettings",
    "OBJECTIVES",
    "ROLL_VIEWS",
    "FLIP_ROLL_VIEWS",
    "RUDA_VIEWS",
    "register_objective",
    "unregister_objective",
]


class ObjectiveSettings(Protocol):
    """What an objective may read of the recipe (:class:`alfa.gaze.personalize.PersonalizeConfig`)."""

    detach_flipped: bool


@dataclass(frozen=True)
class Objective:
    """One objective: its name (the value of ``--loss``), a line saying what it asks of the model, the loss of
    the predictions on a personalization batch under the recipe's settings, the views that batch holds (in
    order, ``N`` rows each) and whether the benchmark's loss ablation gives it a row.

    ``flip_branches``: its loss holds the flip's mirrored branch, the one ``detach_flipped`` detaches (no other
    loss reads it). ``targets``, if given, computes the person's targets from the model without its adapter and
    the person's ``(N, 3, H, W)`` images; the loss then takes them as a third argument, ``loss(pred, settings,
    targets)`` (:meth:`__call__` passes them on)."""

    name: str
    description: str
    loss: Callable[..., Tensor]
    views: tuple[str, ...] = FLIP_VIEWS
    ablation: bool = True
    targets: Callable[[nn.Module, Tensor], Tensor] | None = None
    flip_branches: bool = False  # its loss has the flip's two branches, which the recipe's detach_flipped reaches

    def __call__(self, pred: Tensor, settings: ObjectiveSettings, targets: Tensor | None = None) -> Tensor:
        """The loss of ``pred``, with the person's ``targets`` for an objective that declares them."""
        if self.targets is None:
            return self.loss(pred, settings)
        if targets is None:
            raise ValueError(f"objective {self.name!r} needs the targets its targets(model, images) computes")
        return self.loss(pred, settings, targets)


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


# (unrolled view, its rolled views): the originals and the augmented copies, each rolled both ways
_ROLL_PAIRS = (
    ("original", (roll_view_name(ROLL_DEGREES), roll_view_name(-ROLL_DEGREES))),
    ("augmented", (roll_view_name(ROLL_DEGREES, augmented=True), roll_view_name(-ROLL_DEGREES, augmented=True))),
)
ROLL_VIEWS = tuple(v for unrolled, rolled in _ROLL_PAIRS for v in (unrolled, *rolled))
"""The roll objective's views: the originals, them rolled by ±8° inside their inscribed disc, then the same of
the augmented copies (``6·N`` rows)."""
FLIP_ROLL_VIEWS = FLIP_VIEWS + ROLL_VIEWS
"""``flip+roll``'s views: the flip's ``4·N`` rows, then the roll's ``6·N``."""
RUDA_VIEWS = (roll_view_name(-ROLL_DEGREES), "original", roll_view_name(ROLL_DEGREES))
"""RUDA's views: each original rolled by −8°, 0° and +8° inside its inscribed disc (``3·N`` rows)."""


def _roll_terms(rows: dict[str, Tensor]) -> Tensor:
    """The roll consistency loss averaged over every (unrolled, rolled) pair of views, both branches trained
    whatever the recipe's ``detach_flipped`` (which is the flip's: :func:`~alfa.gaze.losses.roll_consistency_loss`
    says why a detached rolled branch would barely see a pitch offset)."""
    terms = [
        roll_consistency_loss(rows[unrolled], rows[view], roll_angle(view))
        for unrolled, rolled in _ROLL_PAIRS
        for view in rolled
    ]
    return torch.stack(terms).mean()


def _roll(pred: Tensor, settings: ObjectiveSettings) -> Tensor:
    return _roll_terms(view_rows(pred, ROLL_VIEWS))


def _flip_roll(pred: Tensor, settings: ObjectiveSettings) -> Tensor:
    flip_rows = 4 * pred.shape[0] // len(FLIP_ROLL_VIEWS)
    return _flip(pred[:flip_rows], settings) + _roll_terms(view_rows(pred[flip_rows:], ROLL_VIEWS))


def _ruda(pred: Tensor, settings: ObjectiveSettings) -> Tensor:
    rows = view_rows(pred, RUDA_VIEWS)
    angles = torch.tensor([roll_angle(v) for v in RUDA_VIEWS])
    return rotation_distribution_loss(torch.stack([rows[v] for v in RUDA_VIEWS]), angles)


register_objective(
    Objective("flip", "flip symmetry: a mirrored face gets the mirrored gaze", _flip, flip_branches=True)
)
register_objective(
    Objective("augment", "augmentation consistency: an augmented copy gets the original's gaze", _augment)
)
register_objective(
    Objective(
        "roll",
        f"roll consistency: a face rolled by ±{ROLL_DEGREES:g}° about the camera axis gets the rolled gaze",
        _roll,
        ROLL_VIEWS,
    )
)
register_objective(
    Objective(
        "flip+roll", "flip symmetry plus roll consistency (the sum)", _flip_roll, FLIP_ROLL_VIEWS, flip_branches=True
    )
)
register_objective(
    Objective(
        "ruda",
        "RUDA's rotation consistency: the predictions on rolled copies, rolled back, agree (their spread)",
        _ruda,
        RUDA_VIEWS,
        ablation=False,  # RUDA is a row of its own (alfa.gaze.ruda), not a loss of the ablation
    )
)
register_objective(
    Objective(
        DISTILL_OBJECTIVE,
        DISTILL_DESCRIPTION,
        lambda pred, settings, targets: distillation_loss(pred, targets),
        targets=tta_targets,
        # a row of its own, "tta-distill" (alfa.study.bench.methods.OPT_IN_METHODS): as a loss of the ablation it
        # would add a row to the plan of every preset that runs the ablation, and change none of its findings
        ablation=False,
    )
)
