"""Head pose and data normalization: a camera image's face to the 224×224 crop every model here reads.

The method is Zhang, Sugano & Bulling, "Revisiting Data Normalization for Appearance-Based Gaze
Estimation" (ETRA 2018), as the ETH-XGaze release applies it:

1. the head pose ``(R_h, t)`` by ``solvePnP`` of a generic 3-D face model against the image landmarks;
2. the face centre ``c`` (camera frame, mm) from the eye and mouth landmarks of the posed model;
3. the normalizing rotation ``R``: its forward axis ``z`` points from the camera to ``c``, its ``y`` axis is
   ``z × x_h`` (``x_h`` the head's x-axis) and ``x = y × z``, so the crop is upright with the head;
4. the scaling ``S = diag(1, 1, d_n / |c|)`` to the normalized distance ``d_n`` (600 mm), and the normalized
   camera ``K_n`` (focal length 960, principal point at the crop's centre, 224×224);
5. the image warp ``W = K_n S R K⁻¹`` and, for gaze, the rotation alone: ``g_n = R g_c`` and back
   ``g_c = Rᵀ g_n`` (the 2018 variant: a scaling does not change a direction).

Conventions (checked against ``gazehub:`` and ``xgaze-h5:``, see :mod:`alfa.gaze.data.gazehub` and
:mod:`alfa.gaze.data.xgaze`): camera axes are OpenCV's (``x`` to the image's right, ``y`` down, ``z`` out of
the lens); a gaze direction ``g`` points from the face to what it looks at; its angles are
``yaw = atan2(-g_x, -g_z)``, ``pitch = asin(-g_y)`` (so a person looking into the camera has ``(0, 0)``,
positive yaw looks towards the image's left, positive pitch looks up), the order ``(yaw, pitch)`` and the
unit radians inside the code, degrees in what the commands print. This is the label convention of both
loaders (ETH-XGaze's h5 files store the same two angles in the order ``(pitch, yaw)``).
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ...fileio import kind_of_file
from ..geometry import pitchyaw_to_vector, vector_to_pitchyaw

__all__ = [
    "CONVENTION",
    "FACE_MODEL_MM",
    "LANDMARK_NAMES",
    "Camera",
    "HeadPose",
    "Normalization",
    "NormalizationConfig",
    "default_camera",
    "load_camera",
    "estimate_head_pose",
    "normalization_of",
    "warp_to_normalized",
    "warp_to_camera",
    "gaze_vector_to_angles",
    "angles_to_gaze_vector",
]

CONVENTION = (
    "yaw = atan2(-g_x, -g_z), pitch = asin(-g_y) of the gaze direction g (from the face to the target) in OpenCV "
    "camera axes (x right, y down, z out of the lens); degrees; (0, 0) looks into the camera, positive yaw towards "
    "the image's left, positive pitch up; the (yaw, pitch) of the gazehub: and xgaze-h5: labels (which are radians)"
)
"""What every printed gaze and head angle means, said in the output beside them."""

LANDMARK_NAMES = ("right_eye", "left_eye", "mouth_right", "mouth_left")
"""The four landmarks, in this order everywhere: the person's right eye and mouth corner are on the image's left."""

# A generic face in its own frame (mm): x to the person's left (the image's right when the face looks into the
# camera), y down, z into the head, origin between the eyes, so a face squarely facing the camera has R_h = I.
# Our own round numbers for an average adult: eye centres 63 mm apart (interpupillary distance), mouth corners
# 50 mm apart, 58 mm below the eyes and 8 mm behind them.
FACE_MODEL_MM = np.array(
    [[-31.5, 0.0, 0.0], [31.5, 0.0, 0.0], [-25.0, 58.0, 8.0], [25.0, 58.0, 8.0]],
    dtype=np.float64,
)
EYE_DISTANCE_MM = 63.0
# The face centre is the mean of the eye corners and the mouth corners (Zhang et al. 2018's choice for MPIIFaceGaze;
# ETH-XGaze's release averages the eye corners with the nostrils, which these four landmarks lack); each eye centre
# stands for its eye's two corners, so the eyes weigh twice.
FACE_CENTRE_WEIGHTS = np.array([2.0, 2.0, 1.0, 1.0]) / 6.0


@dataclass(frozen=True)
class NormalizationConfig:
    """The normalized camera: the distance the face is brought to, its focal length and the crop's size."""

    distance_mm: float = 600.0
    focal: float = 960.0
    size: int = 224

    def matrix(self) -> np.ndarray:
        c = self.size / 2.0
        return np.array([[self.focal, 0.0, c], [0.0, self.focal, c], [0.0, 0.0, 1.0]])


