"""Loaders for the real gaze datasets, on fixtures written in the exact real layouts."""

from __future__ import annotations

import math
import os
import pickle
import shutil
from pathlib import Path

import h5py
import numpy as np
import pytest
import tiny_models  # noqa: F401 — registers tiny_gaze_net, which these tests' checkpoints name
import torch
from torch.utils.data import DataLoader

from alfa.gaze.data.base import GazeDataset
from alfa.gaze.data.fixtures import write_gazehub_fixture, write_xgaze_h5_dir, write_xgaze_h5_fixture
from alfa.gaze.data.gazehub import DatasetFormatError, GazeHubDataset
from alfa.gaze.data.registry import PersonSubset, open_dataset, split_persons
from alfa.gaze.data.xgaze import XGazeH5Dataset
from alfa.gaze.geometry import angular_error, gazehub_vector_to_pitchyaw, pitchyaw_to_vector

COLOR_TOLERANCE = 4 / 255  # flat-colour JPEGs come back within a few levels


def _read_columns(label: Path) -> tuple[list[str], list[list[str]]]:
    lines = label.read_text().splitlines()
    return lines[0].split(), [line.split() for line in lines[1:] if line.strip()]


def _column(label: Path, name: str) -> np.ndarray:
    header, rows = _read_columns(label)
    j = header.index(name)
    return np.array([[float(v) for v in row[j].split(",")] for row in rows])


def _edit_line(path: Path, line: int, edit) -> None:
    lines = path.read_text().splitlines()
    lines[line - 1] = edit(lines[line - 1])
    path.write_text("\n".join(lines) + "\n")


def _check_against_truth(ds: GazeDataset, truth) -> None:
    assert ds.persons() == truth.persons
    start = 0
    for person in truth.persons:
        n = len(truth.gaze[person])
        indices = ds.person_indices(person)
        assert indices == list(range(start, start + n)), "each person's images keep label-file order"
        start += n
        torch.testing.assert_close(ds.gaze[indices], torch.tensor(truth.gaze[person], dtype=torch.float32))
        torch.testing.assert_close(
            ds.head[indices], torch.tensor(truth.head[person], dtype=torch.float32), equal_nan=True
        )
        for j, i in enumerate(indices[:2]):
            item = ds[i]
            assert item["person"] == person and item["index"] == i
            assert item["image"].dtype == torch.float32 and item["image"].shape == (3, 16, 16)
            expected = torch.tensor(truth.colors[person][j], dtype=torch.float32) / 255
            assert (item["image"].mean((1, 2)) - expected).abs().max() <= COLOR_TOLERANCE
    assert len(ds) == start


# ----- GazeHub folders -----


def test_mpiifacegaze_labels_persons_and_order(tmp_path):
    truth = write_gazehub_fixture(tmp_path, "mpiifacegaze")
    ds = open_dataset(f"gazehub:mpiifacegaze:{tmp_path}")
    assert isinstance(ds, GazeHubDataset) and ds.name == "mpiifacegaze"
    assert [p.name for p in sorted((tmp_path / "Label").iterdir())] == ["p00.label", "p01.label", "p02.label"]
    _check_against_truth(ds, truth)
    # The first 5 images of a person (the personalization set) are the first 5 label rows.
    first = ds.person_indices("p01")[:5]
    assert [ds.image_path(i).name for i in first] == ["1.jpg", "2.jpg", "3.jpg", "4.jpg", "5.jpg"]
    assert ds.source_line(first[0]).endswith("p01.label:2")


def test_eyediap_natural_person_order_and_head_turned_to_face_camera(tmp_path):
    truth = write_gazehub_fixture(tmp_path, "eyediap", persons=["p1", "p2", "p10"])
    ds = open_dataset(f"gazehub:diap:{tmp_path}")
    assert ds.persons() == ["p1", "p2", "p10"]  # not p1, p10, p2
    # The file stores the head's backward axis (yaw near +-pi), the loader the facing direction.
    stored = _column(truth.label_files[0], "2DHead")
    assert (np.abs(stored[:, 0]) > math.pi / 2).all()
    _check_against_truth(ds, truth)


def test_2dgaze_agrees_with_3dgaze_in_every_fixture(tmp_path):
    for name in ("mpiifacegaze", "eyediap"):
        truth = write_gazehub_fixture(tmp_path / name, name)
        for label in truth.label_files:
            from_3d = gazehub_vector_to_pitchyaw(torch.tensor(_column(label, "3DGaze")))
            torch.testing.assert_close(from_3d, torch.tensor(_column(label, "2DGaze")))
    # Gaze360's 3DGaze is in its eye frame (x left, y up, z away): GazeHub's own conversion is
    # yaw = atan2(x, -z), pitch = asin(y).
    truth = write_gazehub_fixture(tmp_path / "g360", "gaze360")
    g3 = _column(truth.label_files[0], "3DGaze")
    yaw_pitch = np.stack([np.arctan2(g3[:, 0], -g3[:, 2]), np.arcsin(g3[:, 1])], -1)
    np.testing.assert_allclose(yaw_pitch, _column(truth.label_files[0], "2DGaze"), atol=1e-12)


