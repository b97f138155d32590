"""docs/camera.md: ``alfa predict`` on a real photo, drawn (box, landmarks, gaze arrow, the normalized crop) and
printed, with what the camera path assumes. Made from the command's committed JSON and crop
(:data:`alfa.study.pages.CAMERA_DATA`), so the page regenerates in a second without the model."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["camera_page", "plot_camera"]

ARROW_MM = 150.0
"""The gaze arrow's length in the scene (from the face centre), drawn in both images by projection."""


SECTIONS = "\n".join(
    [
        "## Screen points",
        "",
        "With the screen's geometry, the gaze ray from the face centre meets the screen's plane "
        '(`--screen S.json`): `{"width_mm", "height_mm", "width_px", "height_px", "top_left_mm": [x, y, z], '
        '"rotation": 3×3}`, all in the camera frame; `rotation` (its columns: the screen\'s right, down and '
        "normal, as the person sees it) defaults to `[[-1, 0, 0], [0, 1, 0], [0, 0, -1]]`, the screen in the "
        "camera's plane facing the person, as a laptop's webcam above its screen sees it (a rotation or a depth "
        "that puts the face behind the screen, its right and left swapped, is answered with an error, and "
        "`alfa predict` exits 2 when every face is). `top_left_mm` is the "
        "screen's top-left corner as the person sees it, which lies at +x in the camera frame (the camera's x "
        "points to the image's right, the person's left): a 344 mm wide screen whose camera sits 8 mm above the "
        "middle of its top edge has `top_left_mm` `[172, 8, 0]`. Without the geometry, `--screen-fit C.json` "
        'fits screen pixels from camera-frame gaze angles of a few calibration points: `{"degree": 1, "points": '
        '[{"gaze_deg": [yaw, pitch], "screen_px": [x, y]}, ...]}`, affine (3 points at least, not all on one '
        "line of the screen) or quadratic (`degree` 2, 6 at least, not all on one conic, such as two rows: a "
        "3×3 grid serves either). Each point's `gaze_deg` is the `gaze_camera` (`yaw_deg`, `pitch_deg`) that "
        "`alfa predict --json` gives for a photo of the person looking at that screen pixel; or the point names "
        'that photo instead (`{"photo": "calib/p1.jpg", "screen_px": [x, y]}`, relative to the file\'s folder), '
        "and `alfa predict` reads its one face with the same model, adapter and camera first, giving the same "
        "fit as those printed gazes. A fit also absorbs what the person's adapter leaves over; take the gazes "
        "with that person's `--adapter`. The output's `screen_fit` lists the points with their gazes, the fit's "
        "residual (`rms_px`) and its leave-one-out error (`leave_one_out_px`: each point predicted by the fit of "
        "the others, what to expect of a point the fit has not seen; none when no point is to spare, as with 3 "
        "points of an affine fit). A fit knows no "
        "screen size, so its point has no `on_screen`. A fit whose calibration gazes barely spread or nearly lie "
        "on one line is kept, with one warning line on stderr: its terms are ill-conditioned (condition number "
        "above 50 for an affine fit, 2,500 for a quadratic, with the angles in radians), so a gaze error of a "
        "degree may move its screen points far. In all three files a key the reader does not know (a "
        'misspelt `rotaton`) is refused, and so are values that are not numbers (`true`, `"500"`), pixel sizes '
        "that are no whole number, screen sides outside 1 to 100,000 (millimetres or pixels: a unit slip), gazes "
        "beyond ±90°, screen points beyond ±100,000 px and a degree other than 1 or 2.",
        "",
        "A fit maps what the model says onto the screen; the same session's photos can correct the model itself: "
        "with the screen's geometry each photo is a labelled image (the direction from the face to its point), "
        'which `alfa calibrate --data "photos:<points file>?screen=<screen file>&size=N"` fits the person\'s '
        "calibration file on ([deploy.md](deploy.md), *A person's own photos*).",
        "",
        "## The service and videos",
        "",
        "`alfa serve` answers `POST /predict/photo?user=ID` with a photo of any size and the same fields as "
        "above (plus `user`), the crop made on the server with `alfa serve --camera K.json`'s intrinsics (else "
        "the default ones) and, with `--screen S.json`, each face's `screen` point (one camera and screen for "
        "every user, as at a kiosk); a photo without exactly "
        "one face or a corrupt one is a 400 with the reason, and one over the service's pixel limit (checked "
        "from its header, before decoding) a 413, as a face crop is. `alfa predict --video V.mp4` reads a "
        "video's frames (every `--every`-th): per video its `camera` (the intrinsics, as a photo's), the "
        "`convention` and `smoothing`, and per frame the largest face's fields, as a photo's, with `frame` (its "
        "index) and `gaze_smoothed`, the camera-frame gaze (`gaze_camera`'s angles) smoothed exponentially over "
        "frames (`--smooth`, the new frame's weight); a frame without a face is recorded as such and restarts the "
        "smoothing.",
        "",
        "## Why OpenCV's Haar cascades",
        "",
        "Nothing may be downloaded at run time, so the detector's weights must ship inside a wheel that installs "
        "beside torch 2.13 and numpy 2. OpenCV's wheels below 5.0 carry their cascades in `cv2.data` (the 5.0 "
        "wheels ship that folder empty, hence `opencv-python-headless<5` in the `camera` extra), and OpenCV is "
        "needed anyway for `solvePnP` and the warp: one dependency. The others considered: MediaPipe 0.10.21, "
        "the last release whose wheel bundles the face-mesh models, pins `numpy<2` and `protobuf<5` (later "
        "releases need a model file downloaded); dlib's 68-point predictor comes in `face-recognition-models`, "
        "a 100 MB package whose model was trained on iBUG 300-W, licensed for research only; facenet-pytorch's "
        "MTCNN imports torchvision. The price: frontal faces only, and four landmarks from boxes (eye centres, "
        "mouth ends) rather than corners, so the head pose is rough; the crop is not.",
        "",
    ]
)
"""The page's sections that depend on no number: screen points, the service and videos, the detector's choice."""


