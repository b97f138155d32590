"""The roll law in every synthetic world: the scene rolled about the camera axis by ``a`` renders as the crop rotated
by ``a`` about its centre (``roll_images``), inside the crop's inscribed disc, and its visual axis is the label rolled
by ``a`` (``roll_gaze``). The flip law's counterpart (tests/test_synthetic.py), for every head pose and light.

What the renderer keeps fixed to the image frame rather than the scene is set to zero here, because a roll cannot
carry it: ``light_grad`` (an illumination falloff along the image's columns), the sensor noise field (pixel noise
resampled bilinearly is not the noise of the rolled scene) and the annotation noise (added to the label's angles,
not to the visual axis). ``FaceParams.rolled`` rotates everything else (head, light, crop shift, background
gradient). The v2 worlds' label convention (``label_origin_pitch_deg``: labels from a gaze origin below the eyes)
adds a constant pitch to every label, and a roll does not commute with a constant offset: the law holds for the
visual axis (``gaze_labels``), not for the convention's labels (the last assertion shows the difference).

Tolerance: the crop is rendered at 48 pixels with one-pixel anti-aliased edges, and bilinear resampling smooths such
an edge over a pixel, so the two images differ by up to a fifth of the range on a few edge pixels; their mean
absolute difference over the disc stays under 3 grey levels (0.012), a quarter of what the roll itself changes, while
the roll by the opposite angle is several times further (test_roll_law_fails_when_it_should).
"""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
import torch
from test_synthetic import _random_scenes

from alfa.gaze.data.synthetic import FaceParams, gaze_labels, get_domain, list_domains, render_faces
from alfa.gaze.geometry import angular_error, roll_gaze, roll_images

SIZE, PER_WORLD, ANGLE = 48, 2, 0.3  # pixels, images per world, radians (17°: beyond any world's head-roll spread)
WORLDS = list_domains(None)


def _disc(size: int) -> torch.Tensor:
    """The pixels no rotated-in corner reaches: centres inside the inscribed circle, less a pixel's margin."""
    r = torch.linspace(-1, 1, size + 1)[:-1] + 1 / size
    u, v = torch.meshgrid(r, r, indexing="xy")
    return u**2 + v**2 < (1 - 2 / size) ** 2


def _frame_fixed_terms_zeroed(params: FaceParams) -> FaceParams:
    zero = torch.zeros_like(params.head_yaw)
    return replace(params, light_grad=zero, label_noise_yaw=zero, label_noise_pitch=zero)


@pytest.fixture(scope="module")
def renders() -> dict[str, tuple[FaceParams, torch.Tensor, torch.Tensor]]:
    """Per world: its scenes, their images and the images of the rolled scenes. Worlds whose cameras share a
    resolution render in one call (the renderer's cost is per call more than per image)."""
    groups: dict[int, list[tuple[str, FaceParams, torch.Tensor]]] = {}
    for name in WORLDS:
        params, noise = _random_scenes(name, PER_WORLD, seed=7, size=SIZE)
        groups.setdefault(noise.shape[-1], []).append((name, _frame_fixed_terms_zeroed(params), noise))
    out = {}
    for res, members in groups.items():
        params = FaceParams.cat([p for _, p, _ in members])
        both = FaceParams.cat([params, params.rolled(ANGLE)])
        images = render_faces(both, torch.zeros(2 * len(members) * PER_WORLD, 4, res, res), SIZE)
        plain, rolled = images.chunk(2)
        for k, (name, p, _) in enumerate(members):
            part = slice(k * PER_WORLD, (k + 1) * PER_WORLD)
            out[name] = (p, plain[part], rolled[part])
    return out


def _mean_in_disc(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Per image, the mean absolute difference over the disc's pixels and the channels."""
    return (a - b).abs()[..., _disc(a.shape[-1])].mean((1, 2))


@pytest.mark.parametrize("name", WORLDS)
def test_roll_law(name, renders):
    params, image, rolled = renders[name]
    residual = _mean_in_disc(roll_images(image, ANGLE), rolled)
    assert residual.max() < 0.012
    assert (residual < 0.25 * _mean_in_disc(image, rolled)).all()  # the roll moves far more than the law misses
    labels = gaze_labels(params.rolled(ANGLE))
    assert angular_error(roll_gaze(gaze_labels(params), ANGLE), labels).max() < 0.05  # degrees, float32 rounding
    origin = get_domain(name).label_origin_pitch_deg * math.pi / 180
    if origin:  # the convention's labels: a constant pitch offset, which the roll turns into yaw
        offset = torch.tensor([0.0, origin])
        moved = angular_error(roll_gaze(gaze_labels(params) + offset, ANGLE), labels + offset)
        assert moved.min() > 0.5 * math.degrees(2 * math.sin(ANGLE / 2) * origin)


def test_roll_law_fails_when_it_should(renders):
    """The check is not vacuous: the opposite angle misses the rolled scene by several times the tolerance, an
    unrolled light or crop shift breaks it, and the unrotated label is degrees away."""
    for name in ("eth", "mpii-v2"):
        params, image, rolled = renders[name]
        assert _mean_in_disc(roll_images(image, -ANGLE), rolled).min() > 0.02
        assert angular_error(gaze_labels(params), gaze_labels(params.rolled(ANGLE))).min() > 1.0
        assert angular_error(roll_gaze(gaze_labels(params), -ANGLE), gaze_labels(params.rolled(ANGLE))).min() > 2.0
    params, image, rolled = renders["eth-studio"]  # a strong key light from the side
    turned = params.rolled(ANGLE)
    fixed_light = replace(turned, light_az=params.light_az, light_el=params.light_el)
    noise = torch.zeros(PER_WORLD, 4, image.shape[-1], image.shape[-1])
    assert _mean_in_disc(roll_images(image, ANGLE), render_faces(fixed_light, noise, SIZE)).min() > 0.012


def test_rolled_scene_keeps_the_person_and_composes():
    """``rolled`` changes only the scene's pose, light, shift and background gradient, and two rolls are one."""
    params, _ = _random_scenes("gaze360", 3, seed=2, size=SIZE)
    twice, once = params.rolled(0.2).rolled(0.15), params.rolled(0.35)
    for field in ("head_yaw", "head_pitch", "head_roll", "light_az", "light_el", "shift_x", "shift_y", "bg_grad_x"):
        assert (getattr(twice, field) - getattr(once, field)).abs().max() < 1e-5, field
    assert (params.rolled(0.0).head_roll - params.head_roll).abs().max() < 1e-6
    assert torch.equal(params.rolled(0.3).eye_yaw, params.eye_yaw) and torch.equal(params.rolled(0.3).skin, params.skin)
