"""A photo in, per face: its box, landmarks, head pose, normalized crop, gaze (normalized and camera frame)
and screen point out; the same for a video's frames, smoothed over time.

The model is a ``predictor``: normalized crops ``(N, 3, size, size)`` in [0, 1] to ``(yaw, pitch)`` radians in
the normalized frame, so the command (a checkpoint and an adapter) and the HTTP service (its shared base and a
user's adapter, under its lock) each bring their own. :func:`answer_photo` is the service's whole path from
request bytes to the answer's fields.
"""

from __future__ import annotations

import dataclasses
import io
import math
import os
import re
import threading
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .detect import DETECT_SIDE, MIN_FACE_PX, FaceDetection, detect_faces
from .normalize import (
    CONVENTION,
    LANDMARK_NAMES,
    Camera,
    Normalization,
    NormalizationConfig,
    angles_to_gaze_vector,
    default_camera,
    estimate_head_pose,
    gaze_vector_to_angles,
    normalization_of,
    warp_to_normalized,
)
from .screen import Screen, ScreenFit

__all__ = [
    "MAX_PIXELS",
    "MIN_SIDE",
    "PACKAGED_PHOTOS",
    "Predictor",
    "PhotoOptions",
    "FaceResult",
    "read_photo",
    "PILLOW_WARNINGS_LOCK",
    "decode_photo",
    "analyse_photo",
    "analyse_video",
    "crop_name",
    "predict_photos",
    "predict_videos",
    "fit_screen",
    "answer_photo",
    "normalized_faces",
    "resized_crops",
    "SeveralFaces",
    "calibration_gaze",
    "model_predictor",
    "video_frames",
    "GazeSmoother",
]

Predictor = Callable[[Tensor], Tensor]
MAX_PIXELS = 50_000_000
"""The largest photo decoded (width × height), checked from its header before any pixel is decoded."""
MIN_SIDE = 64
"""The shortest side a photo may have: below it no face reaches the detector's smallest box with margin."""
_EXIF_ORIENTATION = 0x0112
VIDEO_SUFFIXES = (".mp4", ".avi", ".mov", ".mkv", ".webm", ".m4v", ".wmv")
"""File endings of videos, for the hint a photo read of one gets."""
PILLOW_WARNINGS_LOCK = threading.Lock()
"""Held while a Pillow warning filter is set: ``warnings.catch_warnings`` saves and restores the process's one
filter list, so two service threads inside it at once could leave another's filter in place for good."""
PACKAGED_PHOTOS = ("astronaut", "camera", "chelsea", "coffee")
"""Photos inside scikit-image's wheel that ``skimage:NAME`` names (their sources and licences: the README.txt
of ``skimage/data``); ``astronaut`` is NASA's portrait of Eileen Collins, in the public domain."""


def decode_photo(data: bytes, what: str = "the image") -> tuple[np.ndarray, list[str]]:
    """RGB ``uint8`` ``(H, W, 3)`` from encoded bytes (any format Pillow reads), turned upright by its EXIF
    orientation, and notes on what was done to it (a grayscale photo is copied into three channels: the
    models read RGB, the detector luminance). Size limits are checked from the header, before decoding."""
    from PIL import Image, ImageOps, UnidentifiedImageError

    try:
        with PILLOW_WARNINGS_LOCK, warnings.catch_warnings():  # our own limit below judges the size, not Pillow
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            img = Image.open(io.BytesIO(data))
        with img:
            width, height = img.size
            if width * height > MAX_PIXELS:
                raise ValueError(f"{what} is {width}×{height}: over the limit of {MAX_PIXELS:,} pixels")
            if min(width, height) < MIN_SIDE:
                raise ValueError(f"{what} is {width}×{height}: too small to find a face (at least {MIN_SIDE} a side)")
            img.load()
            gray = img.mode in ("1", "L", "LA", "I", "F") or img.mode.startswith("I;16")
            notes = [f"grayscale ({img.mode}) copied into RGB"] if gray else []
            if img.mode in ("RGBA", "LA", "PA", "RGBa", "La") or "transparency" in img.info:
                notes.append("its transparency dropped (a transparent pixel shows the colour it stores)")
            if img.mode == "CMYK":  # Pillow's plain formula, no colour profile: colours may be off, the face not
                notes.append("CMYK converted to RGB")
            if img.getexif().get(_EXIF_ORIENTATION, 1) != 1:
                notes.append("turned upright by its EXIF orientation")
            upright, scaled = eight_bits(ImageOps.exif_transpose(img))
            notes += [scaled] if scaled else []
            rgb = np.asarray(upright.convert("RGB"), dtype=np.uint8).copy()
            frames = _frame_count(img)
            if frames > 1:  # an animation or a multi-page file: the face is looked for in its first frame only
                notes.append(f"the first of its {frames} frames read")
    except Image.DecompressionBombError:  # a header beyond Pillow's own limit, far beyond ours
        raise ValueError(f"{what} is over the limit of {MAX_PIXELS:,} pixels") from None
    except UnidentifiedImageError:
        raise ValueError(f"{what} is not a readable image: empty, or in no format Pillow reads") from None
    except (OSError, SyntaxError) as e:  # truncated or corrupt data inside a known format
        raise ValueError(f"{what} is not a readable image ({e})") from None
    return rgb, notes


