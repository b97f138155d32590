"""The one dataset interface every gaze source implements (synthetic worlds and real loaders).

An item is a dict::

    image  : float32 tensor (3, H, W), RGB in [0, 1]
    gaze   : float32 tensor (2,), (yaw, pitch) in radians, normalized camera frame
    head   : float32 tensor (2,), (yaw, pitch) of the head, NaN where unknown
    person : str, the person's id
    index  : int, position in the dataset

Persons are listed in dataset order and each person's images keep the dataset's order, so
"the first 5 images of a person" (the personalization protocol) is well defined.

Batches are read by index through :meth:`GazeDataset.labels` (the label table alone, no image read) and
:meth:`GazeDataset.raw_images` (the images as stored: uint8 where the source is 8-bit), which
:func:`unit_images` turns into the items' float32 in [0, 1]. Why two steps: a training loader's worker
processes hand uint8 batches over, a quarter of the bytes, and the conversion runs once per batch on the
model's device rather than once per image on the CPU.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import torch
from torch import Tensor
from torch.utils.data import Dataset

__all__ = [
    "GazeDataset",
    "InMemoryGazeDataset",
    "UnknownPersonError",
    "data_signature",
    "data_signature_mismatch",
    "images_differ",
    "loading_progress",
    "shows_loading_progress",
    "signature_mismatch",
    "unit_images",
]


_LOADING_PROGRESS = contextvars.ContextVar("alfa_loading_progress", default=True)


@contextlib.contextmanager
def loading_progress(show: bool) -> Iterator[None]:
    """Whether the loaders draw their progress bars (reading a large label file, checking that its images exist)
    while the block runs: a command's ``--quiet`` turns them off with everything else it prints."""
    token = _LOADING_PROGRESS.set(show)
    try:
        yield
    finally:
        _LOADING_PROGRESS.reset(token)


def shows_loading_progress() -> bool:
    """What :func:`loading_progress` set (drawn by default)."""
    return _LOADING_PROGRESS.get()


class UnknownPersonError(KeyError, ValueError):
    """A person a dataset does not have. A ``KeyError`` (a lookup that failed, what callers of
    :meth:`GazeDataset.person_indices` catch) and a ``ValueError`` (bad input: the command line says it in one
    line)."""

    def __str__(self) -> str:
        # KeyError's own str is the repr of its argument: the message would print inside quotes.
        return str(self.args[0]) if self.args else ""


class GazeDataset(Dataset):
    """Base class: subclasses set ``name``, implement ``__len__``, ``__getitem__`` and ``persons``, and either
    fill ``_index`` (person -> the indices of their images, in dataset order), from which
    :meth:`person_indices` answers, or override :meth:`person_indices` itself."""

    name: str = "gaze"
    _index: dict[str, list[int]]

    def persons(self) -> list[str]:
        raise NotImplementedError

    def person_indices(self, person: str) -> list[int]:
        """Indices of ``person``'s images, in dataset order."""
        index = getattr(self, "_index", None)
        if index is None:
            raise NotImplementedError(f"{type(self).__name__} fills no _index: it must define person_indices")
        if person not in index:
            raise UnknownPersonError(f"{self.name}: no person {person!r}")
        return list(index[person])

    def positions(self, indices: Iterable[int]) -> list[int]:
        """``indices`` as positions ``0 … len - 1`` (a negative one counts from the end, as a list's does); one out
        of range is refused with the dataset's name, as an item's is."""
        n = len(self)
        out = []
        for i in indices:
            i = int(i)
            if not -n <= i < n:
                raise IndexError(f"{self.name}: index {i} out of range for {n} images")
            out.append(i % n)
        return out

    def labels(self, indices: Sequence[int]) -> Tensor:
        """``(yaw, pitch)`` labels ``(N, 2)`` float32 of the given items: from the label table ``gaze`` where the
        dataset keeps one (no image is read), else from the items."""
        table = getattr(self, "gaze", None)
        if isinstance(table, Tensor):
            return table[torch.as_tensor(self.positions(indices), dtype=torch.long)].float()
        return torch.stack([torch.as_tensor(self[int(i)]["gaze"]).float() for i in indices])

    def raw_images(self, indices: Sequence[int]) -> Tensor:
        """Images ``(N, 3, H, W)`` of the given items as stored: uint8 where the source is 8-bit, else float in
        ``[0, 1]``; :func:`unit_images` gives the items' float32. This default stacks the items' images; a
        dataset that reads 8-bit images overrides it to skip the per-image float conversion."""
        return torch.stack([self[int(i)]["image"] for i in indices])

    def person_signature(self, person: str, labels: bool = True) -> dict[str, Any]:
        """What tells ``person``'s images here from another dataset's person of the same names (two GazeHub
        folders, two synthetic worlds of one name): how many images, their size, the mean colour of the first and
        the last image and, with ``labels``, the mean of their labels. The files made from a person's images
        record it (a label-free adapter's without the labels: it never reads them), and :func:`signature_mismatch`
        compares two within a tolerance, so the same data read on another machine, a few bits off, still matches.
        Reads two images and, with ``labels``, the person's labels (from the label table where the dataset keeps
        one, else from every item); raises as they do (an unknown person, an unreadable file)."""
        indices = self.person_indices(person)
        if not indices:
            return {"images": 0}
        ends = unit_images(self.raw_images([indices[0], indices[-1]])).double()
        signature: dict[str, Any] = {"images": len(indices), "image_size": list(ends.shape[1:])}
        if labels:
            gaze = self.labels(indices).double().mean(dim=0)
            signature["gaze_mean"] = [round(v, 7) for v in gaze.tolist()]
        signature["end_colours"] = [round(v, 6) for v in ends.mean(dim=(2, 3)).flatten().tolist()]
        return signature


