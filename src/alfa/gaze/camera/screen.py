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

A point may name the photo of the person looking at its screen pixel instead of its gaze
(``{"photo": "calib/p1.jpg", "screen_px": [x, y]}``, relative to the file's folder): the model that will read
the person's photos reads it, with the same camera (:meth:`CalibrationPoints.fit`'s ``gaze_of``).

degree 1 is affine (3 unknowns per axis: at least 3 points), degree 2 a quadratic (6: at least 6). Such a fit
absorbs the person's offset between their optical and visual axes as well, which a geometry cannot: it
composes with an adapter's calibration (the fit takes the adapted model's gaze).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from .normalize import _float_array, read_json_file, refuse_unknown_keys, whole_number

__all__ = [
    "ILL_CONDITIONED",
    "Screen",
    "ScreenFit",
    "CalibrationPoints",
    "load_screen",
    "load_screen_fit",
    "read_calibration_points",
    "fit_screen",
]

_SCREEN_IN_CAMERA_PLANE = np.diag([-1.0, 1.0, -1.0])
_SIZES = ("width_mm", "height_mm", "width_px", "height_px")


BEHIND_THE_SCREEN = (
    "the face is behind the screen's plane as its top_left_mm and rotation place it: the screen's x axis runs left "
    "to right and its y axis top to bottom as the person sees it, so x × y points away from the person, and the "
    "plane lies between the person and the camera's far side (top_left_mm's z is the screen's depth: near 0 for a "
    "camera on its frame)"
)
"""A screen point's error where the face is on the wrong side of the screen: never so in a real set-up, so the
screen file is wrong (``alfa predict`` refuses a run where every face is)."""


@dataclass
class Screen:
    """A screen's size (``mm`` and pixels) and pose (``top_left_mm``, ``rotation``) in the camera frame."""

    width_mm: float
    height_mm: float
    width_px: int
    height_px: int
    top_left_mm: np.ndarray
    rotation: np.ndarray = field(default_factory=lambda: _SCREEN_IN_CAMERA_PLANE.copy())

    def pixel_mm(self, x_px: float, y_px: float) -> np.ndarray:
        """The camera-frame position (mm) of the screen pixel ``(x_px, y_px)``: what :meth:`point` gives back for
        a ray through it."""
        on_plane = np.array([x_px * self.width_mm / self.width_px, y_px * self.height_mm / self.height_px, 0.0])
        return self.top_left_mm + self.rotation @ on_plane

    def faces_it(self, origin_mm: np.ndarray) -> bool:
        """Whether ``origin_mm`` (a face) is on the side of the screen its pixels are seen from."""
        return float(self.rotation[:, 2] @ (origin_mm - self.top_left_mm)) < 0

    def point(self, origin_mm: np.ndarray, gaze: np.ndarray) -> dict[str, Any]:
        """Where the ray from ``origin_mm`` along the camera-frame direction ``gaze`` meets the screen's plane:
        ``{"x_px", "y_px", "x_mm", "y_mm", "on_screen"}``, or ``{"error": ...}`` for a ray that never meets it."""
        normal = self.rotation[:, 2]
        if not self.faces_it(origin_mm):
            # a rotation whose x × y points at the person reads the screen from behind: left and right swapped
            return {"error": BEHIND_THE_SCREEN}
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
        low, high = (1, MAX_SCREEN_PX) if key.endswith("_px") else (MIN_SCREEN_MM, MAX_SCREEN_MM)
        if not low <= size <= high:  # a unit slip (metres for millimetres) would put every point far off
            raise ValueError(f"{path}: {key} is {data[key]!r}; a screen's is {low:,} to {high:,}")
    rotation = _float_array(data.get("rotation", _SCREEN_IN_CAMERA_PLANE), (3, 3), f"{path}: rotation")
    if not np.allclose(rotation.T @ rotation, np.eye(3), atol=1e-3) or np.linalg.det(rotation) < 0:
        raise ValueError(f"{path}: rotation must be a rotation matrix (orthonormal columns, determinant +1)")
    top_left = _float_array(data["top_left_mm"], (3,), f"{path}: top_left_mm")
    return Screen(sizes[0], sizes[1], int(sizes[2]), int(sizes[3]), top_left, rotation)