@dataclass
class Camera:
    """A camera's intrinsics: ``matrix`` (3×3, pixels), ``distortion`` (OpenCV's coefficients, possibly
    empty), ``image_size`` ``(width, height)`` it was calibrated for (``None``: any), and ``source``, which the
    output repeats (a file, or the default and what it assumes)."""

    matrix: np.ndarray
    distortion: np.ndarray = field(default_factory=lambda: np.zeros(0))
    image_size: tuple[int, int] | None = None
    source: str = "given"

    def check_fits(self, width: int, height: int) -> None:
        """Refuse intrinsics that cannot be this image's camera (``ValueError``, one line)."""
        fx, fy, cx, cy = self.matrix[0, 0], self.matrix[1, 1], self.matrix[0, 2], self.matrix[1, 2]
        if self.image_size is not None and tuple(self.image_size) != (width, height):
            w, h = self.image_size
            raise ValueError(f"{self.source} describes a {w}×{h} camera; this image is {width}×{height}")
        if not (0 <= cx <= width and 0 <= cy <= height):
            raise ValueError(
                f"{self.source}: the principal point ({cx:g}, {cy:g}) lies outside this {width}×{height} image"
            )
        longest = max(width, height)
        if not (0.1 * longest <= fx <= 20 * longest and 0.1 * longest <= fy <= 20 * longest):
            raise ValueError(
                f"{self.source}: focal lengths ({fx:g}, {fy:g}) px do not fit a {width}×{height} image "
                f"(expected {0.1 * longest:g} to {20 * longest:g})"
            )
        if not 0.5 <= fy / fx <= 2:  # a camera's pixels are close to square: fx and fy within a few per cent
            raise ValueError(f"{self.source}: focal lengths ({fx:g}, {fy:g}) px: one is over twice the other")
        stretch = self._corner_stretch(width, height)
        if not 0.25 <= stretch <= 4:
            raise ValueError(
                f"{self.source}: the distortion {_rounded(self.distortion)} moves this image's corner {stretch:.3g}× "
                "its distance from the centre (a lens's is within 0.25–4×): check the coefficients"
            )

    def _corner_stretch(self, width: int, height: int) -> float:
        """How many times its undistorted distance from the principal point the distortion puts an image corner
        at: of the four, the one moved most (by ratio, out or in). OpenCV's model and order: radial k1, k2, k3
        over k4, k5, k6, tangential p1, p2, thin prism s1–s4 (the tilt terms, rarely used, are not read)."""
        k1, k2, p1, p2, k3, k4, k5, k6, s1, s2, s3, s4 = np.pad(self.distortion[:12], (0, 12))[:12]
        fx, fy, cx, cy = self.matrix[0, 0], self.matrix[1, 1], self.matrix[0, 2], self.matrix[1, 2]
        stretches = []
        for x, y in (((u - cx) / fx, (v - cy) / fy) for u in (0, width) for v in (0, height)):
            r2 = x * x + y * y
            if r2 == 0:
                continue
            denominator = 1 + k4 * r2 + k5 * r2**2 + k6 * r2**3
            if denominator <= 0:
                return float("inf")
            radial = (1 + k1 * r2 + k2 * r2**2 + k3 * r2**3) / denominator
            moved_x = x * radial + 2 * p1 * x * y + p2 * (r2 + 2 * x * x) + s1 * r2 + s2 * r2**2
            moved_y = y * radial + p1 * (r2 + 2 * y * y) + 2 * p2 * x * y + s3 * r2 + s4 * r2**2
            stretches.append(float(np.hypot(moved_x, moved_y) / np.sqrt(r2)))
        return max(stretches, key=lambda s: abs(np.log(s)) if s > 0 else np.inf, default=1.0)

    def to_dict(self) -> dict[str, Any]:
        return {
            "matrix": _rounded(self.matrix),
            "distortion": _rounded(self.distortion),
            "source": self.source,
        }


def default_camera(width: int, height: int) -> Camera:
    """The intrinsics assumed when none are given: focal length the image's width (about a 53° horizontal
    field of view, a common webcam's), principal point at the centre, no distortion."""
    matrix = np.array([[width, 0.0, width / 2.0], [0.0, width, height / 2.0], [0.0, 0.0, 1.0]])
    source = "default (no --camera): focal length = image width, principal point = image centre, no distortion"
    return Camera(matrix, np.zeros(0), (width, height), source)


