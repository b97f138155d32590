"""Faces and their four landmarks in a photo, by OpenCV's Haar cascades (the files inside its wheel).

Why these (docs/camera.md says more): nothing may be downloaded at run time, so the detector's weights must
ship inside a wheel that installs beside torch 2.13 and numpy 2. OpenCV's wheels below 5.0 carry their
cascades in ``cv2.data`` (5.0's ship that folder empty), and OpenCV is needed anyway for ``solvePnP`` and the
warp. MediaPipe 0.10.21, the last with the bundled face-mesh models, pins ``numpy<2`` and ``protobuf<5``
(later releases need a downloaded model file); dlib's 68-point predictor comes in a 100 MB package whose
training data (iBUG 300-W) is licensed for research only; facenet-pytorch's MTCNN imports torchvision.

A cascade finds boxes, not points, so the landmarks are the centres of the two eye boxes and the ends of the
mouth box (narrowed: the cascade's box holds cheek around the lips). Where a cascade finds no eye pair or no
mouth, those landmarks are placed by the generic face's proportions instead and listed as ``estimated``:
the head pose then rests on fewer measured points, and the output says so. Where it finds neither, the box is
not taken for a face.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

import numpy as np

from .normalize import EYE_DISTANCE_MM, FACE_MODEL_MM

__all__ = ["DETECT_SIDE", "FaceDetection", "detect_faces", "MIN_FACE_PX"]

MIN_FACE_PX = 40
"""The smallest face box searched for (pixels a side, at :data:`DETECT_SIDE`): below it the eyes are a few pixels
and no pose fits."""
DETECT_SIDE = 640
"""The longest side a photo is searched for faces at (a larger one is shrunk for the search): so a face must span
at least ``MIN_FACE_PX / DETECT_SIDE`` (about a sixteenth) of a large photo's longest side."""

# Where a face box holds its eyes (centres, as shares of the box), for eye pairs the cascade misses.
_EYE_SHARES = ((0.30, 0.38), (0.70, 0.38))
_MOUTH_BOX_WIDTH_SHARE = 0.75
# The generic face's proportions, for the mouth placed from the eyes.
_MOUTH_DROP = FACE_MODEL_MM[2, 1] / EYE_DISTANCE_MM
_MOUTH_HALF_WIDTH = FACE_MODEL_MM[3, 0] / EYE_DISTANCE_MM


@dataclass
class FaceDetection:
    """One face: ``box`` ``(x, y, width, height)`` in pixels, ``landmarks`` ``(4, 2)`` pixels in
    :data:`~alfa.gaze.camera.normalize.LANDMARK_NAMES` order, and which of them are ``estimated`` (placed by
    proportions, not found by a cascade)."""

    box: tuple[int, int, int, int]
    landmarks: np.ndarray
    estimated: tuple[str, ...] = ()


_THREADS_CASCADES = threading.local()


def _cascade(name: str):
    """The cascade ``name``, one per thread: OpenCV's ``detectMultiScale`` on one classifier from several threads
    (a server's workers) gave other boxes, a second face missed, and assertion errors."""
    held = _THREADS_CASCADES.__dict__.setdefault("by_name", {})
    if name not in held:
        held[name] = _load_cascade(name)
    return held[name]


def _load_cascade(name: str):
    import cv2

    folder = getattr(getattr(cv2, "data", None), "haarcascades", "")
    cascade = cv2.CascadeClassifier(folder + name)
    if cascade.empty():
        raise RuntimeError(
            f"OpenCV's {name} is not in this installation ({folder or 'no cv2.data'}): install "
            'opencv-python-headless below 5.0 (pip install -e ".[camera]"), whose wheels ship the cascades'
        )
    return cascade


