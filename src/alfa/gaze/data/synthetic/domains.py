"""The four synthetic gaze domains: what each world is like, how persons and scenes are drawn, and
:func:`make_domain`, which renders a domain split into an :class:`~alfa.gaze.data.base.InMemoryGazeDataset`.

The domains differ only in the world (light, camera, who the persons are, how they hold head and
eyes, glasses); nothing in them knows about any adaptation method. All domains share one anatomy
(:data:`ANATOMY`): the same eye geometry, kappa spread and asymmetries.

Determinism: person ``k`` of a split draws everything from its own generator, seeded from
``(seed, domain, split, k)``, so a person's images do not depend on how many persons are made, and
its per-image parameters are drawn in fixed chunks, so fewer images per person give a prefix.
"""

from __future__ import annotations

import math
import os
import zlib
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace

import numpy as np
import torch
from torch import Tensor
from tqdm import tqdm

from ...geometry import pitchyaw_to_vector, vector_to_pitchyaw
from ..base import InMemoryGazeDataset
from .render import NOISE_CHANNELS, FaceParams, gaze_labels, head_rotation, render_faces

__all__ = [
    "ANATOMY",
    "DOMAINS",
    "DomainConfig",
    "SPLITS",
    "check_domain",
    "get_domain",
    "list_domains",
    "make_domain",
    "render_person",
    "sample_capture",
    "sample_persons",
    "sample_scenes",
    "place_capture",
]

DEG = math.pi / 180.0
SPLITS = ("train", "val", "test")
LIGHT_SIDES = ("image", "person", "fixed", "fixed-right")
PARAM_CHUNK = 16  # per-image parameters are drawn this many at a time (prefix stability)
CROP_ZOOM = 1.9  # the normalized crop is tight: eyes in the upper half, cheeks and chin at the borders
RENDER_PIXELS = 1 << 17  # pixels per render call: small enough to stay in cache, large enough to amortize
MIN_SIZE = 16  # the smallest crop a world is made at: the eyes, a tenth of the face, need a few pixels


@dataclass(frozen=True)
class Anatomy:
    """Person-level distributions shared by every domain: ``(mean, std)`` pairs in head units or degrees.

    Proportions are anatomical (head half-width 0.68 ~ 70 mm) except the eyes, drawn about 1.2× life
    size (eyeball radius 0.15 ~ 15 mm instead of 12) so that a 64-pixel crop keeps a usable iris."""

    face_w: tuple[float, float] = (0.68, 0.035)
    face_h: tuple[float, float] = (0.92, 0.045)
    face_d: tuple[float, float] = (0.62, 0.03)
    eye_sep: tuple[float, float] = (0.32, 0.018)
    eye_y: tuple[float, float] = (0.16, 0.025)
    eye_w: tuple[float, float] = (0.165, 0.012)
    eye_low: tuple[float, float] = (0.28, 0.05)
    eye_tilt: tuple[float, float] = (0.06, 0.08)
    lid_skew: tuple[float, float] = (0.15, 0.1)
    lid_follow: tuple[float, float] = (0.4, 0.08)
    ball_r: tuple[float, float] = (0.15, 0.007)
    iris_r: tuple[float, float] = (0.072, 0.005)
    kappa_yaw_deg: tuple[float, float] = (0.0, 2.0)
    kappa_pitch_deg: tuple[float, float] = (0.0, 1.5)
    eye_sep_asym: float = 0.03  # std of the relative left/right differences
    eye_y_asym: float = 0.006
    eye_w_asym: float = 0.04
    eye_open_asym: float = 0.08
    brow_asym: float = 0.01


ANATOMY = Anatomy()

# Colour palettes (linear-ish RGB albedo).
SKIN_DARK, SKIN_LIGHT = (0.30, 0.19, 0.13), (0.93, 0.76, 0.64)
IRIS_PALETTE = {
    "dark brown": (0.18, 0.10, 0.06),
    "brown": (0.36, 0.21, 0.10),
    "hazel": (0.45, 0.37, 0.18),
    "green": (0.30, 0.42, 0.25),
    "blue": (0.32, 0.47, 0.65),
    "grey": (0.47, 0.50, 0.52),
}
HAIR_PALETTE = {
    "black": (0.05, 0.04, 0.04),
    "dark brown": (0.18, 0.11, 0.07),
    "brown": (0.35, 0.22, 0.12),
    "blond": (0.70, 0.56, 0.33),
    "grey": (0.60, 0.59, 0.57),
}