def test_a_real_gazehub_eyediap_row_reads_as_yaw_pitch(tmp_path):
    # Row p1/face/1.jpg of GazeHub's EyeDiap Label/p1.label (as republished in DreamtaleCore/PnP-GA
    # data/p1.label): 3DGaze, 3DHead, 2DGaze, 2DHead.
    row = (
        "p1/face/1.jpg p1/left/1.jpg p1/right/1.jpg 1_A_DS_S_1 "
        "0.14081258383322426,-0.3196966177425554,-0.9369983398268011 "
        "2.871716933330232,0.014235182196801154,-0.10565350508229936 "
        "-0.14916426897866814,0.32540928438070094 -3.0680425601330272,-0.26807960166499656"
    )
    (tmp_path / "Label").mkdir()
    (tmp_path / "Label" / "p1.label").write_text("Face Left Right Origin 3DGaze 3DHead 2DGaze 2DHead\n" + row + "\n")
    write_gazehub_fixture(tmp_path / "images", "eyediap", persons=["p1"], images_per_person=1)
    (tmp_path / "Image" / "p1" / "face").mkdir(parents=True)
    (tmp_path / "images" / "Image" / "p1" / "face" / "1.jpg").rename(tmp_path / "Image" / "p1" / "face" / "1.jpg")
    ds = GazeHubDataset(tmp_path, "eyediap")  # verify_3d is on: 3DGaze and 2DGaze must agree
    yaw, pitch = ds[0]["gaze"].tolist()
    assert yaw == pytest.approx(-0.14916427) and pitch == pytest.approx(0.32540929)
    # Looking up at the screen above the camera: positive pitch, as in the spec's convention.
    assert pitch > 0
    # Head turned around to face the camera: small yaw, the same (upward) pitch sign as the gaze.
    head_yaw, head_pitch = ds[0]["head"].tolist()
    assert head_yaw == pytest.approx(0.0735, abs=1e-3) and head_pitch == pytest.approx(0.2681, abs=1e-3)


def test_gaze360_persons_groups_and_splits(tmp_path):
    train = write_gazehub_fixture(tmp_path, "gaze360", split="train", images_per_person=4)
    val = write_gazehub_fixture(tmp_path, "gaze360", split="val", persons=["rec_007/000002"], seed=1)
    ds = open_dataset(f"gazehub:gaze360:{tmp_path}")
    _check_against_truth(ds, train)
    assert all(torch.isnan(ds.head).flatten()), "Gaze360 has no head pose"
    assert [ds.person_group(p) for p in ds.persons()] == ["rec_000", "rec_000", "rec_003"]
    for split in ("val", "validation"):
        held_out = open_dataset(f"gazehub:gaze360:{tmp_path}?split={split}")
        _check_against_truth(held_out, val)
    # Holding out persons never separates identities of one recording.
    for seed in range(5):
        fit, hold = split_persons(ds, val_fraction=0.5, seed=seed)
        assert {ds.person_group(p) for p in fit}.isdisjoint({ds.person_group(p) for p in hold})
        assert sorted(fit + hold) == sorted(ds.persons()) and hold


def test_eth_xgaze_gazehub_labels_are_reordered_from_pitch_yaw(tmp_path):
    truth = write_gazehub_fixture(tmp_path, "eth-xgaze")
    stored = _column(truth.label_files[0], "gaze")
    first = truth.persons[0]
    np.testing.assert_array_equal(stored[: len(truth.gaze[first])], truth.gaze[first][:, ::-1])
    ds = open_dataset(f"gazehub:eth-xgaze:{tmp_path}")
    _check_against_truth(ds, truth)
    assert ds.image_path(0).parent.parent.name == "train"  # faces live under Image/train/
    # A label file someone already converted to (yaw, pitch) can say so.
    as_is = GazeHubDataset(tmp_path, "eth", stored_order="yaw-pitch")
    torch.testing.assert_close(as_is.gaze, ds.gaze.flip(-1))
    # ETH-XGaze's validation label file points into Image/train as well.
    (tmp_path / "Label" / "valid.label").write_text("\n".join(truth.label_files[0].read_text().splitlines()[:3]) + "\n")
    valid = GazeHubDataset(tmp_path, "eth-xgaze", split="val")
    assert len(valid) == 2 and valid.image_path(0) == ds.image_path(0)
    # its first face missing, the others are still looked for under Image/train: one face is missing, not all
    ds.image_path(0).unlink()
    with pytest.raises(DatasetFormatError, match=rf"^1 of {len(ds)} face images .* missing, first: .*Image/train/"):
        GazeHubDataset(tmp_path, "eth-xgaze")
    shutil.rmtree(tmp_path / "Image" / "train")
    with pytest.raises(DatasetFormatError, match=r"missing \(none is under .*Image, nor its train/ or split folders"):
        GazeHubDataset(tmp_path, "eth-xgaze")
    # read as a target's layout, the source's split file would be a person with swapped angles: refused
    for target in ("mpii", "eyediap"):
        with pytest.raises(
            DatasetFormatError, match=r"holds train\.label, valid\.label, a split's label file .* is the dataset"
        ):
            GazeHubDataset(tmp_path, target)


