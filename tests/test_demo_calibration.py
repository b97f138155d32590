"""The demo's labelled column (``alfa calibrate``'s default on 9 labelled images) and which images each column
uses (:class:`alfa.gaze.demo_scoring.DemoImages`)."""

import pytest
import torch
from torch import nn

from alfa.gaze.calibrate import CalibrateConfig
from alfa.gaze.data.base import InMemoryGazeDataset
from alfa.gaze.demo_scoring import DemoImages, calibrate_and_score
from alfa.gaze.evaluate import evaluate

OFFSET = (0.05, -0.08)  # radians: what the model adds to every (yaw, pitch) of one person


class Offset(nn.Module):
    """A gaze model whose prediction is each image's mean per channel (red: yaw, green: pitch) less 0.5, plus a
    constant offset, through one linear head (which the affine calibration corrects)."""

    def __init__(self, offset: tuple[float, float]) -> None:
        super().__init__()
        self.head = nn.Linear(3, 2)
        with torch.no_grad():
            self.head.weight.copy_(torch.tensor([[1.0, 0.0, 0.0], [0.0, 1.0, 0.0]]))
            self.head.bias.copy_(torch.tensor(offset) - 0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(x.mean((2, 3)))


def flat_faces(persons: int, per_person: int) -> InMemoryGazeDataset:
    """Flat images whose gaze label is exactly what :class:`Offset` predicts before its offset."""
    g = torch.Generator().manual_seed(0)
    n = persons * per_person
    levels = torch.randint(0, 256, (n, 3), generator=g, dtype=torch.uint8)
    images = levels[:, :, None, None].expand(n, 3, 4, 4).contiguous()
    gaze = levels[:, :2].float() / 255.0 - 0.5
    ids = torch.arange(persons).repeat_interleave(per_person)
    return InMemoryGazeDataset(images, gaze, ids, [f"p{i}" for i in range(persons)], name="flat")


def test_the_calibration_removes_a_constant_offset_on_images_it_never_saw_labelled(tmp_path):
    data = flat_faces(persons=2, per_person=5 + 4 + 32)  # 5 adapt, 4 scored, the pool of 32
    images = DemoImages.split(data, n_adapt=5, pool=32)
    model = Offset(OFFSET).eval()
    config = CalibrateConfig()  # alfa calibrate's default: affine, k = 9, a random draw
    column = "calibrated (9 labels)"
    report = calibrate_and_score(model, images, config, tmp_path / "calibrated", column)
    source = evaluate(model, images.label_free(), n_adapt=5, before="source-only", progress=False)
    for person, start in (("p0", 0), ("p1", 41)):
        assert source.columns["source-only"][person] > 5.0  # the offset: about 5.4 degrees
        assert report.columns[column][person] < 1e-3  # the affine map finds the offset exactly
        assert report.meta["scored"][person] == list(range(start + 5, start + 9))
        labelled = set(report.meta["labelled"][person])
        assert len(labelled) == 9 and labelled <= set(range(start + 9, start + 41))
    # deterministic: a rerun (into the same folder, whose files it replaces) draws and scores the same
    again = calibrate_and_score(model, images, config, tmp_path / "calibrated", column)
    assert again.columns == report.columns and again.meta == report.meta


def test_a_person_without_room_for_the_pool_is_one_clear_error():
    data = flat_faces(persons=1, per_person=5 + 32)
    with pytest.raises(ValueError, match="person 'p0' has 37 images; the demo needs 5 to adapt on, 32 for the"):
        DemoImages.split(data, n_adapt=5, pool=32)


def test_the_demo_refuses_targets_of_another_image_size_before_training(tmp_path):
    """`alfa demo --targets "synthetic:mpii?size=16"` trained a 48×48 source model, then scored 16×16 faces and
    printed its (much worse) numbers with exit 0."""
    import dataclasses

    from alfa.gaze.pipeline import DemoConfig, run_demo

    tiny = "synthetic:eth?size=20&persons=2&images_per_person=2"
    config = DemoConfig(
        source=tiny, val_source=None, targets=("synthetic:mpii?size=16&persons=2&images_per_person=40",)
    )
    config = dataclasses.replace(config, out_dir=str(tmp_path / "demo"), cache_dir=str(tmp_path / "cache"))
    with pytest.raises(ValueError, match=r"^synthetic:mpii\?size=16&.*: 16×16 images, the demo's source model trains"):
        run_demo(config, progress=False)
    assert not (tmp_path / "demo").exists() and not (tmp_path / "cache").exists()  # refused before anything ran


def test_the_verdict_calls_a_change_the_printed_precision_shows_as_zero_unchanged():
    """The demo once said a column "lowered" the error by -0.001° (printed "-0.00"): a change below the printed
    precision is called unchanged, either sign; a real one lowered or did NOT lower."""
    from alfa.gaze.evaluate import EvaluationReport
    from alfa.gaze.pipeline import verdict

    before = {"p0": 10.0, "p1": 12.0}
    columns = {
        "source-only": before,
        "tiny-drop": {"p0": 9.998, "p1": 12.0},
        "tiny-rise": {"p0": 10.004, "p1": 12.0},
        "drop": {"p0": 9.9, "p1": 11.9},
        "rise": {"p0": 10.2, "p1": 12.0},
    }
    report = EvaluationReport("toy", 5, ["p0", "p1"], {"p0": 3, "p1": 3}, columns=columns)
    (line,) = verdict({"toy": report})
    # the difference of the means as printed: 11.00 − 11.00, whichever side of it the unrounded means lie
    assert "tiny-drop left it unchanged (11.00 deg, +0.00; lower for 1 of 2 persons)" in line
    assert "tiny-rise left it unchanged (11.00 deg, +0.00;" in line
    assert "drop lowered it (10.90 deg, -0.10;" in line and "rise did NOT lower it (11.10 deg, +0.10;" in line
