"""Batches read by index (``labels``, ``raw_images``) give exactly what the items give, for every kind of dataset;
8-bit sources hand over uint8; labels are read without touching an image; the training loader's batches are
the same with and without worker processes."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from alfa.gaze.data.base import GazeDataset, InMemoryGazeDataset, _looked_up, unit_images
from alfa.gaze.data.fixtures import write_gazehub_fixture, write_xgaze_h5_dir
from alfa.gaze.data.gazehub import GazeHubDataset
from alfa.gaze.data.registry import PersonSubset
from alfa.gaze.data.xgaze import XGazeH5Dataset
from alfa.gaze.demo_scoring import _PersonOrder
from alfa.gaze.evaluate import load_examples, load_images, load_raw_images
from alfa.gaze.train import _iterate


def _in_memory(dtype: torch.dtype) -> InMemoryGazeDataset:
    g = torch.Generator().manual_seed(0)
    images = torch.randint(0, 256, (8, 3, 6, 5), generator=g, dtype=torch.uint8)
    if dtype != torch.uint8:
        images = images.to(dtype) / 255.0
    gaze = torch.randn(8, 2, generator=g)
    return InMemoryGazeDataset(images, gaze, torch.tensor([0, 0, 0, 1, 1, 1, 2, 2]), ["a", "b", "c"])


def _gazehub(root: Path, size: int | None) -> GazeHubDataset:
    write_gazehub_fixture(root, "mpiifacegaze", images_per_person=3, size=10, write_eyes=False)
    return GazeHubDataset(root, "mpiifacegaze", size=size)


def _xgaze(root: Path, size: int | None) -> XGazeH5Dataset:
    write_xgaze_h5_dir(root, images=3, size=10)
    return XGazeH5Dataset(root, size=size)


KINDS = {
    "in-memory uint8": lambda tmp: _in_memory(torch.uint8),
    "in-memory float": lambda tmp: _in_memory(torch.float32),
    "gazehub": lambda tmp: _gazehub(tmp, None),
    "gazehub resized": lambda tmp: _gazehub(tmp, 7),
    "xgaze h5": lambda tmp: _xgaze(tmp, None),
    "xgaze h5 resized": lambda tmp: _xgaze(tmp, 7),
    "person subset": lambda tmp: PersonSubset(_gazehub(tmp, None), ["p01", "p02"]),
    "person order": lambda tmp: _PersonOrder(_in_memory(torch.uint8), {"b": [5, 3]}),
}


@pytest.mark.parametrize("kind", list(KINDS))
def test_batches_equal_the_items(kind: str, tmp_path: Path) -> None:
    ds = KINDS[kind](tmp_path)
    indices = [len(ds) - 1, 0, 2, 0]  # out of order, one twice
    items = [ds[i] for i in indices]
    raw = ds.raw_images(indices)
    assert torch.equal(unit_images(raw), torch.stack([item["image"] for item in items]))
    assert raw.is_contiguous()  # laid out as the stacked items are: the same convolution kernels, the same numbers
    assert torch.equal(ds.labels(indices), torch.stack([torch.as_tensor(item["gaze"]).float() for item in items]))
    images, labels = load_examples(ds, indices)
    assert torch.equal(images, unit_images(raw)) and torch.equal(labels, ds.labels(indices))


@pytest.mark.parametrize(
    "kind",
    ["in-memory uint8", "gazehub", "gazehub resized", "xgaze h5", "xgaze h5 resized", "person subset", "person order"],
)
def test_eight_bit_sources_hand_over_uint8(kind: str, tmp_path: Path) -> None:
    assert KINDS[kind](tmp_path).raw_images([0, 1]).dtype == torch.uint8


@pytest.mark.parametrize("kind", list(KINDS))
def test_an_index_out_of_range_is_refused_by_name(kind: str, tmp_path: Path) -> None:
    ds = KINDS[kind](tmp_path)
    n = len(ds)
    for read in (ds.raw_images, ds.labels):
        with pytest.raises(IndexError, match=rf"^{ds.name}: index {n} out of range for {n} images$"):
            read([0, n])
        with pytest.raises(IndexError, match=rf"index {-n - 1} out of range"):
            read([-n - 1])
    assert torch.equal(ds.raw_images([-1]), ds.raw_images([n - 1]))  # counted from the end, as a list's are
    with pytest.raises(ValueError, match="no images requested"):
        load_raw_images(ds, [])


def test_a_channels_last_store_gives_a_contiguous_batch_through_the_views() -> None:
    ds = _in_memory(torch.uint8)
    ds.images = ds.images.contiguous(memory_format=torch.channels_last)
    for view in (PersonSubset(ds, ["a", "c"]), _PersonOrder(ds, {"b": [5, 3]})):
        assert view.raw_images([0, 1]).is_contiguous()


def test_labels_read_no_image(tmp_path: Path) -> None:
    ds = _gazehub(tmp_path, None)
    expected = torch.stack([ds[i]["gaze"] for i in range(len(ds))])
    for image in (tmp_path / "Image").rglob("*.jpg"):
        image.unlink()
    assert torch.equal(ds.labels(range(len(ds))), expected)
    assert torch.equal(PersonSubset(ds, ["p01"]).labels([0]), expected[ds.person_indices("p01")[:1]])
    with pytest.raises(Exception, match="cannot read image"):  # while an image is read, and fails
        ds.raw_images([0])


class _Items(GazeDataset):
    """A dataset with only items (no label table, no raw_images of its own): the base class's defaults."""

    def __init__(self, images: torch.Tensor) -> None:
        self.images, self.name, self._index = images, "items", {"p": list(range(len(images)))}

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, i: int) -> dict:
        return {"image": self.images[i], "gaze": torch.tensor([0.1 * i, -0.2]), "head": torch.zeros(2), "person": "p"}

    def persons(self) -> list[str]:
        return ["p"]


