"""Test-time augmentation by the flip and the roll (``alfa.gaze.tta``): the kinds and their costs, each wrapper
against the average computed by hand, and the split of an error into what the flip, the roll, both and neither see,
on constructed predictions whose errors are known."""

from __future__ import annotations

import math

import pytest
import torch
from tiny_models import TinyGazeNet

from alfa.gaze.data.synthetic import get_domain, list_domains
from alfa.gaze.flip import FlipTTA
from alfa.gaze.geometry import angular_error, flip_yaw, pitchyaw_to_vector, roll_gaze, roll_images, vector_to_pitchyaw
from alfa.gaze.orbit import orbit_parts, predict_orbit
from alfa.gaze.tta import (
    ROLL_TTA_ANGLES,
    ROLL_TTA_DEG,
    TTA_KINDS,
    GridTTA,
    GroupTTA,
    RollTTA,
    tta_combine,
    tta_kind,
    tta_views,
)

DEG = math.pi / 180


def _model_and_images(seed: int = 0) -> tuple[TinyGazeNet, torch.Tensor]:
    torch.manual_seed(seed)
    return TinyGazeNet().eval(), torch.rand(5, 3, 32, 32, generator=torch.Generator().manual_seed(seed + 1))


def _in_disc(x: torch.Tensor, angle: float) -> torch.Tensor:
    """The crop rolled inside its inscribed disc (pixel centres within half the side of the centre), corners kept."""
    r = torch.arange(x.shape[-1]) - (x.shape[-1] - 1) / 2
    disc = (r[:, None] ** 2 + r[None, :] ** 2 <= (x.shape[-1] / 2) ** 2).float()
    return roll_images(x, angle) * disc + x * (1 - disc)


def test_a_rolled_view_keeps_the_corners_and_rolls_the_disc():
    x = torch.rand(2, 3, 32, 32, generator=torch.Generator().manual_seed(3))
    (view,) = tta_views(x, (False,), (0.3,))
    assert torch.equal(view[..., 0, 0], x[..., 0, 0]) and torch.equal(view[..., -1, -1], x[..., -1, -1])
    assert (view - _in_disc(x, 0.3)).abs().max() < 1e-6 and (view - x)[..., 16, 16].abs().max() > 0


def test_the_kinds_their_costs_and_a_bad_name():
    assert list(TTA_KINDS) == ["flip", "roll", "flip+roll"]
    assert [k.passes for k in TTA_KINDS.values()] == [2, 3, 6]
    assert ROLL_TTA_ANGLES == (0.0, 8 * DEG, -8 * DEG)
    with pytest.raises(ValueError, match=r"unknown test-time augmentation 'rol'; expected one of flip, roll"):
        tta_kind("rol")


def test_the_declared_roll_follows_from_the_worlds_head_roll_spread():
    """The reason of ``ROLL_TTA_DEG`` holds for the registered worlds: twice the narrower source's head-roll spread,
    and a target head rolled by it stays inside that source's trained range (3σ) for at least 90 % of views."""
    worlds = [get_domain(name) for name in list_domains(None)]
    source = min(w.head_roll_std for w in worlds if w.role == "source")
    # the constructed flip control's target (docs/flip-premise.md §7.4) has the studio's own head roll and runs no
    # roll row: the reason is about the targets the roll rows score
    scored = [w for w in worlds if w.role == "target" and w.name != "eth-studio-mirrored-v2"]
    target = max(w.head_roll_std for w in scored)
    assert ROLL_TTA_DEG == 2 * source
    inside = 0.5 * (math.erf((3 * source - ROLL_TTA_DEG) / (target * math.sqrt(2))) + 1)
    assert inside >= 0.9


@torch.no_grad()
def test_each_wrapper_is_its_average_computed_by_hand():
    model, x = _model_and_images()
    assert torch.equal(TTA_KINDS["flip"].wrap(model)(x), FlipTTA(model)(x))  # --tta flip is --flip-tta
    back = [roll_gaze(model(_in_disc(x, a)), -a) if a else model(x) for a in ROLL_TTA_ANGLES]
    mean = vector_to_pitchyaw(sum(pitchyaw_to_vector(p) for p in back))
    assert (RollTTA(model)(x) - mean).abs().max() < 1e-6
    mirrored = [flip_yaw(roll_gaze(model(_in_disc(x.flip(-1), a)), -a)) for a in ROLL_TTA_ANGLES]
    group = vector_to_pitchyaw(sum(pitchyaw_to_vector(p) for p in back + mirrored))
    assert (GroupTTA(model)(x) - group).abs().max() < 1e-6
    # Each kind's views and combination (what the service batches) give its wrapper's answer.
    for kind in TTA_KINDS.values():
        assert (kind.combine([model(v) for v in kind.views(x)]) - kind.wrap(model)(x)).abs().max() < 1e-6
    # A wrapper takes the model's mode, so evaluating through it (which restores the mode after) leaves it be.
    assert not RollTTA(model).training and not GroupTTA(model).training and not FlipTTA(model).training
    # The TTA differs from the model's own prediction (the check is not vacuous), by well under the views' spread.
    assert (GroupTTA(model)(x) - model(x)).abs().max() > 1e-4