@dataclass(frozen=True)
class DomainConfig:
    """One synthetic world. Ranges are ``(low, high)`` for uniform draws; gaze and head angles are
    ``(mean, std, limit)`` in degrees for clipped normal draws (the limit is about the mean)."""

    name: str
    description: str
    role: str  # "source" (train on it) or "target" (personalize and evaluate on it)
    persons: dict[str, int]  # persons per split
    images_per_person: int
    render_scale: float  # camera resolution relative to the output size (below 1: upsampled, soft)
    # gaze in the camera frame, and head pose (follows the gaze by head_follow, plus its own spread)
    gaze_yaw: tuple[float, float, float]
    gaze_pitch: tuple[float, float, float]
    head_yaw: tuple[float, float, float]
    head_pitch: tuple[float, float, float]
    head_roll_std: float
    head_follow: float
    crop_jitter: float  # std of the crop shift; scale jitter is half of it
    label_noise_deg: float
    # light
    light_az: tuple[float, float]  # (mean |azimuth|, std) in degrees; the side is random
    light_el: tuple[float, float]  # (mean, std) in degrees
    ambient: tuple[float, float]
    diffuse: tuple[float, float]
    light_warmth: tuple[float, float]  # -1 cool (bluish) .. +1 warm (orange)
    light_grad_std: float
    specular: tuple[float, float]
    background: tuple[float, float]  # brightness
    background_colour: float  # how colourful backgrounds are
    # camera
    exposure: tuple[float, float]
    colour_cast: tuple[float, float, float]
    cast_jitter: float
    vignette: tuple[float, float]
    blur: tuple[float, float]  # sigma in camera pixels at the 64-pixel reference size, at most 1
    noise_read: tuple[float, float]
    noise_shot: tuple[float, float]
    noise_chroma: tuple[float, float]
    gamma: tuple[float, float]
    # who the persons are
    skin_tone: tuple[float, float]  # 0 darkest .. 1 lightest
    eye_open: tuple[float, float]  # (mean, std) of the upper lid height
    glasses_prob: float
    iris_weights: tuple[float, ...]  # over IRIS_PALETTE
    hair_weights: tuple[float, ...] = field(default=(0.35, 0.3, 0.15, 0.1, 0.1))  # over HAIR_PALETTE
    # Left/right asymmetries of the capture (docs/synthetic.md § Asymmetric worlds). The defaults make a
    # world mirror-symmetric in distribution: the key light's side is drawn per image, the camera is
    # straight in front of the person.
    # "image": side drawn per image; "person": one side per person; "fixed": image left; "fixed-right": image right
    light_side: str = "image"
    camera_yaw: tuple[float, float] = (0.0, 0.0)  # (mean |offset|, std) in degrees of the camera, one side per person
    # The label convention: labels measured from a gaze origin below the eyes (the face centre, as face-based
    # releases define it) point up by this angle at the world's viewing distance. Pitch only: a vertical origin
    # shift is mirror-symmetric, so the flip law holds.
    label_origin_pitch_deg: float = 0.0
    version: str = "v1"  # "v1": the first worlds; "v2": calibrated to the real cross-domain regime (calibrated.py)

    def __post_init__(self) -> None:
        problems = []
        if self.role not in ("source", "target"):
            problems.append(f"role must be 'source' or 'target', not {self.role!r}")
        if not self.persons or any(split not in SPLITS or n < 1 for split, n in self.persons.items()):
            problems.append(f"persons must map splits {SPLITS} to counts >= 1, got {self.persons}")
        if not 0.0 <= self.blur[0] <= self.blur[1] <= 1.0:
            problems.append(f"blur must be 0 <= low <= high <= 1, got {self.blur}")
        if len(self.iris_weights) != len(IRIS_PALETTE) or len(self.hair_weights) != len(HAIR_PALETTE):
            problems.append("iris_weights and hair_weights need one weight per palette colour")
        if self.light_side not in LIGHT_SIDES:
            problems.append(f"light_side must be one of {LIGHT_SIDES}, not {self.light_side!r}")
        if self.camera_yaw[0] < 0 or self.camera_yaw[1] < 0:
            problems.append(f"camera_yaw must be a non-negative (mean |offset|, std), got {self.camera_yaw}")
        if problems:
            raise ValueError(f"domain {self.name!r}: " + "; ".join(problems))

    def default_split(self) -> str:
        return "train" if self.role == "source" else "test"

    @property
    def mirror_symmetric(self) -> bool:
        """Whether the world's distribution of scenes is its own mirror image (every person equally
        likely lit from either side and seen from straight ahead)."""
        return self.light_side == "image" and self.camera_yaw == (0.0, 0.0)


