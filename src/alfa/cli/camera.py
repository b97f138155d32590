"""The camera command of ``alfa``: ``predict``, from photos (or a video's frames) to gaze and screen points.

The handler turns options into :class:`alfa.gaze.camera.PhotoOptions` and a predictor of the checkpoint (and
adapter), and calls :func:`alfa.gaze.camera.photo.predict_photos` or :func:`~alfa.gaze.camera.photo.analyse_video`.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from .options import at_least, default_of, device_option, positive_fraction, quiet_option, threads_option
from .registry import Command

__all__ = ["PREDICT"]


def _predict_arguments(p: argparse.ArgumentParser) -> None:
    from alfa.gaze.camera.photo import PACKAGED_PHOTOS, PhotoOptions, analyse_video

    packaged = ", ".join(f"skimage:{n}" for n in PACKAGED_PHOTOS[1:])
    p.add_argument(
        "images",
        nargs="+",
        metavar="IMAGE",
        help=f"photo files (or skimage:astronaut, a packaged photo of a face; {packaged} have none to find); with "
        "--video: videos",
    )
    p.add_argument("--checkpoint", required=True, help="the gaze model (a source model or a truncated base)")
    p.add_argument("--adapter", help="a person's adapter file to load onto --checkpoint")
    p.add_argument(
        "--camera",
        help="the camera's intrinsics (JSON: matrix, distortion, image_size; docs/camera.md); default: focal length "
        "= image width, no distortion, as the output says",
    )
    screen = p.add_mutually_exclusive_group()
    screen.add_argument("--screen", help="the screen's size and pose in the camera frame (JSON; docs/camera.md)")
    screen.add_argument(
        "--screen-fit",
        help="instead of --screen: a few calibration points, each a screen pixel and the gaze (degrees) or the photo "
        "of the person looking at it, to fit the screen point from (JSON; docs/camera.md)",
    )
    p.add_argument(
        "--faces",
        choices=("one", "all"),
        default=PhotoOptions().faces,
        help="one: a photo must show exactly one face; all: read every face (default %(default)s)",
    )
    p.add_argument("--json", help="also write the printed JSON to this file")
    p.add_argument("--crops", help="folder to write each face's normalized 224×224 crop to (<photo>-face<i>.png)")
    p.add_argument(
        "--replace",
        action="store_true",
        help="overwrite the --json file, and these photos' crops in --crops, if they exist (by default that is "
        "refused before anything runs)",
    )
    p.add_argument("--video", action="store_true", help="IMAGE names video files: per frame its largest face, smoothed")
    # None until given: an option given without --video is refused, not silently unused
    smooth, every = default_of(analyse_video, "alpha"), default_of(analyse_video, "every")
    p.add_argument(
        "--smooth",
        type=positive_fraction,
        help=f"video: a new frame's weight in the smoothed gaze (1: none; default {smooth})",
    )
    p.add_argument("--every", type=at_least(1), help=f"video: every N-th frame (default {every})")
    quiet_option(p)
    device_option(p)
    threads_option(p)


def _options(args: argparse.Namespace) -> tuple[Any, Any]:
    """The photo options, and a screen-fit file's points (read and checked; fitted once the model can read its
    photos, :func:`alfa.gaze.camera.photo.fit_screen`)."""
    from alfa.gaze.camera import PhotoOptions, load_camera, load_screen, read_calibration_points

    options = PhotoOptions(
        camera=load_camera(args.camera) if args.camera else None,
        screen=load_screen(args.screen) if args.screen else None,
        faces=args.faces,
    )
    points = read_calibration_points(args.screen_fit) if args.screen_fit else None
    if points is not None and args.json:
        taken = [p for p in points.photos if p is not None and p.resolve() == Path(args.json).resolve()]
        if taken:
            raise ValueError(f"--json {args.json} is a photo of --screen-fit {args.screen_fit}: choose another path")
    return options, points


def _refuse_json_among_crops(args: argparse.Namespace) -> None:
    """``--json`` named like one of these photos' crops in ``--crops``: the crop would be written, then replaced by
    the JSON, and the record would still name it."""
    if not (args.json and args.crops) or Path(args.json).resolve().parent != Path(args.crops).resolve():
        return
    from alfa.gaze.camera.photo import is_crop_of

    if any(is_crop_of(Path(args.json).name, image) for image in args.images):
        raise ValueError(f"--json {args.json} is named like a crop of these photos in --crops: choose another name")


def _predictor(args: argparse.Namespace) -> Any:
    from alfa.adapters import load_adapter
    from alfa.gaze.camera import model_predictor
    from alfa.gaze.devices import resolve_device

    from .guards import load_finished

    model, saved = load_finished(args.checkpoint)
    if not saved.get("input_size"):
        raise ValueError(f"{args.checkpoint} does not record the image size it was trained on")
    model.to(resolve_device(args.device)).eval()
    if args.adapter:
        load_adapter(model, args.adapter)
    return model_predictor(model, tuple(saved["input_size"]))


def _predict(args: argparse.Namespace) -> None:
    from alfa.fileio import finite_or_none, write_json

    _refuse_unused_options(args)
    absent = [i for i in args.images if not i.startswith("skimage:") and not Path(i).is_file()]
    if absent:  # said before the model runs on the others
        first = f"{absent[0]} is a folder, not a photo" if Path(absent[0]).is_dir() else f"{absent[0]}: no such file"
        raise ValueError(first + (f" (and {len(absent) - 1} more inputs that are no file)" if len(absent) > 1 else ""))
    _refuse_json_among_crops(args)
    options, points = _options(args)  # bad files are refused before the model loads
    predictor = _predictor(args)
    meta: dict[str, Any] = {"checkpoint": args.checkpoint, "adapter": args.adapter}
    if points is not None:
        from alfa.gaze.camera.photo import fit_screen

        meta["screen_fit"] = fit_screen(points, options, predictor)
        warning = options.screen_fit.warning()
        if warning is not None:  # kept (the person may have no better points), but said
            print(f"alfa predict: warning: {args.screen_fit}: {warning}", file=sys.stderr)
    if args.video:
        from alfa.gaze.camera.photo import analyse_video, predict_videos

        alpha = default_of(analyse_video, "alpha") if args.smooth is None else args.smooth
        every = default_of(analyse_video, "every") if args.every is None else args.every
        records, failures = predict_videos(args.images, predictor, options, alpha, every, progress=not args.quiet)
    else:
        from alfa.gaze.camera.photo import predict_photos

        records, failures = predict_photos(
            args.images, predictor, options, args.crops, progress=not args.quiet, replace=args.replace
        )
    if len(failures) == len(args.images):  # nothing was read: the one line says why, no JSON of errors
        one = len(failures) == 1 and not args.video
        raise ValueError(failures[0] if one else f"no input could be read; first: {failures[0]}")
    document = {**meta, "videos" if args.video else "photos": records}
    print(json.dumps(finite_or_none(document), indent=2))  # as write_json writes it: strict JSON, the same text
    if args.json:
        write_json(args.json, document)
    if failures:
        raise ValueError(f"{len(failures)} of {len(args.images)} inputs gave no gaze; first: {failures[0]}")
    _refuse_a_screen_behind_every_face(args, records)


def _refuse_a_screen_behind_every_face(args: argparse.Namespace, records: Any) -> None:
    """A screen file that puts every face behind the screen is wrong (the output is kept: its gazes are right)."""
    from alfa.gaze.camera.screen import BEHIND_THE_SCREEN

    def screens(value: Any) -> Any:
        if isinstance(value, dict):
            yield from ([value["screen"]] if isinstance(value.get("screen"), dict) else [])
            yield from (s for v in value.values() for s in screens(v))
        elif isinstance(value, list):
            yield from (s for v in value for s in screens(v))

    found = list(screens(records))
    if args.screen and found and all(s.get("error") == BEHIND_THE_SCREEN for s in found):
        raise ValueError(f"--screen {args.screen}: for every face, {BEHIND_THE_SCREEN}")


def _refuse_unused_options(args: argparse.Namespace) -> None:
    """An option that would change nothing for these inputs is refused, not silently left unused."""
    if args.video and args.crops:
        raise ValueError("--crops writes photos' crops; a video's frames are not written (leave out --crops)")
    if args.video and args.faces == "all":
        raise ValueError("--faces all reads every face of a photo; a video is read by its largest face per frame")
    unused = [f"--{name}" for name in ("smooth", "every") if getattr(args, name) is not None]
    if unused and not args.video:
        verb = "apply" if len(unused) > 1 else "applies"
        raise ValueError(f"{' and '.join(unused)} {verb} to videos (with --video); these are photos")


PREDICT = Command(
    "predict",
    help="gaze from photos: face, landmarks, head pose, normalized crop, camera-frame gaze, screen point",
    description="Find the face in each photo, normalize it as ETH-XGaze does (224×224, 600 mm, focal 960), run the "
    "model on the crop and print, per face, every step as JSON (docs/camera.md shows one).",
    add_arguments=_predict_arguments,
    run=_predict,
    outputs={"json": False, "crops": True},
    mixed=frozenset({"crops"}),
    extra="camera",
)
