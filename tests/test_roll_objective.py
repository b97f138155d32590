"""The roll-consistency objective: its views, its loss, and what it sees that the flip cannot (a constant pitch
offset), on a toy model that obeys the roll law exactly; its gradients reach exactly an adapter's parameters."""

import math
import types

import pytest
import torch
from test_bench import tiny
from tiny_models import TinyGazeNet
from torch import nn

import alfa
import alfa.study.bench.produce as produce
from alfa.gaze.geometry import flip_yaw, roll_gaze, roll_images, vector_to_pitchyaw
from alfa.gaze.losses import flip_symmetry_loss, roll_consistency_loss
from alfa.gaze.objectives import FLIP_ROLL_VIEWS, OBJECTIVES, ROLL_VIEWS, RUDA_VIEWS
from alfa.gaze.personalize import PersonalizeConfig, build_batch
from alfa.gaze.recipes import RECIPE_GRID
from alfa.gaze.views import FLIP_VIEWS, ROLL_DEGREES, VIEWS, disc_mask, roll_view_name, view_rows
from alfa.study.bench.plan import grid_plan, plan_records
from alfa.study.bench.schema import config_hash
from alfa.study.bench.variants import GRID

ANGLE = math.radians(ROLL_DEGREES)


class BlobGaze(nn.Module):
    """A toy gaze model that obeys the roll law: the gaze points along ``(−u, −v, 1)``, ``(u, v)`` the
    brightness centroid of the image about its centre (pixel right and down are −x and −y of the camera frame),
    plus a trainable constant ``offset`` (yaw, pitch), the error a source model may carry."""

    def __init__(self, offset=(0.0, 0.0)) -> None:
        super().__init__()
        self.offset = nn.Parameter(torch.tensor(offset, dtype=torch.float32))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w = x.mean(1)
        size = w.shape[-1]
        coords = (torch.arange(size, dtype=x.dtype) - (size - 1) / 2) / size
        mass = w.sum((1, 2))
        u = (w * coords[None, None, :]).sum((1, 2)) / mass
        v = (w * coords[None, :, None]).sum((1, 2)) / mass
        return vector_to_pitchyaw(torch.stack((-u, -v, torch.ones_like(u)), -1)) + self.offset


def _blobs(n: int = 3, size: int = 32) -> torch.Tensor:
    """Smooth bright blobs well inside the inscribed disc, on black (so a roll inside the disc loses nothing)."""
    g = torch.Generator().manual_seed(1)
    centres = (torch.rand(n, 2, generator=g) - 0.5) * 0.4 * size
    yy, xx = torch.meshgrid(torch.arange(size) - (size - 1) / 2, torch.arange(size) - (size - 1) / 2, indexing="ij")
    d2 = (xx[None] - centres[:, 0, None, None]) ** 2 + (yy[None] - centres[:, 1, None, None]) ** 2
    return torch.exp(-d2 / 8.0)[:, None].expand(n, 3, size, size).contiguous()


def test_the_roll_loss_is_zero_for_a_roll_equivariant_prediction_and_sees_a_pitch_offset_the_flip_cannot():
    gaze = torch.tensor([[0.2, -0.1], [-0.3, 0.25], [0.05, 0.4]])
    for angle in (ANGLE, -ANGLE):
        assert roll_consistency_loss(gaze, roll_gaze(gaze, angle), angle).item() < 1e-6
    offset = torch.tensor([0.0, 0.1])
    biased = roll_consistency_loss(gaze + offset, roll_gaze(gaze, ANGLE) + offset, ANGLE).item()
    # about |b − Roll_{−θ}(b)|_1 = 0.1·(sin θ + 1 − cos θ) per image
    assert biased == pytest.approx(0.1 * (math.sin(ANGLE) + 1 - math.cos(ANGLE)), rel=0.1)
    assert flip_symmetry_loss(gaze + offset, flip_yaw(gaze) + offset).item() == 0.0  # the flip's blind spot