def _frame_count(img: Any) -> int:
    """How many frames an image file holds; 1 where counting fails (counting reads every frame, and a damaged
    later one, in a file cut short, must not cost the first, which was read)."""
    try:
        return int(getattr(img, "n_frames", 1))
    except Exception:  # noqa: BLE001 — Pillow raises IndexError, struct.error, TypeError on a damaged frame
        return 1


def eight_bits(img: Any) -> tuple[Any, str | None]:
    """A grayscale image of more than 8 bits (``I;16``, ``I``, ``F``: a near-infrared eye camera's) as an 8-bit one,
    scaled by the bit depth its values use (12 bits stored in 16 are scaled as 12), a float one by [0, 1]; and a
    note saying so. Pillow's own conversion clips at 255, which turns such a photo white."""
    from PIL import Image

    if not (img.mode in ("I", "F") or img.mode.startswith("I;16")):
        return img, None
    values = np.asarray(img, dtype=np.float64)
    top = float(np.nanmax(values)) if values.size else 0.0
    if img.mode == "F":
        scale, said = (255.0, "values in [0, 1]") if top <= 1.0 else (1.0, "values clipped to [0, 255]")
    else:
        bits = max(8, int(np.ceil(np.log2(top + 1)))) if top > 0 else 8
        scale, said = 255.0 / (2**bits - 1), f"{bits}-bit values"
    eight = np.clip(np.rint(np.nan_to_num(values) * scale), 0, 255).astype(np.uint8)
    return Image.fromarray(eight, "L"), f"scaled to 8 bits ({img.mode}, {said})"


def read_photo(source: str | os.PathLike) -> tuple[np.ndarray, list[str]]:
    """:func:`decode_photo` of a file, or of ``skimage:NAME`` (one of :data:`PACKAGED_PHOTOS`, a photo that
    ships inside scikit-image's wheel, to try the command without a photo of one's own)."""
    name = str(source)
    if name.startswith("skimage:"):
        photo = name.split(":", 1)[1]
        if photo not in PACKAGED_PHOTOS:
            raise ValueError(f"{name}: the packaged photos are {', '.join('skimage:' + p for p in PACKAGED_PHOTOS)}")
        from importlib.resources import files

        data = (files("skimage.data") / f"{photo}.png").read_bytes()
    else:
        path = Path(name)
        if not path.is_file():
            raise FileNotFoundError(f"{path} is a folder, not a photo" if path.is_dir() else f"{path}: no such file")
        data = path.read_bytes()
    try:
        return decode_photo(data, what=name)
    except ValueError as e:
        if Path(name).suffix.lower() in VIDEO_SUFFIXES:
            raise ValueError(f"{e} (a video? add --video)") from None
        raise


@dataclass
class PhotoOptions:
    """How a photo is read: its ``camera`` (``None``: :func:`default_camera` of its size), a ``screen``
    geometry or a ``screen_fit`` (or neither), ``faces`` (``"one"``: exactly one face, else
    :class:`SeveralFaces`; ``"all"``; ``"largest"``: the largest face only, as a video's frames are read) and the
    normalized camera ``config``."""

    camera: Camera | None = None
    screen: Screen | None = None
    screen_fit: ScreenFit | None = None
    faces: str = "one"
    config: NormalizationConfig = field(default_factory=NormalizationConfig)

    def __post_init__(self) -> None:
        if self.faces not in ("one", "all", "largest"):
            raise ValueError(f"faces must be 'one', 'all' or 'largest', got {self.faces!r}")


