"""Test-time augmentation by the two laws of a gaze crop, the flip and the roll: the kinds, their costs, and the form
their averaging takes inside an exported graph.

**The kinds** (:data:`TTA_KINDS`, the names ``alfa evaluate``, ``serve`` and ``export`` take with ``--tta``):

- ``flip``: :class:`FlipTTA` (also :mod:`alfa.gaze.flip`'s), ``½ [f(x) + FlipYaw(f(flip x))]``; 2 forward passes;
- ``roll``: :class:`RollTTA`, the predictions on the crop rolled by each declared angle ``a`` of
  :data:`ROLL_TTA_ANGLES` (0 among them), each rolled back by ``roll_gaze(·, -a)``; 3 passes;
- ``flip+roll``: :class:`GroupTTA`, both crops (plain and flipped) at every declared angle, each view's prediction
  rolled back and then mirrored back; 6 passes.

A view is rolled **inside the crop's inscribed disc, its corners kept** (:func:`alfa.gaze.views.roll_in_disc`):
``roll_images`` brings black wedges into the corners, which no training image has and which move a model's
prediction, while the roll law holds inside the disc only. It is the roll of the personalization objectives' views,
the same function and the same disc (:mod:`alfa.gaze.views`), so that a roll means one thing in the project.

A roll moves yaw into pitch, so the rolled-back predictions are averaged as **unit vectors** (their mean direction,
renormalized), the average that does not depend on the angles' chart: rotating every view's prediction and then
averaging is averaging and then rotating. The ``flip`` kind keeps :class:`FlipTTA`'s mean of angles, so that
``--tta flip`` is ``--flip-tta`` and the committed flip-TTA numbers stay what they were (the two means differ by
at most a few hundredths of a degree on a trained model's predictions, whose two views differ by 2–3°).

**The declared angle.** :data:`ROLL_TTA_DEG` is the roll views' :data:`alfa.gaze.views.ROLL_DEGREES`, 8°: twice
the head-roll spread of the narrower source world (``eth``, ``head_roll_std`` 4° in ``data/synthetic/domains.py``,
trained on rolls up to 3σ = 12°). A target head (roll spread 3°) rolled by 8° then has a roll of about N(8°, 3°),
inside ``eth``'s trained range for 91 % of views and inside ``gaze360``'s (σ 6°, up to 18°) for nearly all, while
the views differ from the crop by over twice the targets' own spread. It was fixed from the worlds' settings, before
any error was measured with it.

What each law can see of a model's error is :mod:`alfa.gaze.orbit`. This module needs torch alone (no
package of the gaze extra), so that ``alfa export --tta`` runs where the library does.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .geometry import flip_yaw, pitchyaw_to_vector, roll_gaze, vector_to_pitchyaw
from .views import ROLL_DEGREES, disc_mask, roll_in_disc

__all__ = [
    "ROLL_TTA_DEG",
    "ROLL_TTA_ANGLES",
    "disc_mask",
    "roll_in_disc",
    "CalibrationUnderTTA",
    "TTAKind",
    "TTA_KINDS",
    "tta_kind",
    "tta_views",
    "tta_combine",
    "flip_tta_from",
    "FlipTTA",
    "RollTTA",
    "GroupTTA",
    "GridTTA",
]

ROLL_TTA_DEG = ROLL_DEGREES
"""The declared roll of roll-TTA, in degrees, used as ``±``: the roll views' (module docstring: why 8°)."""

ROLL_TTA_ANGLES: tuple[float, ...] = (0.0, ROLL_TTA_DEG * math.pi / 180, -ROLL_TTA_DEG * math.pi / 180)
"""The rolls (radians) of the roll-TTA views: the crop itself, then ``±`` :data:`ROLL_TTA_DEG`."""


def flip_tta_from(pred: Tensor, pred_of_flipped: Tensor) -> Tensor:
    """``ĝ = ½ [pred + FlipYaw(pred_of_flipped)]`` from predictions already made on the images and their
    horizontal flips (same order)."""
    if pred.shape != pred_of_flipped.shape:
        raise ValueError(f"prediction shapes differ: {tuple(pred.shape)} vs {tuple(pred_of_flipped.shape)}")
    return 0.5 * (pred + flip_yaw(pred_of_flipped))


