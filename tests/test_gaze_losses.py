"""Losses, augmentation and the personalization batch of the gaze stack."""

import math

import pytest
import torch
import torch.nn.functional as F

from alfa.gaze.augment import AugmentConfig, augment_images, seed_from_generator
from alfa.gaze.evaluate import GazeError
from alfa.gaze.geometry import angular_error, flip_yaw
from alfa.gaze.losses import (
    augmentation_consistency_loss,
    finite_or_raise,
    flip_symmetry_loss,
    supervised_l1_loss,
)
from alfa.gaze.personalize import PersonalizeConfig, build_batch, person_seed


def test_flip_loss_is_zero_for_a_mirror_consistent_prediction():
    pred = torch.randn(6, 2)
    assert flip_symmetry_loss(pred, flip_yaw(pred)).item() == 0.0


def test_flip_loss_value_by_hand():
    pred = torch.tensor([[0.3, 0.1], [-0.2, 0.0]])
    flipped = torch.tensor([[-0.1, 0.2], [0.2, 0.5]])
    # FlipYaw(flipped) = [[0.1, 0.2], [-0.2, 0.5]]; L1 per image: 0.2 + 0.1 = 0.3 and 0 + 0.5 = 0.5.
    assert flip_symmetry_loss(pred, flipped).item() == pytest.approx(0.4)


def test_flip_loss_cannot_see_a_common_pitch_offset_but_sees_a_yaw_offset():
    """Why the report splits the error into yaw and pitch: shifting every pitch prediction (of an image
    and of its mirror) by the same amount leaves the loss unchanged; a yaw shift does not."""
    pred, flipped = torch.randn(8, 2), torch.randn(8, 2)
    loss = flip_symmetry_loss(pred, flipped)
    pitch_shift = torch.tensor([0.0, 0.7])
    assert torch.allclose(flip_symmetry_loss(pred + pitch_shift, flipped + pitch_shift), loss)
    mirror = flip_yaw(pred)
    yaw_shift = torch.tensor([0.7, 0.0])
    assert flip_symmetry_loss(pred + yaw_shift, mirror + yaw_shift).item() == pytest.approx(
        2 * 0.7
    )  # the yaw residual doubles


def test_gaze_error_parts_in_degrees():
    label = torch.tensor([[0.1, -0.2], [0.0, 0.1], [-0.1, 0.0], [0.2, 0.3]])
    pred = label + torch.tensor([[0.02, 0.05], [-0.02, 0.05], [0.02, 0.05], [-0.02, 0.05]])
    e = GazeError.of(pred, label)
    deg = 180 / math.pi
    assert e.yaw == pytest.approx(0.02 * deg, rel=1e-5) and e.yaw_bias == pytest.approx(0.0, abs=1e-5)
    assert e.pitch == pytest.approx(0.05 * deg, rel=1e-5) and e.pitch_bias == pytest.approx(0.05 * deg, rel=1e-5)
    assert e.angular == pytest.approx(float(angular_error(pred.double(), label.double()).mean()))
    assert e.yaw_ms == pytest.approx((0.02 * deg) ** 2, rel=1e-5) and e.pitch_ms == pytest.approx((0.05 * deg) ** 2)
    assert set(e.parts()) == {"yaw", "pitch", "yaw_bias", "pitch_bias", "yaw_ms", "pitch_ms"}


def test_flip_loss_detaches_the_flipped_branch_by_default():
    pred = torch.randn(4, 2, requires_grad=True)
    flipped = torch.randn(4, 2, requires_grad=True)
    flip_symmetry_loss(pred, flipped).backward()
    assert pred.grad is not None and pred.grad.abs().sum() > 0
    assert flipped.grad is None
    pred.grad = None
    flip_symmetry_loss(pred, flipped, detach_flipped=False).backward()
    assert flipped.grad is not None and flipped.grad.abs().sum() > 0
    # d/d flipped of |p_yaw + f_yaw| is the same sign as d/d pred: the yaw is mirrored.
    assert torch.equal(torch.sign(flipped.grad[:, 0]), torch.sign(pred.grad[:, 0]))
    assert torch.equal(torch.sign(flipped.grad[:, 1]), -torch.sign(pred.grad[:, 1]))