@dataclass
class ScreenFit:
    """A least-squares map from camera-frame gaze angles (degrees) to screen pixels: ``coefficients`` ``(terms,
    2)`` over the polynomial terms of ``degree``; ``rms_px`` its residual on the calibration points, and
    ``leave_one_out_px`` the error on each point of the fit made without it (root mean square; ``None`` with no
    point to spare): what to expect of a point the fit has not seen. ``condition``: the condition number of the
    fit's terms (angles in radians), which :meth:`warning` compares with :data:`ILL_CONDITIONED`."""

    degree: int
    coefficients: np.ndarray
    rms_px: float
    leave_one_out_px: float | None = None
    gaze_deg: np.ndarray = field(default_factory=lambda: np.zeros((0, 2)))
    screen_px: np.ndarray = field(default_factory=lambda: np.zeros((0, 2)))
    condition: float = 1.0

    def warning(self) -> str | None:
        """One line saying the fit is ill-conditioned (its calibration gazes barely spread, or nearly lie on one
        line), or ``None``: such a fit is kept, but a small error in a gaze moves its screen points far."""
        limit = ILL_CONDITIONED[self.degree]
        if self.condition <= limit:
            return None
        return (
            f"the screen fit is ill-conditioned (its terms' condition number {self.condition:.3g} is above "
            f"{limit:g}): the calibration gazes barely spread or nearly lie on one line, so a gaze error of a degree "
            "may move a screen point far; spread the points over the screen (a 3×3 grid)"
        )

    def summary(self) -> dict[str, Any]:
        """The fit's printable record: its degree, points (gaze and screen pixel) and errors."""
        return {
            "degree": self.degree,
            "rms_px": round(self.rms_px, 1),
            "leave_one_out_px": None if self.leave_one_out_px is None else round(self.leave_one_out_px, 1),
            "points": [
                {"gaze_deg": [round(float(v), 3) for v in g], "screen_px": [round(float(v), 1) for v in px]}
                for g, px in zip(self.gaze_deg, self.screen_px)
            ],
        }

    def point(self, yaw_deg: float, pitch_deg: float) -> dict[str, Any]:
        x, y = (_terms(np.array([[yaw_deg, pitch_deg]]), self.degree) @ self.coefficients)[0]
        return {"method": f"fit (degree {self.degree})", "x_px": round(float(x), 1), "y_px": round(float(y), 1)}


def _terms(angles: np.ndarray, degree: int) -> np.ndarray:
    yaw, pitch, one = angles[:, 0], angles[:, 1], np.ones(len(angles))
    columns = [one, yaw, pitch] + ([yaw * yaw, yaw * pitch, pitch * pitch] if degree == 2 else [])
    return np.stack(columns, 1)


# Where a fit's terms are ill-conditioned (ScreenFit.warning): the condition number of its design matrix with the
# angles in radians, the unit of a gaze's own range (a field of view spans about 1), so that the constant term and
# the angles are compared on one scale. A least-squares fit changes, relative to itself, by up to the condition
# number times its terms' relative error, which a gaze off by 1° (a good model's error) makes about 0.02: above
# 50 = 1/0.02 a 1° error can move the fitted map by as much as its own size. A quadratic's terms are the angles'
# squares, its condition about the square of the affine one's: 50² there. A 3×3 grid over a laptop's screen at
# arm's length (±15° by ±10°) is about 7 (affine) and 75 (quadratic); nine gazes scattered by 1° about one point,
# or by 0.3° about one line, are above 100 and 10,000.
ILL_CONDITIONED = {1: 50.0, 2: 50.0**2}

MAX_SCREEN_PX = 100_000
"""How far from the screen's top-left corner a calibration point may be, in pixels: beyond any screen (a typo)."""
MIN_SCREEN_MM, MAX_SCREEN_MM = 1, 100_000
"""A screen's side in millimetres: a watch's to a stadium's."""