DOMAINS: dict[str, DomainConfig] = {}


def _register(cfg: DomainConfig) -> None:
    DOMAINS[cfg.name] = cfg


_register(
    DomainConfig(
        name="eth",
        description="ETH-XGaze-like source: many persons in a studio, bright even light, wide gaze and head ranges",
        role="source",
        persons={"train": 200, "val": 10},
        images_per_person=100,
        render_scale=1.0,
        gaze_yaw=(0.0, 25.0, 70.0),
        gaze_pitch=(0.0, 15.0, 40.0),
        head_yaw=(0.0, 18.0, 55.0),
        head_pitch=(0.0, 12.0, 35.0),
        head_roll_std=4.0,
        head_follow=0.5,
        crop_jitter=0.015,
        label_noise_deg=0.5,
        light_az=(0.0, 35.0),
        light_el=(25.0, 10.0),
        ambient=(0.35, 0.7),
        diffuse=(0.35, 0.75),
        light_warmth=(-0.2, 0.2),
        light_grad_std=0.05,
        specular=(0.5, 0.8),
        background=(0.2, 0.45),
        background_colour=0.1,
        exposure=(0.85, 1.15),
        colour_cast=(1.0, 1.0, 1.0),
        cast_jitter=0.02,
        vignette=(0.0, 0.1),
        blur=(0.3, 0.6),
        noise_read=(0.004, 0.012),
        noise_shot=(0.005, 0.015),
        noise_chroma=(0.1, 0.3),
        gamma=(0.95, 1.05),
        skin_tone=(0.0, 1.0),
        eye_open=(0.5, 0.08),
        glasses_prob=0.15,
        iris_weights=(0.35, 0.25, 0.1, 0.1, 0.15, 0.05),
    )
)
_register(
    DomainConfig(
        name="gaze360",
        description="Gaze360-like source: in the wild, lower resolution, wider yaw, harsh and coloured light",
        role="source",
        persons={"train": 80, "val": 10},
        images_per_person=100,
        render_scale=0.55,
        gaze_yaw=(0.0, 45.0, 85.0),
        gaze_pitch=(0.0, 15.0, 40.0),
        head_yaw=(0.0, 30.0, 70.0),
        head_pitch=(0.0, 12.0, 30.0),
        head_roll_std=6.0,
        head_follow=0.6,
        crop_jitter=0.04,
        label_noise_deg=1.5,
        light_az=(35.0, 30.0),
        light_el=(40.0, 20.0),
        ambient=(0.2, 0.35),
        diffuse=(0.7, 1.1),
        light_warmth=(-0.5, 0.4),
        light_grad_std=0.15,
        specular=(0.6, 1.0),
        background=(0.2, 0.8),
        background_colour=0.35,
        exposure=(0.75, 1.25),
        colour_cast=(1.0, 1.0, 1.0),
        cast_jitter=0.06,
        vignette=(0.0, 0.2),
        blur=(0.4, 0.9),
        noise_read=(0.01, 0.02),
        noise_shot=(0.01, 0.03),
        noise_chroma=(0.2, 0.4),
        gamma=(0.85, 1.15),
        skin_tone=(0.0, 1.0),
        eye_open=(0.5, 0.08),
        glasses_prob=0.12,
        iris_weights=(0.35, 0.25, 0.1, 0.1, 0.15, 0.05),
    )
)
_register(
    DomainConfig(
        name="mpii",
        description="MPIIGaze-like target: 15 laptop users, webcam noise, narrow ranges, uneven indoor light",
        role="target",
        persons={"test": 15, "val": 5, "train": 80},
        images_per_person=150,
        render_scale=0.8,
        gaze_yaw=(0.0, 9.0, 25.0),
        gaze_pitch=(-8.0, 7.0, 20.0),
        head_yaw=(0.0, 9.0, 25.0),
        head_pitch=(-3.0, 7.0, 20.0),
        head_roll_std=3.0,
        head_follow=0.3,
        crop_jitter=0.03,
        label_noise_deg=1.0,
        light_az=(45.0, 20.0),
        light_el=(15.0, 15.0),
        ambient=(0.2, 0.4),
        diffuse=(0.5, 0.9),
        light_warmth=(0.1, 0.6),
        light_grad_std=0.2,
        specular=(0.4, 0.8),
        background=(0.15, 0.6),
        background_colour=0.25,
        exposure=(0.7, 1.1),
        colour_cast=(1.02, 1.0, 0.95),
        cast_jitter=0.04,
        vignette=(0.15, 0.35),
        blur=(0.4, 0.7),
        noise_read=(0.025, 0.05),
        noise_shot=(0.02, 0.04),
        noise_chroma=(0.4, 0.6),
        gamma=(0.9, 1.1),
        skin_tone=(0.3, 1.0),
        eye_open=(0.42, 0.08),
        glasses_prob=0.35,
        iris_weights=(0.3, 0.3, 0.1, 0.1, 0.15, 0.05),
    )
)
_register(
    DomainConfig(
        name="eyediap",
        description="EyeDiap-like target: 14 persons, low-resolution VGA camera, colour cast, blur",
        role="target",
        persons={"test": 14, "val": 5, "train": 80},
        images_per_person=150,
        render_scale=0.5,
        gaze_yaw=(0.0, 11.0, 30.0),
        gaze_pitch=(0.0, 9.0, 25.0),
        head_yaw=(0.0, 10.0, 30.0),
        head_pitch=(0.0, 6.0, 20.0),
        head_roll_std=3.0,
        head_follow=0.4,
        crop_jitter=0.03,
        label_noise_deg=1.2,
        light_az=(20.0, 20.0),
        light_el=(30.0, 10.0),
        ambient=(0.3, 0.45),
        diffuse=(0.4, 0.7),
        light_warmth=(0.2, 0.5),
        light_grad_std=0.1,
        specular=(0.3, 0.6),
        background=(0.3, 0.6),
        background_colour=0.15,
        exposure=(0.8, 1.1),
        colour_cast=(0.92, 1.05, 0.8),
        cast_jitter=0.03,
        vignette=(0.05, 0.2),
        blur=(0.3, 0.6),
        noise_read=(0.015, 0.03),
        noise_shot=(0.01, 0.03),
        noise_chroma=(0.2, 0.4),
        gamma=(0.9, 1.1),
        skin_tone=(0.25, 1.0),
        eye_open=(0.48, 0.08),
        glasses_prob=0.2,
        iris_weights=(0.3, 0.3, 0.1, 0.1, 0.15, 0.05),
    )
)


