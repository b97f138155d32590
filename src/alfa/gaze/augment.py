"""The personalization augmentation (spec §4): ColorJitter, GaussianBlur and RandomAffine (kornia).

Deterministic given a seed: the random draws happen inside ``torch.random.fork_rng`` seeded with it,
so the same seed gives the same augmented images and the caller's random state is left untouched.
No horizontal flip here: flips are the loss's business (their label changes, spec gaze-data §1).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch
from torch import Tensor, nn

__all__ = ["AugmentConfig", "build_augmentation", "augment_images", "seed_from_generator"]


@dataclass
class AugmentConfig:
    """Strengths of the three augmentations (fixed a priori, never chosen on target results).

    ``blur_kernel`` is in pixels (odd) and is clamped to the image size; ``translate`` is a fraction of
    the image size; ``affine_degrees`` is kept small because a rotation of the face crop is a small
    change of the apparent gaze that the (unlabeled) loss cannot know about.
    """

    brightness: float = 0.2
    contrast: float = 0.2
    saturation: float = 0.2
    hue: float = 0.02
    jitter_p: float = 1.0
    blur_kernel: int = 5
    blur_sigma: tuple[float, float] = (0.1, 1.5)
    blur_p: float = 0.5
    affine_degrees: float = 3.0
    translate: float = 0.04
    scale: tuple[float, float] = (0.95, 1.05)
    affine_p: float = 0.5

    @classmethod
    def small_faces(cls) -> AugmentConfig:
        """The augmentation for small face crops (the synthetic worlds' 32–64 pixels): a 3-pixel blur kernel with
        a narrower σ, since the 5-pixel default is sized for 224×224 images."""
        return cls(blur_kernel=3, blur_sigma=(0.1, 1.0))

    def validate(self) -> None:
        for name in ("brightness", "contrast", "saturation", "hue", "affine_degrees", "translate"):
            if getattr(self, name) < 0:
                raise ValueError(f"AugmentConfig.{name} must be non-negative, got {getattr(self, name)}")
        for name in ("jitter_p", "blur_p", "affine_p"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"AugmentConfig.{name} must be a probability, got {getattr(self, name)}")
        if self.hue > 0.5:
            raise ValueError(f"AugmentConfig.hue must be at most 0.5, got {self.hue}")
        if self.blur_kernel < 1 or self.blur_kernel % 2 == 0:
            raise ValueError(f"AugmentConfig.blur_kernel must be a positive odd integer, got {self.blur_kernel}")
        if not 0 < self.blur_sigma[0] <= self.blur_sigma[1]:
            raise ValueError(f"AugmentConfig.blur_sigma must be 0 < low <= high, got {self.blur_sigma}")
        if not 0 < self.scale[0] <= self.scale[1]:
            raise ValueError(f"AugmentConfig.scale must be 0 < low <= high, got {self.scale}")

    def to_dict(self) -> dict:
        return asdict(self)


def build_augmentation(config: AugmentConfig, image_size: int) -> nn.Module:
    """The kornia pipeline for images of side ``image_size`` (each image gets its own draw)."""
    # kornia is imported here, where it is used, not with the module: AugmentConfig is read by every command
    # that declares personalization options, and kornia's import is a fifth of a second of each ``alfa --help``.
    import kornia.augmentation as K

    config.validate()
    kernel = min(config.blur_kernel, image_size - 1 if image_size % 2 == 0 else image_size)
    kernel = max(1, kernel if kernel % 2 == 1 else kernel - 1)
    steps: list[nn.Module] = [
        K.ColorJitter(config.brightness, config.contrast, config.saturation, config.hue, p=config.jitter_p),
        K.RandomGaussianBlur((kernel, kernel), config.blur_sigma, p=config.blur_p),
        K.RandomAffine(
            degrees=config.affine_degrees,
            translate=(config.translate, config.translate),
            scale=config.scale,
            padding_mode="border",
            p=config.affine_p,
        ),
    ]
    return K.AugmentationSequential(*steps)


def seed_from_generator(generator: torch.Generator) -> int:
    """Draw a seed for :func:`augment_images` from a ``torch.Generator``."""
    return int(torch.randint(0, 2**31 - 1, (1,), generator=generator).item())


def augment_images(images: Tensor, config: AugmentConfig, seed: int, pipeline: nn.Module | None = None) -> Tensor:
    """One augmented copy of each image of ``images`` ``(N, 3, H, W)`` in ``[0, 1]``, deterministic in
    ``seed``. ``pipeline`` (from :func:`build_augmentation`) can be passed to avoid rebuilding it."""
    if images.ndim != 4 or images.shape[1] != 3:
        raise ValueError(f"images must be (N, 3, H, W), got {tuple(images.shape)}")
    if not torch.isfinite(images).all():
        raise ValueError("images contain NaN or infinite values")
    if pipeline is None:
        pipeline = build_augmentation(config, min(images.shape[-2:]))
    devices = [images.device] if images.device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices), torch.no_grad():
        torch.manual_seed(seed)
        out = pipeline(images.float())
    return out.clamp(0.0, 1.0).to(images.dtype)
