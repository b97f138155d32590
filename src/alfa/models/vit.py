"""A plain Vision Transformer with CRATE's front end, for side-by-side comparisons with CRATE.

The front end (shared with :mod:`alfa.models.crate`): cut the image into ``patch × patch`` patches,
flatten each to ``(p1 p2 c)`` order, LayerNorm → Linear → LayerNorm, prepend a class token, add
learned position embeddings. The head: LayerNorm on the class token, then a Linear layer with
``num_classes`` outputs (2 for gaze regression, read as ``(yaw, pitch)``).

The registered sizes mirror the CRATE ones (same width, depth and heads; MLP ratio 4), so
``vit_tiny`` here is as wide as DeiT-S (384), *not* DeiT-Ti (192). Parameter counts at
224×224, patch 16, 1000 classes: vit_tiny 22.05 M, vit_small 49.00 M, vit_base 86.57 M,
vit_large 304.33 M. Like the CRATE constructors, they take any :class:`ViTConfig` field as a keyword
override (e.g. ``depth=2``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .registry import register_model

__all__ = [
    "PatchEmbedding",
    "TokenFrontEnd",
    "ViTConfig",
    "ViTAttention",
    "ViTBlock",
    "VisionTransformer",
    "TokenTransformer",
    "build_token_model",
    "resolve_num_outputs",
    "vit_tiny",
    "vit_small",
    "vit_base",
    "vit_large",
]


def _pair(value: int | tuple[int, int], what: str) -> tuple[int, int]:
    pair = (value, value) if isinstance(value, int) else tuple(value)
    if len(pair) != 2 or not all(isinstance(v, int) and v > 0 for v in pair):
        raise ValueError(f"{what} must be a positive int or a pair of them, got {value!r}")
    return pair  # type: ignore[return-value]


def resolve_num_outputs(num_classes: int, num_outputs: int | None) -> int:
    """``num_outputs`` is an alias of ``num_classes`` (the gaze code says outputs, ImageNet says classes);
    given, it replaces the default of 1000 classes, and contradicting any other value is an error."""
    out = num_classes
    if num_outputs is not None:
        if num_classes not in (1000, num_outputs):
            raise ValueError(f"num_classes={num_classes} and num_outputs={num_outputs} disagree; give one of them")
        out = num_outputs
    if isinstance(out, bool) or not isinstance(out, int) or out <= 0:
        raise ValueError(f"the head needs a positive integer number of outputs, got {out!r}")
    return out


class PatchEmbedding(nn.Module):
    """Patchify, then LayerNorm → Linear → LayerNorm (CRATE's patch embedding)."""

    def __init__(
        self, image_size: int | tuple[int, int], patch_size: int | tuple[int, int], channels: int, dim: int
    ) -> None:
        super().__init__()
        self.image_size = _pair(image_size, "image_size")
        self.patch_size = _pair(patch_size, "patch_size")
        (H, W), (ph, pw) = self.image_size, self.patch_size
        if H % ph or W % pw:
            raise ValueError(f"image size {H}×{W} is not divisible by the patch size {ph}×{pw}")
        self.grid = (H // ph, W // pw)
        self.channels = channels
        patch_dim = channels * ph * pw
        self.norm_in = nn.LayerNorm(patch_dim)
        self.proj = nn.Linear(patch_dim, dim)
        self.norm_out = nn.LayerNorm(dim)

    @property
    def num_patches(self) -> int:
        return self.grid[0] * self.grid[1]

    def patchify(self, images: Tensor) -> Tensor:
        """``(b, c, H, W)`` → ``(b, patches, ph·pw·c)``, patches in row-major order."""
        if images.ndim != 4 or tuple(images.shape[1:]) != (self.channels, *self.image_size):
            want = (self.channels, *self.image_size)
            raise ValueError(
                f"expected images of shape (batch, {', '.join(map(str, want))}), got {tuple(images.shape)}"
            )
        b, c = images.shape[:2]
        (gh, gw), (ph, pw) = self.grid, self.patch_size
        x = images.reshape(b, c, gh, ph, gw, pw).permute(0, 2, 4, 3, 5, 1)
        return x.reshape(b, gh * gw, ph * pw * c)

    def forward(self, images: Tensor) -> Tensor:
        return self.norm_out(self.proj(self.norm_in(self.patchify(images))))


class TokenFrontEnd(nn.Module):
    """Patch embedding + class token + learned position embeddings: images → ``(b, 1 + patches, dim)``."""

    def __init__(
        self, image_size: int | tuple[int, int], patch_size: int | tuple[int, int], channels: int, dim: int
    ) -> None:
        super().__init__()
        self.patch_embed = PatchEmbedding(image_size, patch_size, channels, dim)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, dim))
        self.pos_embed = nn.Parameter(torch.zeros(1, 1 + self.patch_embed.num_patches, dim))
        nn.init.trunc_normal_(self.cls_token, std=0.02)
        nn.init.trunc_normal_(self.pos_embed, std=0.02)

    def forward(self, images: Tensor) -> Tensor:
        patches = self.patch_embed(images)
        cls = self.cls_token.expand(patches.shape[0], -1, -1)
        return torch.cat([cls, patches], dim=1) + self.pos_embed


