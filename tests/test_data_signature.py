"""A person's data signature: files made from a person's images (adapters, calibrations) record it, so that a
folder made for one dataset is neither resumed nor replaced, nor scored, on another dataset of the same name
(two GazeHub folders, two synthetic worlds of one name), while the same data read a few bits off still matches."""

from __future__ import annotations

import pytest
import torch
from tiny_models import truncated_tiny_gaze_net

import alfa
from alfa.gaze.calibrate import CalibrateConfig, calibrate_dataset
from alfa.gaze.data import InMemoryGazeDataset
from alfa.gaze.data.base import signature_mismatch
from alfa.gaze.evaluate import evaluate
from alfa.gaze.personalize import PersonalizeConfig, personalize_dataset


def _dataset(seed: int = 0, name: str = "toy", images: int = 12, size: int = 16) -> InMemoryGazeDataset:
    g = torch.Generator().manual_seed(seed)
    n = 2 * images
    pixels = torch.randint(0, 256, (n, 3, size, size), generator=g, dtype=torch.uint8)
    gaze = (torch.rand(n, 2, generator=g) - 0.5) * 0.8
    return InMemoryGazeDataset(pixels, gaze, torch.arange(2).repeat_interleave(images), ["p0", "p1"], name=name)


@pytest.fixture
def base() -> torch.nn.Module:
    return truncated_tiny_gaze_net()


def test_the_signature_tells_other_data_apart_and_passes_the_same_data_a_few_bits_off():
    data = _dataset()
    mine = data.person_signature("p0")
    assert signature_mismatch(mine, data.person_signature("p0")) is None
    assert signature_mismatch(None, mine) is None  # a file from before signatures: passes as it did
    nudged = InMemoryGazeDataset(data.images, data.gaze + 1e-7, data.person_ids, data.person_names, name="toy")
    assert signature_mismatch(mine, nudged.person_signature("p0")) is None
    assert signature_mismatch(mine, data.person_signature("p1")) == "the labels differ"
    relabelled = InMemoryGazeDataset(data.images, data.gaze.flip(0), data.person_ids, data.person_names, name="toy")
    assert signature_mismatch(mine, relabelled.person_signature("p0")) == "the labels differ"
    repainted = InMemoryGazeDataset(255 - data.images, data.gaze, data.person_ids, data.person_names, name="toy")
    assert signature_mismatch(mine, repainted.person_signature("p0")) == "the images differ"
    assert (
        signature_mismatch(mine, _dataset(images=11).person_signature("p0"))
        == "the file was made from 12 images of the person, this dataset has 11"
    )
    assert (
        signature_mismatch(mine, _dataset(size=8).person_signature("p0"))
        == "the file was made from images of size [3, 16, 16], these are [3, 8, 8]"
    )
    assert "unreadable" in signature_mismatch("junk", mine)


def test_a_calibration_folder_of_another_dataset_of_the_same_name_is_refused_and_kept(base, tmp_path):
    config = CalibrateConfig(method="offset", k=2, pool=8)
    calibrate_dataset(base, _dataset(seed=0), config, tmp_path, progress=False)
    before = (tmp_path / "p0.safetensors").read_bytes()
    with pytest.raises(
        ValueError, match=r"its calibration for 'p0' was made from the images of another dataset named 'toy'"
    ):
        calibrate_dataset(base, _dataset(seed=1), config, tmp_path, progress=False)
    assert (tmp_path / "p0.safetensors").read_bytes() == before
    again = calibrate_dataset(base, _dataset(seed=0), config, tmp_path, progress=False)
    assert {e["status"] for e in again["persons"].values()} == {"skipped"}
    report = evaluate(base, _dataset(seed=1), adapters=tmp_path, n_adapt=8, progress=False)
    assert "made from the images of another dataset named 'toy': the labels differ" in report.failed["p0"]
    assert set(
        evaluate(base, _dataset(seed=0), adapters=tmp_path, n_adapt=8, progress=False).columns["personalized"]
    ) == {
        "p0",
        "p1",
    }