def test_a_non_finite_float_image_is_refused_by_name() -> None:
    images = torch.rand(3, 3, 4, 4, dtype=torch.float64)
    images[2, 0, 1, 1] = 1e300  # finite in float64, infinite as the float32 the model gets
    ds = _Items(images)
    assert torch.equal(ds.labels([2, 0]), torch.tensor([[0.2, -0.2], [0.0, -0.2]]))
    load_images(ds, [0, 1])
    with pytest.raises(ValueError, match=r"items: image 2 \(probe\) contains NaN or infinite values"):
        load_raw_images(ds, [0, 2], what="probe")


@pytest.mark.parametrize("workers", [0, 1])
def test_training_batches_with_and_without_workers(workers: int, tmp_path: Path) -> None:
    ds = _gazehub(tmp_path, None)
    batches = [[0, 3, 1], [5, 2]]
    got = list(_iterate(ds, batches, workers))
    assert len(got) == 2
    for (raw, labels), batch in zip(got, batches):
        assert raw.dtype == torch.uint8
        assert torch.equal(unit_images(raw), load_images(ds, batch)) and torch.equal(labels, ds.labels(batch))


def test_the_lookup_a_gpu_uses_gives_the_cpus_quotients() -> None:
    raw = torch.arange(256, dtype=torch.uint8).reshape(1, 4, 8, 8).expand(2, 4, 8, 8)
    looked_up = _looked_up(raw)
    assert looked_up.dtype == torch.float32 and looked_up.shape == raw.shape
    assert torch.equal(looked_up, raw.float().div_(255.0))


def test_unit_images_is_division_by_255() -> None:
    raw = torch.tensor([0, 255, 51, 128], dtype=torch.uint8)
    assert torch.equal(unit_images(raw), torch.tensor([0.0, 1.0, 0.2, 128 / 255], dtype=torch.float32))
    floats = torch.tensor([0.5, 2.0], dtype=torch.float64)
    assert torch.equal(unit_images(floats), floats.float())  # not rescaled