# --- asymmetric worlds: the positive controls of the flip-symmetry premise (docs/synthetic.md § Asymmetric
# worlds; values fixed, with their reasons, before any method was run on them). Each is a copy of a world
# above with one capture asymmetry added; the flip law holds in all of them (tests/test_synthetic.py).
_register(
    replace(
        DOMAINS["eth"],
        name="eth-studio",
        description="ETH-XGaze-like studio whose key light sits on a fixed side (the image's left) of the rig",
        light_side="fixed",
        light_az=(40.0, 10.0),
        ambient=(0.25, 0.45),
        diffuse=(0.6, 0.9),
    )
)
_register(
    replace(
        DOMAINS["mpii"],
        name="mpii-window",
        description="MPIIGaze-like laptop users, each lit by a window on one side (the side drawn per person)",
        light_side="person",
        light_az=(55.0, 15.0),
        ambient=(0.15, 0.3),
        diffuse=(0.7, 1.0),
    )
)
_register(
    replace(
        DOMAINS["eyediap"],
        name="eyediap-offcam",
        description="EyeDiap-like persons whose camera sits off to one side of the screen (the side drawn per person)",
        camera_yaw=(12.0, 4.0),
    )
)


def list_domains(version: str | None = "v1") -> list[str]:
    """The registered worlds of ``version`` (``None``: every version), in registration order."""
    return [name for name, cfg in DOMAINS.items() if version is None or cfg.version == version]


def get_domain(name: str) -> DomainConfig:
    """The world ``name``; a first-version world also answers to its versioned name (``eth-v1`` is ``eth``,
    the same world and the same persons)."""
    base = name.removesuffix("-v1")
    if base not in DOMAINS or (base != name and DOMAINS[base].version != "v1"):
        raise ValueError(f"unknown synthetic domain {name!r}; known: {', '.join(list_domains(None))}")
    return DOMAINS[base]


# --- random draws (all through an explicit generator)


def _uniform(g: torch.Generator, n: int, lo_hi: tuple[float, float]) -> Tensor:
    lo, hi = lo_hi
    return lo + (hi - lo) * torch.rand(n, generator=g)