def test_supervised_l1_is_the_per_image_norm_mean():
    pred, target = torch.randn(5, 2), torch.randn(5, 2)
    assert supervised_l1_loss(pred, target).item() == pytest.approx(2 * F.l1_loss(pred, target).item(), rel=1e-6)


def test_augmentation_consistency_trains_the_augmented_branch():
    original = torch.randn(3, 2, requires_grad=True)
    augmented = torch.randn(3, 2, requires_grad=True)
    loss = augmentation_consistency_loss(original, augmented)
    assert loss.item() == pytest.approx((augmented - original).abs().sum(1).mean().item())
    loss.backward()
    assert original.grad is None and augmented.grad is not None


@pytest.mark.parametrize(
    "a,b,message",
    [
        (torch.zeros(3, 3), torch.zeros(3, 3), r"\(N, 2\)"),
        (torch.zeros(3, 2), torch.zeros(4, 2), "shapes differ"),
        (torch.zeros(0, 2), torch.zeros(0, 2), "empty batch"),
    ],
)
def test_losses_refuse_bad_shapes(a, b, message):
    with pytest.raises(ValueError, match=message):
        flip_symmetry_loss(a, b)


def test_finite_or_raise_names_the_stage():
    assert finite_or_raise(torch.tensor(1.5), "x").item() == 1.5
    with pytest.raises(FloatingPointError, match="personalization: the loss is nan"):
        finite_or_raise(torch.tensor(float("nan")), "personalization")


def _smooth_images(n: int = 4, size: int = 24) -> torch.Tensor:
    g = torch.Generator().manual_seed(3)
    coarse = torch.rand(n, 3, 4, 4, generator=g)
    return F.interpolate(coarse, size=(size, size), mode="bilinear", align_corners=False)


def test_augmentation_is_deterministic_in_its_seed_and_leaves_global_rng_alone():
    images = _smooth_images()
    torch.manual_seed(123)
    state = torch.get_rng_state()
    a = augment_images(images, AugmentConfig(), seed=7)
    assert torch.equal(torch.get_rng_state(), state)
    b = augment_images(images, AugmentConfig(), seed=7)
    c = augment_images(images, AugmentConfig(), seed=8)
    assert torch.equal(a, b)
    assert not torch.equal(a, c)
    assert a.shape == images.shape and a.min() >= 0 and a.max() <= 1
    assert not torch.equal(a, images)
    g1, g2 = torch.Generator().manual_seed(5), torch.Generator().manual_seed(5)
    assert seed_from_generator(g1) == seed_from_generator(g2)


def test_augmentation_refuses_nan_and_bad_config():
    images = _smooth_images()
    images[1, 0, 2, 2] = float("nan")
    with pytest.raises(ValueError, match="NaN"):
        augment_images(images, AugmentConfig(), seed=0)
    with pytest.raises(ValueError, match="blur_kernel"):
        augment_images(_smooth_images(), AugmentConfig(blur_kernel=4), seed=0)


def test_personalization_batch_layout():
    images = _smooth_images(5)
    config = PersonalizeConfig()
    batch = build_batch(images, config, seed=11)
    assert batch.shape == (20, 3, 24, 24)
    assert torch.equal(batch[:5], images)  # the originals first
    assert torch.equal(batch[5:10], augment_images(images, config.augment, seed=11))  # one augmented copy each
    assert torch.equal(batch[10:], torch.flip(batch[:10], dims=[-1]))  # then the flips, same order
    assert torch.equal(build_batch(images, config, seed=11), batch)


def test_person_seed_is_stable_and_distinct():
    # pinned: the same in every process and Python (a seed from hash() would change with PYTHONHASHSEED), so a
    # person's adapter init and augmentation never change unannounced
    assert (person_seed(0, "p00", "x"), person_seed(3, "p07", "personalize")) == (158016240, 1063251163)
    assert len({person_seed(0, "p00", "x"), person_seed(0, "p01", "x"), person_seed(1, "p00", "x")}) == 3
    assert 0 <= person_seed(0, "p00", "x") < 2**31