def test_files_from_before_signatures_still_resume_and_score(base, tmp_path):
    """A file without a signature, as the code before wrote it: a rerun keeps it, evaluation scores with it."""
    data = _dataset()
    config = CalibrateConfig(method="offset", k=2, pool=8)
    calibrate_dataset(base, data, config, tmp_path / "cal", progress=False)
    method, recipe = alfa.AlfaConfig(heads=2, rank=2), PersonalizeConfig(steps=1, n_adapt=5)
    personalize_dataset(base, data, method, recipe, tmp_path / "ad", progress=False)
    for path in [*(tmp_path / "cal").glob("*.safetensors"), *(tmp_path / "ad").glob("*.safetensors")]:
        about = alfa.read_adapter_metadata(path)["about"]
        del about["data"]
        alfa.load_adapter(base, path)
        alfa.save_adapter(base, path, about=about)
        alfa.detach(base)
        assert "data" not in alfa.read_adapter_metadata(path)["about"]
    again = calibrate_dataset(base, data, config, tmp_path / "cal", progress=False)
    assert {e["status"] for e in again["persons"].values()} == {"skipped"}
    rerun = personalize_dataset(base, data, method, recipe, tmp_path / "ad", progress=False)
    assert {o.status for o in rerun.persons.values()} == {"skipped"}
    for folder, n_adapt in ((tmp_path / "cal", 8), (tmp_path / "ad", 5)):
        report = evaluate(base, _dataset(seed=1), adapters=folder, n_adapt=n_adapt, progress=False)
        assert set(report.columns["personalized"]) == {"p0", "p1"}  # no signature: scored as before, unchecked


def test_the_same_data_a_few_bits_off_resumes_a_calibration(base, tmp_path):
    config = CalibrateConfig(method="offset", k=2, pool=8)
    data = _dataset()
    calibrate_dataset(base, data, config, tmp_path, progress=False)
    nudged = InMemoryGazeDataset(data.images, data.gaze + 3e-7, data.person_ids, data.person_names, name="toy")
    again = calibrate_dataset(base, nudged, config, tmp_path, progress=False)
    assert {e["status"] for e in again["persons"].values()} == {"skipped"}


class _UnreadableLast(InMemoryGazeDataset):
    """p1's last image does not read (a damaged file): only what reads it fails."""

    def raw_images(self, indices):
        if self.person_indices("p1")[-1] in [int(i) for i in indices]:
            raise ValueError("p1/last.jpg: not an image")
        return super().raw_images(indices)


def test_a_person_whose_images_do_not_read_or_who_is_unknown_fails_alone(base, tmp_path):
    data = _dataset()
    damaged = _UnreadableLast(data.images, data.gaze, data.person_ids, data.person_names, name="toy")
    method, recipe = alfa.AlfaConfig(heads=2, rank=2), PersonalizeConfig(steps=1)
    run = personalize_dataset(
        base, damaged, method, recipe, tmp_path / "ad", persons=["p0", "p1", "nobody"], progress=False
    )
    assert {p: o.status for p, o in run.persons.items()} == {"p0": "ok", "p1": "failed", "nobody": "failed"}
    assert run.persons["p1"].error == "p1/last.jpg: not an image"  # the reason as a user reads it, no class name
    assert run.persons["nobody"].error == "toy: no person 'nobody'"
    config = CalibrateConfig(method="offset", k=2, pool=8)
    record = calibrate_dataset(base, damaged, config, tmp_path / "cal", persons=["p0", "p1", "nobody"], progress=False)
    assert {p: e["status"] for p, e in record["persons"].items()} == {"p0": "ok", "p1": "failed", "nobody": "failed"}
    assert record["persons"]["p1"]["error"] == "p1/last.jpg: not an image"