def _normal(g: torch.Generator, n: int, mean: float, std: float, limit: float | None = None) -> Tensor:
    x = std * torch.randn(n, generator=g)
    if limit is not None:
        x = x.clamp(-limit, limit)
    return mean + x


def _palette(g: torch.Generator, n: int, palette: dict, weights: tuple[float, ...], jitter: float) -> Tensor:
    colours = torch.tensor(list(palette.values()))
    pick = torch.multinomial(torch.tensor(weights, dtype=torch.float32), n, replacement=True, generator=g)
    return (colours[pick] * (1 + jitter * torch.randn(n, 3, generator=g))).clamp(0.01, 1.0)


def sample_persons(cfg: DomainConfig, n: int, g: torch.Generator) -> dict[str, Tensor]:
    """Draw ``n`` persons' identity parameters (the identity fields of :class:`FaceParams`)."""
    an = ANATOMY
    tone = _uniform(g, n, cfg.skin_tone)
    dark, light = torch.tensor(SKIN_DARK), torch.tensor(SKIN_LIGHT)
    skin = dark + (light - dark) * tone[:, None]
    skin = (skin * (1 + 0.04 * torch.randn(n, 3, generator=g))).clamp(0.02, 1.0)
    return {
        "face_w": _normal(g, n, *an.face_w),
        "face_h": _normal(g, n, *an.face_h),
        "face_d": _normal(g, n, *an.face_d),
        "skin": skin,
        "hair": _palette(g, n, HAIR_PALETTE, cfg.hair_weights, 0.1),
        "iris": _palette(g, n, IRIS_PALETTE, cfg.iris_weights, 0.12),
        "sclera": (torch.tensor([0.9, 0.86, 0.84]) + 0.03 * torch.randn(n, 3, generator=g)).clamp(0.6, 1.0),
        "eye_sep": _normal(g, n, *an.eye_sep),
        "eye_y": _normal(g, n, *an.eye_y),
        "eye_w": _normal(g, n, *an.eye_w),
        "eye_open": _normal(g, n, *cfg.eye_open).clamp(0.2, 0.8),
        "eye_low": _normal(g, n, *an.eye_low).clamp(0.12, 0.5),
        "eye_tilt": _normal(g, n, *an.eye_tilt),
        "lid_skew": _normal(g, n, *an.lid_skew),
        "lid_follow": _normal(g, n, *an.lid_follow).clamp_min(0.0),
        "ball_r": _normal(g, n, *an.ball_r),
        "iris_r": _normal(g, n, *an.iris_r),
        "eye_sep_asym": _normal(g, n, 0.0, an.eye_sep_asym),
        "eye_y_asym": _normal(g, n, 0.0, an.eye_y_asym),
        "eye_w_asym": _normal(g, n, 0.0, an.eye_w_asym),
        "eye_open_asym": _normal(g, n, 0.0, an.eye_open_asym),
        "kappa_yaw": _normal(g, n, *an.kappa_yaw_deg) * DEG,
        "kappa_pitch": _normal(g, n, *an.kappa_pitch_deg) * DEG,
        "brow_gap": _normal(g, n, 0.09, 0.012),
        "brow_arch": _normal(g, n, 0.025, 0.01),
        "brow_t": _normal(g, n, 0.018, 0.004).clamp_min(0.006),
        "brow_asym": _normal(g, n, 0.0, an.brow_asym),
        "nose_dx": _normal(g, n, 0.0, 0.008),
        "nose_len": _normal(g, n, 0.2, 0.02),
        "nose_h": _normal(g, n, 0.06, 0.015).clamp_min(0.0),
        "mouth_y": _normal(g, n, -0.36, 0.03),
        "mouth_w": _normal(g, n, 0.13, 0.015),
        "mouth_curve": _normal(g, n, 0.0, 0.02),
        "mouth_dx": _normal(g, n, 0.0, 0.008),
        "hair_y": _normal(g, n, 0.56, 0.06),
        "hair_part": _normal(g, n, 0.0, 0.1),
        "glasses": (torch.rand(n, generator=g) < cfg.glasses_prob).float(),
        "glasses_rim": _normal(g, n, 0.02, 0.006).clamp_min(0.006),
        "glasses_tint": _uniform(g, n, (0.0, 0.25)),
    }


