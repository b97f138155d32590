"""Loader for GazeHub-normalized gaze datasets: ``<root>/Image/...`` and ``<root>/Label/*.label``.

GazeHub (Cheng et al., "Appearance-based Gaze Estimation With Deep Learning: A Review and
Benchmark") ships MPIIFaceGaze, EyeDiap, Gaze360 and ETH-XGaze as face crops plus plain-text label
files: a header line of column names, then one space-separated row per image, vectors comma-joined.
What each dataset looks like (checked against the GazeHub processing scripts; docs/real-data.md has
the sources):

- MPIIFaceGaze: ``Label/p00.label`` ... ``p14.label``, one file per person, header
  ``Face Left Right Origin WhichEye 3DGaze 3DHead 2DGaze 2DHead Rmat Smat GazeOrigin``; faces at
  ``Image/p00/face/1.jpg``.
- EyeDiap: ``Label/p1.label`` ... (p1-p11, p14-p16), header
  ``Face Left Right Origin 3DGaze 3DHead 2DGaze 2DHead``. Its ``2DHead`` describes the head's
  backward axis (yaw near +-pi); we turn it around so head (0, 0) means "facing the camera" as in
  MPIIFaceGaze.
- Gaze360: ``Label/train.label``, ``val.label``, ``test.label``, header
  ``Face Left Right Origin 3DGaze 2DGaze``; ``3DGaze`` is in Gaze360's eye frame (x left, y up,
  z away). No head pose. The person is the tracked identity in ``Origin``
  (``rec_XXX/head/<identity>/<frame>.jpg``), unique only within a recording, so the recording is
  the unit for person-disjoint splits.
- ETH-XGaze: ``Label/train.label`` (faces under ``Image/train/subjectXXXX/``), columns face, gaze,
  head, origin; gaze and head are copied from the ETH-XGaze h5 files and so are stored as
  ``(pitch, yaw)``: we reorder them.

Every direction this loader returns is ``(yaw, pitch)`` in radians (spec gaze-data §1).
"""

from __future__ import annotations

import itertools
import math
import os
import re
import warnings
from array import array
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor
from tqdm import tqdm

from ..geometry import angular_error, gazehub_vector_to_pitchyaw, pitchyaw_to_vector, vector_to_pitchyaw
from .base import GazeDataset, UnknownPersonError, shows_loading_progress, unit_images
from .registry import register_dataset

__all__ = [
    "DatasetFormatError",
    "GazeHubFormat",
    "GAZEHUB_FORMATS",
    "GazeHubDataset",
    "canonical_gazehub_name",
    "check_gazehub",
    "load_image",
    "natural_key",
    "open_gazehub",
]


class DatasetFormatError(ValueError):
    """Input that does not have the layout a loader expects. The message starts with the file
    (and line, or h5 row) where the problem is."""


ImageSize = int | tuple[int, int] | None


@dataclass(frozen=True)
class GazeHubFormat:
    """How one GazeHub dataset is laid out and which conventions its label columns use."""

    name: str
    header: tuple[str, ...]  # the header line GazeHub writes (fixtures write exactly this)
    per_person_label_files: bool  # Label/<person>.label (targets) or Label/<split>.label (sources)
    stored_order: str  # order of the two angles in 2DGaze / 2DHead: "yaw-pitch" or "pitch-yaw"
    gaze3d_frame: str | None  # "gazehub" (negated camera-frame vector), "gaze360-eye", or None
    head_points_backward: bool  # 2DHead is the direction of the head's backward axis
    person_from: str  # "label-file", "face-dir" (first folder of the face path) or "gaze360-origin"


def _header(line: str) -> tuple[str, ...]:
    return tuple(line.split())


GAZEHUB_FORMATS: dict[str, GazeHubFormat] = {
    "mpiifacegaze": GazeHubFormat(
        "mpiifacegaze",
        _header("Face Left Right Origin WhichEye 3DGaze 3DHead 2DGaze 2DHead Rmat Smat GazeOrigin"),
        per_person_label_files=True,
        stored_order="yaw-pitch",
        gaze3d_frame="gazehub",
        head_points_backward=False,
        person_from="label-file",
    ),
    "eyediap": GazeHubFormat(
        "eyediap",
        _header("Face Left Right Origin 3DGaze 3DHead 2DGaze 2DHead"),
        per_person_label_files=True,
        stored_order="yaw-pitch",
        gaze3d_frame="gazehub",
        head_points_backward=True,
        person_from="label-file",
    ),
    "gaze360": GazeHubFormat(
        "gaze360",
        _header("Face Left Right Origin 3DGaze 2DGaze"),
        per_person_label_files=False,
        stored_order="yaw-pitch",
        gaze3d_frame="gaze360-eye",
        head_points_backward=False,
        person_from="gaze360-origin",
    ),
    # Header as written by an ETH-XGaze h5 -> GazeHub conversion script; the loader matches any of
    # the accepted spellings (face; gaze/2DGaze; head/2DHead; origin), so "Face 2DGaze 2DHead" parses too.
    "eth-xgaze": GazeHubFormat(
        "eth-xgaze",
        _header("face gaze head origin cam_index frame_index normmat"),
        per_person_label_files=False,
        stored_order="pitch-yaw",
        gaze3d_frame=None,
        head_points_backward=False,
        person_from="face-dir",
    ),
}