def test_gazehub_resize_and_person_selection(tmp_path):
    write_gazehub_fixture(tmp_path, "mpiifacegaze", images_per_person=2)
    assert open_dataset(f"gazehub:mpii:{tmp_path}?size=8")[0]["image"].shape == (3, 8, 8)
    assert GazeHubDataset(tmp_path, "mpii", size=(6, 10))[0]["image"].shape == (3, 6, 10)
    some = GazeHubDataset(tmp_path, "mpii", persons=["p02", "p00"])
    assert some.persons() == ["p00", "p02"] and len(some) == 4
    with pytest.raises(KeyError, match="p07"):
        GazeHubDataset(tmp_path, "mpii", persons=["p07"])
    with pytest.raises(ValueError, match="no splits"):
        GazeHubDataset(tmp_path, "mpii", split="train")


# ----- raw ETH-XGaze h5 -----


def test_xgaze_h5_is_lazy_bgr_to_rgb_and_pitch_yaw_to_yaw_pitch(tmp_path):
    truth = write_xgaze_h5_dir(tmp_path, subjects=(0, 3, 11), images=4)
    with h5py.File(tmp_path / "subject0003.h5", "r") as h5:  # the file really is (pitch, yaw) and BGR
        np.testing.assert_array_equal(h5["face_gaze"][()], truth["subject0003"]["gaze"][:, ::-1])
        np.testing.assert_array_equal(h5["face_patch"][1], truth["subject0003"]["rgb"][1][..., ::-1])
    ds = open_dataset(f"xgaze-h5:{tmp_path}")
    assert isinstance(ds, XGazeH5Dataset) and ds._handles == {}, "no file is held open before an item is read"
    assert ds.persons() == ["subject0000", "subject0003", "subject0011"]
    for person, t in truth.items():
        idx = ds.person_indices(person)
        torch.testing.assert_close(ds.gaze[idx], torch.tensor(t["gaze"], dtype=torch.float32))
        torch.testing.assert_close(ds.head[idx], torch.tensor(t["head"], dtype=torch.float32))
    item = ds[5]
    assert item["person"] == "subject0003" and item["index"] == 5
    expected = torch.tensor(truth["subject0003"]["rgb"][1]).permute(2, 0, 1).float() / 255
    assert torch.equal(item["image"], expected)
    assert set(ds._handles) == {1}, "only the file that was read is open"
    clone = pickle.loads(pickle.dumps(ds))  # what a spawned DataLoader worker receives
    assert clone._handles == {} and torch.equal(clone[5]["image"], expected)
    # Forked workers open their own handles (the parent already holds one) and read the same pixels.
    batches = list(DataLoader(ds, batch_size=4, num_workers=2))
    images = torch.cat([b["image"] for b in batches])
    assert torch.equal(images[5], expected) and images.shape == (12, 3, 16, 16)
    ds.close()


def test_xgaze_h5_root_subjects_and_resize(tmp_path):
    write_xgaze_h5_dir(tmp_path / "train", subjects=(2, 1), images=3)
    ds = XGazeH5Dataset(tmp_path, persons=["subject0002"], size=8)  # the ETH-XGaze root: uses train/
    assert ds.persons() == ["subject0002"] and len(ds) == 3 and ds[0]["image"].shape == (3, 8, 8)
    single = open_dataset(f"xgaze-h5:{tmp_path / 'train' / 'subject0001.h5'}")
    assert single.persons() == ["subject0001"]
    no_head = write_xgaze_h5_fixture(tmp_path / "nohead" / "subject0005.h5", images=2, with_head=False)
    assert torch.isnan(XGazeH5Dataset(no_head["path"]).head).all()


# ----- person-wise splits -----