class SeveralFaces(ValueError):
    """A photo read for exactly one face shows several (``boxes``: theirs, the largest first); raised before any of
    them is normalized. Each caller adds what its user can do about it (an option of ``alfa predict``, another
    calibration photo, another request)."""

    def __init__(self, boxes: list[list[int]]) -> None:
        self.boxes = boxes
        super().__init__(f"{len(boxes)} faces found (boxes {', '.join(map(str, boxes))})")


@dataclass
class FaceResult:
    """One face's answer: its printable ``fields``, its normalized ``crop`` (RGB ``uint8``) and the
    ``normalization`` that made it."""

    fields: dict[str, Any]
    crop: np.ndarray
    normalization: Normalization


def _undistorted(rgb: np.ndarray, camera: Camera) -> tuple[np.ndarray, Camera]:
    if camera.distortion.size == 0 or not camera.distortion.any():
        return rgb, camera
    import cv2

    plain = Camera(camera.matrix, np.zeros(0), camera.image_size, camera.source)
    return cv2.undistort(rgb, camera.matrix, camera.distortion), plain


def analyse_photo(
    rgb: np.ndarray, predictor: Predictor, options: PhotoOptions, notes: list[str] | None = None
) -> tuple[dict[str, Any], list[FaceResult]]:
    """Every field of a photo's answer (``image``, ``camera``, ``convention``, ``faces``) and each face's
    result, the largest face first. ``ValueError`` for a photo without a face, with several faces where
    ``options.faces`` is ``"one"``, or with intrinsics that do not fit it."""
    height, width = rgb.shape[:2]
    camera, faces = normalized_faces(rgb, options)
    crops = np.stack([f.crop for f in faces])
    with torch.no_grad():
        predicted = predictor(torch.from_numpy(crops).permute(0, 3, 1, 2).float() / 255.0)
    for face, yaw_pitch in zip(faces, predicted.double().numpy()):
        _add_gaze(face, yaw_pitch, options)
    answer = {
        "image": {"width": width, "height": height, "notes": list(notes or [])},
        "camera": camera.to_dict(),
        "convention": CONVENTION,
        "faces": [f.fields for f in faces],
    }
    return answer, faces


def normalized_faces(rgb: np.ndarray, options: PhotoOptions) -> tuple[Camera, list[FaceResult]]:
    """The camera a photo is read with and its faces (as ``options.faces`` asks, the largest first), each found,
    normalized and cropped, no gaze yet: what :func:`analyse_photo` reads the gaze of. ``ValueError`` as there."""
    height, width = rgb.shape[:2]
    camera = options.camera or default_camera(width, height)
    camera.check_fits(width, height)
    image, camera_used = _undistorted(rgb, camera)
    detections = detect_faces(image)
    if not detections:
        smallest = math.ceil(MIN_FACE_PX * max(1.0, max(height, width) / DETECT_SIDE))
        raise ValueError(f"no face found in the image (a frontal face of at least {smallest} pixels is needed)")
    if options.faces == "one" and len(detections) > 1:
        raise SeveralFaces([list(d.box) for d in detections])
    read = detections[:1] if options.faces == "largest" else detections
    return camera, [_normalize_face(image, d, camera_used, options.config) for d in read]


def _normalize_face(image: np.ndarray, detection: FaceDetection, camera: Camera, config) -> FaceResult:
    head = estimate_head_pose(detection.landmarks, camera)
    normalization = normalization_of(head, camera, config)
    fields = {
        "box": list(detection.box),
        "landmarks": {n: np.round(p, 1).tolist() for n, p in zip(LANDMARK_NAMES, detection.landmarks)},
        "estimated_landmarks": list(detection.estimated),
        "head_pose": {
            **head.angles(),
            "translation_mm": np.round(head.translation_mm, 1).tolist(),
            "normalized": normalization.head_angles(head),
        },
        "normalization": normalization.to_dict(),
    }
    return FaceResult(fields, warp_to_normalized(image, normalization), normalization)


