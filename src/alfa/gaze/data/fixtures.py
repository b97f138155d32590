"""Write tiny datasets in the exact layouts of the real ones, for tests.

``write_gazehub_fixture`` writes a GazeHub folder (``Image/``, ``Label/``) for MPIIFaceGaze,
EyeDiap, Gaze360 or ETH-XGaze with the same file names, header line, column order, angle order and
3-D conventions as GazeHub's own processing scripts; ``write_xgaze_h5_fixture`` writes one raw
ETH-XGaze subject file (BGR patches, ``(pitch, yaw)`` labels). Both return the ground truth they
wrote, already in the project's convention (``(yaw, pitch)`` radians, RGB), so a test can compare
what a loader reads against it. Images are flat colours, so JPEG keeps them to within a few levels.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from ..geometry import pitchyaw_to_vector
from .gazehub import GAZEHUB_FORMATS, canonical_gazehub_name

__all__ = ["FixtureTruth", "write_gazehub_fixture", "write_xgaze_h5_fixture", "write_xgaze_h5_dir", "DEFAULT_PERSONS"]

DEFAULT_PERSONS = {
    "mpiifacegaze": ["p00", "p01", "p02"],
    "eyediap": ["p1", "p2", "p10"],  # p10 after p2: label files are read in natural order
    "gaze360": ["rec_000/000000", "rec_000/000001", "rec_003/000000"],
    "eth-xgaze": ["subject0000", "subject0003", "subject0011"],
}


@dataclass
class FixtureTruth:
    """What a fixture writer put on disk, in the project's conventions."""

    root: Path
    persons: list[str]
    gaze: dict[str, np.ndarray] = field(default_factory=dict)  # person -> (n, 2) (yaw, pitch)
    head: dict[str, np.ndarray] = field(default_factory=dict)  # person -> (n, 2) (yaw, pitch), NaN if none
    colors: dict[str, np.ndarray] = field(default_factory=dict)  # person -> (n, 3) uint8 RGB of each face
    faces: dict[str, list[Path]] = field(default_factory=dict)  # person -> face image paths
    label_files: list[Path] = field(default_factory=list)


def _fmt(values) -> str:
    return ",".join(repr(float(v)) for v in values)


def _rotation_vector_with_z_axis(z_axis: np.ndarray) -> np.ndarray:
    """An axis-angle vector whose rotation maps (0, 0, 1) onto ``z_axis`` (a plausible 3DHead)."""
    z = z_axis / np.linalg.norm(z_axis)
    axis = np.cross([0.0, 0.0, 1.0], z)
    s, c = np.linalg.norm(axis), float(z[2])
    return np.zeros(3) if s < 1e-12 else axis / s * np.arctan2(s, c)


def _save_image(path: Path, rgb: tuple[int, int, int], size: tuple[int, int]) -> None:
    from PIL import Image

    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", (size[1], size[0]), tuple(int(c) for c in rgb)).save(path, quality=95)


def _angles(rng: np.random.Generator, n: int, yaw: float, pitch: float) -> np.ndarray:
    return np.stack([rng.uniform(-yaw, yaw, n), rng.uniform(-pitch, pitch, n)], -1)