def test_split_persons_is_deterministic_disjoint_and_complete(tmp_path):
    write_xgaze_h5_dir(tmp_path, subjects=range(10), images=2)
    ds = XGazeH5Dataset(tmp_path)
    train, val = split_persons(ds, val_fraction=0.2, seed=3)
    assert (train, val) == split_persons(ds, val_fraction=0.2, seed=3)
    assert len(val) == 2 and set(train).isdisjoint(val) and sorted(train + val) == sorted(ds.persons())
    assert train == [p for p in ds.persons() if p in train], "lists keep dataset order"
    assert any(split_persons(ds, 0.2, seed=s)[1] != val for s in range(4, 9))
    assert split_persons(ds, 0.0) == (ds.persons(), [])
    subset = PersonSubset(ds, val)
    assert subset.persons() == val and len(subset) == 4
    assert subset.person_indices(val[1]) == [2, 3]
    item = subset[2]
    assert item["person"] == val[1] and item["index"] == 2
    assert torch.equal(item["image"], ds[ds.person_indices(val[1])[0]]["image"])


# ----- malformed input: a clear error naming the file and the line -----


@pytest.fixture
def mpii(tmp_path):
    write_gazehub_fixture(tmp_path, "mpiifacegaze", images_per_person=3)
    return tmp_path


def test_a_byte_order_mark_and_a_size_below_one(mpii):
    label = mpii / "Label" / "p00.label"
    plain = GazeHubDataset(mpii, "mpii")
    label.write_bytes(b"\xef\xbb\xbf" + label.read_bytes())  # as some editors save
    torch.testing.assert_close(GazeHubDataset(mpii, "mpii").gaze, plain.gaze)
    for size in ("0", "-3"):
        with pytest.raises(ValueError, match=rf"option 'size={size}': size must be at least 1"):
            open_dataset(f"gazehub:mpii:{mpii}?size={size}")


def test_wrong_column_count(mpii):
    _edit_line(mpii / "Label" / "p01.label", 3, lambda line: line.rsplit(" ", 1)[0])
    with pytest.raises(DatasetFormatError, match=r"p01\.label:3: expected 12 space-separated columns .* found 11"):
        GazeHubDataset(mpii, "mpiifacegaze")


def test_unparsable_and_nan_labels(mpii):
    label = mpii / "Label" / "p00.label"
    original = label.read_text()

    def set_2dgaze(value):
        def edit(line):
            tokens = line.split()
            tokens[7] = value
            return " ".join(tokens)

        return edit

    _edit_line(label, 2, set_2dgaze("0.1;0.2"))
    with pytest.raises(DatasetFormatError, match=r"p00\.label:2: column 2DGaze is '0.1;0.2', expected 2"):
        GazeHubDataset(mpii, "mpii")
    label.write_text(original)
    _edit_line(label, 4, set_2dgaze("nan,0.1"))
    with pytest.raises(DatasetFormatError, match=r"p00\.label:4: column 2DGaze is 'nan,0.1', which is not finite"):
        GazeHubDataset(mpii, "mpii")
    label.write_text(original)
    _edit_line(label, 3, set_2dgaze("30.0,-12.5"))  # degrees, not radians
    with pytest.raises(DatasetFormatError, match=r"p00\.label:3: column 2DGaze is '30.0,-12.5', beyond ±π: .*degrees"):
        GazeHubDataset(mpii, "mpii", verify_3d=False)


def test_unknown_or_missing_header(mpii):
    label = mpii / "Label" / "p02.label"
    original = label.read_text()
    _edit_line(label, 1, lambda line: line.replace("2DGaze", "GazeAngles"))
    with pytest.raises(DatasetFormatError, match=r"p02\.label:1: unrecognized header .*missing gaze2d"):
        GazeHubDataset(mpii, "mpii")
    label.write_text("\n".join(original.splitlines()[1:]) + "\n")  # no header line at all
    with pytest.raises(DatasetFormatError, match=r"p02\.label:1: unrecognized header 'p02/face/1\.jpg"):
        GazeHubDataset(mpii, "mpii")


def test_swapped_columns_caught_by_the_3d_check(mpii):
    def swap(line):
        tokens = line.split()
        tokens[7] = ",".join(reversed(tokens[7].split(",")))
        return " ".join(tokens)

    _edit_line(mpii / "Label" / "p01.label", 3, swap)
    with pytest.raises(DatasetFormatError, match=r"p01\.label:3: 2DGaze .* and 3DGaze .* disagree by") as e:
        GazeHubDataset(mpii, "mpii")
    assert "'?verify_3d=false' after a dataset spec" in str(e.value)  # how a CLI user turns it off, too
    assert len(GazeHubDataset(mpii, "mpii", verify_3d=False)) == 9