class CrateLikeConfig(Protocol):
    """The fields :class:`TokenTransformer` reads from a model config."""

    image_size: int | tuple[int, int]
    patch_size: int | tuple[int, int]
    num_classes: int
    dim: int
    depth: int
    channels: int


def init_linear_layers(module: nn.Module) -> None:
    """Truncated-normal (σ = 0.02) weights and zero biases for every Linear, the usual ViT init."""
    for m in module.modules():
        if isinstance(m, nn.Linear):
            nn.init.trunc_normal_(m.weight, std=0.02)
            if m.bias is not None:
                nn.init.zeros_(m.bias)


@dataclass
class ViTConfig:
    """Sizes of a :class:`VisionTransformer`."""

    image_size: int | tuple[int, int] = 224
    patch_size: int | tuple[int, int] = 16
    num_classes: int = 1000
    dim: int = 384
    depth: int = 12
    heads: int = 6
    mlp_ratio: float = 4.0
    channels: int = 3


class ViTAttention(nn.Module):
    """Multi-head self-attention with one fused ``qkv`` projection (query, key, value in that order)."""

    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        if dim % heads:
            raise ValueError(f"dim {dim} is not divisible by heads {heads}")
        self.heads = heads
        self.head_dim = dim // heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)

    def split_heads(self, projected: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """``qkv`` output ``(b, n, 3·dim)`` → query, key, value, each ``(b, heads, n, head_dim)``."""
        b, n, _ = projected.shape
        q, k, v = projected.view(b, n, 3, self.heads, self.head_dim).permute(2, 0, 3, 1, 4)
        return q, k, v

    def forward(self, x: Tensor) -> Tensor:
        q, k, v = self.split_heads(self.qkv(x))
        out = F.scaled_dot_product_attention(q, k, v)
        return self.proj(out.transpose(1, 2).flatten(2))


class ViTBlock(nn.Module):
    """Pre-LayerNorm block: ``z + attn(LN z)``, then ``z + MLP(LN z)``."""

    def __init__(self, dim: int, heads: int, mlp_ratio: float) -> None:
        super().__init__()
        hidden = int(round(dim * mlp_ratio))
        self.norm1 = nn.LayerNorm(dim)
        self.attn = ViTAttention(dim, heads)
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, hidden), nn.GELU(), nn.Linear(hidden, dim))

    def forward(self, z: Tensor) -> Tensor:
        z = z + self.attn(self.norm1(z))
        return z + self.mlp(self.norm2(z))