def write_gazehub_fixture(
    root: str | Path,
    dataset: str = "mpiifacegaze",
    *,
    persons: Sequence[str] | None = None,
    images_per_person: int = 6,
    size: int = 16,
    split: str = "train",
    seed: int = 0,
    write_eyes: bool = True,
) -> FixtureTruth:
    """Write a small GazeHub-layout dataset under ``root`` and return what was written.

    Person names follow the real datasets: ``p00`` (MPIIFaceGaze), ``p1`` (EyeDiap),
    ``rec_000/000000`` (Gaze360: recording/identity), ``subject0000`` (ETH-XGaze). ``split`` names
    the label file for the sources (Gaze360, ETH-XGaze); calling again with another split adds a
    second label file to the same root.
    """
    fmt = GAZEHUB_FORMATS[canonical_gazehub_name(dataset)]
    root = Path(root)
    persons = list(persons) if persons is not None else list(DEFAULT_PERSONS[fmt.name])
    rng = np.random.default_rng(seed)
    truth = FixtureTruth(root=root, persons=persons)
    (root / "Label").mkdir(parents=True, exist_ok=True)
    header = " ".join(fmt.header)
    eye_size = (max(2, size // 4), max(2, size // 2))
    sources: list[str] = []  # rows of a source split file, all persons together

    counter = 0  # Gaze360/ETH-XGaze number their face images across the whole split
    for person_number, person in enumerate(persons):
        n = images_per_person
        gaze = _angles(rng, n, 0.6, 0.4)
        head = _angles(rng, n, 0.5, 0.3) if fmt.name != "gaze360" else np.full((n, 2), np.nan)
        colors = rng.integers(16, 240, size=(n, 3), dtype=np.int64).astype(np.uint8)
        truth.gaze[person], truth.head[person], truth.colors[person] = gaze, head, colors
        truth.faces[person] = []
        rows = []
        for j in range(n):
            counter += 1
            yaw_pitch = gaze[j]
            camera_vector = pitchyaw_to_vector(torch.tensor(yaw_pitch, dtype=torch.float64)).numpy()
            if fmt.name in ("mpiifacegaze", "eyediap"):
                face = f"{person}/face/{j + 1}.jpg"
                left, right = f"{person}/left/{j + 1}.jpg", f"{person}/right/{j + 1}.jpg"
                image_dir = root / "Image"
                gaze3d = -camera_vector  # GazeHub stores the negated direction
                head2d = head[j]
                if fmt.head_points_backward:
                    # EyeDiap's 2DHead describes the opposite axis of the head: yaw near +-pi.
                    head2d = np.array([np.arctan2(-np.sin(head[j][0]), -np.cos(head[j][0])), -head[j][1]])
                # GazeHub's 2DHead is (atan2(z_x, z_z), asin(z_y)) of the head rotation's z-axis.
                z_axis = pitchyaw_to_vector(torch.tensor(head2d, dtype=torch.float64)).numpy()
                head3d = _rotation_vector_with_z_axis(z_axis)
                if fmt.name == "mpiifacegaze":
                    columns = [
                        face, left, right, f"day{1 + j // 3:02d}/{j + 1:04d}.jpg", ("left", "right")[j % 2],
                        _fmt(gaze3d), _fmt(head3d), _fmt(yaw_pitch), _fmt(head2d),
                        _fmt(rng.normal(0, 0.1, 3)), _fmt([1.0, 1.0, 0.9]), _fmt(rng.normal(0, 20, 3)),
                    ]  # fmt: skip
                else:
                    number = int(person[1:]) if person[1:].isdigit() else person_number + 1
                    origin = f"{number}_A_FT_S_{1 + 15 * j}"
                    columns = [face, left, right, origin, _fmt(gaze3d), _fmt(head3d), _fmt(yaw_pitch), _fmt(head2d)]
            elif fmt.name == "gaze360":
                recording, identity = person.split("/")
                face = f"{split}/Face/{counter}.jpg"
                left, right = f"{split}/Left/{counter}.jpg", f"{split}/Right/{counter}.jpg"
                image_dir = root / "Image"
                x, y, z = camera_vector
                gaze3d = np.array([x, y, -z])  # Gaze360 eye frame: x left, y up, z away
                origin = f"{recording}/head/{identity}/{100 + j:06d}.jpg"
                columns = [face, left, right, origin, _fmt(gaze3d), _fmt(yaw_pitch)]
            else:  # ETH-XGaze: gaze and head copied from the h5 files, so (pitch, yaw)
                face = f"{person}/{counter}.jpg"
                left = right = None
                image_dir = root / "Image" / split
                columns = [
                    face, _fmt(yaw_pitch[::-1]), _fmt(head[j][::-1]), f"{person}/{j}.jpg",
                    str(j % 18), str(j), _fmt(np.eye(3).ravel()),
                ]  # fmt: skip
            _save_image(image_dir / face, tuple(colors[j]), (size, size))
            if write_eyes and left is not None:
                _save_image(image_dir / left, tuple(colors[j]), eye_size)
                _save_image(image_dir / right, tuple(colors[j]), eye_size)
            truth.faces[person].append(image_dir / face)
            rows.append(" ".join(columns))
        if fmt.per_person_label_files:
            label = root / "Label" / f"{person}.label"
            label.write_text(header + "\n" + "\n".join(rows) + "\n", encoding="utf-8")
            truth.label_files.append(label)
        else:
            sources.extend(rows)
    if not fmt.per_person_label_files:
        label = root / "Label" / f"{split}.label"
        label.write_text(header + "\n" + "\n".join(sources) + "\n", encoding="utf-8")
        truth.label_files.append(label)
    return truth


def write_xgaze_h5_fixture(
    path: str | Path,
    *,
    images: int = 5,
    size: int = 16,
    seed: int = 0,
    with_gaze: bool = True,
    with_head: bool = True,
) -> dict:
    """Write one raw ETH-XGaze subject file (``subject0000.h5`` style) and return its truth.

    Keys and layout as released: ``face_patch`` (N, S, S, 3) uint8 BGR in (1, S, S, 3) chunks,
    ``face_gaze`` and ``face_head_pose`` (N, 2) float as (pitch, yaw), ``face_mat_norm`` (N, 3, 3),
    ``cam_index`` and ``frame_index`` (N, 1). ``with_gaze=False`` writes a test-subject file.
    The returned ``rgb`` is (N, S, S, 3) uint8; ``gaze``/``head`` are (N, 2) (yaw, pitch).
    """
    import h5py

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    rgb = rng.integers(0, 256, size=(images, size, size, 3), dtype=np.int64).astype(np.uint8)
    gaze = _angles(rng, images, 1.2, 0.7)
    head = _angles(rng, images, 1.0, 0.6)
    with h5py.File(path, "w") as h5:
        h5.create_dataset("face_patch", data=rgb[..., ::-1], chunks=(1, size, size, 3), compression="lzf")
        if with_gaze:
            h5.create_dataset("face_gaze", data=gaze[:, ::-1].astype(np.float64))
        if with_head:
            h5.create_dataset("face_head_pose", data=head[:, ::-1].astype(np.float64))
        h5.create_dataset("face_mat_norm", data=np.tile(np.eye(3), (images, 1, 1)))
        h5.create_dataset("cam_index", data=(np.arange(images) % 18).reshape(-1, 1).astype(np.int64))
        h5.create_dataset("frame_index", data=(np.arange(images) // 18).reshape(-1, 1).astype(np.int64))
    return {
        "path": path,
        "person": path.stem,
        "rgb": rgb,
        "gaze": gaze,
        "head": head if with_head else np.full((images, 2), np.nan),
    }


def write_xgaze_h5_dir(
    root: str | Path, subjects: Sequence[int] = (0, 3, 11), *, images: int = 5, size: int = 16, seed: int = 0
) -> dict[str, dict]:
    """Write ``subjectXXXX.h5`` files for ``subjects`` under ``root``; returns person -> truth."""
    root = Path(root)
    out = {}
    for k, subject in enumerate(subjects):
        truth = write_xgaze_h5_fixture(root / f"subject{subject:04d}.h5", images=images, size=size, seed=seed + k)
        out[truth["person"]] = truth
    return out