def sample_scenes(cfg: DomainConfig, n: int, g: torch.Generator) -> dict[str, Tensor]:
    """Draw ``n`` images' scene parameters (pose, gaze, light, camera: the scene fields of
    :class:`FaceParams`). The eyes rotate within anatomical limits (±45° yaw, ±35° pitch in the head);
    when the sampled gaze is out of reach, the eyes stop at the limit and the label follows."""
    gaze_yaw = _normal(g, n, 0.0, cfg.gaze_yaw[1], cfg.gaze_yaw[2]) + cfg.gaze_yaw[0]
    gaze_pitch = _normal(g, n, 0.0, cfg.gaze_pitch[1], cfg.gaze_pitch[2]) + cfg.gaze_pitch[0]
    head_yaw = (cfg.head_follow * gaze_yaw + _normal(g, n, cfg.head_yaw[0], cfg.head_yaw[1])).clamp(
        -cfg.head_yaw[2], cfg.head_yaw[2]
    )
    head_pitch = (cfg.head_follow * gaze_pitch + _normal(g, n, cfg.head_pitch[0], cfg.head_pitch[1])).clamp(
        cfg.head_pitch[0] - cfg.head_pitch[2], cfg.head_pitch[0] + cfg.head_pitch[2]
    )
    head_roll = _normal(g, n, 0.0, cfg.head_roll_std, 3 * cfg.head_roll_std)
    rot = head_rotation(head_yaw * DEG, head_pitch * DEG, head_roll * DEG)
    gaze = pitchyaw_to_vector(torch.stack([gaze_yaw, gaze_pitch], -1) * DEG)
    in_head = vector_to_pitchyaw((rot.transpose(1, 2) @ gaze.unsqueeze(-1)).squeeze(-1))
    side = torch.where(torch.rand(n, generator=g) < 0.5, -1.0, 1.0)
    if cfg.light_side == "fixed":  # a studio rig: the key light always on the image's left (positive azimuth)
        side = torch.ones(n)
    elif cfg.light_side == "fixed-right":  # the same rig set up mirrored: the key light on the image's right
        side = -torch.ones(n)
    warmth = _uniform(g, n, cfg.light_warmth)
    light_rgb = torch.stack([1 + 0.15 * warmth, torch.ones(n), 1 - 0.25 * warmth], -1)
    bg_level = _uniform(g, n, cfg.background)
    bg = bg_level[:, None] * (1 + cfg.background_colour * torch.randn(n, 3, generator=g))
    cast = torch.tensor(cfg.colour_cast) * (1 + cfg.cast_jitter * torch.randn(n, 3, generator=g))
    return {
        "head_yaw": head_yaw * DEG,
        "head_pitch": head_pitch * DEG,
        "head_roll": head_roll * DEG,
        "eye_yaw": in_head[:, 0].clamp(-45 * DEG, 45 * DEG),
        "eye_pitch": in_head[:, 1].clamp(-35 * DEG, 35 * DEG),
        "shift_x": _normal(g, n, 0.0, cfg.crop_jitter, 3 * cfg.crop_jitter),
        "shift_y": _normal(g, n, 0.0, cfg.crop_jitter, 3 * cfg.crop_jitter),
        "scale": CROP_ZOOM * _normal(g, n, 1.0, 0.5 * cfg.crop_jitter, 1.5 * cfg.crop_jitter),
        "label_noise_yaw": _normal(g, n, 0.0, cfg.label_noise_deg) * DEG,
        "label_noise_pitch": _normal(g, n, 0.0, cfg.label_noise_deg) * DEG,
        "light_az": side * _normal(g, n, cfg.light_az[0], cfg.light_az[1]).abs() * DEG,
        "light_el": _normal(g, n, *cfg.light_el) * DEG,
        "ambient": _uniform(g, n, cfg.ambient),
        "diffuse": _uniform(g, n, cfg.diffuse),
        "light_rgb": light_rgb,
        "light_grad": _normal(g, n, 0.0, cfg.light_grad_std, 2 * cfg.light_grad_std),
        "specular": _uniform(g, n, cfg.specular),
        "bg": bg.clamp(0.02, 1.0),
        "bg_grad_x": _normal(g, n, 0.0, 0.1),
        "bg_grad_y": _normal(g, n, 0.0, 0.1),
        "exposure": _uniform(g, n, cfg.exposure),
        "white_balance": cast.clamp(0.5, 1.5),
        "vignette": _uniform(g, n, cfg.vignette),
        "blur": _uniform(g, n, cfg.blur),
        "noise_read": _uniform(g, n, cfg.noise_read),
        "noise_shot": _uniform(g, n, cfg.noise_shot),
        "noise_chroma": _uniform(g, n, cfg.noise_chroma),
        "gamma": _uniform(g, n, cfg.gamma),
    }