def _add_gaze(face: FaceResult, yaw_pitch: np.ndarray, options: PhotoOptions) -> None:
    if not np.isfinite(yaw_pitch).all():  # else NaN screen points, and a JSON answer no reader accepts
        raise ValueError(f"the model's gaze for this face is not finite ({yaw_pitch.tolist()}): check the checkpoint")
    normalization = face.normalization
    gaze_normalized = angles_to_gaze_vector(yaw_pitch)
    gaze_camera = normalization.to_camera(gaze_normalized)
    camera_angles = np.degrees(gaze_vector_to_angles(gaze_camera))
    face.fields["gaze_normalized"] = _angles(np.degrees(yaw_pitch))
    face.fields["gaze_camera"] = {**_angles(camera_angles), "vector": np.round(gaze_camera, 5).tolist()}
    if options.screen is not None:
        face.fields["screen"] = options.screen.point(normalization.face_centre_mm, gaze_camera)
    elif options.screen_fit is not None:
        face.fields["screen"] = options.screen_fit.point(*camera_angles)


def _angles(yaw_pitch_deg: np.ndarray) -> dict[str, float]:
    return {"yaw_deg": round(float(yaw_pitch_deg[0]), 3), "pitch_deg": round(float(yaw_pitch_deg[1]), 3)}


def answer_photo(data: bytes, predictor: Predictor, options: PhotoOptions | None = None) -> dict[str, Any]:
    """The HTTP service's path: encoded photo bytes (any size) to the answer's fields (:func:`analyse_photo`'s),
    exactly one face by default. ``ValueError`` says what is wrong with the photo."""
    rgb, notes = decode_photo(data)
    answer, _ = analyse_photo(rgb, predictor, options or PhotoOptions(), notes)
    return answer


def calibration_gaze(
    photo: str | os.PathLike,
    predictor: Predictor,
    camera: Camera | None = None,
    config: NormalizationConfig | None = None,
) -> np.ndarray:
    """The camera-frame gaze (yaw, pitch; degrees, as printed) of the one face of a calibration photo: the number
    a person would copy from ``alfa predict --json`` into a screen-fit file's ``gaze_deg``. ``config``: the
    normalized camera, the one the photos the fit serves are read with (default: :class:`NormalizationConfig`)."""
    rgb, notes = read_photo(photo)
    options = PhotoOptions(camera=camera, faces="one", config=config or NormalizationConfig())
    try:
        answer, _ = analyse_photo(rgb, predictor, options, notes)
    except SeveralFaces as e:
        raise ValueError(f"{e}: a calibration photo must show only the person looking at the point") from None
    gaze = answer["faces"][0]["gaze_camera"]
    return np.array([gaze["yaw_deg"], gaze["pitch_deg"]])


def resized_crops(crops: Tensor, size: tuple[int, int]) -> Tensor:
    """Normalized crops (``N×3×H×W`` floats in [0, 1]) as a model trained at ``size`` reads them: resized with
    antialiasing where they differ. Every path from a photo to a model's input goes through it (predictions, the
    labelled images of a person's calibration photos), so each sees the same numbers."""
    if tuple(crops.shape[-2:]) == tuple(size):
        return crops
    return F.interpolate(crops, size=tuple(size), mode="bilinear", align_corners=False, antialias=True)


def model_predictor(model: nn.Module, input_size: tuple[int, int]) -> Predictor:
    """A :data:`Predictor` of a gaze model (eval mode, no gradients) that reads ``input_size`` images: each
    224×224 crop is resized to it with antialiasing first (a checkpoint records the size it was trained on)."""

    def predict(crops: Tensor) -> Tensor:
        device = next(model.parameters()).device
        crops = resized_crops(crops, input_size)
        model.eval()
        with torch.no_grad():
            return model(crops.to(device)).float().cpu()

    return predict


def video_frames(path: str | os.PathLike, every: int = 1) -> Iterator[tuple[int, np.ndarray]]:
    """``(frame index, RGB uint8 frame)`` of a video file, every ``every``-th frame (OpenCV's reader)."""
    import cv2

    if not Path(path).is_file():
        raise FileNotFoundError(f"no such video file: {path}")
    # FFmpeg would print its own lines ("[mov,mp4,...] moov atom not found") before our one-line refusal; it reads
    # this when OpenCV first opens a video, so a caller's own setting wins.
    os.environ.setdefault("OPENCV_FFMPEG_LOGLEVEL", "-8")
    capture = cv2.VideoCapture(str(path))
    try:
        if not capture.isOpened():
            raise ValueError(f"{path} is not a video OpenCV can read")
        index = 0
        while True:
            ok, frame = capture.read()
            if not ok:
                break
            if index % every == 0:
                yield index, cv2.cvtColor(frame, cv2.COLOR_BGR2RGB)
            index += 1
        if index == 0:
            raise ValueError(f"{path} holds no frame OpenCV can decode")
    finally:
        capture.release()