def test_the_roll_batch_holds_the_declared_views_and_the_flip_batch_is_unchanged():
    images = torch.rand(2, 3, 16, 16)
    flip_batch = build_batch(images, PersonalizeConfig(), seed=3)
    assert torch.equal(flip_batch, torch.cat([flip_batch[:4], torch.flip(flip_batch[:4], dims=[-1])]))
    assert OBJECTIVES["flip"].views == OBJECTIVES["augment"].views == FLIP_VIEWS
    roll = view_rows(build_batch(images, PersonalizeConfig(loss="roll"), seed=3), ROLL_VIEWS)
    assert torch.equal(roll["original"], images) and torch.equal(roll["augmented"], flip_batch[2:4])
    disc = disc_mask(16)
    for sign in ("+", "-"):  # rolled inside the inscribed disc, the corners kept
        view = roll[f"rolled {sign}{ROLL_DEGREES:g}°"]
        angle = ANGLE if sign == "+" else -ANGLE
        assert torch.equal(view * disc, roll_images(images, angle) * disc)
        assert torch.equal(view * (1 - disc), images * (1 - disc))
    both = build_batch(images, PersonalizeConfig(loss="flip+roll"), seed=3)
    assert both.shape[0] == 2 * len(FLIP_ROLL_VIEWS) and torch.equal(both[:8], flip_batch)
    assert disc_mask(4).tolist() == [[0, 1, 1, 0], [1, 1, 1, 1], [1, 1, 1, 1], [0, 1, 1, 0]]
    assert VIEWS["original"].roll == 0.0 and VIEWS[f"rolled -{ROLL_DEGREES:g}°"].roll == pytest.approx(-ANGLE)


def test_the_objectives_name_exactly_the_views_that_views_defines():
    """The names are made once (views.roll_view_name): every view an objective declares is a defined one, the
    built-in objectives together use every defined view, and a roll view's name says its roll."""
    declared = {v for objective in OBJECTIVES.values() for v in objective.views}
    assert declared == set(VIEWS) and {*ROLL_VIEWS, *RUDA_VIEWS, *FLIP_ROLL_VIEWS} <= set(VIEWS)
    assert (
        roll_view_name(ROLL_DEGREES) == "rolled +8°" and roll_view_name(-8.0, augmented=True) == "augmented rolled -8°"
    )
    for name in (n for n in VIEWS if "rolled" in n):
        sign = 1 if "+" in name else -1
        assert VIEWS[name].roll == pytest.approx(sign * ANGLE)
        assert name == roll_view_name(sign * ROLL_DEGREES, augmented=name.startswith("augmented"))


@pytest.mark.parametrize("loss", ["roll", "flip"])
def test_on_a_model_that_obeys_the_roll_law_only_an_offset_is_penalized_and_the_roll_pulls_the_pitch_back(loss):
    images = _blobs()
    config = PersonalizeConfig(loss=loss)
    batch = build_batch(images, config, seed=0)
    objective = OBJECTIVES[loss].loss
    assert objective(BlobGaze()(batch), config).item() < 2e-3  # the law holds: nothing to correct
    model = BlobGaze(offset=(0.0, 0.1))
    value = objective(model(batch), config)
    value.backward()
    if loss == "flip":  # a shared pitch offset is invisible to the flip: the loss does not change
        assert value.item() == pytest.approx(objective(BlobGaze()(batch), config).item(), abs=1e-6)
        return
    assert value.item() > 5e-3
    assert model.offset.grad[1].item() > 0  # a descent step lowers the offset's pitch toward 0
    # the L1 residual's gradient is its sign times about sin θ (the yaw residual a pitch offset makes): plain
    # steps walk the pitch back from 0.1
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    for _ in range(20):
        optimizer.zero_grad()
        objective(model(batch), config).backward()
        optimizer.step()
    assert abs(model.offset[1].item()) < 0.02