def load_camera(path: str | os.PathLike) -> Camera:
    """Intrinsics from a JSON file: ``{"matrix": [[fx, 0, cx], [0, fy, cy], [0, 0, 1]], "distortion": [k1, k2,
    p1, p2, k3] (optional), "image_size": [width, height] (optional)}``; ``ValueError`` names what is wrong."""
    path = Path(path)
    data = read_json_file(path)
    if not isinstance(data, dict) or "matrix" not in data:
        raise ValueError(f'{path}: expected {{"matrix": [[fx, 0, cx], [0, fy, cy], [0, 0, 1]], ...}}')
    refuse_unknown_keys(data, ("matrix", "distortion", "image_size"), str(path))
    matrix = _float_array(data["matrix"], (3, 3), f"{path}: matrix")
    if matrix[0, 1] != 0 or matrix[1, 0] != 0 or not np.allclose(matrix[2], [0, 0, 1]):
        raise ValueError(f"{path}: matrix must be [[fx, 0, cx], [0, fy, cy], [0, 0, 1]]")
    distortion = _float_array(data.get("distortion", []), None, f"{path}: distortion").reshape(-1)
    if distortion.size not in (0, 4, 5, 8, 12, 14):
        raise ValueError(f"{path}: distortion has {distortion.size} coefficients; OpenCV takes 4, 5, 8, 12 or 14")
    size = data.get("image_size")
    if size is not None:
        if not (isinstance(size, list) and len(size) == 2):
            raise ValueError(f"{path}: image_size must be [width, height], got {size!r}")
        size = tuple(whole_number(v, f"{path}: image_size") for v in size)  # true is no size: read before floats
        if min(size) < 1:
            raise ValueError(f"{path}: image_size must be positive, got {data['image_size']!r}")
    return Camera(matrix, distortion, size, str(path))


def read_json_file(path: str | os.PathLike) -> Any:
    """A JSON file's content; ``ValueError`` naming the file where it is not UTF-8 text (a UTF-8 byte-order mark is
    read; UTF-16, what some Windows shells write, is said as such where the bytes look like it, another 8-bit
    encoding such as Latin-1 otherwise) or not JSON."""
    raw = Path(path).read_bytes()
    try:
        return json.loads(raw.decode("utf-8-sig"))
    except UnicodeDecodeError as e:
        kind = kind_of_file(path)  # a photo named where its JSON file goes is no text in another encoding
        if kind not in (None, "a JSON file"):
            raise ValueError(f"{path} is {kind}, not a JSON file") from None
        raise ValueError(f"{path} is not UTF-8 text ({_encoding_guess(raw, e)} save it as UTF-8)") from None
    except json.JSONDecodeError as e:
        raise ValueError(f"{path} is not JSON ({e.msg}, line {e.lineno})") from None


def _encoding_guess(raw: bytes, error: UnicodeDecodeError) -> str:
    """What the bytes of a file that is not UTF-8 look like: UTF-16 only where they do (a UTF-16 byte-order mark,
    or a NUL in many of the first bytes, as ASCII text in UTF-16 has every other byte), else an 8-bit encoding
    such as Latin-1, with the first byte UTF-8 does not take."""
    head = raw[:256]
    if head.startswith((b"\xff\xfe", b"\xfe\xff")) or head.count(0) >= len(head) // 4 > 0:
        return "saved as UTF-16?"
    return (
        f"byte 0x{error.object[error.start]:02x} at offset {error.start}: saved in Latin-1 or another 8-bit encoding?"
    )


def refuse_unknown_keys(data: dict[str, Any], known: tuple[str, ...], what: str) -> None:
    """A key a file's reader does not know is refused (``ValueError`` naming it and the known ones): a misspelt
    optional key ("distorsion") would otherwise be left out without a word."""
    unknown = sorted(set(data) - set(known))
    if unknown:
        raise ValueError(f"{what}: unknown key {', '.join(map(repr, unknown))} (expected {', '.join(known)})")


def whole_number(value: Any, what: str) -> int:
    """``value`` as an ``int``: refused unless it is a whole number (``1920``, ``1920.0``; not ``1920.5`` or
    ``true``)."""
    number = isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, bool)
    if not number or not math.isfinite(value) or value != int(value):
        shown = f"{float(value):g}" if isinstance(value, (np.integer, np.floating)) else repr(value)
        raise ValueError(f"{what} must be a whole number, got {shown}")
    return int(value)