def test_missing_images_are_found_up_front(mpii):
    (mpii / "Image" / "p01" / "face" / "2.jpg").unlink()
    with pytest.raises(
        DatasetFormatError, match=r"1 of 9 face images .* missing, first: .*p01\.label:3: .*p01/face/2\.jpg"
    ):
        GazeHubDataset(mpii, "mpii")
    lazy = GazeHubDataset(mpii, "mpii", check_files=False)
    with pytest.raises(DatasetFormatError, match=r"cannot read image .*listed at .*p01\.label:3"):
        lazy[4]


def test_repeated_faces_and_faces_outside_the_dataset_are_refused(mpii):
    label = mpii / "Label" / "p01.label"
    original = label.read_text()
    lines = original.splitlines()
    label.write_text("\n".join([*lines, lines[2]]) + "\n")  # row 3 pasted again as row 5
    with pytest.raises(
        DatasetFormatError, match=r"p01\.label:5: face 'p01/face/2\.jpg' is listed again \(first at .*p01\.label:3\)"
    ):
        GazeHubDataset(mpii, "mpii")
    for face in ("../outside.jpg", "p01/../../outside.jpg", "/etc/hostname"):
        label.write_text(original)
        _edit_line(label, 2, lambda line, face=face: " ".join([face, *line.split()[1:]]))
        with pytest.raises(DatasetFormatError, match=r"p01\.label:2: face path .* leads out of the dataset's Image/"):
            GazeHubDataset(mpii, "mpii", check_files=False)
    label.write_text(original)
    assert len(GazeHubDataset(mpii, "mpii")) == 9  # the check passes what is right


def test_an_unlistable_folder_is_not_called_missing(mpii, monkeypatch):
    import alfa.gaze.data.gazehub as gazehub

    listdir = os.listdir

    def refuse(folder):
        def guarded(path="."):
            if Path(path).name == folder:
                raise PermissionError(13, "Permission denied", str(path))
            return listdir(path)

        monkeypatch.setattr(gazehub.os, "listdir", guarded)

    refuse("Label")
    with pytest.raises(DatasetFormatError, match=r"Label: cannot list the label folder \(Permission denied\)"):
        GazeHubDataset(mpii, "mpii")
    refuse("face")
    with pytest.raises(
        DatasetFormatError, match=r"face: cannot list the image folder \(Permission denied\), listed at"
    ):
        GazeHubDataset(mpii, "mpii")


def test_empty_or_missing_label_folder(tmp_path):
    with pytest.raises(DatasetFormatError, match=r"/none: no such folder \(a GazeHub root\)"):
        GazeHubDataset(tmp_path / "none", "mpii")  # not "none/Label: no Label/ folder"
    with pytest.raises(DatasetFormatError, match="no Label/ folder"):
        GazeHubDataset(tmp_path, "mpii")
    (tmp_path / "Label").mkdir()
    with pytest.raises(DatasetFormatError, match=r"Label: no \.label files"):
        GazeHubDataset(tmp_path, "eyediap")
    write_gazehub_fixture(tmp_path, "gaze360", split="train")
    with pytest.raises(DatasetFormatError, match=r"no label file for split 'test' \(looked for test\.label\); found"):
        GazeHubDataset(tmp_path, "gaze360", split="test")
    # it looked for every name of a validation split, and says so (it said "no val.label" of valid.label too)
    with pytest.raises(DatasetFormatError, match=r"'val' \(looked for val\.label, validation\.label, valid\.label\)"):
        GazeHubDataset(tmp_path, "gaze360", split="val")


def test_unreadable_person_ids(tmp_path):
    truth = write_gazehub_fixture(tmp_path / "g", "gaze360")
    _edit_line(truth.label_files[0], 3, lambda line: line.replace("rec_000/head/000000/", "rec_000_"))
    with pytest.raises(DatasetFormatError, match=r"train\.label:3: Origin 'rec_000_000101\.jpg' is not"):
        GazeHubDataset(tmp_path / "g", "gaze360")
    truth = write_gazehub_fixture(tmp_path / "e", "eth-xgaze")
    _edit_line(truth.label_files[0], 2, lambda line: line.replace("subject0000/1.jpg", "1.jpg", 1))
    with pytest.raises(DatasetFormatError, match=r"train\.label:2: face path '1\.jpg' has no person folder"):
        GazeHubDataset(tmp_path / "e", "eth-xgaze")