class FlipTTA(nn.Module):
    """A model that predicts with flip test-time augmentation: ``forward(x) = ½ [f(x) + FlipYaw(f(flip x))]``.

    It wraps ``model`` without copying it, so every evaluation path (per-person errors, ``alfa evaluate``,
    the benchmark) scores flip-TTA unchanged; it trains nothing and costs two forward passes."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model
        self.training = model.training  # the wrapper takes the model's mode (its own flag only, not its parts')

    def forward(self, x: Tensor) -> Tensor:
        return flip_tta_from(self.model(x), self.model(torch.flip(x, dims=[-1])))


def tta_views(images: Tensor, flips: Sequence[bool], angles: Sequence[float]) -> list[Tensor]:
    """The views of ``images`` ``(N, 3, H, W)`` (square) a TTA predicts on: for each flip (``False``: the crop,
    ``True``: its mirror image), the crop rolled inside its disc by each angle, in that order."""
    out = []
    for flip in flips:
        base = torch.flip(images, dims=[-1]) if flip else images
        out.extend(base if angle == 0 else roll_in_disc(base, angle) for angle in angles)
    return out


def tta_combine(preds: Sequence[Tensor], flips: Sequence[bool], angles: Sequence[float]) -> Tensor:
    """The TTA prediction from the predictions on :func:`tta_views`' views (same order): each rolled back and
    mirrored back to the crop's frame, then averaged as unit vectors (their mean direction)."""
    if len(preds) != len(flips) * len(angles):
        raise ValueError(f"{len(preds)} predictions for {len(flips) * len(angles)} views")
    back, k = [], 0
    for flip in flips:
        for angle in angles:
            p = preds[k] if angle == 0 else roll_gaze(preds[k], -angle)
            back.append(flip_yaw(p) if flip else p)
            k += 1
    return vector_to_pitchyaw(torch.stack([pitchyaw_to_vector(p) for p in back]).mean(0)).to(preds[0].dtype)


class _ViewTTA(nn.Module):
    """A model that predicts the unit-vector mean over its views (:func:`tta_views`, :func:`tta_combine`). It wraps
    ``model`` without copying it; each view is one forward pass of the batch."""

    flips: tuple[bool, ...] = (False,)
    angles: tuple[float, ...] = ROLL_TTA_ANGLES

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model
        self.training = model.training  # the wrapper takes the model's mode (its own flag only, not its parts')

    def forward(self, x: Tensor) -> Tensor:
        views = tta_views(x, self.flips, self.angles)
        return tta_combine([self.model(v) for v in views], self.flips, self.angles)


class RollTTA(_ViewTTA):
    """Roll test-time augmentation: the mean direction of ``roll_gaze(f(roll(x, a)), -a)`` over the declared
    angles :data:`ROLL_TTA_ANGLES` (3 forward passes); trains nothing."""

    flips = (False,)


class GroupTTA(_ViewTTA):
    """Flip × roll test-time augmentation: the crop and its mirror image, each at every declared angle, each
    prediction rolled back and mirrored back, their mean direction (6 forward passes); trains nothing."""

    flips = (False, True)


class GridTTA(nn.Module):
    """A kind's test-time augmentation for a fixed image size, in the form an exported graph takes: each view is a
    ``grid_sample`` with a constant grid (inside the disc the roll of :func:`alfa.gaze.geometry.roll_images` at the
    declared angle, outside it each pixel itself, the flip folded into both), the model runs once on all views
    stacked, and each prediction goes back to the crop's frame through a constant 3×3 matrix (``FlipYaw · Rz(-a)``
    on the unit vector) before the mean direction. The same numbers as the kind's wrapper up to float rounding
    (tests/test_tta.py), in a graph whose size does not grow with the number of views; ONNX has ``GridSample`` from
    opset 16."""

    def __init__(self, model: nn.Module, flips: Sequence[bool], angles: Sequence[float], image_size: int) -> None:
        super().__init__()
        self.model = model
        self.training = model.training
        self.views = len(flips) * len(angles)
        thetas, stills, back = [], [], []
        for flip in flips:
            for angle in angles:
                cos, sin = math.cos(angle), math.sin(angle)
                # roll_images samples its input at (cos x + sin y, -sin x + cos y); the flipped input at -x of that
                mirror = -1.0 if flip else 1.0
                thetas.append([[mirror * cos, mirror * sin, 0.0], [-sin, cos, 0.0]])
                stills.append([[mirror, 0.0, 0.0], [0.0, 1.0, 0.0]])  # the corners: each pixel (mirrored) itself
                back.append([[mirror * cos, mirror * sin, 0.0], [-sin, cos, 0.0], [0.0, 0.0, 1.0]])
        size = [len(thetas), 1, image_size, image_size]
        rolled, still = (F.affine_grid(torch.tensor(t), size, align_corners=False) for t in (thetas, stills))
        inside = disc_mask(image_size).bool()[None, :, :, None]
        self.register_buffer("grids", torch.where(inside, rolled, still), persistent=False)
        self.register_buffer("back", torch.tensor(back), persistent=False)

    def forward(self, x: Tensor) -> Tensor:
        n, k, grid = x.shape[0], self.views, self.grids.shape[1:]
        # One sampling of all views: the batch repeated per view, each view's grid repeated per image.
        grids = self.grids[:, None].expand(k, n, *grid).reshape(k * n, *grid)
        views = F.grid_sample(x.repeat(k, 1, 1, 1), grids, mode="bilinear", padding_mode="zeros", align_corners=False)
        preds = self.model(views).view(k, n, 2)
        vectors = torch.einsum("kij,knj->ni", self.back, pitchyaw_to_vector(preds)) / k
        return vector_to_pitchyaw(vectors).to(preds.dtype)


