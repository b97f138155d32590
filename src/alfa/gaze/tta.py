"""Test-time augmentation by the two laws of a gaze crop, the flip and the roll, and what each can see of a
model's error.

**The kinds** (:data:`TTA_KINDS`, the names ``alfa evaluate``, ``serve`` and ``export`` take with ``--tta``):

- ``flip``: :class:`alfa.gaze.flip.FlipTTA`, ``½ [f(x) + FlipYaw(f(flip x))]``; 2 forward passes;
- ``roll``: :class:`RollTTA`, the predictions on the crop rolled by each declared angle ``a`` of
  :data:`ROLL_TTA_ANGLES` (0 among them), each rolled back by ``roll_gaze(·, -a)``; 3 passes;
- ``flip+roll``: :class:`GroupTTA`, both crops (plain and flipped) at every declared angle, each view's prediction
  rolled back and then mirrored back; 6 passes.

A roll moves yaw into pitch, so the rolled-back predictions are averaged as **unit vectors** (their mean direction,
renormalized), the average that does not depend on the angles' chart: rotating every view's prediction and then
averaging is averaging and then rotating. The ``flip`` kind keeps :class:`FlipTTA`'s mean of angles, so that
``--tta flip`` is ``--flip-tta`` and the committed flip-TTA numbers stay what they were (the two means differ by
far less than a tenth of a degree for the spreads of these predictions).

**The declared angle.** :data:`ROLL_TTA_DEG` is 8°: twice the head-roll spread of the narrower source world (``eth``,
``head_roll_std`` 4° in ``data/synthetic/domains.py``, trained on rolls up to 3σ = 12°). A target head (roll spread
3°) rolled by 8° then has a roll of about N(8°, 3°), inside ``eth``'s trained range for 91 % of views and inside
``gaze360``'s (σ 6°, up to 18°) for nearly all, while the views differ from the crop by over twice the targets' own
spread. It was fixed from the worlds' settings, before any error was measured with it.

**What each law sees** (:func:`orbit_parts`, the generalization of :func:`alfa.gaze.flip.flip_parts`). Write the
error as a field ``e(x) = f(x) − y(x)`` over images; since the labels obey both laws, averaging the rolled-back and
mirrored-back predictions over a group of views averages ``e`` the same way. With ``P_F`` the average over the flip
group, ``P_R`` over the rolls by multiples of the declared angle (the cyclic group it generates, 45 rolls for 8°:
what a roll-consistency loss at that angle constrains once chained) and ``P_G = P_F P_R = P_R P_F`` over both (the
dihedral group), the error splits exactly into four parts:

    e = P_G e  +  (1 − P_F) P_R e  +  P_F (1 − P_R) e  +  (1 − P_F)(1 − P_R) e
        neither    the flip only      the roll only        both

A constant yaw offset is seen by both, a constant pitch offset by the roll only (its mirror image is itself), an
error that turns with the image (e.g. a gain on the angle from the camera axis) by neither. The roll's share needs
the whole orbit, crops rolled up to 180°: it says what a roll signal can see in principle, not what a roll-TTA at
±8° removes (that average keeps ``(1 + 2 cos 8°)/3`` = 99 % of a constant offset; a consistency loss is what
removes it).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass

import torch
from torch import Tensor, nn

from .data.base import GazeDataset
from .evaluate import EVAL_BATCH_SIZE, eval_indices, load_examples, predict_images
from .flip import FlipTTA, flip_tta_from
from .geometry import angular_error, flip_yaw, pitchyaw_to_vector, roll_gaze, roll_images, vector_to_pitchyaw

__all__ = [
    "ROLL_TTA_DEG",
    "ROLL_TTA_ANGLES",
    "ORBIT_STEPS",
    "TTAKind",
    "TTA_KINDS",
    "tta_kind",
    "tta_views",
    "tta_combine",
    "RollTTA",
    "GroupTTA",
    "OrbitParts",
    "predict_orbit",
    "orbit_parts",
    "person_orbit_parts",
]

_DEG = 180.0 / math.pi

ROLL_TTA_DEG = 8.0
"""The declared roll of roll-TTA, in degrees, used as ``±`` (module docstring: why 8°)."""

ROLL_TTA_ANGLES: tuple[float, ...] = (0.0, ROLL_TTA_DEG * math.pi / 180, -ROLL_TTA_DEG * math.pi / 180)
"""The rolls (radians) of the roll-TTA views: the crop itself, then ``±`` :data:`ROLL_TTA_DEG`."""


def tta_views(images: Tensor, flips: Sequence[bool], angles: Sequence[float]) -> list[Tensor]:
    """The views of ``images`` ``(N, 3, H, W)`` (square) a TTA predicts on: for each flip (``False``: the crop,
    ``True``: its mirror image), the crop rolled by each angle, in that order."""
    out = []
    for flip in flips:
        base = torch.flip(images, dims=[-1]) if flip else images
        out.extend(base if angle == 0 else roll_images(base, angle).to(images.dtype) for angle in angles)
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


# ----------------------------------------------------------------------------- what a flip and a roll see


@dataclass(frozen=True)
class OrbitParts:
    """How one set of predictions splits under the flip and the roll (module docstring), in degrees.

    ``error``: mean angular error; ``mse``: mean of ``||e||²`` with ``e`` the difference of the predicted and the
    true unit vectors (squared degrees: for small errors the chord is the angle). The shares are of ``mse``:
    ``flip_seen`` of ``||(1 − P_F) e||²``, ``roll_seen`` of ``||(1 − P_R) e||²``, and the four exact parts
    ``neither``, ``flip_only``, ``roll_only``, ``both``, with ``cross`` the share of their cross terms (the four and
    ``cross`` add up to 1; on a dataset closed under the group the cross terms vanish). ``roll_steps``: the
    rolls of the cyclic group (360° / steps apart)."""

    error: float
    mse: float
    flip_seen: float
    roll_seen: float
    neither: float
    flip_only: float
    roll_only: float
    both: float
    cross: float
    roll_steps: int

    def to_dict(self) -> dict[str, float]:
        return asdict(self)


def _orbit_views(steps: int) -> tuple[tuple[bool, ...], tuple[float, ...]]:
    if steps < 2:
        raise ValueError(f"the roll group needs at least 2 steps, got {steps}")
    return (False, True), tuple(2 * math.pi * k / steps for k in range(steps))


ORBIT_STEPS = round(360 / ROLL_TTA_DEG)
"""The rolls of the cyclic group the declared angle generates (45 for 8°)."""


@torch.no_grad()
def predict_orbit(
    model: nn.Module, images: Tensor, steps: int = ORBIT_STEPS, batch_size: int = EVAL_BATCH_SIZE
) -> Tensor:
    """``(2, steps, N, 2)``: the model's predictions on ``images`` (``s = 0``) and their mirror images (``s = 1``)
    rolled by ``2π k / steps`` (``k``), as they come (not rolled back)."""
    flips, angles = _orbit_views(steps)
    preds = [predict_images(model, v, batch_size=batch_size) for v in tta_views(images, flips, angles)]
    return torch.stack(preds).view(2, steps, *preds[0].shape)


def orbit_parts(orbit: Tensor, labels: Tensor) -> OrbitParts:
    """Split the error of the predictions on the crops (``orbit[0, 0]``) against ``labels`` (``(N, 2)`` radians)
    into what the flip, the roll, both and neither see, from the predictions on the whole orbit
    (:func:`predict_orbit`)."""
    if orbit.ndim != 4 or orbit.shape[0] != 2 or orbit.shape[-1] != 2 or orbit.shape[2] == 0:
        raise ValueError(f"orbit predictions must be (2, steps, N, 2) with N >= 1, got {tuple(orbit.shape)}")
    if labels.shape != orbit.shape[2:]:
        raise ValueError(f"labels {tuple(labels.shape)} do not match predictions {tuple(orbit.shape[2:])}")
    steps = orbit.shape[1]
    orbit, labels = orbit.detach().double(), labels.detach().double()
    angles = torch.tensor([2 * math.pi * k / steps for k in range(steps)], dtype=orbit.dtype)
    back = roll_gaze(orbit, -angles[None, :, None])  # each view's prediction in its own crop's frame
    back = torch.stack((back[0], flip_yaw(back[1])))
    vec = pitchyaw_to_vector(back) * _DEG  # (2, steps, N, 3); differences of these are in degrees
    f, y = vec[0, 0], pitchyaw_to_vector(labels) * _DEG
    p_flip, p_roll, p_both = vec[:, 0].mean(0), vec[0].mean(0), vec.mean((0, 1))
    e = f - y
    pieces = {
        "neither": p_both - y,
        "flip_only": p_roll - p_both,
        "roll_only": p_flip - p_both,
        "both": f - p_flip - p_roll + p_both,
    }
    mse = float((e**2).sum(-1).mean())
    share = (lambda x: float((x**2).sum(-1).mean()) / mse) if mse > 0 else (lambda x: float("nan"))
    shares = {name: share(x) for name, x in pieces.items()}
    return OrbitParts(
        error=float(angular_error(orbit[0, 0], labels).mean()),
        mse=mse,
        flip_seen=share(f - p_flip),
        roll_seen=share(f - p_roll),
        **shares,
        cross=1.0 - sum(shares.values()) if mse > 0 else float("nan"),
        roll_steps=steps,
    )


def person_orbit_parts(
    model: nn.Module,
    dataset: GazeDataset,
    persons: Sequence[str],
    n_adapt: int,
    steps: int = ORBIT_STEPS,
    batch_size: int = EVAL_BATCH_SIZE,
) -> dict[str, OrbitParts]:
    """:class:`OrbitParts` of ``model`` per person, over the person's scored images (those after the first
    ``n_adapt``); ``2 · steps`` forward passes per image."""
    out: dict[str, OrbitParts] = {}
    for person in persons:
        images, labels = load_examples(dataset, eval_indices(dataset, person, n_adapt))
        out[person] = orbit_parts(predict_orbit(model, images, steps, batch_size), labels)
    return out