def test_bad_h5_files(tmp_path):
    path = tmp_path / "subject0000.h5"

    def rewrite(**overrides):
        write_xgaze_h5_fixture(path, images=3)
        with h5py.File(path, "a") as h5:
            for key, value in overrides.items():
                del h5[key]
                if value is not None:
                    h5.create_dataset(key, data=value)

    rewrite(face_gaze=None)
    with pytest.raises(DatasetFormatError, match=r"subject0000\.h5: missing key 'face_gaze' \(ETH-XGaze test"):
        XGazeH5Dataset(path)
    rewrite(face_patch=np.zeros((3, 16, 16), np.uint8))
    with pytest.raises(DatasetFormatError, match=r"subject0000\.h5: face_patch has shape \(3, 16, 16\)"):
        XGazeH5Dataset(path)
    rewrite(face_gaze=np.zeros((4, 2)))
    with pytest.raises(DatasetFormatError, match=r"face_gaze has shape \(4, 2\), expected \(3, 2\)"):
        XGazeH5Dataset(path)
    rewrite(face_gaze=np.array([[0.0, 0.1], [0.2, 0.3], [np.nan, 0.0]]))
    with pytest.raises(DatasetFormatError, match=r"subject0000\.h5: face_gaze row 2 is \[nan, 0\.0\], not finite"):
        XGazeH5Dataset(path)
    rewrite(face_gaze=np.array([[0.0, 0.1], [0.2, 30.0], [0.0, 0.0]]))
    with pytest.raises(DatasetFormatError, match=r"face_gaze row 1 is \[0\.2, 30\.0\], beyond ±π: .*degrees"):
        XGazeH5Dataset(path)
    rewrite(face_gaze=np.array([b"a", b"b", b"c"]))
    with pytest.raises(DatasetFormatError, match=r"subject0000\.h5: face_gaze does not read as numbers"):
        XGazeH5Dataset(path)
    write_xgaze_h5_fixture(path, images=3)
    with h5py.File(path, "a") as h5:
        del h5["face_gaze"]
        h5.create_group("face_gaze")
    with pytest.raises(DatasetFormatError, match=r"subject0000\.h5: face_gaze is a Group, expected an array"):
        XGazeH5Dataset(path)
    path.write_text("not hdf5")
    with pytest.raises(DatasetFormatError, match=r"subject0000\.h5: not a readable HDF5 file"):
        XGazeH5Dataset(path)
    (tmp_path / "empty").mkdir()
    with pytest.raises(DatasetFormatError, match="no .h5 files here"):
        XGazeH5Dataset(tmp_path / "empty")


# ----- the spec string -----


def test_open_dataset_specs_and_options(tmp_path):
    write_gazehub_fixture(tmp_path, "mpiifacegaze", images_per_person=2)
    ds = open_dataset(f"gazehub:MPIIFaceGaze:{tmp_path}?persons=p01,p02&check_files=false")
    assert ds.persons() == ["p01", "p02"]
    assert open_dataset(f"gazehub:mpii:{tmp_path}", persons=["p00"]).persons() == ["p00"]  # kwargs too
    with pytest.raises(ValueError, match="bad option 'colour=red'"):
        open_dataset(f"gazehub:mpii:{tmp_path}?colour=red")
    with pytest.raises(ValueError, match="unknown kind 'imagenet'"):
        open_dataset("imagenet:/data")
    with pytest.raises(ValueError, match="expected gazehub:<dataset>:<root>"):
        open_dataset("gazehub:mpii")
    with pytest.raises(ValueError, match="unknown GazeHub dataset 'utmultiview'"):
        open_dataset(f"gazehub:utmultiview:{tmp_path}")
    assert issubclass(DatasetFormatError, ValueError)
    # an unknown or no person, and an option the h5 files do not take: ValueErrors, so one line on the command line
    for spec, words in (
        (f"gazehub:mpii:{tmp_path}?persons=p99", r"no person\(s\) \['p99'\]"),
        (f"gazehub:mpii:{tmp_path}?persons=,", "persons= names no one"),
    ):
        with pytest.raises(ValueError, match=words) as e:
            open_dataset(spec)
        assert isinstance(e.value, KeyError) or "names no one" in str(e.value)
    write_xgaze_h5_dir(tmp_path / "eth", subjects=(0,), images=2)
    with pytest.raises(ValueError, match="no subject file"):
        open_dataset(f"xgaze-h5:{tmp_path / 'eth'}?persons=nobody")
    with pytest.raises(ValueError, match=r"option\(s\) split do not apply to ETH-XGaze's h5 files"):
        open_dataset(f"xgaze-h5:{tmp_path / 'eth'}?split=val")
    with pytest.raises(ValueError, match=r"option\(s\) images_per_person, seed do not apply to a GazeHub folder"):
        open_dataset(f"gazehub:mpii:{tmp_path}?seed=3&images_per_person=2")