_NAME_ALIASES = {
    "mpiifacegaze": "mpiifacegaze",
    "mpii": "mpiifacegaze",
    "mpiigaze": "mpiifacegaze",
    "eyediap": "eyediap",
    "diap": "eyediap",
    "gaze360": "gaze360",
    "eth-xgaze": "eth-xgaze",
    "ethxgaze": "eth-xgaze",
    "eth": "eth-xgaze",
    "xgaze": "eth-xgaze",
}

# Header names (lower case) that mean each column role; GazeHub's own spellings first. The first
# header column matching a role wins, so files that carry extra columns still parse.
_ROLE_NAMES = {
    "face": ("face",),
    "gaze2d": ("2dgaze", "gaze2d", "gaze"),
    "head2d": ("2dhead", "head2d", "head"),
    "gaze3d": ("3dgaze", "gaze3d"),
    "origin": ("origin", "metapath", "name"),
}

_SPLIT_ALIASES = {"val": ("val", "validation", "valid"), "validation": ("validation", "val", "valid")}
_SPLIT_ALIASES["valid"] = _SPLIT_ALIASES["val"]

# The 2-D labels are recomputed from the 3-D ones by GazeHub; anything beyond rounding means the
# columns are not what we think they are.
_MAX_3D_2D_DISAGREEMENT_DEG = 0.5


def canonical_gazehub_name(name: str) -> str:
    """``"mpii"`` -> ``"mpiifacegaze"`` etc.; raises ``ValueError`` listing the known names."""
    key = name.strip().lower().replace("_", "-")
    if key not in _NAME_ALIASES:
        raise ValueError(f"unknown GazeHub dataset {name!r}; known: {', '.join(GAZEHUB_FORMATS)}")
    return _NAME_ALIASES[key]


def natural_key(text: str) -> list:
    """Sort key that orders digit runs by value: p1, p2, p10 (not p1, p10, p2)."""
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", text)]


def _at(path: Path, line: int | None = None) -> str:
    return f"{path}:{line}" if line is not None else str(path)


def _reverse_direction(yaw_pitch: Tensor) -> Tensor:
    return vector_to_pitchyaw(-pitchyaw_to_vector(yaw_pitch.double())).float()


def _gaze3d_to_yaw_pitch(vectors: Tensor, frame: str) -> Tensor:
    if frame == "gazehub":
        return gazehub_vector_to_pitchyaw(vectors)
    if frame == "gaze360-eye":
        # Gaze360's eye frame has x left, y up, z away from the camera; the camera frame has x
        # right, y down, z away. GazeHub's stored vector is the negated camera-frame direction.
        x, y, z = vectors.unbind(-1)
        return vector_to_pitchyaw(torch.stack((x, y, -z), -1))
    raise ValueError(f"unknown 3-D gaze frame {frame!r}")


def _resized(rgb: np.ndarray, size: ImageSize) -> np.ndarray:
    """(H, W, 3) uint8 RGB, resized bilinearly to ``size`` if it is set and differs, as a writable copy (h5py and
    PIL may hand out read-only arrays, which torch.from_numpy warns about)."""
    if size is not None:
        from PIL import Image

        height, width = (size, size) if isinstance(size, int) else size
        if rgb.shape[:2] != (height, width):
            rgb = np.asarray(Image.fromarray(rgb).resize((width, height), Image.BILINEAR))
    return np.array(rgb, dtype=np.uint8, copy=True)


MAX_UPSCALE = 4
"""The most a face is upscaled a side to the ``?size=`` asked: a smaller one (a 1×1 "face" to 32×32) holds nothing of
a gaze to score or learn from, and is refused rather than blurred up."""


def _target(size: ImageSize) -> tuple[int, int]:
    return (size, size) if isinstance(size, int) else (int(size[0]), int(size[1]))


