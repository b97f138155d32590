"""The views of a personalization batch: what each objective asks the batch to hold.

A view is one transformed copy of the person's ``N`` images (the originals, their augmented copies, the
horizontal flips of either, their rolls about the camera axis, ...). An objective
(:class:`alfa.gaze.objectives.Objective`) declares the views it needs, in order;
:func:`alfa.gaze.personalize.build_batch` stacks them, ``N`` rows each, and the objective's loss reads its
predictions back by view (:func:`view_rows`). The flip objectives declare :data:`FLIP_VIEWS`, the layout every
objective had before views existed, so their batches are the same tensors as before.

A roll view (:func:`rolled`) rolls the image **inside its inscribed disc** (:func:`disc_mask`) and keeps the
corners of the unrolled image: :func:`alfa.gaze.geometry.roll_images` brings zeros into the corners, and the roll
law holds only inside the disc. Of the three ways, a plain roll puts black wedges in the rolled image only;
masking both images to the disc makes the law exact but moves every prediction, the unrolled ones too, away
from those on the images as they are scored (a model reacts to black corners); a roll inside the disc leaves
the unrolled branch the image itself and brings in no black. The last is what the views do (the corners of a
rolled view are those of the unrolled image, a small seam at the circle: they carry little of the gaze).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from .geometry import roll_images

__all__ = [
    "View",
    "VIEWS",
    "FLIP_VIEWS",
    "ROLL_DEGREES",
    "register_view",
    "disc_mask",
    "roll_in_disc",
    "rolled",
    "roll_view_name",
    "roll_angle",
    "build_views",
    "view_rows",
]


@dataclass(frozen=True)
class View:
    """One view: its name and how it is made from the ``(N, 3, H, W)`` originals and their augmented copies.
    ``roll`` is the view's roll about the camera axis in radians (0 for an unrolled one)."""

    name: str
    build: Callable[[Tensor, Tensor], Tensor]
    roll: float = 0.0


VIEWS: dict[str, View] = {}
"""Every view by name."""


def register_view(view: View) -> View:
    """Add ``view`` to :data:`VIEWS` (a name may be registered once)."""
    if view.name in VIEWS:
        raise ValueError(f"view {view.name!r} is already registered")
    VIEWS[view.name] = view
    return view


def disc_mask(size: int, dtype: torch.dtype = torch.float32) -> Tensor:
    """``(size, size)`` ones on the pixels whose centres lie inside the image's inscribed circle, zeros outside
    (the part of a square image that a rotation about its centre keeps inside the image)."""
    centre = (size - 1) / 2
    coords = torch.arange(size, dtype=torch.float64) - centre
    radius2 = coords[:, None] ** 2 + coords[None, :] ** 2
    return (radius2 <= (size / 2) ** 2).to(dtype)


def _flip(images: Tensor) -> Tensor:
    return torch.flip(images, dims=[-1])


ROLL_DEGREES = 8.0
"""The roll of the roll views, ±8°, fixed (declared from the worlds, never from an error): the narrowest
source's head roll (ETH's and the studio's: σ = 4°, clipped at 3σ = 12°; Gaze360's σ is 6°, the targets' 3°;
``alfa.gaze.data.synthetic.domains``) is 2σ = 8°, so a face of typical roll (within 1σ) rolled by it stays
inside the 12° the source model was trained on. Fixed rather than drawn per step: the personalization batch
is built once per person (the augmented copies are fixed over the steps too), and a ± pair keeps the batch's
mean roll at zero."""


def roll_in_disc(images: Tensor, angle: float) -> Tensor:
    """``images`` rolled by ``angle`` (radians, :func:`alfa.gaze.geometry.roll_images`) inside their inscribed disc,
    the corners outside it those of the images as they were: the one roll of the project (the roll views here, the
    roll TTA of :mod:`alfa.gaze.tta`)."""
    mask = disc_mask(images.shape[-1], images.dtype).to(images.device)
    return roll_images(images, angle).to(images.dtype) * mask + images * (1 - mask)


def roll_view_name(degrees: float, augmented: bool = False) -> str:
    """The name of the view of the originals (or augmented copies) rolled by ``degrees``: ``rolled +8°``,
    ``augmented rolled -8°``; the one place a roll view's name is made (the objectives name their views by it)."""
    return f"{'augmented ' if augmented else ''}rolled {degrees:+g}°"


def rolled(degrees: float, augmented: bool = False) -> View:
    """The view of the originals (or augmented copies) rolled by ``degrees`` about the camera axis inside their
    inscribed disc, the corners kept as they were (:func:`roll_in_disc`), named by :func:`roll_view_name`."""
    angle = math.radians(degrees)

    def build(images: Tensor, aug: Tensor) -> Tensor:
        return roll_in_disc(aug if augmented else images, angle)

    return View(roll_view_name(degrees, augmented), build, angle)


for _view in (
    View("original", lambda images, aug: images),
    View("augmented", lambda images, aug: aug),
    View("flipped", lambda images, aug: _flip(images)),
    View("flipped augmented", lambda images, aug: _flip(aug)),
    rolled(ROLL_DEGREES),
    rolled(-ROLL_DEGREES),
    rolled(ROLL_DEGREES, augmented=True),
    rolled(-ROLL_DEGREES, augmented=True),
):
    register_view(_view)

FLIP_VIEWS = ("original", "augmented", "flipped", "flipped augmented")
"""The flip objectives' views: ``[originals | augmented | flipped originals | flipped augmented]``."""


def roll_angle(name: str) -> float:
    """The roll of view ``name`` in radians."""
    return VIEWS[name].roll


def build_views(images: Tensor, augmented: Tensor, views: Sequence[str]) -> Tensor:
    """The batch ``(len(views)·N, 3, H, W)``: each view of ``images`` (with ``augmented``, their augmented
    copies) in the order of ``views``."""
    unknown = [v for v in views if v not in VIEWS]
    if unknown:
        raise ValueError(f"unknown view(s) {unknown}; views are {', '.join(VIEWS)}")
    return torch.cat([VIEWS[v].build(images, augmented) for v in views])


def view_rows(pred: Tensor, views: Sequence[str]) -> dict[str, Tensor]:
    """The rows of ``pred`` (the predictions on a batch of :func:`build_views`) by view name."""
    if not views or pred.shape[0] % len(views):
        raise ValueError(f"{pred.shape[0]} predictions do not split into the {len(views)} views {tuple(views)}")
    return dict(zip(views, pred.chunk(len(views))))