def _only_numbers(value: Any) -> bool:
    """Whether ``value`` is a number or nested lists of numbers: ``true`` and ``"500"`` are not (numpy would read
    them as 1.0 and 500.0, and a typo in a file would be applied without a word)."""
    if isinstance(value, np.ndarray):  # a default of the code's own
        return value.dtype.kind in "iuf"
    if isinstance(value, (list, tuple)):
        return all(_only_numbers(v) for v in value)
    return isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, (bool, np.bool_))


def _float_array(value: Any, shape: tuple[int, ...] | None, what: str) -> np.ndarray:
    if not _only_numbers(value):
        raise ValueError(f"{what} must be numbers, got {value!r}")
    try:
        array = np.asarray(value, dtype=np.float64)
    except (TypeError, ValueError):
        raise ValueError(f"{what} must be numbers, got {value!r}") from None
    if shape is not None and array.shape != shape:
        raise ValueError(f"{what} must have shape {shape}, got {array.shape}")
    if not np.isfinite(array).all():
        raise ValueError(f"{what} must be finite numbers")
    return array


@dataclass
class HeadPose:
    """The generic face model's pose in the camera frame: ``rotation`` (its axes as columns) and
    ``translation_mm`` (its origin, between the eyes); ``points_mm`` the posed landmarks."""

    rotation: np.ndarray
    translation_mm: np.ndarray

    @property
    def points_mm(self) -> np.ndarray:
        return FACE_MODEL_MM @ self.rotation.T + self.translation_mm

    def angles(self) -> dict[str, float]:
        """Where the face points (the model's ``-z``), in :data:`CONVENTION`, and its roll in the image plane."""
        yaw, pitch = np.degrees(gaze_vector_to_angles(-self.rotation[:, 2]))
        roll = math.degrees(math.atan2(self.rotation[1, 0], self.rotation[0, 0]))
        return {"yaw_deg": round(float(yaw), 3), "pitch_deg": round(float(pitch), 3), "roll_deg": round(roll, 3)}


def estimate_head_pose(landmarks: np.ndarray, camera: Camera) -> HeadPose:
    """Fit the generic face model to four image landmarks (:data:`LANDMARK_NAMES` order, pixels). Four points
    of a nearly flat model leave mirror-image poses almost equally good, and a refinement started from one
    place can settle in the wrong one. So the fit is refined from two starts, a face that looks into the camera
    at the distance its eye spacing implies (ETH-XGaze too refines from an initial pose) and the global
    solution of SQPnP, and keeps the one that reprojects the landmarks best (the first on a tie). From the
    frontal start alone, a head tilted up 30° comes out tilted down 6°, even with exact landmarks."""
    import cv2

    points = np.asarray(landmarks, dtype=np.float64).reshape(4, 2)
    eye_px = float(np.linalg.norm(points[1] - points[0]))
    if eye_px < 2.0:
        raise ValueError("the eye landmarks coincide: no head pose can be fitted")
    depth = camera.matrix[0, 0] * EYE_DISTANCE_MM / eye_px
    middle = (points[0] + points[1]) / 2.0
    frontal = depth * (np.linalg.inv(camera.matrix) @ np.array([middle[0], middle[1], 1.0]))
    starts = [(np.zeros((3, 1)), frontal.reshape(3, 1))]
    try:  # SQPnP asserts (cv2.error) on landmarks too close together for it, as a small face's are
        found, rvec, tvec = cv2.solvePnP(
            FACE_MODEL_MM, points, camera.matrix, camera.distortion, flags=cv2.SOLVEPNP_SQPNP
        )
    except cv2.error:
        found = False
    if found:
        starts.append((rvec, tvec))
    fits = []
    for rvec, tvec in starts:
        ok, rvec, tvec = cv2.solvePnP(
            FACE_MODEL_MM, points, camera.matrix, camera.distortion, rvec, tvec, True, cv2.SOLVEPNP_ITERATIVE
        )
        if ok and np.isfinite(rvec).all() and np.isfinite(tvec).all() and tvec[2, 0] > 0:
            projected, _ = cv2.projectPoints(FACE_MODEL_MM, rvec, tvec, camera.matrix, camera.distortion)
            fits.append((float(np.linalg.norm(projected.reshape(4, 2) - points, axis=1).mean()), rvec, tvec))
    if not fits:
        raise RuntimeError("the head pose fit failed on these landmarks")
    _, rvec, tvec = min(fits, key=lambda fit: fit[0])  # min keeps the first of equal errors: the frontal start
    rotation, _ = cv2.Rodrigues(rvec)
    return HeadPose(rotation, tvec.reshape(3))