def refuse_tiny_face(shape: tuple[int, ...], size: ImageSize, where: str) -> bool:
    """Whether a face of ``shape`` (H, W, ...) is upscaled to ``size``; a ``DatasetFormatError`` naming ``where``
    (its label line or file row) where it is more than :data:`MAX_UPSCALE` times too small a side."""
    if size is None:
        return False
    (h, w), (height, width) = shape[:2], _target(size)
    if h * MAX_UPSCALE < height or w * MAX_UPSCALE < width:
        raise DatasetFormatError(
            f"{where}: the face is {h}×{w}, too small to resize to {height}×{width} (more than {MAX_UPSCALE}× a "
            "side, nothing of the gaze is left): use a smaller ?size=, or leave the face out"
        )
    return h < height or w < width


def upscale_note(name: str, sizes: Iterable[tuple[int, int]] | None, size: ImageSize, first: str) -> str:
    """The one note a dataset gives of faces smaller than its ``size`` being upscaled: how many of ``sizes`` (every
    face's (H, W); ``None`` where counting them would mean reading too many files) and the smallest."""
    height, width = _target(size)
    small = [s for s in sizes or () if s[0] < height or s[1] < width]
    if small:
        h, w = min(small, key=lambda s: s[0] * s[1])
        counted = f"{len(small)} face(s) are smaller than {height}×{width}, the smallest {h}×{w}"
    else:
        counted = f"faces smaller than {height}×{width} are met (first: {first}; not counted in so large a dataset)"
    return f"{name}: {counted}: upscaled to ?size={height}, which blurs them (said once for the dataset)"


def _stack_rgb(images: Sequence[np.ndarray], where: Callable[[int], str] | None = None) -> Tensor:
    """(H, W, 3) uint8 arrays of one size -> (N, 3, H, W) uint8, contiguous: a batch laid out channels-last would
    take other convolution kernels on the CPU, and other numbers, than the items stacked. ``where(k)`` names the
    k-th image's origin (its label line, its file and row) for the error a face of another size gets."""
    sizes = sorted({image.shape[:2] for image in images})
    if len(sizes) > 1:
        shown = " and ".join(f"{h}×{w}" for h, w in sizes[:2])
        odd = next(k for k, image in enumerate(images) if image.shape[:2] != images[0].shape[:2])
        named = f"; the first of another size than the batch's first: {where(odd)}" if where is not None else ""
        raise DatasetFormatError(
            f"faces of different sizes in one batch ({shown}{' and more' if len(sizes) > 2 else ''}{named}): add "
            "?size=N to the dataset spec to resize every face to N×N"
        )
    return torch.from_numpy(np.stack(images)).permute(0, 3, 1, 2).contiguous()


def _read_rgb(path: str | Path) -> np.ndarray:
    from PIL import Image

    try:
        with Image.open(path) as img:
            return np.asarray(img.convert("RGB"))
    except (OSError, ValueError, Image.DecompressionBombError) as err:  # the last: a header claiming a huge image
        raise DatasetFormatError(f"{path}: cannot read image ({err})") from err


def load_image(path: str | Path, size: ImageSize = None) -> Tensor:
    """Read an image file as a (3, H, W) float32 RGB tensor in [0, 1], optionally resized."""
    return unit_images(_stack_rgb([_resized(_read_rgb(path), size)])[0])


@dataclass
class _LabelFile:
    path: Path
    image_root: Path
    names: list[str]  # header column names, for messages
    columns: dict[str, int]  # role -> column index


class _Rows:
    """All label rows in flat arrays: a Python object per row would cost gigabytes and minutes on
    ETH-XGaze's 750k rows."""

    def __init__(self) -> None:
        self.faces: list[str] = []
        self.gaze = array("d")
        self.head = array("d")
        self.gaze3d = array("d")
        self.file = array("i")
        self.line = array("q")
        self.person = array("i")
        self.person_names: list[str] = []
        self.person_id: dict[str, int] = {}
        self.group: dict[str, str] = {}

    def person_number(self, person: str, group: str) -> int:
        number = self.person_id.get(person)
        if number is None:
            number = self.person_id[person] = len(self.person_names)
            self.person_names.append(person)
            self.group[person] = group
        return number