def test_unreadable_faces_are_named_by_their_file(tmp_path):
    """A face whose header claims a huge image, faces of two sizes in one batch, a damaged h5 chunk, and an error
    re-raised from a loader worker: each one line that names the file (and the way out)."""
    from PIL import Image

    from alfa.cli.errors import error_line

    write_gazehub_fixture(tmp_path / "m", "mpiifacegaze", images_per_person=2)
    ds = GazeHubDataset(tmp_path / "m", "mpii")
    face = ds.image_path(0)
    limit, Image.MAX_IMAGE_PIXELS = Image.MAX_IMAGE_PIXELS, 10  # every face is then a "decompression bomb"
    try:
        with pytest.raises(DatasetFormatError, match=rf"{face}: cannot read image"):
            ds[0]
    finally:
        Image.MAX_IMAGE_PIXELS = limit
    Image.new("RGB", (20, 32)).save(face)  # another size than the others
    with pytest.raises(DatasetFormatError, match=r"faces of different sizes .* add \?size=N"):
        ds.raw_images([0, 1])
    path = tmp_path / "subject0000.h5"
    write_xgaze_h5_fixture(path, images=3)
    h5 = XGazeH5Dataset(path)
    real_handle = h5._handle

    class Damaged:
        def __getitem__(self, key):
            raise OSError("Can't synchronously read data (filter returned failure during read)")

    h5._handle = lambda k: {"face_patch": Damaged()}
    with pytest.raises(DatasetFormatError, match=r"subject0000\.h5: face_patch row 1 cannot be read"):
        h5[1]
    h5._handle = real_handle
    Path(face).write_bytes(b"not an image")  # read in a worker process: the line is still the file's
    with pytest.raises(DatasetFormatError) as e:
        list(DataLoader(ds, batch_size=1, num_workers=1))
    assert "DataLoader worker" in str(e.value)
    assert error_line(e.value).startswith(f"{face}: cannot read image (cannot identify image file")


def test_open_dataset_routes_synthetic(monkeypatch):
    import alfa.gaze.data.synthetic as synthetic

    calls = []
    monkeypatch.setattr(synthetic, "make_domain", lambda name, **kw: calls.append((name, kw)) or "made", raising=False)
    assert open_dataset("synthetic:mpii-like?seed=3&persons=4", size=32) == "made"
    with pytest.raises(ValueError, match="stored_order do not apply to a synthetic world; its options: split, seed"):
        open_dataset("synthetic:mpii?stored_order=yaw-pitch")  # a gazehub option: once a TypeError
    assert calls == [("mpii-like", {"seed": 3, "persons": 4, "size": 32})]
    # an option in the spec and another value of it as a keyword: one of them silently lost (size=64 won)
    with pytest.raises(ValueError, match=r"size=48 in the spec and size=64 as a keyword: give it once$"):
        open_dataset("synthetic:mpii?size=48", size=64)
    assert open_dataset("synthetic:mpii?size=48", size=48) == "made"  # the same value twice is no conflict


def test_fixture_angles_are_consistent_with_the_geometry():
    # The fixtures write GazeHub 3-D vectors as the negated pitchyaw_to_vector; check that round trip.
    yaw_pitch = torch.tensor([[0.3, -0.2], [-1.0, 0.5]], dtype=torch.float64)
    back = gazehub_vector_to_pitchyaw(-pitchyaw_to_vector(yaw_pitch))
    assert angular_error(back, yaw_pitch).max() < 1e-6


def test_the_loaders_return_the_same_batches_with_2_workers_as_with_0(tmp_path):
    from alfa.gaze.train import _iterate

    write_gazehub_fixture(tmp_path / "gh", "mpiifacegaze", images_per_person=4)
    write_xgaze_h5_dir(tmp_path / "xg", subjects=(1, 2), images=4)
    for ds in (GazeHubDataset(tmp_path / "gh", "mpii"), XGazeH5Dataset(tmp_path / "xg")):
        batches = [list(range(i, min(i + 3, len(ds)))) for i in range(0, len(ds), 3)][::-1]  # out of order
        plain = list(_iterate(ds, batches, 0))
        parallel = list(_iterate(ds, batches, 2))
        assert len(plain) == len(parallel) == len(batches)
        for (a_img, a_gaze), (b_img, b_gaze) in zip(plain, parallel):
            assert torch.equal(a_img, b_img) and torch.equal(a_gaze, b_gaze)


def test_the_loaders_bars_are_drawn_unless_a_command_is_quiet(mpii, monkeypatch):
    import argparse

    import alfa.gaze.data.gazehub as gazehub
    from alfa.cli import _quiet_loading

    bars = []
    monkeypatch.setattr(gazehub, "tqdm", lambda items, **kw: bars.append(kw["desc"]) or items)
    monkeypatch.setattr(gazehub, "_BAR_BYTES", 0)
    monkeypatch.setattr(gazehub, "_BAR_IMAGES", 0)
    GazeHubDataset(mpii, "mpii")
    assert bars == ["reading p00.label", "reading p01.label", "reading p02.label", "checking mpiifacegaze images"]
    bars.clear()
    with _quiet_loading(argparse.Namespace(quiet=True)):
        GazeHubDataset(mpii, "mpii")
    assert bars == []