class CalibrationUnderTTA(ValueError):
    """A user calibration from labelled images met a test-time augmentation (:meth:`TTAKind.refuse_calibration`)."""


@dataclass(frozen=True)
class TTAKind:
    """One kind of test-time augmentation: its name, the wrapper that predicts with it, its views (``flips`` ×
    ``angles``, :func:`tta_views`) and how their predictions combine; ``passes``, its inference cost, is the
    number of views (forward passes per image)."""

    name: str
    wrap: Callable[[nn.Module], nn.Module]
    flips: tuple[bool, ...]
    angles: tuple[float, ...]
    combine: Callable[[Sequence[Tensor]], Tensor]
    description: str

    @property
    def passes(self) -> int:
        return len(self.flips) * len(self.angles)

    def views(self, images: Tensor) -> list[Tensor]:
        return tta_views(images, self.flips, self.angles)

    def check_size(self, image_size: tuple[int, int]) -> None:
        """A kind that rolls the crop about its centre needs square crops: others are refused in one line."""
        if self.angles != (0.0,) and image_size[0] != image_size[1]:
            raise ValueError(f"test-time augmentation {self.name!r} rolls the crop about its centre, so it needs "
                             f"square images, not {image_size[0]}×{image_size[1]}")  # fmt: skip

    def refuse_calibration(self, about: Mapping[str, Any], what: str) -> None:
        """A user calibration from labelled images (``alfa calibrate``'s file records them under ``labelled`` in its
        ``about``) is refused under this kind, in one line: fitted on the plain crop's predictions, its correction
        goes into every view, and the views' average undoes part of it (under the flip the yaw of an offset cancels
        exactly: ``½ [(f(x) + c) + FlipYaw(f(flip x) + c)]`` keeps only ``c``'s pitch; a roll turns ``c``)."""
        if about.get("labelled"):
            raise CalibrationUnderTTA(
                f"{what} is a calibration from labelled images, and test-time augmentation {self.name!r} averages "
                f"{self.passes} views of each crop, which undoes part of its correction (the yaw of an offset "
                "cancels under the flip): use it without --tta"
            )

    def exportable(self, model: nn.Module, image_size: tuple[int, int]) -> nn.Module:
        """``model`` with this kind's TTA in the form to export for images of ``image_size``: the flip as
        :class:`FlipTTA` (two passes of the model, a mirrored input), the others as :class:`GridTTA`."""
        self.check_size(image_size)
        if self.angles == (0.0,):
            return self.wrap(model)
        return GridTTA(model, self.flips, self.angles, image_size[0])


def _kinds() -> dict[str, TTAKind]:
    roll, group = ((False,), ROLL_TTA_ANGLES), ((False, True), ROLL_TTA_ANGLES)
    kinds = (
        TTAKind("flip", FlipTTA, (False, True), (0.0,), lambda p: flip_tta_from(*p), "the crop and its mirror image"),
        TTAKind("roll", RollTTA, *roll, lambda p: tta_combine(p, *roll), f"the crop rolled by 0, ±{ROLL_TTA_DEG:g}°"),
        TTAKind("flip+roll", GroupTTA, *group, lambda p: tta_combine(p, *group), "both crops at each of those rolls"),
    )
    return {kind.name: kind for kind in kinds}


TTA_KINDS: dict[str, TTAKind] = _kinds()
"""The kinds by name, in the order of the options' help."""


def tta_kind(name: str) -> TTAKind:
    """The kind called ``name``, or one line naming the kinds there are."""
    if name not in TTA_KINDS:
        raise ValueError(f"unknown test-time augmentation {name!r}; expected one of {', '.join(TTA_KINDS)}")
    return TTA_KINDS[name]
