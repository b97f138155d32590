"""The roll primitives (``alfa.gaze.geometry``): the gaze and the image rolled about the camera axis agree with the
renderer's rolled scene, compose as rotations, and see a constant offset that the flip cannot."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
import torch
from test_synthetic import _random_scenes

from alfa.gaze.data.synthetic.render import gaze_labels, render_faces
from alfa.gaze.geometry import angular_error, flip_yaw, roll_gaze, roll_images

_INSCRIBED = 0.85  # squared radius (in [-1, 1] pixel-centre units) inside which no rotated-in corner reaches


def _disc(size: int) -> torch.Tensor:
    r = torch.linspace(-1, 1, size + 1)[:-1] + 1 / size
    u, v = torch.meshgrid(r, r, indexing="xy")
    return u**2 + v**2 < _INSCRIBED


def test_roll_gaze_is_a_rotation_about_the_camera_axis():
    g = torch.tensor([[0.3, -0.2], [-0.5, 0.4], [0.0, 0.0]])
    a, b = 0.4, -0.9
    torch.testing.assert_close(roll_gaze(roll_gaze(g, a), b), roll_gaze(g, a + b), atol=1e-6, rtol=0)
    torch.testing.assert_close(roll_gaze(roll_gaze(g, a), -a), g, atol=1e-6, rtol=0)
    # Looking down the camera axis is the rotation's fixed point; a quarter turn maps yaw into pitch.
    torch.testing.assert_close(roll_gaze(g[2:], 1.0), g[2:], atol=1e-7, rtol=0)
    turned = roll_gaze(torch.tensor([[0.3, 0.0]]), math.pi / 2)
    assert turned[0, 0].abs() < 1e-6 and abs(turned[0, 1].item() - 0.3) < 1e-6
    # The angle between two gazes is kept.
    torch.testing.assert_close(angular_error(roll_gaze(g[:2], a), roll_gaze(g[1:], a)), angular_error(g[:2], g[1:]))


def test_a_roll_sees_a_constant_offset_that_the_flip_cannot():
    """For ``f = g + b``: the flip residual of a pitch offset is zero, the roll residual is not."""
    g = torch.tensor([[0.2, 0.1], [-0.3, -0.2]])
    b = torch.tensor([0.0, 0.08])
    flip_residual = (g + b) - flip_yaw(flip_yaw(g) + b)
    assert flip_residual.abs().max() < 1e-7
    assert angular_error(roll_gaze(g, 0.5) + b, roll_gaze(g + b, 0.5)).min() > 1.0  # degrees


@pytest.mark.parametrize("name", ["eth", "mpii"])
def test_rolled_image_is_the_rolled_scene(name):
    """A head facing the camera under a frontal light, rolled by ``a``, renders (inside the inscribed disc)
    as the image rolled by ``a``, and its label is the rolled label; the opposite sign is far off."""
    params, noise = _random_scenes(name, 6, seed=1, size=64)
    zero = torch.zeros_like(params.head_yaw)
    params = replace(
        params,
        head_yaw=zero,
        head_pitch=zero,
        light_az=zero,
        light_el=zero,
        light_grad=zero,
        label_noise_yaw=zero,
        label_noise_pitch=zero,
    )
    noise, a = torch.zeros_like(noise), 0.3
    image = render_faces(params, noise, 64)
    rolled_scene = replace(params, head_roll=params.head_roll + a)
    rolled = render_faces(rolled_scene, noise, 64)
    disc = _disc(64)
    err = lambda sign: (roll_images(image, sign * a) - rolled).abs()[..., disc].mean()  # noqa: E731
    assert err(1) < 0.012 and err(-1) > 0.04
    labels = gaze_labels(rolled_scene)
    assert angular_error(roll_gaze(gaze_labels(params), a), labels).max() < 1e-3
    assert angular_error(roll_gaze(gaze_labels(params), -a), labels).max() > 5.0


def test_roll_images_refuses_non_square_images():
    with pytest.raises(ValueError, match="H == W"):
        roll_images(torch.zeros(1, 3, 4, 5), 0.1)