class GazeSmoother:
    """Exponential smoothing of a face's camera-frame gaze over a video's frames: each frame's direction is
    ``alpha`` of the new one plus ``1 - alpha`` of the running one (``alpha`` 1: no smoothing); a frame without
    a face starts it afresh (the person may have moved)."""

    def __init__(self, alpha: float) -> None:
        if not 0 < alpha <= 1:
            raise ValueError(f"the smoothing factor must be in (0, 1], got {alpha}")
        self.alpha = alpha
        self.state: np.ndarray | None = None

    def update(self, gaze_camera: np.ndarray | None) -> np.ndarray | None:
        if gaze_camera is None:
            self.state = None
            return None
        mixed = gaze_camera if self.state is None else self.alpha * gaze_camera + (1 - self.alpha) * self.state
        self.state = mixed / np.linalg.norm(mixed)
        return self.state


def analyse_video(
    path: str | os.PathLike,
    predictor: Predictor,
    options: PhotoOptions,
    alpha: float = 0.5,
    every: int = 1,
    camera: dict[str, Any] | None = None,
) -> Iterator[dict[str, Any]]:
    """One record per frame read (every ``every``-th): the largest face's fields, its camera-frame gaze smoothed
    over the frames (``gaze_smoothed``, :class:`GazeSmoother`), or ``{"frame", "error"}`` for a frame whose face
    could not be read (the video goes on). Each record also has ``frame``. ``camera``, where given, is filled with
    the intrinsics the first frame read was read with (a photo answer's ``camera``)."""
    smoother = GazeSmoother(alpha)
    one_face = dataclasses.replace(options, faces="largest")
    for index, rgb in video_frames(path, every):
        try:
            answer, _ = analyse_photo(rgb, predictor, one_face)
        except (ValueError, RuntimeError) as e:
            smoother.update(None)
            yield {"frame": index, "error": str(e)}
            continue
        if camera is not None and not camera:
            camera.update(answer["camera"])
        face = answer["faces"][0]
        smoothed = smoother.update(np.asarray(face["gaze_camera"]["vector"]))
        face["gaze_smoothed"] = _angles(np.degrees(gaze_vector_to_angles(smoothed)))
        yield {"frame": index, **face}


def crop_name(source: str | os.PathLike, face: int) -> str:
    """The file a face's normalized crop is written to: ``<photo's stem>-face<i>.png``."""
    stem = str(source).split(":", 1)[1] if str(source).startswith("skimage:") else Path(source).stem
    return f"{stem}-face{face}.png"


def is_crop_of(name: str, source: str | os.PathLike) -> bool:
    """Whether a file called ``name`` is one of ``source``'s crops, as :func:`crop_name` names them (any face)."""
    prefix = crop_name(source, 0)[: -len("0.png")]
    return re.fullmatch(re.escape(prefix) + r"\d+\.png", name) is not None


def _refuse_crop_clashes(sources: list[str], folder: Path, replace: bool) -> dict[str, list[Path]]:
    """Each photo's crops get a name of their own in ``folder``, and no crop there is replaced unless ``replace``.
    Returns each photo's earlier crops there: with ``replace``, a photo's new crops replace them once written (an
    earlier run may have found more faces); a photo that fails keeps them."""
    prefixes: dict[str, str] = {}
    for source in sources:
        prefix = crop_name(source, 0)[: -len("0.png")]
        if prefix in prefixes:
            what = (
                "is given twice" if prefixes[prefix] == source else f"and {prefixes[prefix]} would both write {prefix}…"
            )
            raise ValueError(f"--crops: {source} {what}; predict them in two runs, or rename one")
        prefixes[prefix] = source
    if not folder.is_dir():
        return {}
    earlier = {source: [p for p in folder.iterdir() if is_crop_of(p.name, source)] for source in prefixes.values()}
    inputs = {Path(s).resolve(): s for s in sources if not s.startswith("skimage:")}
    for source, found in earlier.items():
        taken = [inputs[p.resolve()] for p in found if p.resolve() in inputs]
        if taken:  # a crop written there, or --replace's clearing of earlier crops, would lose one of the photos
            raise ValueError(
                f"--crops {folder}: {taken[0]} is one of these photos and is named like a crop of {source}, which "
                "would replace it: choose another --crops folder"
            )
    clash = [source for source, found in earlier.items() if found]
    if clash and not replace:
        raise FileExistsError(
            f"--crops {folder} already holds crops of {clash[0]}: choose another folder, or add --replace"
        )
    return earlier