def fit_screen(gaze_deg: np.ndarray, screen_px: np.ndarray, degree: int = 1) -> ScreenFit:
    """Fit ``screen_px`` ``(k, 2)`` from ``gaze_deg`` ``(k, 2)`` (yaw, pitch): affine (``degree`` 1) or
    quadratic (2). Refuses too few points, and points that leave the fit undetermined: gazes that repeat or lie on
    one line, and screen positions on one line (degree 1) or one conic (degree 2)."""
    if degree not in (1, 2):
        raise ValueError(f"degree must be 1 (affine) or 2 (quadratic), got {degree}")
    gaze_deg, screen_px = np.asarray(gaze_deg, np.float64), np.asarray(screen_px, np.float64)
    terms = _terms(gaze_deg, degree)
    if len(gaze_deg) < terms.shape[1]:
        raise ValueError(f"a degree-{degree} fit needs at least {terms.shape[1]} points, got {len(gaze_deg)}")
    if np.linalg.matrix_rank(terms) < terms.shape[1]:
        raise ValueError("the calibration gazes do not determine the fit (they lie on a line or repeat)")
    if np.linalg.matrix_rank(_terms(screen_px, degree)) < terms.shape[1]:
        # a model's gazes are never exactly on a line, so the check above passes where the targets are: the fit
        # then follows the gazes' noise in the direction the targets do not span (a 3×2 grid at degree 2 puts the
        # screen's centre a median 164 px off)
        shape = "on one line" if degree == 1 else "on one conic (two lines of points, say)"
        raise ValueError(
            f"the calibration points do not determine a degree-{degree} fit: their screen positions lie {shape}; "
            "spread them over the screen (a 3×3 grid serves either degree)"
        )
    coefficients, *_ = np.linalg.lstsq(terms, screen_px, rcond=None)
    rms = float(np.sqrt(np.mean(np.sum((terms @ coefficients - screen_px) ** 2, 1))))
    condition = float(np.linalg.cond(_terms(np.radians(gaze_deg), degree)))
    return ScreenFit(degree, coefficients, rms, _leave_one_out(terms, screen_px), gaze_deg, screen_px, condition)


def _leave_one_out(terms: np.ndarray, screen_px: np.ndarray) -> float | None:
    if len(terms) <= terms.shape[1]:
        return None  # without a point to spare the others do not determine a fit
    errors = []
    for i in range(len(terms)):
        keep = np.arange(len(terms)) != i
        if np.linalg.matrix_rank(terms[keep]) < terms.shape[1]:
            return None  # this point alone determines part of the fit
        coefficients, *_ = np.linalg.lstsq(terms[keep], screen_px[keep], rcond=None)
        errors.append(np.sum((terms[i] @ coefficients - screen_px[i]) ** 2))
    return float(np.sqrt(np.mean(errors)))


@dataclass
class CalibrationPoints:
    """A calibration file, read and checked (:func:`read_calibration_points`): each point's screen pixel and
    either its gaze (camera-frame degrees) or the photo of the person looking at it (``None`` in the other)."""

    source: str
    degree: int
    screen_px: np.ndarray
    gaze_deg: list[np.ndarray | None]
    photos: list[Path | None]

    def fit(self, gaze_of: Callable[[Path], np.ndarray] | None = None) -> ScreenFit:
        """The fit; ``gaze_of(photo)`` gives a photo point's gaze (the model's, as ``alfa predict`` prints it)."""
        gazes = []
        for i, (gaze, photo) in enumerate(zip(self.gaze_deg, self.photos), start=1):
            if photo is not None:
                if gaze_of is None:
                    raise ValueError(
                        f"{self.source}: point {i} names a photo ({photo}), whose gaze only a model gives (alfa "
                        "predict reads it with the --checkpoint and --adapter it reads the other photos with)"
                    )
                try:
                    gaze = np.asarray(gaze_of(photo), np.float64)
                except (ValueError, OSError) as e:
                    raise ValueError(f"{self.source}: point {i}'s photo {photo}: {e}") from None
            gazes.append(gaze)
        try:
            return fit_screen(np.stack(gazes), self.screen_px, self.degree)
        except ValueError as e:
            raise ValueError(f"{self.source}: {e}") from None