_SIGNATURE_TOLERANCE = {"gaze_mean": 1e-5, "end_colours": 1e-4}
"""How far two signatures' means may be apart and still be one person's data (radians, and colour in [0, 1]):
far above a re-rendering's few bits, far below what another person's or world's images give."""


def signature_mismatch(saved: Any, here: dict[str, Any]) -> str | None:
    """How the person a file was made from (``saved``, its :meth:`GazeDataset.person_signature`) differs from
    the one of that name ``here``; ``None`` if they match, or if ``saved`` is ``None`` (a file from before
    signatures were recorded, which passes as it did)."""
    if saved is None:
        return None
    if not isinstance(saved, dict):
        return f"its data signature is unreadable ({saved!r})"
    if saved.get("images") != here.get("images"):
        count = saved.get("images")
        return f"the file was made from {count} images of the person, this dataset has {here.get('images')}"
    if saved.get("image_size") != here.get("image_size"):
        return f"the file was made from images of size {saved.get('image_size')}, these are {here.get('image_size')}"
    for key, tolerance in _SIGNATURE_TOLERANCE.items():
        a, b = saved.get(key), here.get(key)
        if not (isinstance(a, list) and isinstance(b, list) and len(a) == len(b)):
            if a != b:
                return f"its {key.replace('_', ' ')} is {a}, here {b}"
            continue
        if any(not isinstance(x, (int, float)) or abs(x - y) > tolerance for x, y in zip(a, b)):
            return "the labels differ" if key == "gaze_mean" else "the images differ"
    return None


def data_signature(dataset: GazeDataset, persons: Iterable[str] | None = None) -> dict[str, dict[str, Any]]:
    """Each person's :meth:`GazeDataset.person_signature` (of ``persons``, default all): what a run's state records
    of the images it was made from, so that a resume on another dataset of the same name and counts (another
    folder, another world's seed) is refused instead of continuing, or returning, a run made from other images.
    Reads two images and the labels of each person."""
    return {p: dataset.person_signature(p) for p in (dataset.persons() if persons is None else persons)}


def data_signature_mismatch(saved: Any, here: dict[str, dict[str, Any]]) -> str | None:
    """How the data a run's file was made from (``saved``, its :func:`data_signature`) differs from ``here``;
    ``None`` if they match, or if ``saved`` is ``None`` (a file written before the signature existed, which passes
    as it did: runs in progress must not be refused or redone for a key they never wrote)."""
    if saved is None:
        return None
    if not isinstance(saved, dict):
        return f"its data signature is unreadable ({type(saved).__name__})"
    if set(saved) != set(here):
        other = sorted(set(saved) ^ set(here), key=str)
        return f"its persons are others ({', '.join(map(repr, other[:3]))}{' and more' if len(other) > 3 else ''})"
    for person, signature in here.items():
        why = signature_mismatch(saved[person], signature)
        if why is not None:
            return f"person {person!r}: {why}"
    return None