def predict_photos(
    sources: list[str],
    predictor: Predictor,
    options: PhotoOptions,
    crops: str | os.PathLike | None = None,
    progress: bool = True,
    replace: bool = False,
) -> tuple[list[dict[str, Any]], list[str]]:
    """:func:`analyse_photo` of each photo file (or ``skimage:NAME``), with a progress bar: one record per photo
    (``{"photo", **answer}``, or ``{"photo", "error"}`` for one that could not be read, after which the others
    still are), and the messages of the failures. Crops are written to ``crops`` as :func:`crop_name` says. Before
    any photo is read, two photos whose crops would have one name (``a/x.png`` and ``b/x.png``) are refused, and so
    are crops of these photos already there unless ``replace``."""
    from PIL import Image
    from tqdm.auto import tqdm

    from alfa.fileio import write_bytes

    folder = Path(crops) if crops is not None else None
    earlier = _refuse_crop_clashes(sources, folder, replace) if folder is not None else {}
    records, failures = [], []
    for source in tqdm(sources, desc="photos", unit="photo", disable=not progress or len(sources) < 2):
        try:
            rgb, notes = read_photo(source)
            try:
                answer, faces = analyse_photo(rgb, predictor, options, notes)
            except SeveralFaces as e:
                raise ValueError(f"{e}; pass --faces all to read every one") from None
        except (ValueError, RuntimeError, OSError) as e:
            records.append({"photo": str(source), "error": str(e)})
            # a read error already starts with the photo's name; a later one (no face) does not
            failures.append(str(e) if str(e).startswith(str(source)) else f"{source}: {e}")
            continue
        for i, face in enumerate(faces):
            if folder is not None:
                buffer = io.BytesIO()
                Image.fromarray(face.crop).save(buffer, format="PNG")
                face.fields["crop"] = str(write_bytes(folder / crop_name(source, i), buffer.getvalue()))
        written = {crop_name(source, i) for i in range(len(faces))} if folder is not None else set()
        for path in earlier.get(str(source), []):  # an earlier run's crops this run did not write again
            if path.name not in written:
                path.unlink(missing_ok=True)
        records.append({"photo": str(source), **answer})
    return records, failures


def predict_videos(
    sources: list[str], predictor: Predictor, options: PhotoOptions, alpha: float, every: int, progress: bool = True
) -> tuple[list[dict[str, Any]], list[str]]:
    """:func:`analyse_video` of each video file, with a progress bar of its frames: one record per video
    (``{"video", "camera", "convention", "smoothing", "frames"}``; ``camera`` is ``None`` where no frame had a
    face), and the messages of the videos without a single readable face (a frame
    without one is part of a video; a video without any is a failure)."""
    from tqdm.auto import tqdm

    records, failures = [], []
    for video in sources:
        camera: dict[str, Any] = {}
        frames = analyse_video(video, predictor, options, alpha=alpha, every=every, camera=camera)
        first = next(frames, None)  # opens the video: a file that is none is refused before a bar is drawn
        read = [] if first is None else [first, *tqdm(frames, desc="frames", unit="frame", disable=not progress)]
        record = {"video": video, "camera": camera or None, "convention": CONVENTION, "smoothing": alpha}
        records.append({**record, "frames": read})
        if all("error" in frame for frame in read):
            # the first frame's reason, where it is not the usual missing face (a camera file for another size)
            why = f" (the first frame: {read[0]['error']})" if read else ""
            failures.append(f"{video}: no frame with a readable face{why}")
    return records, failures


def fit_screen(points: Any, options: PhotoOptions, predictor: Predictor) -> dict[str, Any]:
    """Fit the screen from ``points`` (a :class:`~alfa.gaze.camera.screen.CalibrationPoints`), each point's photo
    read by ``predictor`` with ``options``' camera as every photo is, and set the fit in ``options``; its printable
    summary, with the photos read."""
    options.screen_fit = points.fit(lambda photo: calibration_gaze(photo, predictor, options.camera, options.config))
    summary = {"file": points.source, **options.screen_fit.summary()}
    for point, photo in zip(summary["points"], points.photos):
        if photo is not None:
            point["photo"] = str(photo)
    return summary