@torch.no_grad()
def test_the_exported_form_is_the_wrapper_up_to_rounding():
    """``GridTTA`` (constant grids with the flip folded in, one pass of all views, constant back-rotations) gives its
    kind's numbers, so the ONNX graph made of it is the Python TTA; a roll needs square crops."""
    model, x = _model_and_images(2)
    for kind in TTA_KINDS.values():
        assert (kind.exportable(model, (32, 32))(x) - kind.wrap(model)(x)).abs().max() < 1e-6, kind.name
    assert isinstance(TTA_KINDS["flip+roll"].exportable(model, (32, 32)), GridTTA)
    with pytest.raises(ValueError, match="needs square images, not 32×24"):
        TTA_KINDS["roll"].exportable(model, (32, 24))
    TTA_KINDS["flip"].check_size((32, 24))  # a flip needs no square


def test_predictions_that_obey_both_laws_are_returned_unchanged_and_an_offset_is_kept_by_roll_tta():
    g = 0.3 * torch.randn(8, 2, generator=torch.Generator().manual_seed(2))
    kind = TTA_KINDS["flip+roll"]
    lawful = [roll_gaze(flip_yaw(g) if f else g, a) for f in kind.flips for a in kind.angles]
    assert angular_error(kind.combine(lawful), g).max() < 1e-3
    # A constant pitch offset b: flip-TTA keeps all of it; roll-TTA at ±8° keeps (1 + 2 cos 8°) / 3 of it.
    b = torch.tensor([0.0, 2 * DEG])
    small = torch.zeros(1, 2)
    roll = TTA_KINDS["roll"]
    kept = roll.combine([roll_gaze(small, a) + b for a in roll.angles])[0, 1] / b[1]
    assert kept == pytest.approx((1 + 2 * math.cos(8 * DEG)) / 3, abs=1e-3)
    assert TTA_KINDS["flip"].combine([g + b, flip_yaw(g) + b])[:, 1].sub(g[:, 1] + b[1]).abs().max() < 1e-6
    with pytest.raises(ValueError, match="3 predictions for 6 views"):
        tta_combine(lawful[:3], kind.flips, kind.angles)


def _orbit_of(labels: torch.Tensor, steps: int, error) -> torch.Tensor:
    """The predictions on every view of the orbit of a model whose prediction is ``error(true label of the view)``."""
    views = []
    for flip in (False, True):
        start = flip_yaw(labels) if flip else labels
        views.append(torch.stack([error(roll_gaze(start, 2 * math.pi * k / steps)) for k in range(steps)]))
    return torch.stack(views).double()


@pytest.mark.parametrize("steps", [8, 45])
def test_what_the_flip_and_the_roll_see_of_known_errors(steps):
    """A yaw offset: the flip and the roll see all of it (both). A pitch offset: the flip sees none of it, the roll
    all (roll only). An error that turns with the image (a gain on the gaze angles, nearly): neither sees it."""
    labels = 0.2 * torch.randn(40, 2, generator=torch.Generator().manual_seed(5)).double()
    yaw = orbit_parts(_orbit_of(labels, steps, lambda y: y + torch.tensor([3 * DEG, 0.0])), labels)
    assert yaw.flip_seen == pytest.approx(1, abs=0.02) and yaw.roll_seen == pytest.approx(1, abs=0.02)
    assert yaw.both == pytest.approx(1, abs=0.03) and yaw.neither < 0.01 and yaw.error == pytest.approx(3, rel=0.1)
    pitch = orbit_parts(_orbit_of(labels, steps, lambda y: y + torch.tensor([0.0, 3 * DEG])), labels)
    assert pitch.flip_seen < 1e-3 and pitch.roll_seen == pytest.approx(1, abs=0.02)
    assert pitch.roll_only == pytest.approx(1, abs=0.03) and pitch.both < 0.01 and pitch.roll_steps == steps
    # A gain on the angles commutes with the flip exactly and with a roll to second order in the angles.
    gain = orbit_parts(_orbit_of(labels, steps, lambda y: 1.1 * y), labels)
    assert gain.neither == pytest.approx(1, abs=0.02) and gain.flip_seen == 0 and gain.roll_seen < 0.02
    for parts in (yaw, pitch, gain):
        total = parts.neither + parts.flip_only + parts.roll_only + parts.both + parts.cross
        assert total == pytest.approx(1, abs=1e-9)


def test_orbit_predictions_of_a_model_and_bad_shapes():
    model, x = _model_and_images(1)
    orbit = predict_orbit(model, x, steps=4)
    assert orbit.shape == (2, 4, 5, 2)
    with torch.no_grad():
        assert (orbit[0, 0] - model(x)).abs().max() < 1e-6
        assert (orbit[1, 2] - model(_in_disc(x.flip(-1), math.pi))).abs().max() < 1e-6
    parts = orbit_parts(orbit, torch.zeros(5, 2))
    assert 0 < parts.flip_seen and 0 < parts.roll_seen and parts.error > 0
    with pytest.raises(ValueError, match=r"\(2, steps, N, 2\)"):
        orbit_parts(torch.zeros(1, 4, 5, 2), torch.zeros(5, 2))
    with pytest.raises(ValueError, match="labels"):
        orbit_parts(orbit, torch.zeros(4, 2))
    with pytest.raises(ValueError, match="at least 2"):
        predict_orbit(model, x, steps=1)