def images_differ(saved: Any, dataset: GazeDataset, person: str) -> str | None:
    """:func:`signature_mismatch` of ``saved`` against ``dataset``'s ``person``, whose images are read only when
    ``saved`` holds a signature. ``None`` also where they cannot be read (an unknown person, an unreadable file):
    that is not for this check to report, the person's own reading or scoring says why."""
    if saved is None:
        return None
    try:  # the labels are read only where the file recorded theirs (a label-free adapter's file does not)
        here = dataset.person_signature(person, labels=not isinstance(saved, dict) or "gaze_mean" in saved)
    except (ValueError, KeyError, IndexError, OSError):
        return None
    return signature_mismatch(saved, here)


_UNIT = torch.arange(256, dtype=torch.float32).div_(255.0)
"""The 256 quotients ``v / 255`` as the CPU computes them: the numbers an item made from a uint8 pixel holds."""


def unit_images(raw: Tensor) -> Tensor:
    """:meth:`GazeDataset.raw_images` as the items carry them, on ``raw``'s device: uint8 divided by 255 into
    float32, anything else as float32; the same numbers an item's ``image`` holds, on every device."""
    if raw.dtype != torch.uint8:
        return raw.float()
    # A GPU divides by a number as a multiplication by its reciprocal, one bit off v / 255 for about half of the
    # 256 values; looking the CPU's quotients up gives the items' numbers there too.
    return raw.float().div_(255.0) if raw.device.type == "cpu" else _looked_up(raw)


def _looked_up(raw: Tensor) -> Tensor:
    return _UNIT.to(raw.device)[raw.long()]


class InMemoryGazeDataset(GazeDataset):
    """A dataset held in memory as tensors (images as uint8 to keep it small)."""

    def __init__(
        self,
        images: Tensor,
        gaze: Tensor,
        person_ids: Tensor,
        person_names: Sequence[str],
        head: Tensor | None = None,
        name: str = "gaze",
    ) -> None:
        n = images.shape[0]
        if images.ndim != 4 or images.shape[1] != 3:
            raise ValueError(f"images must be (N, 3, H, W), got {tuple(images.shape)}")
        if gaze.shape != (n, 2):
            raise ValueError(f"gaze must be (N, 2) = ({n}, 2), got {tuple(gaze.shape)}")
        if person_ids.shape != (n,):
            raise ValueError(f"person_ids must be (N,) = ({n},), got {tuple(person_ids.shape)}")
        if head is not None and head.shape != (n, 2):
            raise ValueError(f"head must be (N, 2) = ({n}, 2), got {tuple(head.shape)}")
        if not torch.isfinite(gaze).all():
            raise ValueError("gaze labels contain NaN or infinite values")
        self.images = images
        self.gaze = gaze.float()
        self.head = head.float() if head is not None else torch.full((n, 2), float("nan"))
        self.person_ids = person_ids.long()
        self.person_names = list(person_names)
        self.name = name
        self._index: dict[str, list[int]] = {p: [] for p in self.person_names}
        for i, pid in enumerate(self.person_ids.tolist()):
            self._index[self.person_names[pid]].append(i)

    def __len__(self) -> int:
        return self.images.shape[0]

    def image(self, i: int) -> Tensor:
        return unit_images(self.images[i])

    def raw_images(self, indices: Sequence[int]) -> Tensor:
        return self.images[torch.as_tensor(self.positions(indices), dtype=torch.long)]

    def __getitem__(self, i: int) -> dict:
        return {
            "image": self.image(i),
            "gaze": self.gaze[i],
            "head": self.head[i],
            "person": self.person_names[int(self.person_ids[i])],
            "index": i,
        }

    def persons(self) -> list[str]:
        return [p for p in self.person_names if self._index[p]]

    def subset(self, indices: Sequence[int]) -> InMemoryGazeDataset:
        idx = torch.as_tensor(list(indices), dtype=torch.long)
        return InMemoryGazeDataset(
            self.images[idx], self.gaze[idx], self.person_ids[idx], self.person_names, self.head[idx], self.name
        )
