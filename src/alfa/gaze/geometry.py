"""Gaze geometry in the conventions of the field (spec gaze-data §1).

Directions are ``(yaw, pitch)`` in radians in the normalized camera frame, as the last dimension of
a tensor. The 3-D unit vector is ``(cos p · sin y, sin p, cos p · cos y)``; GazeHub stores the
negated vector, which :func:`gazehub_vector_to_pitchyaw` undoes. (The name ``pitchyaw`` follows the
field's habit; the order is always ``(yaw, pitch)``.)
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

__all__ = [
    "pitchyaw_to_vector",
    "vector_to_pitchyaw",
    "gazehub_vector_to_pitchyaw",
    "angular_error",
    "flip_yaw",
    "roll_gaze",
    "roll_images",
]


def _as_tensor(x: Tensor | list | tuple) -> Tensor:
    t = torch.as_tensor(x)
    return t if t.is_floating_point() else t.to(torch.get_default_dtype())


def _check_last_dim(t: Tensor, size: int, what: str) -> None:
    if t.ndim == 0 or t.shape[-1] != size:
        raise ValueError(f"{what} must have last dimension {size}, got shape {tuple(t.shape)}")


def pitchyaw_to_vector(yaw_pitch: Tensor) -> Tensor:
    """``(..., 2)`` ``(yaw, pitch)`` radians -> ``(..., 3)`` unit vectors ``(x, y, z)``."""
    g = _as_tensor(yaw_pitch)
    _check_last_dim(g, 2, "yaw_pitch")
    yaw, pitch = g[..., 0], g[..., 1]
    return torch.stack((torch.cos(pitch) * torch.sin(yaw), torch.sin(pitch), torch.cos(pitch) * torch.cos(yaw)), -1)


def vector_to_pitchyaw(vector: Tensor) -> Tensor:
    """``(..., 3)`` vectors (any length) -> ``(..., 2)`` ``(yaw, pitch)`` radians; inverse of
    :func:`pitchyaw_to_vector`."""
    v = _as_tensor(vector)
    _check_last_dim(v, 3, "vector")
    v = v / v.norm(dim=-1, keepdim=True).clamp_min(1e-12)
    yaw = torch.atan2(v[..., 0], v[..., 2])
    pitch = torch.asin(v[..., 1].clamp(-1.0, 1.0))
    return torch.stack((yaw, pitch), -1)


def gazehub_vector_to_pitchyaw(vector: Tensor) -> Tensor:
    """A GazeHub 3-D gaze vector ``g`` (the negated convention) -> ``(yaw, pitch)``:
    ``yaw = atan2(-g_x, -g_z)``, ``pitch = asin(-g_y)``."""
    return vector_to_pitchyaw(-_as_tensor(vector))


def angular_error(pred: Tensor, target: Tensor) -> Tensor:
    """Angle in degrees between ``(..., 2)`` ``(yaw, pitch)`` predictions and labels (or ``(..., 3)``
    vectors). The cosine is clipped to ``[-1, 1]`` so parallel vectors give 0, not NaN."""
    a, b = _as_tensor(pred), _as_tensor(target)
    if a.shape != b.shape:
        raise ValueError(f"pred and target shapes differ: {tuple(a.shape)} vs {tuple(b.shape)}")
    if a.ndim and a.shape[-1] == 2:
        a, b = pitchyaw_to_vector(a), pitchyaw_to_vector(b)
    _check_last_dim(a, 3, "pred")
    cos = (a * b).sum(-1) / (a.norm(dim=-1) * b.norm(dim=-1)).clamp_min(1e-12)
    return torch.rad2deg(torch.arccos(cos.clamp(-1.0, 1.0)))


def flip_yaw(yaw_pitch: Tensor) -> Tensor:
    """The label of the horizontally flipped image: ``(yaw, pitch) -> (-yaw, pitch)``."""
    g = _as_tensor(yaw_pitch)
    _check_last_dim(g, 2, "yaw_pitch")
    return torch.stack((-g[..., 0], g[..., 1]), -1)


def roll_gaze(yaw_pitch: Tensor, angle: Tensor | float) -> Tensor:
    """The label of the image rolled by ``angle`` (radians; :func:`roll_images`): the gaze vector rotated by
    ``angle`` about the camera axis, ``(x, y) -> (x cos a - y sin a, x sin a + y cos a)``, ``z`` unchanged.

    ``angle`` is a number or a tensor broadcast against the batch (one angle per row). Unlike the flip, a roll
    moves pitch into yaw, so a constant offset ``b`` of a model ``f = g + b`` shows in the roll residual
    ``f(roll x) - roll(f(x)) = b - roll(b)``."""
    g = _as_tensor(yaw_pitch)
    _check_last_dim(g, 2, "yaw_pitch")
    a = torch.as_tensor(angle, dtype=g.dtype)
    v = pitchyaw_to_vector(g)
    cos, sin = torch.cos(a), torch.sin(a)
    x, y = v[..., 0] * cos - v[..., 1] * sin, v[..., 0] * sin + v[..., 1] * cos
    return vector_to_pitchyaw(torch.stack((x, y, v[..., 2]), -1))


def roll_images(images: Tensor, angle: Tensor | float) -> Tensor:
    """``(N, C, H, W)`` square images rotated by ``angle`` (radians) about their centre, the image of the scene
    rolled about the camera axis (orthographic normalized crops): what was at ``(x, y)`` of the d-frame moves to
    its rotation by ``angle``, so :func:`roll_gaze` with the same angle is the new label.

    Bilinear sampling; the corners the rotation brings in from outside the image are zero, which is why the
    roll law only holds inside the image's inscribed circle. ``angle`` is a number or ``(N,)`` tensor."""
    if images.ndim != 4 or images.shape[-1] != images.shape[-2]:
        raise ValueError(f"images must be (N, C, H, W) with H == W, got shape {tuple(images.shape)}")
    n = images.shape[0]
    dtype = images.dtype if images.is_floating_point() else torch.float32
    a = torch.as_tensor(angle, dtype=dtype).expand(n)
    cos, sin = torch.cos(a), torch.sin(a)
    # Pixel u (column, right) and v (row, down) are -x and -y of the d-frame, and a rotation commutes with that
    # negation, so the content moves by the same rotation in (u, v); the grid maps each output pixel to the input
    # point it shows, the inverse rotation.
    zero = torch.zeros_like(a)
    theta = torch.stack((torch.stack((cos, sin, zero), -1), torch.stack((-sin, cos, zero), -1)), -2)
    grid = torch.nn.functional.affine_grid(theta, list(images.shape), align_corners=False)
    return torch.nn.functional.grid_sample(
        images.to(dtype), grid, mode="bilinear", padding_mode="zeros", align_corners=False
    )


DEG = math.pi / 180.0
