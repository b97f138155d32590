"""A person's own calibration photos as labelled images: ``photos:<points file>?screen=<screen file>``.

A tracker calibrates a new user by asking them to look at a few points on the screen and taking a photo at each.
The points file is the one ``alfa predict --screen-fit`` reads (:mod:`alfa.gaze.camera.screen`), each point naming
its photo and the screen pixel looked at (``{"points": [{"photo": "p1.jpg", "screen_px": [x, y]}, ...]}``); the
screen file gives the screen's geometry in the camera frame (``alfa predict --screen``'s). Each photo's one face is
found, normalized and cropped as ``alfa predict`` does it (:func:`alfa.gaze.camera.normalized_faces`, the camera
file of ``?camera=`` or the default intrinsics), and its label is the direction from the face centre to the screen
pixel, turned into the normalized camera's frame: ``(yaw, pitch)`` radians in the convention the models are
trained on. The crops are resized to ``?size=`` (default 224) exactly as a prediction resizes them
(:func:`alfa.gaze.camera.resized_crops`), so a calibration fitted on them corrects what ``alfa predict`` and
``alfa serve`` compute. One person (``?person=``, default the points file's name without its suffix); its head
labels are the normalized head directions, as the datasets'.

So ``alfa calibrate --data "photos:calib/points.json?screen=screen.json&size=48" --k 8 --pool 8`` turns a
9-point session into ``<person>.safetensors`` (the ninth point left for ``alfa evaluate --adapters`` to score, as
``alfa calibrate`` leaves one of every person's images), which ``alfa predict --adapter`` and ``alfa serve`` read
like any calibration. The opener lives here, above both the loaders and the camera
path; importing this module registers the kind (:func:`alfa.gaze.pipeline.open_data`, which every command opens
``--data`` with, does), or call :func:`calibration_photos` itself.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch

from .data.base import InMemoryGazeDataset
from .data.registry import register_dataset
from .evaluate import adapter_filename

__all__ = ["calibration_photos"]

CROP_SIZE = 224
"""The normalized camera's crop side (:class:`alfa.gaze.camera.NormalizationConfig`), the default ``?size=``."""


def _check(rest: str, options: dict[str, Any], spec: str) -> None:
    """What the spec alone shows wrong: no points file, or no ``?screen=`` file (the photos are not read)."""
    if not rest:
        raise ValueError(f"dataset spec {spec!r}: name the points file: photos:<points file>?screen=<screen file>")
    for what, path in (("points file", rest), ("screen file (?screen=)", options.get("screen"))):
        if path is None:
            raise ValueError(
                f"dataset spec {spec!r}: ?screen=<screen file> is needed: the screen's geometry turns each point's "
                "screen pixel into a gaze label (docs/camera.md § Screen points)"
            )
        _refuse_no_file(spec, what, path)
    camera = options.get("camera")
    if camera is not None:
        _refuse_no_file(spec, "camera file (?camera=)", camera)
    person = options.get("person")
    if person == "":
        raise ValueError(f"dataset spec {spec!r}: ?person= is empty")
    # the file name is of [A-Za-z0-9._-] already; a user id alfa serve takes starts with a letter or digit
    if person is not None and not adapter_filename(person)[0].isalnum():
        raise ValueError(
            f"dataset spec {spec!r}: ?person={person}: its file would be {adapter_filename(person)}, which alfa "
            "serve takes for no user (an id starts with a letter or digit, then letters, digits, '.', '_', '-')"
        )


def _refuse_no_file(spec: str, what: str, path: str) -> None:
    if Path(path).is_dir():
        raise ValueError(f"dataset spec {spec!r}: the {what} {path} is a folder, not a file")
    if not Path(path).is_file():
        raise ValueError(f"dataset spec {spec!r}: the {what} {path}: no such file")


@register_dataset(
    "photos",
    form="photos:<points file>?screen=<screen file>",
    options=("screen", "camera", "person", "size"),
    what="a person's calibration photos",
    option_types={"screen": str, "camera": str, "person": str},
    check=_check,
)
def open_photos(rest: str, options: dict[str, Any], spec: str) -> InMemoryGazeDataset:
    """``photos:<points file>?screen=<screen file>[&camera=<camera file>][&person=<id>][&size=<side>]``."""
    _check(rest, options, spec)
    return calibration_photos(
        rest,
        options["screen"],
        camera_file=options.get("camera"),
        person=options.get("person"),
        size=options.get("size", CROP_SIZE),
    )


def calibration_photos(
    points_file: str | Path,
    screen_file: str | Path,
    *,
    camera_file: str | Path | None = None,
    person: str | None = None,
    size: int = CROP_SIZE,
) -> InMemoryGazeDataset:
    """The labelled images of one person's calibration photos (the module's docstring); ``ValueError`` names the
    point and photo at fault (a point that gives a gaze instead of a photo, a photo without exactly one face, a
    face on the far side of the screen)."""
    from .camera import (
        PhotoOptions,
        SeveralFaces,
        gaze_vector_to_angles,
        load_camera,
        load_screen,
        normalized_faces,
        read_calibration_points,
        read_photo,
        resized_crops,
    )
    from .camera.photo import VIDEO_SUFFIXES
    from .camera.screen import BEHIND_THE_SCREEN

    points = read_calibration_points(points_file, for_fit=False)
    screen = load_screen(screen_file)
    options = PhotoOptions(camera=None if camera_file is None else load_camera(camera_file), faces="one")
    crops, gaze, head = [], [], []
    for i, (photo, pixel) in enumerate(zip(points.photos, points.screen_px), start=1):
        where = f"{points_file}: point {i}"
        if photo is None:
            raise ValueError(f"{where} gives a gaze, not a photo: a labelled image needs the photo of the person "
                             "looking at the point")  # fmt: skip
        if photo.suffix.lower() in VIDEO_SUFFIXES:
            raise ValueError(f"{where}'s photo {photo} is a video: each point needs a photo (a frame of it will do)")
        try:
            face = normalized_faces(read_photo(photo)[0], options)[1][0]
        except SeveralFaces as e:
            raise ValueError(f"{where}'s photo {photo}: {e}: a calibration photo shows only the person") from None
        except (ValueError, OSError) as e:  # a message of read_photo's that begins with the file's name says it once
            named = str(e).startswith(f"{photo} ")
            raise ValueError(f"{where}'s photo {e}" if named else f"{where}'s photo {photo}: {e}") from None
        centre = face.normalization.face_centre_mm
        if not screen.faces_it(centre):
            raise ValueError(f"{where}'s photo {photo}: {BEHIND_THE_SCREEN} (check {screen_file})")
        ray = screen.pixel_mm(*pixel) - centre
        gaze.append(gaze_vector_to_angles(face.normalization.to_normalized(ray / np.linalg.norm(ray))))
        normalized_head = face.fields["head_pose"]["normalized"]
        head.append(np.radians([normalized_head["yaw_deg"], normalized_head["pitch_deg"]]))
        crops.append(face.crop)
    pixels = torch.from_numpy(np.stack(crops)).permute(0, 3, 1, 2).float() / 255.0
    images = resized_crops(pixels, (size, size)).contiguous()
    name = person if person is not None else Path(points_file).stem
    return InMemoryGazeDataset(
        images,
        torch.from_numpy(np.stack(gaze)).float(),
        torch.zeros(len(crops), dtype=torch.long),
        [name],
        head=torch.from_numpy(np.stack(head)).float(),
        name=f"photos:{Path(points_file).stem}",
    )
