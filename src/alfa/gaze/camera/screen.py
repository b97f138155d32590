"""Where on a screen a person looks: by ray–plane intersection with a known screen geometry, or by a fit
from a few calibration points when the geometry is unknown.

A screen file (JSON) gives the screen's size and pose in the camera frame (OpenCV axes, millimetres)::

    {"width_mm": 344, "height_mm": 194, "width_px": 1920, "height_px": 1080,
     "top_left_mm": [172, 8, 0],
     "rotation": [[-1, 0, 0], [0, 1, 0], [0, 0, -1]]}

``rotation``'s columns are the screen's axes in the camera frame: ``x`` along its top edge to the right (as
the person sees it), ``y`` down its left edge, ``z`` their cross product. Left out, it is the one above:
the screen in the camera's own plane, facing the person (a laptop's webcam above its screen), so the
screen's right is the camera image's left. ``top_left_mm`` is the screen's top-left pixel corner in the
camera frame (above: a camera 8 mm above the top edge's middle).

A calibration file instead lists gaze directions (camera frame, degrees, as ``alfa predict`` prints them)
with the screen points the person looked at, and a fit maps one to the other::

    {"degree": 1, "points": [{"gaze_deg": [yaw, pitch], "screen_px": [x, y]}, ...]}

degree 1 is affine (3 unknowns per axis: at least 3 points), degree 2 a quadratic (6: at least 6). Such a fit
absorbs the person's offset between their optical and visual axes as well, which a geometry cannot: it
composes with an adapter's calibration (the fit takes the adapted model's gaze).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from .normalize import _float_array, refuse_unknown_keys, whole_number

__all__ = ["Screen", "ScreenFit", "load_screen", "load_screen_fit", "fit_screen"]

_SCREEN_IN_CAMERA_PLANE = np.diag([-1.0, 1.0, -1.0])
_SIZES = ("width_mm", "height_mm", "width_px", "height_px")


@dataclass
class Screen:
    """A screen's size (``mm`` and pixels) and pose (``top_left_mm``, ``rotation``) in the camera frame."""

    width_mm: float
    height_mm: float
    width_px: int
    height_px: int
    top_left_mm: np.ndarray
    rotation: np.ndarray = field(default_factory=lambda: _SCREEN_IN_CAMERA_PLANE.copy())

    def point(self, origin_mm: np.ndarray, gaze: np.ndarray) -> dict[str, Any]:
        """Where the ray from ``origin_mm`` along the camera-frame direction ``gaze`` meets the screen's plane:
        ``{"x_px", "y_px", "x_mm", "y_mm", "on_screen"}``, or ``{"error": ...}`` for a ray that never meets it."""
        normal = self.rotation[:, 2]
        facing = float(normal @ gaze)
        if abs(facing) < 1e-9:
            return {"error": "the gaze runs parallel to the screen"}
        t = float(normal @ (self.top_left_mm - origin_mm)) / facing
        if t <= 0:
            return {"error": "the gaze points away from the screen"}
        on_plane = self.rotation.T @ (origin_mm + t * gaze - self.top_left_mm)
        x_mm, y_mm = float(on_plane[0]), float(on_plane[1])
        x_px, y_px = x_mm * self.width_px / self.width_mm, y_mm * self.height_px / self.height_mm
        inside = 0 <= x_px <= self.width_px and 0 <= y_px <= self.height_px
        return {
            "method": "geometry",
            "x_px": round(x_px, 1),
            "y_px": round(y_px, 1),
            "x_mm": round(x_mm, 2),
            "y_mm": round(y_mm, 2),
            "on_screen": inside,
        }


def load_screen(path: str | os.PathLike) -> Screen:
    """A :class:`Screen` from its JSON file (the module's first example); ``ValueError`` names what is wrong."""
    data = _read_json(path)
    refuse_unknown_keys(data, (*_SIZES, "top_left_mm", "rotation"), str(path))
    missing = [k for k in (*_SIZES, "top_left_mm") if k not in data]
    if missing:
        raise ValueError(f"{path}: missing {', '.join(missing)} (see docs/camera.md for the screen file)")
    sizes = [float(_float_array(data[k], (), f"{path}: {k}")) for k in _SIZES]
    for key, size in zip(_SIZES, sizes):
        if size <= 0:
            raise ValueError(f"{path}: {key} must be positive, got {data[key]!r}")
        if key.endswith("_px"):
            whole_number(data[key], f"{path}: {key}")
    rotation = _float_array(data.get("rotation", _SCREEN_IN_CAMERA_PLANE), (3, 3), f"{path}: rotation")
    if not np.allclose(rotation.T @ rotation, np.eye(3), atol=1e-3) or np.linalg.det(rotation) < 0:
        raise ValueError(f"{path}: rotation must be a rotation matrix (orthonormal columns, determinant +1)")
    top_left = _float_array(data["top_left_mm"], (3,), f"{path}: top_left_mm")
    return Screen(sizes[0], sizes[1], int(sizes[2]), int(sizes[3]), top_left, rotation)