@dataclass
class Normalization:
    """One face's normalization: ``rotation`` ``R`` (rows: the normalized camera's axes in the camera frame),
    ``scale`` ``S``, ``warp`` ``W = K_n S R K⁻¹`` (camera pixels to crop pixels), the face centre and its
    distance, and the config it was made for."""

    rotation: np.ndarray
    scale: np.ndarray
    warp: np.ndarray
    face_centre_mm: np.ndarray
    config: NormalizationConfig

    def to_normalized(self, gaze_camera: np.ndarray) -> np.ndarray:
        """A camera-frame direction (``(..., 3)``) in the normalized frame: ``R g``."""
        return np.asarray(gaze_camera) @ self.rotation.T

    def to_camera(self, gaze_normalized: np.ndarray) -> np.ndarray:
        """A normalized-frame direction back in the camera frame: ``Rᵀ g``."""
        return np.asarray(gaze_normalized) @ self.rotation

    def head_angles(self, head: HeadPose) -> dict[str, float]:
        """The head's direction in the normalized frame (the datasets' ``2DHead``), in degrees."""
        yaw, pitch = np.degrees(gaze_vector_to_angles(-(self.rotation @ head.rotation)[:, 2]))
        return {"yaw_deg": round(float(yaw), 3), "pitch_deg": round(float(pitch), 3)}

    def to_dict(self) -> dict[str, Any]:
        return {
            "face_centre_mm": _rounded(self.face_centre_mm, 2),
            "distance_mm": round(float(np.linalg.norm(self.face_centre_mm)), 2),
            "normalized_distance_mm": self.config.distance_mm,
            "focal": self.config.focal,
            "size": self.config.size,
            "rotation": _rounded(self.rotation, 6),
            "warp": _rounded(self.warp, 6),
        }


def normalization_of(head: HeadPose, camera: Camera, config: NormalizationConfig | None = None) -> Normalization:
    """The normalization of the face at ``head`` seen by ``camera`` (steps 2 to 5 of the module's list)."""
    config = config or NormalizationConfig()
    centre = FACE_CENTRE_WEIGHTS @ head.points_mm
    distance = float(np.linalg.norm(centre))
    z = centre / distance
    y = np.cross(z, head.rotation[:, 0])
    if np.linalg.norm(y) < 1e-9:
        raise ValueError("the head's x-axis points at the camera: no upright normalized crop exists")
    y /= np.linalg.norm(y)
    x = np.cross(y, z)
    rotation = np.stack([x / np.linalg.norm(x), y, z])
    scale = np.diag([1.0, 1.0, config.distance_mm / distance])
    warp = config.matrix() @ scale @ rotation @ np.linalg.inv(camera.matrix)
    return Normalization(rotation, scale, warp, centre, config)


def warp_to_normalized(image: np.ndarray, normalization: Normalization) -> np.ndarray:
    """The normalized crop (``size × size``, the image's channels and dtype) of an undistorted camera image."""
    import cv2

    size = normalization.config.size
    return cv2.warpPerspective(image, normalization.warp, (size, size), flags=cv2.INTER_LINEAR)


def warp_to_camera(crop: np.ndarray, normalization: Normalization, width: int, height: int) -> np.ndarray:
    """The inverse warp: a normalized crop put back into a ``width × height`` camera image (zeros elsewhere)."""
    import cv2

    inverse = np.linalg.inv(normalization.warp)
    return cv2.warpPerspective(crop, inverse, (width, height), flags=cv2.INTER_LINEAR)


def gaze_vector_to_angles(vector: np.ndarray) -> np.ndarray:
    """Directions ``g`` (``(..., 3)``, face to target, OpenCV axes) to ``(yaw, pitch)`` radians in
    :data:`CONVENTION`: :func:`alfa.gaze.geometry.vector_to_pitchyaw` of ``-g`` (its vector is the negated one)."""
    return vector_to_pitchyaw(-torch.as_tensor(np.asarray(vector, dtype=np.float64))).numpy()


def angles_to_gaze_vector(yaw_pitch: np.ndarray) -> np.ndarray:
    """The inverse of :func:`gaze_vector_to_angles`: ``(..., 2)`` radians to unit directions ``g``."""
    return -pitchyaw_to_vector(torch.as_tensor(np.asarray(yaw_pitch, dtype=np.float64))).numpy()


def _rounded(array: np.ndarray, digits: int = 4) -> Any:
    return np.round(np.asarray(array, dtype=np.float64), digits).tolist()