class GazeHubDataset(GazeDataset):
    """A GazeHub-normalized dataset, read lazily: labels are parsed up front, images on access.

    Args:
        root: the folder holding ``Image/`` and ``Label/``.
        dataset: ``mpiifacegaze``, ``eyediap``, ``gaze360`` or ``eth-xgaze`` (aliases: mpii, diap,
            eth, xgaze).
        split: for the sources (Gaze360, ETH-XGaze), which ``Label/<split>.label`` to read
            (default ``train``; ``val``/``validation``/``valid`` are the same). The targets have one
            label file per person and take no split.
        persons: keep only these persons (in dataset order); unknown names are an error.
        size: resize faces to ``size`` (int or ``(H, W)``); None keeps the stored size (224 for GazeHub).
        check_files: verify up front that every listed face image exists.
        verify_3d: where a 3-D gaze column exists, check that it gives the same direction as the
            2-D one (catches a swapped or misread column).
        stored_order: override the angle order of the 2-D columns (``"yaw-pitch"`` or
            ``"pitch-yaw"``), e.g. for an ETH-XGaze label file someone already converted.
    """

    def __init__(
        self,
        root: str | Path,
        dataset: str,
        *,
        split: str | None = None,
        persons: Sequence[str] | None = None,
        size: ImageSize = None,
        check_files: bool = True,
        verify_3d: bool = True,
        stored_order: str | None = None,
    ) -> None:
        self.format = GAZEHUB_FORMATS[canonical_gazehub_name(dataset)]
        self.name = self.format.name
        self.root = Path(root)
        self.size = size
        order = stored_order or self.format.stored_order
        if order not in ("yaw-pitch", "pitch-yaw"):
            raise ValueError(f"stored_order must be 'yaw-pitch' or 'pitch-yaw', got {order!r}")

        rows = _Rows()
        self._files: list[_LabelFile] = []
        for label_path in self._label_paths(split):
            self._read_label_file(label_path, split, rows)
        self._refuse_repeated_faces(rows)
        self._file_index = np.frombuffer(rows.file, dtype=np.int32)
        self._line = np.frombuffer(rows.line, dtype=np.int64)
        gaze = torch.from_numpy(np.frombuffer(rows.gaze, dtype=np.float64).reshape(-1, 2).copy())
        head = torch.from_numpy(np.frombuffer(rows.head, dtype=np.float64).reshape(-1, 2).copy())
        self._check_finite(gaze, "gaze2d")
        self._check_finite(head, "head2d")
        if order == "pitch-yaw":
            gaze, head = gaze.flip(-1), head.flip(-1)
        if verify_3d and self.format.gaze3d_frame is not None:
            gaze3d = torch.from_numpy(np.frombuffer(rows.gaze3d, dtype=np.float64).reshape(-1, 3).copy())
            self._check_finite(gaze3d, "gaze3d")
            self._check_3d_agrees(gaze, gaze3d)
        if self.format.head_points_backward:
            known = ~torch.isnan(head).any(-1)
            head[known] = _reverse_direction(head[known]).double()

        person_of = np.frombuffer(rows.person, dtype=np.int32)
        keep = self._select_persons(rows, person_of, persons)
        faces = rows.faces if keep is None else [rows.faces[i] for i in keep]
        # One bytes array, not a list of str: a loader worker touching a Python object writes its reference count,
        # which copies the page it lies on, so 750k strings would grow every worker by tens of MB an epoch.
        self._faces = np.array([face.encode("utf-8") for face in faces], dtype=bytes)
        if keep is not None:
            self._file_index, self._line, person_of = self._file_index[keep], self._line[keep], person_of[keep]
            gaze, head = gaze[keep], head[keep]
        self.gaze = gaze.float()
        self.head = head.float()
        self._person_of = person_of
        self._person_names = rows.person_names
        self._group = rows.group
        numbers, first = np.unique(person_of, return_index=True)
        self._persons = [rows.person_names[n] for n in numbers[np.argsort(first)]]
        order_by_person = np.argsort(person_of, kind="stable")
        bounds = np.searchsorted(person_of[order_by_person], numbers)
        self._index = {
            rows.person_names[n]: order_by_person[start:stop].tolist()
            for n, start, stop in zip(numbers, bounds, [*bounds[1:], len(person_of)])
        }
        if check_files:
            self._check_files()

    # ----- the GazeDataset interface -----

    def __len__(self) -> int:
        return len(self._faces)

    def __getitem__(self, i: int) -> dict:
        (i,) = self.positions([i])
        person = self._person_names[self._person_of[i]]
        image = unit_images(self.raw_images([i])[0])
        return {"image": image, "gaze": self.gaze[i], "head": self.head[i], "person": person, "index": i}

    def raw_images(self, indices: Sequence[int]) -> Tensor:
        positions = self.positions(indices)
        return _stack_rgb([self._face(i) for i in positions], lambda k: self.source_line(positions[k]))

    def _face_name(self, i: int) -> str:
        """Item ``i``'s face path as its label file gives it (relative to its image folder)."""
        return self._faces[i].decode("utf-8")

    def _face(self, i: int) -> np.ndarray:
        """Item ``i``'s face, (H, W, 3) uint8 RGB at the dataset's size; an unreadable file names its label line."""
        try:
            rgb = _read_rgb(self.image_path(i))
        except DatasetFormatError as err:
            raise DatasetFormatError(f"{err} (listed at {self.source_line(i)})") from err
        if refuse_tiny_face(rgb.shape, self.size, self._where(i)) and not getattr(self, "_upscales_said", False):
            self._upscales_said = True  # once per dataset (per loader worker), however many faces and epochs
            warnings.warn(upscale_note(self.name, self._face_sizes(), self.size, self._where(i)), stacklevel=2)
        return _resized(rgb, self.size)

    def _where(self, i: int) -> str:
        return f"{self.image_path(i)} (listed at {self.source_line(i)})"

    def _face_sizes(self) -> list[tuple[int, int]] | None:
        """Every face's (H, W) from its file's header (not its pixels), the first too small to resize refused now,
        before anyone is scored; ``None`` for a dataset too large to read every header of on the side."""
        if len(self) > _BAR_IMAGES:
            return None
        from PIL import Image

        sizes = []
        for i in range(len(self)):
            try:
                with Image.open(self.image_path(i)) as img:
                    sizes.append((img.height, img.width))
            except (OSError, ValueError, Image.DecompressionBombError):
                continue  # said as such when the face itself is read
            refuse_tiny_face(sizes[-1], self.size, self._where(i))
        return sizes

    def persons(self) -> list[str]:
        return list(self._persons)

    def person_group(self, person: str) -> str:
        """The unit that keeps persons disjoint in a split: the person itself, except for Gaze360
        where one physical subject can carry several identities within a recording."""
        return self._group[person]

    def image_path(self, i: int) -> Path:
        return self._files[int(self._file_index[i])].image_root / self._face_name(i)

    def source_line(self, i: int) -> str:
        """``label_file:line`` the i-th item came from (for error messages and debugging)."""
        return _at(self._files[int(self._file_index[i])].path, int(self._line[i]))

    # ----- reading -----

    def _label_paths(self, split: str | None) -> list[Path]:
        label_dir = _label_folder(self.root)
        try:
            names = os.listdir(label_dir)
        except OSError as err:  # unreadable: said, rather than reported as holding no label files
            raise DatasetFormatError(f"{label_dir}: cannot list the label folder ({err.strerror or err})") from err
        available = sorted(
            (label_dir / n for n in names if n.endswith(".label") and (label_dir / n).is_file()),
            key=lambda p: natural_key(p.name),
        )
        if not available:
            raise DatasetFormatError(f"{label_dir}: no .label files in the label folder")
        if self.format.per_person_label_files:
            if split is not None:
                raise ValueError(
                    f"{self.name} has one label file per person and no splits; select persons with ?persons=p00,p01"
                )
            split_files = [
                p.name for p in available if p.stem.lower() in ("train", "val", "valid", "validation", "test")
            ]
            if split_files:  # a source's layout read as a target's would take its split for a person, and may
                # read its angles in the wrong order: said, not guessed
                raise DatasetFormatError(
                    f"{label_dir}: holds {', '.join(split_files)}, a split's label file (ETH-XGaze's or Gaze360's "
                    f"layout), where {self.name} has one label file per person: is the dataset in the spec right?"
                )
            return available
        split = split or "train"
        for candidate in _SPLIT_ALIASES.get(split, (split,)):
            path = label_dir / f"{candidate}.label"
            if path.is_file():
                return [path]
        looked = ", ".join(f"{c}.label" for c in _SPLIT_ALIASES.get(split, (split,)))
        raise DatasetFormatError(
            f"{label_dir}: no label file for split {split!r} (looked for {looked}); found "
            f"{', '.join(p.name for p in available)}"
        )

    def _columns(self, path: Path, names: list[str]) -> dict[str, int]:
        lowered = [n.lower() for n in names]
        looks_like_data = any("/" in n or "," in n or n.endswith((".jpg", ".png")) for n in lowered)
        columns: dict[str, int] = {}
        for role, aliases in _ROLE_NAMES.items():
            for j, n in enumerate(lowered):
                if n in aliases:
                    columns[role] = j
                    break
        required = ["face", "gaze2d"] + (["origin"] if self.format.person_from == "gaze360-origin" else [])
        missing = [role for role in required if role not in columns]
        if looks_like_data or missing:
            wanted = "; ".join(f"{role}: one of {'/'.join(_ROLE_NAMES[role])}" for role in missing or required)
            hint = "; ETH-XGaze's test labels carry no gaze" if self.name == "eth-xgaze" and "gaze2d" in missing else ""
            raise DatasetFormatError(
                f"{_at(path, 1)}: unrecognized header {' '.join(names)!r} for a GazeHub {self.name} label file "
                f"(expected a header line like {' '.join(self.format.header)!r}; missing {wanted}{hint})"
            )
        if self.format.gaze3d_frame is None:
            columns.pop("gaze3d", None)
        return columns

    def _read_label_file(self, path: Path, split: str | None, rows: _Rows) -> None:
        try:
            with path.open(encoding="utf-8-sig") as stream:  # -sig: a byte-order mark some editors write
                self._read_label_stream(path, stream, split, rows)
        except (OSError, UnicodeDecodeError) as err:
            raise DatasetFormatError(f"{path}: cannot read label file ({err})") from err

    def _read_label_stream(self, path: Path, stream, split: str | None, rows: _Rows) -> None:
        header = stream.readline()
        if not header.strip():
            raise DatasetFormatError(f"{_at(path, 1)}: empty label file (expected a header line)")
        names = header.split()
        columns = self._columns(path, names)
        n_columns = len(names)
        c_face, c_gaze = columns["face"], columns["gaze2d"]
        c_head, c_gaze3d, c_origin = columns.get("head2d"), columns.get("gaze3d"), columns.get("origin")
        k = len(self._files)
        fixed_person = rows.person_number(path.stem, path.stem) if self.format.person_from == "label-file" else None
        # Bound methods in locals: this loop runs once per image (750k times for ETH-XGaze).
        add_face, add_file, add_line, add_person = (
            rows.faces.append,
            rows.file.append,
            rows.line.append,
            rows.person.append,
        )
        add_gaze, add_head, add_gaze3d = rows.gaze.extend, rows.head.extend, rows.gaze3d.extend
        no_head, no_gaze3d = (math.nan, math.nan), (math.nan, math.nan, math.nan)
        numbered = enumerate(stream, start=2)
        if path.stat().st_size > _BAR_BYTES and shows_loading_progress():
            numbered = tqdm(numbered, desc=f"reading {path.name}", unit="row", leave=False)
        first_faces: list[str] = []  # a few, to find the folder the paths are relative to
        for line, text in numbered:
            tokens = text.split()
            if len(tokens) != n_columns:
                if not tokens:
                    continue  # blank lines (e.g. at the end of the file) carry nothing
                raise DatasetFormatError(
                    f"{_at(path, line)}: expected {n_columns} space-separated columns as in the header, "
                    f"found {len(tokens)}"
                )
            try:
                add_gaze(float(v) for v in _exactly(tokens[c_gaze].split(","), 2))
                add_head(no_head if c_head is None else (float(v) for v in _exactly(tokens[c_head].split(","), 2)))
                add_gaze3d(
                    no_gaze3d if c_gaze3d is None else (float(v) for v in _exactly(tokens[c_gaze3d].split(","), 3))
                )
            except ValueError:
                self._raise_unparsable(path, line, tokens, names, columns)
            face = tokens[c_face]
            if face[0] == "/" or ".." in face:
                _refuse_face_outside(path, line, face)
            if fixed_person is None:
                person, group = self._person(path, line, face, tokens[c_origin] if c_origin is not None else None)
                add_person(rows.person_number(person, group))
            else:
                add_person(fixed_person)
            add_face(face)
            add_file(k)
            add_line(line)
            if len(first_faces) < _ROOT_SAMPLE:
                first_faces.append(face)
        if not first_faces:
            raise DatasetFormatError(f"{path}: has a header but no rows")
        self._files.append(_LabelFile(path, self._image_root(path, split, first_faces), names, columns))

    def _refuse_repeated_faces(self, rows: _Rows) -> None:
        # A face listed twice (say, a label file pasted twice) would silently count double in training and in
        # every person's mean error.
        roots = [str(f.image_root) for f in self._files]
        file_of = np.frombuffer(rows.file, dtype=np.int32)
        keys = [(roots[k], face) for k, face in zip(file_of.tolist(), rows.faces)]
        if len(set(keys)) == len(keys):
            return
        first_row: dict[tuple[str, str], int] = {}
        for row, key in enumerate(keys):
            earlier = first_row.setdefault(key, row)
            if earlier != row:
                at = [_at(self._files[file_of[r]].path, rows.line[r]) for r in (earlier, row)]
                raise DatasetFormatError(
                    f"{at[1]}: face {key[1]!r} is listed again (first at {at[0]}); a face counts once: "
                    "remove the repeated row"
                )

    def _raise_unparsable(self, path: Path, line: int, tokens: list[str], names: list[str], columns: dict) -> None:
        for role, count in (("gaze2d", 2), ("head2d", 2), ("gaze3d", 3)):
            if role not in columns:
                continue
            token = tokens[columns[role]]
            try:
                _exactly([float(v) for v in token.split(",")], count)
            except ValueError:
                raise DatasetFormatError(
                    f"{_at(path, line)}: column {names[columns[role]]} is {token!r}, expected {count} "
                    f"comma-separated numbers"
                ) from None
        raise DatasetFormatError(f"{_at(path, line)}: cannot parse the row")

    def _check_finite(self, values: Tensor, role: str) -> None:
        # Rows from files without this column hold NaN by design; only the others must be finite, and a 2D gaze
        # must be in radians: a value beyond π is most likely degrees, which would train on nonsense labels.
        has_column = np.array([role in f.columns for f in self._files])[self._file_index]
        finite = torch.isfinite(values).all(-1).numpy()
        for bad, what in (
            (np.flatnonzero(~finite & has_column), "which is not finite (NaN/inf)"),
            (
                np.flatnonzero((values.abs() > math.pi).any(-1).numpy() & finite & (role == "gaze2d")),
                "beyond ±π: angles are read in radians (degrees?)",
            ),
        ):
            if bad.size:
                label, line = self._files[int(self._file_index[bad[0]])], int(self._line[bad[0]])
                with label.path.open(encoding="utf-8-sig") as stream:  # the one line, not the whole file
                    text = next(itertools.islice(stream, line - 1, None))
                token = text.split()[label.columns[role]]
                raise DatasetFormatError(
                    f"{_at(label.path, line)}: column {label.names[label.columns[role]]} is {token!r}, {what}"
                )

    def _person(self, path: Path, line: int, face: str, origin: str | None) -> tuple[str, str]:
        if self.format.person_from == "face-dir":
            person, sep, _ = face.partition("/")
            if not sep or not person:
                raise DatasetFormatError(
                    f"{_at(path, line)}: face path {face!r} has no person folder (expected e.g. subject0000/1.jpg)"
                )
            return person, person
        # Gaze360: Origin is <recording>/head/<identity>/<frame>.jpg; identities are unique only
        # inside a recording, so the person is recording/identity and its split group the recording.
        parts = (origin or "").split("/")
        if len(parts) < 4 or not all(parts[:3]):
            raise DatasetFormatError(
                f"{_at(path, line)}: Origin {origin!r} is not <recording>/head/<identity>/<frame>.jpg"
            )
        return f"{parts[0]}/{parts[2]}", parts[0]

    def _image_root(self, label_path: Path, split: str | None, first_faces: list[str]) -> Path:
        # MPIIFaceGaze/EyeDiap/Gaze360 paths are relative to Image/; ETH-XGaze's to Image/train (also for its
        # validation file). Take the first root under which the first face exists, else (that one face missing)
        # the root under which most of the first few do: one missing face must not send all of them elsewhere.
        image_dir = self.root / "Image"
        candidates = [image_dir, image_dir / label_path.stem]
        if split:
            candidates.append(image_dir / split)
        candidates.append(image_dir / "train")
        for candidate in candidates:
            if (candidate / first_faces[0]).is_file():
                return candidate
        found = [sum((candidate / face).is_file() for face in first_faces) for candidate in candidates]
        return candidates[found.index(max(found))]  # none found anywhere: Image/, the first

    def _check_3d_agrees(self, gaze2d: Tensor, gaze3d: Tensor) -> None:
        has_3d = torch.from_numpy(
            np.array([f.columns.get("gaze3d") is not None for f in self._files])[self._file_index]
        )
        gaze2d, gaze3d = gaze2d[has_3d], gaze3d[has_3d]
        rows = torch.nonzero(has_3d).flatten()
        if len(rows) == 0:
            return
        norms = gaze3d.norm(dim=-1)
        if norms.min() <= 1e-9:
            raise DatasetFormatError(f"{self.source_line(int(rows[norms.argmin()]))}: 3DGaze is the zero vector")
        error = angular_error(_gaze3d_to_yaw_pitch(gaze3d, self.format.gaze3d_frame), gaze2d)
        worst = int(error.argmax())
        if error[worst] > _MAX_3D_2D_DISAGREEMENT_DEG:
            raise DatasetFormatError(
                f"{self.source_line(int(rows[worst]))}: 2DGaze {gaze2d[worst].tolist()} (as yaw, pitch) and 3DGaze "
                f"{gaze3d[worst].tolist()} disagree by {float(error[worst]):.2f} degrees; the columns are not "
                f"the GazeHub {self.name} layout (skip this check with verify_3d=False in Python, or "
                f"'?verify_3d=false' after a dataset spec)"
            )

    def _select_persons(self, rows: _Rows, person_of: np.ndarray, persons: Iterable[str] | None) -> np.ndarray | None:
        if persons is None:
            return None
        wanted = list(persons)
        if not wanted:
            raise ValueError(f"{self.name}: persons= names no one (leave the option out for every person)")
        unknown = [p for p in wanted if p not in rows.person_id]
        if unknown:
            known = rows.person_names
            shown = ", ".join(known[:20]) + (" ..." if len(known) > 20 else "")
            raise UnknownPersonError(f"{self.name}: no person(s) {unknown} in {self.root}; persons are: {shown}")
        return np.flatnonzero(np.isin(person_of, [rows.person_id[p] for p in wanted]))

    def _check_files(self) -> None:
        if not (self.root / "Image").is_dir():
            raise DatasetFormatError(f"{self.root / 'Image'}: no Image/ folder next to Label/")
        # One directory listing per folder instead of one stat per image: ETH-XGaze has 750k faces.
        listings: dict[str, set[str]] = {}
        roots = [str(f.image_root) for f in self._files]
        missing = []
        indices = range(len(self))
        if len(self) > _BAR_IMAGES and shows_loading_progress():
            indices = tqdm(indices, desc=f"checking {self.name} images", unit="img", leave=False)
        for i in indices:
            folder, name = os.path.split(os.path.normpath(os.path.join(roots[self._file_index[i]], self._face_name(i))))
            listing = listings.get(folder)
            if listing is None:
                try:
                    listing = listings[folder] = set(os.listdir(folder))
                except (FileNotFoundError, NotADirectoryError):
                    listing = listings[folder] = set()
                except OSError as err:  # e.g. no permission: its faces may well be there
                    raise DatasetFormatError(
                        f"{folder}: cannot list the image folder ({err.strerror or err}), "
                        f"listed at {self.source_line(i)}"
                    ) from err
            if name not in listing:
                missing.append(i)
        if missing:
            shown = "; ".join(f"{self.source_line(i)}: {self.image_path(i)}" for i in missing[:5])
            where = ""
            if len(missing) == len(self):
                where = f" (none is under {self.root / 'Image'}, nor its train/ or split folders: is the root right?)"
            raise DatasetFormatError(
                f"{len(missing)} of {len(self)} face images listed in {self.root / 'Label'} are missing{where}, "
                f"first: {shown}"
            )