def test_personalization_redoes_and_the_command_refuses_another_dataset_of_the_same_name(tmp_path, capsys, monkeypatch):
    import alfa.gaze.pipeline as pipeline
    from alfa.cli import main

    base = alfa.models.create_model("tiny_gaze_net").eval()
    alfa.truncate(base, 6)
    method, config = alfa.AlfaConfig(heads=2, rank=2), PersonalizeConfig(steps=1)
    first = personalize_dataset(base, _dataset(seed=0), method, config, tmp_path / "lib", progress=False)
    again = personalize_dataset(base, _dataset(seed=1), method, config, tmp_path / "lib", progress=False)
    assert {o.status for o in first.persons.values()} == {o.status for o in again.persons.values()} == {"ok"}

    monkeypatch.setattr(pipeline, "open_data", lambda spec: _dataset(seed=int(spec[-1])))
    alfa.checkpoint.save_model(tmp_path / "base.safetensors", base, "tiny_gaze_net")
    argv = ["personalize", "--checkpoint", str(tmp_path / "base.safetensors"), "--heads", "2", "--adapter-rank", "2"]
    out = ["--out", str(tmp_path / "cli"), "--steps", "1", "--quiet"]
    assert main([*argv, "--data", "toy:0", *out]) == 0
    made = (tmp_path / "cli" / "p0.safetensors").read_bytes()
    capsys.readouterr()
    assert main([*argv, "--data", "toy:1", *out]) == 2
    err = capsys.readouterr().err
    assert "its adapter for 'p0' was made from the images of another dataset named 'toy': the images differ" in err
    assert "--replace" in err and (tmp_path / "cli" / "p0.safetensors").read_bytes() == made


def test_a_label_free_adapters_file_holds_nothing_of_the_labels_and_its_checks_read_none(base, tmp_path, monkeypatch):
    """Personalization never reads a label, and its files' signatures hold none (they held the labels' mean):
    relabelled data gives the same bytes, and neither the run, its resume nor the check of its files reads
    ``labels``. A file that recorded the labels' mean is still checked against them."""
    data = _dataset()
    method, recipe = alfa.AlfaConfig(heads=2, rank=2), PersonalizeConfig(steps=1, n_adapt=5)
    relabelled = InMemoryGazeDataset(data.images, data.gaze.flip(0), data.person_ids, data.person_names, name="toy")
    personalize_dataset(base, relabelled, method, recipe, tmp_path / "relabelled", progress=False)

    def no_labels(self, indices):
        raise AssertionError("personalization read the labels")

    with monkeypatch.context() as m:
        m.setattr(InMemoryGazeDataset, "labels", no_labels)
        personalize_dataset(base, data, method, recipe, tmp_path / "ad", progress=False)
        again = personalize_dataset(base, data, method, recipe, tmp_path / "ad", progress=False)
    assert {o.status for o in again.persons.values()} == {"skipped"}
    for person in ("p0", "p1"):
        path = tmp_path / "ad" / f"{person}.safetensors"
        assert path.read_bytes() == (tmp_path / "relabelled" / f"{person}.safetensors").read_bytes()
        assert "gaze_mean" not in alfa.read_adapter_metadata(path)["about"]["data"]
    # a file of the code before (the labels' mean in its signature): checked against the labels, as it was
    path = tmp_path / "ad" / "p0.safetensors"
    about = alfa.read_adapter_metadata(path)["about"]
    about["data"] = data.person_signature("p0")
    alfa.load_adapter(base, path)
    alfa.save_adapter(base, path, about=about)
    alfa.detach(base)
    report = evaluate(base, relabelled, adapters=tmp_path / "ad", n_adapt=5, progress=False)
    assert "made from the images of another dataset named 'toy': the labels differ" in report.failed["p0"]
    assert "p1" not in report.failed


def test_two_persons_files_swapped_by_hand_are_named_as_such_not_as_another_dataset(base, tmp_path):
    """Each file records its person: one found under another person's name says so (the message said "made from
    the images of another dataset", which sent the user looking for the wrong thing), and nothing is rewritten."""
    config = CalibrateConfig(method="offset", k=2, pool=8)
    calibrate_dataset(base, _dataset(seed=0), config, tmp_path, progress=False)
    first, second = (tmp_path / "p0.safetensors"), (tmp_path / "p1.safetensors")
    a, b = first.read_bytes(), second.read_bytes()
    first.write_bytes(b), second.write_bytes(a)
    with pytest.raises(
        ValueError, match=r"its file for 'p0' holds the calibration of person 'p1' \(renamed or swapped"
    ):
        calibrate_dataset(base, _dataset(seed=0), config, tmp_path, progress=False)
    assert first.read_bytes() == b and second.read_bytes() == a