def detect_faces(rgb: np.ndarray) -> list[FaceDetection]:
    """Every frontal face in an RGB ``uint8`` image ``(H, W, 3)``, the largest first. A box in which the cascades
    find neither an eye pair nor a mouth is no face: the face cascade alone finds hair or a chin in a tilted
    photo, and every landmark would be the average face's guess."""
    import cv2

    if not isinstance(rgb, np.ndarray) or rgb.dtype != np.uint8 or rgb.ndim != 3 or rgb.shape[2] != 3:
        # said here, not as OpenCV's assertion from inside its colour conversion
        got = f"{rgb.dtype} {tuple(rgb.shape)}" if isinstance(rgb, np.ndarray) else type(rgb).__name__
        raise ValueError(f"detect_faces takes an RGB uint8 image (H, W, 3), got {got} (read_photo reads a file so)")
    gray = cv2.equalizeHist(cv2.cvtColor(rgb, cv2.COLOR_RGB2GRAY))
    # A large photo is searched at DETECT_SIDE: at full size the cascade finds faces in a phone photo's texture
    # (a 1024-pixel portrait gave two, a 4000-pixel one eleven), and takes seconds. Landmarks use the full size.
    scale = min(1.0, DETECT_SIDE / max(gray.shape))
    small = gray if scale == 1.0 else cv2.resize(gray, None, fx=scale, fy=scale, interpolation=cv2.INTER_AREA)
    found = _cascade("haarcascade_frontalface_default.xml").detectMultiScale(
        small, scaleFactor=1.1, minNeighbors=5, minSize=(MIN_FACE_PX, MIN_FACE_PX)
    )
    boxes = [tuple(int(round(v / scale)) for v in b) for b in found]
    boxes = sorted(boxes, key=lambda b: (-b[2] * b[3], b[0], b[1]))
    detections = [_landmarks(gray, box) for box in boxes]
    return [d for d in detections if len(d.estimated) < len(d.landmarks)]


def _landmarks(gray: np.ndarray, box: tuple[int, int, int, int]) -> FaceDetection:
    x, y, w, h = box
    estimated: list[str] = []
    eyes = _eye_pair(gray, box)
    if eyes is None:
        eyes = np.array([[x + sx * w, y + sy * h] for sx, sy in _EYE_SHARES])
        estimated += ["right_eye", "left_eye"]
    mouth = _mouth_corners(gray, box, eyes)
    if mouth is None:
        mouth = _mouth_from_eyes(eyes)
        estimated += ["mouth_right", "mouth_left"]
    return FaceDetection(box, np.concatenate([eyes, mouth]).astype(np.float64), tuple(estimated))


def _eye_pair(gray: np.ndarray, box: tuple[int, int, int, int]) -> np.ndarray | None:
    """The largest eye found in each half of the face's upper part: ``[[image-left eye], [image-right eye]]``
    (the person's right eye first), or ``None``. Glasses defeat the plain cascade more often, so a second one
    trained with them is tried."""
    x, y, w, h = box
    top = gray[y : y + int(0.6 * h), x : x + w]
    for name in ("haarcascade_eye.xml", "haarcascade_eye_tree_eyeglasses.xml"):
        found = _cascade(name).detectMultiScale(
            top, scaleFactor=1.1, minNeighbors=5, minSize=(max(w // 10, 8),) * 2, maxSize=(w // 2,) * 2
        )
        halves: dict[int, tuple[int, np.ndarray]] = {}
        for ex, ey, ew, eh in found:
            centre = np.array([x + ex + ew / 2.0, y + ey + eh / 2.0])
            if centre[1] > y + 0.55 * h:
                continue
            side = int(centre[0] > x + w / 2.0)
            if side not in halves or ew * eh > halves[side][0]:
                halves[side] = (ew * eh, centre)
        if len(halves) == 2:
            return np.stack([halves[0][1], halves[1][1]])
    return None


def _mouth_corners(gray: np.ndarray, box: tuple[int, int, int, int], eyes: np.ndarray) -> np.ndarray | None:
    """The ends of the mouth box nearest to where the eyes put the mouth, narrowed; ``None`` if none."""
    x, y, w, h = box
    y0 = y + h // 2
    lower = gray[y0 : y + h, x : x + w]
    found = _cascade("haarcascade_smile.xml").detectMultiScale(
        lower, scaleFactor=1.1, minNeighbors=10, minSize=(w // 5, h // 10), maxSize=(int(0.8 * w), h // 2)
    )
    if len(found) == 0:
        return None
    expected = _mouth_from_eyes(eyes).mean(0)
    centres = [np.array([x + mx + mw / 2.0, y0 + my + mh / 2.0]) for mx, my, mw, mh in found]
    best = int(np.argmin([np.linalg.norm(c - expected) for c in centres]))
    half = _MOUTH_BOX_WIDTH_SHARE * found[best][2] / 2.0
    centre = centres[best]
    return np.array([[centre[0] - half, centre[1]], [centre[0] + half, centre[1]]])


def _mouth_from_eyes(eyes: np.ndarray) -> np.ndarray:
    """The mouth corners the generic face puts below two eye centres (any roll)."""
    across = eyes[1] - eyes[0]
    down = np.array([-across[1], across[0]])  # across turned a quarter clockwise in the image (y points down)
    centre = eyes.mean(0) + _MOUTH_DROP * down
    return np.stack([centre - _MOUTH_HALF_WIDTH * across, centre + _MOUTH_HALF_WIDTH * across])