def _project(matrix: np.ndarray, point: np.ndarray) -> np.ndarray:
    p = matrix @ point
    return p[:2] / p[2]


def _arrow(ax: Any, matrix: np.ndarray, centre: np.ndarray, gaze: np.ndarray) -> None:
    start, end = _project(matrix, centre), _project(matrix, centre + ARROW_MM * gaze)
    ax.annotate("", xy=tuple(end), xytext=tuple(start), arrowprops={"arrowstyle": "->", "color": "yellow", "lw": 2})


def plot_camera(record: dict[str, Any], data: Path, path: str | os.PathLike) -> Path:
    """The photo with each face's box, landmarks and camera-frame gaze arrow, and the first face's normalized
    crop with its normalized gaze arrow; ``data`` holds the crops ``alfa predict --crops`` wrote."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Rectangle
    from PIL import Image

    from alfa.gaze.camera import angles_to_gaze_vector, read_photo

    from .plotted import save_figure

    photo = record["photos"][0]
    rgb, _ = read_photo(photo["photo"])
    fig, (ax_photo, ax_crop) = plt.subplots(1, 2, figsize=(9.0, 4.6), gridspec_kw={"width_ratios": [1, 1]})
    ax_photo.imshow(rgb)
    camera = np.asarray(photo["camera"]["matrix"])
    for face in photo["faces"]:
        x, y, w, h = face["box"]
        ax_photo.add_patch(Rectangle((x, y), w, h, fill=False, color="cyan", lw=1.5))
        points = np.asarray(list(face["landmarks"].values()))
        ax_photo.plot(points[:, 0], points[:, 1], "o", ms=4, color="magenta", label="landmarks")
        centre = np.asarray(face["normalization"]["face_centre_mm"])
        _arrow(ax_photo, camera, centre, np.asarray(face["gaze_camera"]["vector"]))
    ax_photo.set_title(f"{photo['photo']}: box, landmarks, gaze (camera frame)", fontsize=9)
    face = photo["faces"][0]
    crop = np.asarray(Image.open(data / Path(face["crop"]).name).convert("RGB"))
    ax_crop.imshow(crop)
    norm = face["normalization"]
    size = norm["size"]
    normalized_camera = np.array([[norm["focal"], 0, size / 2], [0, norm["focal"], size / 2], [0, 0, 1.0]])
    gaze = face["gaze_normalized"]
    vector = angles_to_gaze_vector(np.radians([gaze["yaw_deg"], gaze["pitch_deg"]]))
    _arrow(ax_crop, normalized_camera, np.array([0.0, 0.0, norm["normalized_distance_mm"]]), vector)
    ax_crop.set_title(f"normalized crop ({size}×{size}, {norm['normalized_distance_mm']:g} mm, f = {norm['focal']:g})",
                      fontsize=9)  # fmt: skip
    for ax in (ax_photo, ax_crop):
        ax.set_xticks([])
        ax.set_yticks([])
    fig.tight_layout(pad=1.5)
    return save_figure(fig, path, dpi=100)


def camera_page(record: dict[str, Any], command: str, figure: str) -> str:
    """The markdown of docs/camera.md around ``record`` (the JSON ``alfa predict`` printed)."""
    photo = record["photos"][0]
    face = photo["faces"][0]
    gaze, camera_gaze = face["gaze_normalized"], face["gaze_camera"]
    return "\n".join(
        [
            "# From a photo to a gaze point",
            "",
            "<!-- generated by `alfa pages --write` from docs/data/camera (made by the commands below); "
            "do not edit -->",
            "",
            "Every model here reads a normalized 224×224 face crop, as the datasets ship them. `alfa predict` makes "
            "that crop from a photo of any size: it finds the face and four landmarks, fits the head pose, warps "
            "the face to the normalized camera, runs the model on the crop, and turns its gaze back into the "
            "camera's frame and, given a screen, into a point on it.",
            "",
            f"![{photo['photo']}: box, landmarks and gaze; the normalized crop]({figure})",
            "",
            f"**The gaze here is illustrative only.** The model (`{record['checkpoint']}`) is a ResNet-18 trained "
            "briefly on the synthetic ETH-like world (the first command below), the only training data this "
            "repository can make without downloads; on a real face it has never seen anything like, its "
            f"({gaze['yaw_deg']:.1f}°, {gaze['pitch_deg']:.1f}°) says nothing about where she looked. The "
            "detection, landmarks, head pose, crop and the frame conversions are what this page shows; bring a "
            "model trained on ETH-XGaze or GazeHub data (`alfa pretrain --data gazehub:…` or `xgaze-h5:…`) for gaze "
            "worth reading.",
            "",
            "## The commands",
            "",
            "```sh",
            command,
            "```",
            "",
            "The first command is deterministic on one kind of CPU; another kind trains another model (its kernels "
            "round differently, and two epochs on synthetic faces leave a real face's gaze free to land far from "
            "this one), so its gaze differs from the one below while the face, landmarks, head pose "
            "and crop do not. `skimage:astronaut` is a photo inside scikit-image's wheel (installed by the `dev` "
            "extra, not the `camera` one: `pip install scikit-image`; NASA's "
            "portrait of Eileen Collins, public domain); any photo file works the same. The JSON `alfa predict` "
            "printed (and wrote with `--json`):",
            "",
            "```json",
            json.dumps(record, indent=2),
            "```",
            "",
            "## What each field is",
            "",
            "- `notes`: what was done to the photo before any face was looked for: turned upright by its EXIF "
            "orientation; a grayscale photo copied into RGB, one of more than 8 bits (a near-infrared camera's "
            "`I;16`) scaled to 8 bits by the depth its values use; a transparency dropped; a CMYK photo converted "
            "to RGB; only the first frame of an animation read.",
            "- `camera`: the intrinsics used, and where they came from. Without `--camera K.json` they are assumed "
            "(focal length = image width, principal point = centre, no distortion) and `source` says so. A camera "
            'file is `{"matrix": [[fx, 0, cx], [0, fy, cy], [0, 0, 1]], "distortion": [k1, k2, p1, p2, k3], '
            '"image_size": [width, height]}` (distortion and size optional); intrinsics made for another image size, '
            "a principal point outside the image, an implausible focal length (or one over twice the other), a "
            "distortion that moves an image corner by more than a lens does (under 0.25× or over 4× its "
            "distance from the centre, with the radial, tangential and thin-prism terms) or an unknown key are "
            "refused in one line. The three JSON files are read as UTF-8 (a byte-order mark is fine; a UTF-16 "
            "file is said to be one).",
            "- `box`, `landmarks`: the face (x, y, width, height) and the centres of the eyes and the ends of the "
            "mouth, in pixels; the person's right is the image's left. `estimated_landmarks` lists those placed "
            "by an average face's proportions because a cascade found no eye pair or no mouth (a box where it "
            "finds neither is not taken for a face). A photo (or a video "
            "frame) larger than 640 pixels a side is searched for faces at 640 (at full size the cascade finds "
            "faces in a large photo's texture), and the landmarks at full size: a face must span about a sixteenth "
            "of the photo's longest side.",
            "- `head_pose`: the generic face model fitted by `solvePnP` (yaw, pitch of where the face points, "
            "roll; translation of the point between the eyes, mm), and `normalized`: the same direction in the "
            "normalized frame (the datasets' head label). Four nearly coplanar points fix the head's yaw and pitch "
            "only roughly; the crop and the gaze conversion use the face centre and the head's left-right axis, "
            "which they fix well (`tests/test_camera.py` measures it).",
            "- `normalization`: Zhang, Sugano & Bulling (ETRA 2018), with the ETH-XGaze release's rotation, scaling "
            "and warp: the face centre (mean of eye and mouth corners, as Zhang et al. take it for MPIIFaceGaze; "
            "ETH-XGaze's release takes the nostrils in place of the mouth), the rotation `R` whose forward axis "
            "points at it and whose "
            "x-axis follows the head, the scaling to 600 mm, the normalized camera (focal length 960, 224×224) and "
            "the warp `W = K_n S R K⁻¹` from photo pixels to crop pixels.",
            "- `gaze_normalized`: the model's output on the crop; `gaze_camera`: the same direction in the camera "
            "frame, `g_camera = Rᵀ g_normalized`, with its unit vector.",
            "- `screen` (with `--screen` or `--screen-fit`): the point looked at, `x_px`, `y_px` in screen pixels "
            "from the screen's top-left corner as the person sees it (x to the right, y down), and `method` "
            '(`"geometry"`, or `"fit (degree 1)"` and `2`); with the geometry also `x_mm`, `y_mm`, the same point '
            "in millimetres from that corner, and `on_screen`, whether it lies within the screen.",
            "",
            "## The convention",
            "",
            f"Every angle printed: {photo['convention']}. "
            "It is the label convention of the `gazehub:` and `xgaze-h5:` loaders (`alfa.gaze.data`), which the models "
            f"are trained on: this photo's ({gaze['yaw_deg']:.1f}°, {gaze['pitch_deg']:.1f}°) normalized, "
            f"({camera_gaze['yaw_deg']:.1f}°, {camera_gaze['pitch_deg']:.1f}°) in the camera frame. ETH-XGaze's "
            "h5 files and its GazeHub labels store the two angles as (pitch, yaw), MPIIFaceGaze's GazeHub labels as "
            "(yaw, pitch); the loaders reorder them.",
            "",
            SECTIONS,
        ]
    )