def sample_capture(cfg: DomainConfig, n: int, g: torch.Generator) -> dict[str, Tensor]:
    """Draw ``n`` persons' capture setup: the side their key light comes from (``light_side == "person"``:
    +1 image left, -1 right) and their camera's yaw offset (radians, signed). Draws nothing from ``g`` in a
    mirror-symmetric world, so the symmetric worlds' images do not depend on this function."""
    light = torch.zeros(n)
    if cfg.light_side == "person":
        light = torch.where(torch.rand(n, generator=g) < 0.5, -1.0, 1.0)
    camera = torch.zeros(n)
    if cfg.camera_yaw != (0.0, 0.0):
        camera_side = torch.where(torch.rand(n, generator=g) < 0.5, -1.0, 1.0)
        camera = camera_side * _normal(g, n, *cfg.camera_yaw).abs() * DEG
    return {"light_side": light, "camera_yaw": camera}


def place_capture(scenes: dict[str, Tensor], capture: dict[str, Tensor]) -> dict[str, Tensor]:
    """Apply each image's capture setup (values broadcast per image) to its scene parameters.

    A per-person light side replaces the sign of the light's azimuth. A camera that sits off to one side of
    the screen the person faces sees head and eyes turned by its offset ``δ``: in the camera's frame the
    head rotation ``Ry(yaw) Rx Rz`` becomes ``Ry(yaw + δ) Rx Rz``, so the head yaw shifts by ``δ``; the
    eyes do not move in the head, so the gaze label (computed from head and eyes) turns with it. Both are left/right
    odd parameters, so the flip law still holds: the mirrored scene has the mirrored light and camera."""
    out = dict(scenes)
    side = capture["light_side"]
    if bool((side != 0).any()):
        out["light_az"] = torch.where(side != 0, side * scenes["light_az"].abs(), scenes["light_az"])
    if bool((capture["camera_yaw"] != 0).any()):
        out["head_yaw"] = scenes["head_yaw"] + capture["camera_yaw"]
    return out


def _person_generator(cfg: DomainConfig, seed: int, split: str, index: int) -> torch.Generator:
    entropy = [int(seed), zlib.crc32(cfg.name.encode()), zlib.crc32(split.encode()), int(index)]
    state = np.random.SeedSequence(entropy).generate_state(2, dtype=np.uint32)
    return torch.Generator().manual_seed(int(state[0]) << 31 | int(state[1]) >> 1)


def camera_resolution(cfg: DomainConfig, size: int) -> int:
    return max(MIN_SIZE, round(size * cfg.render_scale))


def render_person(
    cfg: DomainConfig, seed: int, split: str, index: int, images: int, size: int
) -> tuple[Tensor, Tensor, Tensor, FaceParams]:
    """Render one person's images: ``(uint8 images (n,3,size,size), gaze (n,2), head (n,2), params)``."""
    g = _person_generator(cfg, seed, split, index)
    person = sample_persons(cfg, 1, g)
    capture = sample_capture(cfg, 1, g)
    res = camera_resolution(cfg, size)
    chunks = math.ceil(images / PARAM_CHUNK)
    scenes, noise = [], torch.empty(chunks * PARAM_CHUNK, NOISE_CHANNELS, res, res)
    for rows in noise.split(PARAM_CHUNK):  # each chunk's noise drawn straight into its (contiguous) rows
        scenes.append(sample_scenes(cfg, PARAM_CHUNK, g))
        torch.randn(rows.shape, generator=g, out=rows)
    scene = {k: torch.cat([s[k] for s in scenes])[:images] for k in scenes[0]}
    scene = place_capture(scene, {k: v.expand(images) for k, v in capture.items()})
    noise = noise[:images]
    params = FaceParams(**{k: v.expand(images, *v.shape[1:]) for k, v in person.items()}, **scene)
    per_call = max(1, RENDER_PIXELS // (res * res))
    pixels = torch.empty(images, 3, size, size, dtype=torch.uint8)
    for start in range(0, images, per_call):
        part, rows = params.select(slice(start, start + per_call)), slice(start, start + per_call)
        pixels[rows] = render_faces(part, noise[rows], size).mul_(255.0).round_()  # 8-bit, call by call
    head = torch.stack([params.head_yaw, params.head_pitch], -1)
    labels = gaze_labels(params)
    if cfg.label_origin_pitch_deg:
        labels = labels + torch.tensor([0.0, cfg.label_origin_pitch_deg * DEG])
    return pixels, labels, head, params


def _physical_memory() -> int | None:
    """This machine's memory in bytes, ``None`` where the system does not say."""
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, ValueError, OSError):
        return None