def test_person_errors_read_a_batch_at_a_time_and_equal_the_whole_tensors(tmp_path):
    """Scoring reads at most one batch of images at a time (a real person has thousands), with the same numbers as
    predicting on all of a person's images at once in the same batches."""
    from alfa.gaze.data.registry import open_dataset
    from alfa.gaze.evaluate import GazeError, eval_indices, load_examples, person_gaze_errors, predict_images
    from alfa.models import create_model

    data = open_dataset("synthetic:mpii?size=16&persons=2&images_per_person=23")
    torch.manual_seed(0)
    model = create_model("tiny_gaze_net").eval()
    read, raw_images = [], data.raw_images
    data.raw_images = lambda indices: read.append(len(indices)) or raw_images(indices)
    errors = person_gaze_errors(model, data, n_adapt=5, batch_size=4)
    assert max(read) == 4 and sum(read) == 2 * 18
    for person, error in errors.items():
        images, gaze = load_examples(data, eval_indices(data, person, 5))
        assert error == GazeError.of(predict_images(model, images, 4), gaze)  # exactly


def test_persons_whose_faces_are_of_another_size_are_named_not_scored_at_it(tmp_path, capsys):
    """A folder with one person's faces at another size (files of two releases mixed) was scored at that size by a
    model trained at the other, and validated on by pretrain, without a word: each batch holds one person's."""
    from PIL import Image

    from alfa.checkpoint import save_model
    from alfa.cli import main
    from alfa.models import create_model

    write_gazehub_fixture(tmp_path / "mpii", "mpiifacegaze", persons=["p00", "p01", "p02"], size=16)
    for face in (tmp_path / "mpii" / "Image" / "p02" / "face").iterdir():
        Image.open(face).resize((24, 24)).save(face)
    spec = f"gazehub:mpiifacegaze:{tmp_path / 'mpii'}"
    checkpoint = save_model(
        tmp_path / "m.safetensors", create_model("tiny_gaze_net"), "tiny_gaze_net", input_size=(16, 16)
    )
    assert main(["evaluate", "--checkpoint", str(checkpoint), "--data", spec, "--quiet"]) == 2
    assert "trained on 16×16 images, mpiifacegaze has 24×24 (person p02's first)" in capsys.readouterr().err
    argv = ["pretrain", "--model", "tiny_gaze_net", "--data", spec, "--out", str(tmp_path / "p"), "--quiet"]
    assert main(argv) == 2
    assert "mpiifacegaze: person p02's faces are 24×24, mpiifacegaze's p00's 16×16" in capsys.readouterr().err
    assert not (tmp_path / "p").exists()


def test_a_face_of_another_size_in_a_batch_names_its_label_line(tmp_path):
    from PIL import Image

    from alfa.gaze.data.registry import open_dataset

    write_gazehub_fixture(tmp_path / "mpii", "mpiifacegaze", persons=["p00"], size=16)
    data = open_dataset(f"gazehub:mpiifacegaze:{tmp_path / 'mpii'}")
    odd = data.image_path(3)
    Image.open(odd).resize((24, 24)).save(odd)
    with pytest.raises(ValueError, match=rf"16×16 and 24×24; the first of another size .*: {data.source_line(3)}\)"):
        data.raw_images(list(range(6)))


def test_the_fixtures_real_data_md_writes_open_with_the_specs_its_chain_names(tmp_path, monkeypatch):
    """No page said how to make data in the real layouts without the datasets: docs/real-data.md now writes some,
    and its chain's specs must open them (the chain itself is the CLI tests' ground), with disjoint val persons."""
    import re

    page = (Path(__file__).resolve().parent.parent / "docs" / "real-data.md").read_text("utf-8")
    section = page.split("## Without the datasets")[1].split("\n## ")[0]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    monkeypatch.chdir(tmp_path)
    exec(compile(code, "docs/real-data.md", "exec"), {})
    specs = dict.fromkeys(re.findall(r"--(?:val-)?data \"?(gazehub:[^\s\"]+)", section))
    assert len(specs) == 3
    opened = {spec: open_dataset(spec) for spec in specs}
    train, val, target = opened.values()
    assert len(target.persons()) == 6 and len(train.persons()) == 6 and len(val.persons()) == 2
    assert not set(train.persons()) & set(val.persons())