class TokenTransformer(nn.Module):
    """What CRATE and the plain ViT share: the token front end, ``depth`` blocks made by ``make_block``,
    class-token pooling, and a LayerNorm + Linear head with ``config.num_classes`` outputs."""

    def __init__(self, config: ViTConfig | CrateLikeConfig, make_block: Callable[[], nn.Module]) -> None:
        super().__init__()
        self.config = config
        self.front = TokenFrontEnd(config.image_size, config.patch_size, config.channels, config.dim)
        self.blocks = nn.ModuleList(make_block() for _ in range(config.depth))
        self.head_norm = nn.LayerNorm(config.dim)
        self.head = nn.Linear(config.dim, config.num_classes)
        init_linear_layers(self)

    def tokens(self, images: Tensor) -> Tensor:
        """All output tokens ``(b, 1 + patches, dim)``, class token first."""
        z = self.front(images)
        for block in self.blocks:
            z = block(z)
        return z

    def features(self, images: Tensor) -> Tensor:
        """The pooled feature vector (normalized class token) the head reads."""
        return self.head_norm(self.tokens(images)[:, 0])

    def forward(self, images: Tensor) -> Tensor:
        return self.head(self.features(images))


class VisionTransformer(TokenTransformer):
    """Plain ViT: CRATE's front end, pre-LN transformer blocks, class-token pooling, LN + Linear head."""

    def __init__(self, config: ViTConfig) -> None:
        super().__init__(config, lambda: ViTBlock(config.dim, config.heads, config.mlp_ratio))


def build_token_model(
    model_cls: Callable[[Any], nn.Module],
    config_cls: type,
    sizes: dict,
    image_size: int | tuple[int, int],
    patch_size: int | tuple[int, int],
    num_classes: int,
    num_outputs: int | None,
    overrides: dict,
) -> Any:
    """The body of every registered constructor: ``sizes`` of the named model, then ``overrides``
    (which win, e.g. ``depth=2`` for a small test model)."""
    num_classes = resolve_num_outputs(num_classes, num_outputs)
    fields = {**sizes, **overrides}
    config = config_cls(image_size=image_size, patch_size=patch_size, num_classes=num_classes, **fields)
    return model_cls(config)


def _vit(sizes: dict, *args: Any) -> VisionTransformer:
    return build_token_model(VisionTransformer, ViTConfig, sizes, *args)


@register_model
def vit_tiny(
    image_size: int | tuple[int, int] = 224,
    patch_size: int | tuple[int, int] = 16,
    num_classes: int = 1000,
    num_outputs: int | None = None,
    **overrides,
) -> VisionTransformer:
    """ViT as wide, deep and multi-headed as CRATE-T (384/12/6); 22.05 M parameters at the defaults."""
    return _vit(dict(dim=384, depth=12, heads=6), image_size, patch_size, num_classes, num_outputs, overrides)


@register_model
def vit_small(
    image_size: int | tuple[int, int] = 224,
    patch_size: int | tuple[int, int] = 16,
    num_classes: int = 1000,
    num_outputs: int | None = None,
    **overrides,
) -> VisionTransformer:
    """ViT with CRATE-S sizes (576/12/12); 49.00 M parameters at the defaults."""
    return _vit(dict(dim=576, depth=12, heads=12), image_size, patch_size, num_classes, num_outputs, overrides)


@register_model
def vit_base(
    image_size: int | tuple[int, int] = 224,
    patch_size: int | tuple[int, int] = 16,
    num_classes: int = 1000,
    num_outputs: int | None = None,
    **overrides,
) -> VisionTransformer:
    """ViT with CRATE-B sizes (768/12/12, i.e. ViT-B/16); 86.57 M parameters at the defaults."""
    return _vit(dict(dim=768, depth=12, heads=12), image_size, patch_size, num_classes, num_outputs, overrides)


@register_model
def vit_large(
    image_size: int | tuple[int, int] = 224,
    patch_size: int | tuple[int, int] = 16,
    num_classes: int = 1000,
    num_outputs: int | None = None,
    **overrides,
) -> VisionTransformer:
    """ViT with CRATE-L sizes (1024/24/16, i.e. ViT-L/16); 304.33 M parameters at the defaults."""
    return _vit(dict(dim=1024, depth=24, heads=16), image_size, patch_size, num_classes, num_outputs, overrides)
