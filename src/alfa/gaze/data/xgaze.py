"""Loader for the raw ETH-XGaze release: one HDF5 file per subject (``subject0000.h5`` ...).

Facts checked against the official repository (xucong-zhang/ETH-XGaze: ``data_loader.py``,
``normalization_example.py``):

- ``face_patch``  (N, S, S, 3) uint8, **BGR** (written from OpenCV images; the official loader
  reverses the channels). S is 224 in the standard download (448 in the large one).
- ``face_gaze``   (N, 2) float, **(pitch, yaw)**: ``pitch = asin(-g_y)``, ``yaw = atan2(-g_x, -g_z)``
  of the normalized gaze vector ``g``. Swapped, this is exactly GazeHub's ``(yaw, pitch)``.
- ``face_head_pose`` (N, 2) float, (pitch, yaw) of the head rotation's z-axis, the same quantity
  as MPIIFaceGaze's GazeHub ``2DHead`` (in the other order).
- ``face_mat_norm`` (N, 3, 3), ``cam_index`` (N, 1), ``frame_index`` (N, 1); unused here.
- Test subjects ship without ``face_gaze``; they cannot be loaded as labelled data.

Images are read lazily. h5py handles are not fork-safe, so each process opens its own handles on
first access (DataLoader workers included) and pickling the dataset drops them.
"""

from __future__ import annotations

import math
import os
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from .base import GazeDataset, UnknownPersonError, unit_images
from .gazehub import (
    DatasetFormatError,
    ImageSize,
    _resized,
    _stack_rgb,
    natural_key,
    refuse_tiny_face,
    upscale_note,
)
from .registry import register_dataset

__all__ = ["XGazeH5Dataset", "check_xgaze_h5", "find_h5_files", "open_xgaze_h5"]

# Handles a forked process inherited; kept referenced so they are never closed in the child.
_INHERITED_HANDLES: list = []


def find_h5_files(path: str | Path) -> list[Path]:
    """The subject files ``path`` names: one ``.h5`` file, a folder of them (natural order), or an
    ETH-XGaze root whose ``train/`` folder holds them."""
    path = Path(path)
    if path.is_file():
        if path.suffix.lower() not in (".h5", ".hdf5"):
            raise DatasetFormatError(f"{path}: not an .h5 file")
        return [path]
    if not path.is_dir():
        raise DatasetFormatError(f"{path}: no such file or folder")
    for folder in (path, path / "train"):
        files = sorted((p for p in folder.glob("*.h5") if p.is_file()), key=lambda p: natural_key(p.name))
        if files:
            return files
    raise DatasetFormatError(f"{path}: no .h5 files here (nor in {path / 'train'})")


def _read_subject_labels(path: Path) -> tuple[np.ndarray, np.ndarray, tuple[int, ...]]:
    """Validate one subject file and return its (gaze, head) as (yaw, pitch) and the patch shape."""
    import h5py

    try:
        h5 = h5py.File(path, "r")
    except OSError as err:
        raise DatasetFormatError(f"{path}: not a readable HDF5 file ({err})") from err
    with h5:
        present = sorted(h5.keys())
        for key in ("face_patch", "face_gaze"):
            if key not in h5:
                hint = " (ETH-XGaze test subjects ship without gaze labels)" if key == "face_gaze" else ""
                raise DatasetFormatError(f"{path}: missing key {key!r}{hint}; keys present: {present}")
        for key in ("face_patch", "face_gaze", "face_head_pose"):
            if key in h5 and not isinstance(h5[key], h5py.Dataset):
                raise DatasetFormatError(f"{path}: {key} is a {type(h5[key]).__name__}, expected an array")
        patch = h5["face_patch"]
        if patch.ndim != 4 or patch.shape[3] != 3 or patch.dtype != np.uint8:
            raise DatasetFormatError(
                f"{path}: face_patch has shape {patch.shape} and dtype {patch.dtype}, expected (N, H, W, 3) uint8"
            )
        n = patch.shape[0]
        if n == 0:
            raise DatasetFormatError(f"{path}: face_patch holds no images")
        arrays = {}
        for key in ("face_gaze", "face_head_pose"):
            if key not in h5:
                continue
            try:
                values = np.asarray(h5[key][()], dtype=np.float64)
            except (TypeError, ValueError, OSError) as err:  # strings, a compound type, a damaged chunk
                raise DatasetFormatError(f"{path}: {key} does not read as numbers ({err})") from err
            if values.shape != (n, 2):
                raise DatasetFormatError(
                    f"{path}: {key} has shape {values.shape}, expected ({n}, 2) to match face_patch"
                )
            bad = np.flatnonzero(~np.isfinite(values).all(axis=1))
            if bad.size:
                raise DatasetFormatError(f"{path}: {key} row {int(bad[0])} is {values[bad[0]].tolist()}, not finite")
            bad = np.flatnonzero((np.abs(values) > math.pi).any(axis=1) & (key == "face_gaze"))
            if bad.size:  # a gaze label in degrees would train on nonsense
                raise DatasetFormatError(
                    f"{path}: {key} row {int(bad[0])} is {values[bad[0]].tolist()}, beyond ±π: angles are read in "
                    "radians (degrees?)"
                )
            arrays[key] = values[:, ::-1]  # stored (pitch, yaw) -> (yaw, pitch)
        head = arrays.get("face_head_pose", np.full((n, 2), np.nan))
        return arrays["face_gaze"], head, tuple(patch.shape)