def load_screen_fit(path: str | os.PathLike) -> ScreenFit:
    """Fit a calibration file whose points give their gazes (the module's second example)."""
    return read_calibration_points(path).fit()


def read_calibration_points(path: str | os.PathLike, *, for_fit: bool = True) -> CalibrationPoints:
    """A calibration file's points, checked (keys, numbers, a named photo's existence) before any model runs;
    a file whose points all give their gazes is fitted here too, so that an undetermined fit is refused now.
    ``for_fit=False``: the points are read for another use than the screen fit (labelled photos), which any number
    of them serves."""
    data = _read_json(path)
    refuse_unknown_keys(data, ("degree", "points"), str(path))
    points = data.get("points")
    if not isinstance(points, list) or not all(isinstance(p, dict) for p in points):
        raise ValueError(
            f'{path}: expected {{"points": [{{"gaze_deg": [yaw, pitch] or "photo": file, "screen_px": [x, y]}}, ...]}}'
        )
    screen = np.zeros((len(points), 2))
    gazes: list[np.ndarray | None] = []
    photos: list[Path | None] = []
    for i, point in enumerate(points, start=1):
        refuse_unknown_keys(point, ("gaze_deg", "photo", "screen_px"), f"{path}: point {i}")
        if "screen_px" not in point:
            raise ValueError(f"{path}: point {i} has no screen_px")
        screen[i - 1] = _float_array(point["screen_px"], (2,), f"{path}: point {i}'s screen_px")
        if (np.abs(screen[i - 1]) > MAX_SCREEN_PX).any():
            raise ValueError(
                f"{path}: point {i}'s screen_px {point['screen_px']} lies beyond ±{MAX_SCREEN_PX:,} px of the "
                "screen's corner"
            )
        gaze, photo = _point_gaze(point, i, path)
        gazes.append(gaze)
        photos.append(photo)
    degree = data.get("degree", 1)
    if degree not in (1, 2) or isinstance(degree, bool):
        raise ValueError(f"{path}: degree must be 1 (affine) or 2 (quadratic), got {degree!r}")
    read = CalibrationPoints(str(path), int(degree), screen, gazes, photos)
    needed = _terms(np.zeros((1, 2)), read.degree).shape[1]
    if for_fit and len(points) < needed:
        raise ValueError(f"{path}: a degree-{read.degree} fit needs at least {needed} points, got {len(points)}")
    if not points:
        raise ValueError(f"{path}: no points")
    if for_fit and not any(p is not None for p in photos):
        read.fit()
    return read


def _point_gaze(point: dict[str, Any], i: int, path: str | os.PathLike) -> tuple[np.ndarray | None, Path | None]:
    if ("gaze_deg" in point) == ("photo" in point):
        raise ValueError(
            f"{path}: point {i} needs either gaze_deg or photo" + (", not both" if "photo" in point else "")
        )
    if "photo" in point:
        if not isinstance(point["photo"], str) or not point["photo"]:
            raise ValueError(f"{path}: point {i}'s photo must be a file name, got {point['photo']!r}")
        photo = Path(path).parent / point["photo"]  # an absolute name stays as it is
        if not photo.is_file():
            what = "a folder, not a photo" if photo.is_dir() else "no such file"
            raise ValueError(f"{path}: point {i}'s photo {photo}: {what}")
        return None, photo
    gaze = _float_array(point["gaze_deg"], (2,), f"{path}: point {i}'s gaze_deg")
    if (np.abs(gaze) > 90).any():
        raise ValueError(f"{path}: point {i}'s gaze_deg {point['gaze_deg']} lies beyond ±90° (yaw, pitch)")
    return gaze, None


def _read_json(path: str | os.PathLike) -> dict[str, Any]:
    data = read_json_file(path)
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a JSON object")
    return data