def _refuse_face_outside(path: Path, line: int, face: str) -> None:
    # Faces are read relative to the dataset's Image/ folder; an absolute path or a '..' would read files the
    # dataset does not hold (and a label file from elsewhere could name any file on the machine).
    if face.startswith("/") or ".." in face.split("/"):
        raise DatasetFormatError(
            f"{_at(path, line)}: face path {face!r} leads out of the dataset's Image/ folder; "
            "face paths are relative to it"
        )


_BAR_BYTES, _BAR_IMAGES = 5_000_000, 50_000
"""A label file this large gets a progress bar while it is read, a dataset of this many images while their files are
checked (ETH-XGaze: 240 MB, 750k faces; MPIIFaceGaze reads in a blink)."""

_ROOT_SAMPLE = 20
"""How many of a label file's first faces choose the folder its face paths are relative to."""


def _exactly(values: list, count: int) -> list:
    if len(values) != count:
        raise ValueError(f"expected {count} values, got {len(values)}")
    return values


def _label_folder(root: Path) -> Path:
    """A GazeHub root's label folder, refused in one line where there is none."""
    label_dir = root / "Label"
    if not root.is_dir():  # said of the root the spec names, not of a Label/ folder inside it
        raise DatasetFormatError(f"{root}: {'not a folder' if root.exists() else 'no such folder'} (a GazeHub root)")
    if not label_dir.is_dir():
        raise DatasetFormatError(
            f"{label_dir}: no Label/ folder; a GazeHub dataset root holds Image/ and Label/*.label"
        )
    return label_dir


def _gazehub_parts(rest: str, spec: str) -> tuple[str, str]:
    """``<dataset>:<root>``'s two parts."""
    name, sep, root = rest.partition(":")
    if not sep or not root:
        raise ValueError(f"dataset spec {spec!r}: expected gazehub:<dataset>:<root>")
    return name, root


def check_gazehub(rest: str, options: dict[str, Any], spec: str) -> None:
    """``gazehub:<dataset>:<root>``'s spec, checked without reading a label (the dataset's name, its label
    folder; :func:`alfa.gaze.data.registry.check_spec`)."""
    name, root = _gazehub_parts(rest, spec)
    canonical_gazehub_name(name)
    _label_folder(Path(root))


@register_dataset(
    "gazehub",
    form="gazehub:<dataset>:<root>",
    options=("split", "size", "check_files", "verify_3d", "stored_order", "persons"),
    what="a GazeHub folder",
    check=check_gazehub,
)
def open_gazehub(rest: str, options: dict[str, Any], spec: str) -> GazeHubDataset:
    """``gazehub:<dataset>:<root>``: a GazeHub-normalized folder (:class:`GazeHubDataset`)."""
    name, root = _gazehub_parts(rest, spec)
    return GazeHubDataset(root, name, **options)
