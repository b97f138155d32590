"""What a flip and a roll can see of a gaze model's error: the generalization of :func:`alfa.gaze.flip.flip_parts`
from the flip to the roll and to both (issue 26).

Write the error as a field ``e(x) = f(x) − y(x)`` over images; since the labels obey both laws, averaging the
rolled-back and mirrored-back predictions over a group of views averages ``e`` the same way. With ``P_F`` the
average over the flip group, ``P_R`` over the rolls by multiples of the declared angle (the cyclic group it
generates, 45 rolls for 8°: what a roll-consistency loss at that angle constrains once chained) and
``P_G = P_F P_R = P_R P_F`` over both (the dihedral group), the error splits exactly into four parts:

    e = P_G e  +  (1 − P_F) P_R e  +  P_F (1 − P_R) e  +  (1 − P_F)(1 − P_R) e
        neither    the flip only      the roll only        both

A constant yaw offset is seen by both, a constant pitch offset by the roll only (its mirror image is itself), an
error that turns with the image (e.g. a gain on the angle from the camera axis) by neither. The roll's share needs
the whole orbit, crops rolled up to 180°: it says what a roll signal can see in principle, not what a roll-TTA at
±8° removes (that average keeps ``(1 + 2 cos 8°)/3`` = 99 % of a constant offset; a consistency loss is what
removes it).

Read the shares with the model in mind. The four parts add up to the error exactly for any model, but they are
orthogonal only on data closed under the group and for errors that vary smoothly along the orbit; a model trained on
heads rolled by a few degrees predicts nonsense on upside-down crops, those predictions enter every average, and the
shares then exceed 1 with large negative cross terms. The shares mean what their names say for models whose errors
along the orbit are bounded (the constructed ones of tests/test_tta.py, or models trained with roll augmentation).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass

import torch
from torch import Tensor, nn

from .data.base import GazeDataset
from .evaluate import EVAL_BATCH_SIZE, eval_indices, load_examples, predict_images
from .geometry import angular_error, flip_yaw, pitchyaw_to_vector, roll_gaze
from .tta import ROLL_TTA_DEG, tta_views

__all__ = ["ORBIT_STEPS", "OrbitParts", "predict_orbit", "orbit_parts", "person_orbit_parts"]

_DEG = 180.0 / math.pi


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