def test_flip_plus_roll_is_the_sum_of_the_flip_loss_on_its_flip_views_and_the_roll_loss_on_its_roll_views():
    torch.manual_seed(0)
    pred = torch.randn(2 * len(FLIP_ROLL_VIEWS), 2)  # N = 2
    settings = PersonalizeConfig(detach_flipped=False)
    want = OBJECTIVES["flip"].loss(pred[:8], settings) + OBJECTIVES["roll"].loss(pred[8:], settings)
    assert OBJECTIVES["flip+roll"].loss(pred, settings).item() == pytest.approx(want.item(), rel=1e-6)


@pytest.mark.parametrize("loss", ["roll", "flip+roll", "ruda"])
def test_gradients_reach_exactly_the_adapters_trainable_parameters(loss):
    torch.manual_seed(0)
    model = TinyGazeNet().eval()
    alfa.truncate(model, rank=8)
    alfa.attach(model, alfa.AlfaConfig(heads=2, rank=4))
    config = PersonalizeConfig(loss=loss)
    batch = build_batch(torch.rand(3, 3, 32, 32), config, seed=0)
    OBJECTIVES[loss].loss(model(batch), config).backward()
    trainable = set(alfa.adapter_parameters(model))
    reached = {name for name, p in model.named_parameters() if p.grad is not None}
    assert trainable and reached == trainable  # every adapter tensor, and nothing of the frozen base
    # (a zero-initialized factor makes its partner's first gradient zero, so the sum is what must move)
    assert sum(model.get_parameter(name).grad.abs().sum() for name in trainable) > 0


def test_the_declared_recipe_grid_keeps_the_objective_and_a_method_is_selected_under_it(tmp_path, monkeypatch):
    """The recipe selection takes the roll objective as it takes the flip: every recipe of the declared grid
    applied to a roll recipe is still a roll recipe, and ``alfa[loss=roll]`` gets its own selection record (the
    grid on the stand-in, run with the roll loss) and selected row, next to Alfa's own, whose hash is unchanged."""
    assert {r.apply(PersonalizeConfig(loss="roll")).loss for r in RECIPE_GRID} == {"roll"}
    config = tiny(methods=(), selected_methods=("alfa", "alfa[loss=roll]"))
    config.validate()
    plans = {p.id: p for p in plan_records(config)}
    grid, row = plans["alfa[loss=roll][grid]|E→stand-in|seed0"], plans["alfa[loss=roll][selected]|E→M|seed0"]
    assert grid.variant.recipe == row.variant.recipe == {"loss": "roll"} and row.variant.selected
    assert grid_plan(config, row).id == grid.id
    assert plans[f"alfa{GRID}|E→stand-in|seed0"].variant.recipe == {}  # Alfa's own selection as it was
    with pytest.raises(ValueError, match="no recipe selection"):
        tiny(selected_methods=("alfa[loss=nope]",)).validate()
    # its hash differs from Alfa's own selection's (which the smoke preset's pinned digest keeps as it was)
    scored = types.SimpleNamespace(spec="stand-in", fingerprint="f")
    hashes = {
        config_hash(config, p, "model", scored, torch.device("cpu"))
        for p in (grid, plans[f"alfa{GRID}|E→stand-in|seed0"])
    }
    assert len(hashes) == 2
    # the grid runs with the roll loss: its first run is caught before it trains (a stand-in of no persons)
    seen = []

    def first_run(model, data, method, recipe, *args, **kwargs):
        seen.append(recipe.loss)
        raise KeyboardInterrupt

    standin = types.SimpleNamespace(data=types.SimpleNamespace(persons=lambda: []), spec="stand-in")
    session = types.SimpleNamespace(config=config, stand_in=lambda source: standin, adapter_dir=lambda plan: tmp_path)
    monkeypatch.setattr(produce, "personalize_dataset", first_run)
    with pytest.raises(KeyboardInterrupt):
        produce._run_selection(session, None, grid, {})
    assert seen == ["roll"]