def _refuse_what_memory_cannot_hold(name: str, split: str, persons: int, images: int, size: int) -> None:
    """A world is rendered into memory: one whose images (uint8, twice while the persons are joined) exceed this
    machine's memory (a mistyped ``size=2240``) is refused in one line before any rendering, instead of failing or
    being killed later."""
    need, have = 2 * persons * images * 3 * size * size, _physical_memory()
    if have is not None and need > have:
        raise ValueError(
            f"synthetic world {name}/{split} at size {size}: {persons} persons × {images} images would take "
            f"{need / 2**30:.1f} GiB of memory, and this machine has {have / 2**30:.1f} GiB; choose a smaller size, "
            "persons or images_per_person"
        )


def check_domain(
    name: str,
    *,
    split: str | None = None,
    persons: int | None = None,
    images_per_person: int | None = None,
    size: int = 64,
) -> tuple[DomainConfig, str, int, int]:
    """What :func:`make_domain` checks before it renders anything: the world, its split, the counts and the size
    (and that memory holds them), each refused in one line; the world, the split, the persons and images per
    person it would render."""
    cfg = get_domain(name)
    split = cfg.default_split() if split is None else split
    if split not in cfg.persons:
        raise ValueError(f"domain {name!r} has no split {split!r}; its splits: {', '.join(sorted(cfg.persons))}")
    n_persons = cfg.persons[split] if persons is None else persons
    n_images = cfg.images_per_person if images_per_person is None else images_per_person
    for what, value, low in (("persons", n_persons, 1), ("images_per_person", n_images, 1), ("size", size, MIN_SIZE)):
        if not isinstance(value, int) or isinstance(value, bool) or value < low:
            world = " for a synthetic world (its eyes need the pixels)" if what == "size" else ""
            raise ValueError(f"{what} must be a whole number of at least {low}{world}, got {value!r}")
    _refuse_what_memory_cannot_hold(name, split, n_persons, n_images, size)
    return cfg, split, n_persons, n_images


def make_domain(
    name: str,
    *,
    split: str | None = None,
    seed: int = 0,
    persons: int | None = None,
    images_per_person: int | None = None,
    size: int = 64,
    progress: bool = False,
    workers: int | None = None,
) -> InMemoryGazeDataset:
    """Render a split of a synthetic domain as an in-memory dataset.

    ``split`` is ``"train"`` or ``"val"`` for sources and ``"test"``, ``"val"`` or ``"train"`` for targets
    (the default is the first; a target's ``train`` persons serve the benchmark's within-target yardstick,
    never personalization); different splits hold different persons. Persons are named ``p00, p01, ...``
    (``v00, ...`` in the val split) and come in order, each with ``images_per_person`` images in a
    fixed order. ``persons`` and ``images_per_person`` default to the domain's sizes. Persons are
    rendered by ``workers`` threads (default: ``torch.get_num_threads()``); the result does not depend
    on it.
    """
    cfg, split, n_persons, n_images = check_domain(
        name, split=split, persons=persons, images_per_person=images_per_person, size=size
    )
    prefix = "v" if split == "val" else "p"
    names = [f"{prefix}{k:02d}" for k in range(n_persons)]

    def render(k: int) -> tuple[Tensor, Tensor, Tensor, FaceParams]:
        # One intra-op thread per worker: the renderer's ops are small, and threads fighting over
        # cores stall; persons render in parallel instead. (The setting is per thread.)
        torch.set_num_threads(1)
        return render_person(cfg, seed, split, k, n_images, size)

    workers = max(1, min(torch.get_num_threads() if workers is None else workers, n_persons))
    with ThreadPoolExecutor(workers) as pool:
        results = pool.map(render, range(n_persons))
        if progress:
            results = tqdm(results, total=n_persons, desc=f"rendering {name}/{split}", unit="person")
        images, gaze, head, _ = zip(*results)
    ids = torch.arange(n_persons).repeat_interleave(n_images)
    return InMemoryGazeDataset(
        torch.cat(images), torch.cat(gaze), ids, names, torch.cat(head), name=f"{cfg.name}/{split}"
    )