@dataclass
class ScreenFit:
    """A least-squares map from camera-frame gaze angles (degrees) to screen pixels: ``coefficients`` ``(terms,
    2)`` over the polynomial terms of ``degree``; ``rms_px`` its residual on the calibration points."""

    degree: int
    coefficients: np.ndarray
    rms_px: float

    def point(self, yaw_deg: float, pitch_deg: float) -> dict[str, Any]:
        x, y = (_terms(np.array([[yaw_deg, pitch_deg]]), self.degree) @ self.coefficients)[0]
        return {"method": f"fit (degree {self.degree})", "x_px": round(float(x), 1), "y_px": round(float(y), 1)}


def _terms(angles: np.ndarray, degree: int) -> np.ndarray:
    yaw, pitch, one = angles[:, 0], angles[:, 1], np.ones(len(angles))
    columns = [one, yaw, pitch] + ([yaw * yaw, yaw * pitch, pitch * pitch] if degree == 2 else [])
    return np.stack(columns, 1)


def fit_screen(gaze_deg: np.ndarray, screen_px: np.ndarray, degree: int = 1) -> ScreenFit:
    """Fit ``screen_px`` ``(k, 2)`` from ``gaze_deg`` ``(k, 2)`` (yaw, pitch): affine (``degree`` 1) or
    quadratic (2). Refuses too few points and points that leave the fit undetermined (all on one line)."""
    if degree not in (1, 2):
        raise ValueError(f"degree must be 1 (affine) or 2 (quadratic), got {degree}")
    gaze_deg, screen_px = np.asarray(gaze_deg, np.float64), np.asarray(screen_px, np.float64)
    terms = _terms(gaze_deg, degree)
    if len(gaze_deg) < terms.shape[1]:
        raise ValueError(f"a degree-{degree} fit needs at least {terms.shape[1]} points, got {len(gaze_deg)}")
    if np.linalg.matrix_rank(terms) < terms.shape[1]:
        raise ValueError("the calibration gazes do not determine the fit (they lie on a line or repeat)")
    coefficients, *_ = np.linalg.lstsq(terms, screen_px, rcond=None)
    rms = float(np.sqrt(np.mean(np.sum((terms @ coefficients - screen_px) ** 2, 1))))
    return ScreenFit(degree, coefficients, rms)


def load_screen_fit(path: str | os.PathLike) -> ScreenFit:
    """Fit a calibration file (the module's second example)."""
    data = _read_json(path)
    refuse_unknown_keys(data, ("degree", "points"), str(path))
    points = data.get("points")
    if not isinstance(points, list) or not all(isinstance(p, dict) for p in points):
        raise ValueError(f'{path}: expected {{"points": [{{"gaze_deg": [yaw, pitch], "screen_px": [x, y]}}, ...]}}')
    gaze, screen = np.zeros((len(points), 2)), np.zeros((len(points), 2))
    for i, point in enumerate(points, start=1):
        refuse_unknown_keys(point, ("gaze_deg", "screen_px"), f"{path}: point {i}")
        for key, out in (("gaze_deg", gaze), ("screen_px", screen)):
            if key not in point:
                raise ValueError(f"{path}: point {i} has no {key}")
            out[i - 1] = _float_array(point[key], (2,), f"{path}: point {i}'s {key}")
        if (np.abs(gaze[i - 1]) > 90).any():
            raise ValueError(f"{path}: point {i}'s gaze_deg {point['gaze_deg']} lies beyond ±90° (yaw, pitch)")
    degree = data.get("degree", 1)
    if degree not in (1, 2) or isinstance(degree, bool):
        raise ValueError(f"{path}: degree must be 1 (affine) or 2 (quadratic), got {degree!r}")
    try:
        return fit_screen(gaze, screen, int(degree))
    except ValueError as e:
        raise ValueError(f"{path}: {e}") from None


def _read_json(path: str | os.PathLike) -> dict[str, Any]:
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise ValueError(f"{path} is not JSON ({e.msg}, line {e.lineno})") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a JSON object")
    return data