class XGazeH5Dataset(GazeDataset):
    """ETH-XGaze subjects read from their h5 files; one person per file, named by the file stem.

    Args:
        path: a subject ``.h5`` file, a folder of them, or the ETH-XGaze root (uses ``train/``).
        persons: keep only these subjects (file stems, e.g. ``subject0000``), in file order.
        size: resize faces to ``size`` (int or ``(H, W)``); None keeps the stored size.
    """

    def __init__(
        self,
        path: str | Path,
        *,
        persons: Sequence[str] | None = None,
        size: ImageSize = None,
        name: str = "eth-xgaze",
    ) -> None:
        self.name = name
        self.size = size
        files = find_h5_files(path)
        stems = [f.stem for f in files]
        if persons is not None:
            if not list(persons):
                raise ValueError(f"{name}: persons= names no subject (leave the option out for every one)")
            unknown = [p for p in persons if p not in stems]
            if unknown:
                raise UnknownPersonError(
                    f"{name}: no subject file(s) for {unknown} in {path}; subjects are: {stems[:20]}"
                )
            wanted = set(persons)
            files = [f for f in files if f.stem in wanted]
        self._files = files
        gaze, head, file_of, row_of = [], [], [], []
        self._index: dict[str, list[int]] = {}
        start = 0
        upscaled: list[tuple[int, int]] = []  # every face's size where it is below the size asked
        for k, f in enumerate(files):
            g, h, patch = _read_subject_labels(f)
            if refuse_tiny_face(patch[1:], size, f"{f}: face_patch"):  # known from the file's shape, up front
                upscaled += [tuple(patch[1:3])] * len(g)
            self._index[f.stem] = list(range(start, start + len(g)))
            start += len(g)
            gaze.append(g)
            head.append(h)
            file_of.append(np.full(len(g), k, dtype=np.int32))
            row_of.append(np.arange(len(g), dtype=np.int64))
        self.gaze = torch.from_numpy(np.concatenate(gaze)).float()
        self.head = torch.from_numpy(np.concatenate(head)).float()
        self._file_of = np.concatenate(file_of)
        self._row_of = np.concatenate(row_of)
        self._handles: dict[int, object] = {}
        self._pid: int | None = None
        if upscaled:  # said once, here, for every file
            warnings.warn(upscale_note(name, upscaled, size, f"{files[0]}"), stacklevel=2)

    def __len__(self) -> int:
        return len(self._file_of)

    def __getitem__(self, i: int) -> dict:
        (i,) = self.positions([i])
        image = unit_images(self.raw_images([i])[0])
        person = self._files[int(self._file_of[i])].stem
        return {"image": image, "gaze": self.gaze[i], "head": self.head[i], "person": person, "index": i}

    def raw_images(self, indices: Sequence[int]) -> Tensor:
        positions = self.positions(indices)
        return _stack_rgb([self._face(i) for i in positions], lambda k: self._origin(positions[k]))

    def _origin(self, i: int) -> str:
        """Item ``i``'s file and row of ``face_patch``, for an error that names it."""
        return f"{self._files[int(self._file_of[i])]}: face_patch row {int(self._row_of[i])}"

    def _face(self, i: int) -> np.ndarray:
        """Item ``i``'s face, (H, W, 3) uint8 RGB (the file stores BGR) at the dataset's size."""
        k, row = int(self._file_of[i]), int(self._row_of[i])
        try:
            face = self._handle(k)["face_patch"][row]
        except OSError as err:  # a damaged chunk: said with its file and row, as the label files' errors are
            raise DatasetFormatError(f"{self._files[k]}: face_patch row {row} cannot be read ({err})") from err
        return _resized(face[..., ::-1], self.size)

    def persons(self) -> list[str]:
        return [f.stem for f in self._files]

    def person_group(self, person: str) -> str:
        return person

    def close(self) -> None:
        """Close this process's open h5 handles (they reopen on the next access)."""
        if self._pid == os.getpid():
            for handle in self._handles.values():
                handle.close()
        self._handles = {}

    def _handle(self, k: int):
        import h5py

        if self._pid != os.getpid():
            # A forked child must not use handles inherited from its parent, nor close them (that
            # would call into HDF5 state copied mid-flight): park them and open its own.
            _INHERITED_HANDLES.extend(self._handles.values())
            self._handles, self._pid = {}, os.getpid()
        handle = self._handles.get(k)
        if handle is None:
            handle = self._handles[k] = h5py.File(self._files[k], "r")
        return handle

    def __getstate__(self) -> dict:
        state = self.__dict__.copy()
        state["_handles"], state["_pid"] = {}, None
        return state


def check_xgaze_h5(rest: str, options: dict[str, Any], spec: str) -> None:
    """``xgaze-h5:<path>``'s spec, checked without reading a file: it names subject files
    (:func:`alfa.gaze.data.registry.check_spec`)."""
    find_h5_files(rest)


@register_dataset(
    "xgaze-h5",
    form="xgaze-h5:<path>",
    aliases=("xgaze_h5", "eth-xgaze-h5"),
    options=("persons", "size"),
    what="ETH-XGaze's h5 files",
    check=check_xgaze_h5,
)
def open_xgaze_h5(rest: str, options: dict[str, Any], spec: str) -> XGazeH5Dataset:
    """``xgaze-h5:<path>``: raw ETH-XGaze subject files (:class:`XGazeH5Dataset`); h5py is imported
    only when a file is read."""
    return XGazeH5Dataset(rest, **options)
