"""CRATE, the white-box transformer (Yu et al., NeurIPS 2023; spec crate.md §2).

A CRATE layer is two optimization steps on the sparse rate reduction objective:

* **MSSA** (compression): per head ``w_k = U_kᵀ z``, ``SSA_k = w_k · softmax(w_kᵀ w_k / √q)`` — one
  matrix ``U_k`` serves as query, key and value — heads concatenated and mapped back by a learned
  output projection with bias. Block: ``z ← z + MSSA(LN z)``.
* **ISTA** (sparsification): ``z ← ReLU(x + η Dᵀ(x − D x) − η λ)`` with ``x = LN z`` and a square
  dictionary ``D`` (``η = λ = 0.1``). No residual around this half.

Layer details that reproduce the published parameter counts (224×224, patch 16, 1000 classes:
crate_tiny 6.09 M, crate_small 13.12 M, crate_base 22.80 M, crate_large 77.64 M):
head dim ``q = dim / heads`` (so ``U = [U_1 … U_K]`` is square), no bias on ``U``, a bias on the
output projection, ``D`` of shape ``dim × dim`` without bias, two LayerNorms per layer, a
LayerNorm → Linear → LayerNorm patch embedding, class token and position embeddings, and a
LayerNorm + Linear head on the class token. No LayerNorm after the last layer besides the head's.

The constructors take ``image_size``, ``patch_size`` and ``num_classes`` (alias ``num_outputs``; 2 for gaze
regression) and any other :class:`CrateConfig` field as a keyword override (e.g. ``depth=2``).

``U`` and the output projection are ``nn.Linear`` layers, so :func:`alfa.truncate` and the adapters
find them. ``D`` is a raw parameter used as both ``D`` and ``Dᵀ``; it is not a Linear layer, so it is
neither truncated nor adapted.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .registry import register_model
from .vit import TokenTransformer, build_token_model

__all__ = [
    "CrateConfig",
    "MultiHeadSubspaceSelfAttention",
    "ISTABlock",
    "CrateBlock",
    "CRATE",
    "crate_tiny",
    "crate_small",
    "crate_base",
    "crate_large",
]


@dataclass
class CrateConfig:
    """Sizes and step constants of a :class:`CRATE` model."""

    image_size: int | tuple[int, int] = 224
    patch_size: int | tuple[int, int] = 16
    num_classes: int = 1000
    dim: int = 384
    depth: int = 12
    heads: int = 6
    channels: int = 3
    ista_step: float = 0.1  # η
    ista_lambda: float = 0.1  # λ


class MultiHeadSubspaceSelfAttention(nn.Module):
    """MSSA: ``subspaces`` holds ``U = [U_1 … U_K]`` (its weight's rows, ``q`` per head, are the
    columns of ``U_k``) and serves as query, key and value; ``proj`` is the learned output map."""

    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        if dim % heads:
            raise ValueError(f"dim {dim} is not divisible by heads {heads}")
        self.heads = heads
        self.head_dim = dim // heads
        self.subspaces = nn.Linear(dim, heads * self.head_dim, bias=False)
        self.proj = nn.Linear(heads * self.head_dim, dim)

    def split_heads(self, projected: Tensor) -> Tensor:
        """``subspaces`` output ``(b, n, heads·q)`` → ``w`` of shape ``(b, heads, n, q)``: row ``i`` of head
        ``k`` is ``U_kᵀ z_i``."""
        b, n, _ = projected.shape
        return projected.view(b, n, self.heads, self.head_dim).transpose(1, 2)

    def forward(self, x: Tensor) -> Tensor:
        w = self.split_heads(self.subspaces(x))
        # softmax(w wᵀ/√q) w, i.e. the spec's w_k · softmax(w_kᵀ w_k/√q) with tokens as rows.
        out = F.scaled_dot_product_attention(w, w, w)
        return self.proj(out.transpose(1, 2).flatten(2))


class ISTABlock(nn.Module):
    """One ISTA step towards a sparse code of ``x`` in the dictionary ``D`` (``dim × dim``):
    ``ReLU(x + η Dᵀ(x − D x) − η λ)``. ``x`` is expected already normalized (the block's LayerNorm)."""

    def __init__(self, dim: int, step: float = 0.1, lam: float = 0.1) -> None:
        super().__init__()
        self.step = step
        self.lam = lam
        self.dictionary = nn.Parameter(torch.empty(dim, dim))
        nn.init.kaiming_uniform_(self.dictionary)

    def forward(self, x: Tensor) -> Tensor:
        D = self.dictionary
        residual = x - F.linear(x, D)  # x − D x, tokens as rows
        grad = F.linear(residual, D.t())  # Dᵀ (x − D x)
        return F.relu(x + self.step * grad - self.step * self.lam)

    def extra_repr(self) -> str:
        return f"dim={self.dictionary.shape[0]}, step={self.step}, lam={self.lam}"


class CrateBlock(nn.Module):
    """``z ← z + MSSA(LN₁ z)``, then ``z ← ISTA(LN₂ z)``."""

    def __init__(self, dim: int, heads: int, ista_step: float = 0.1, ista_lambda: float = 0.1) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(dim)
        self.attn = MultiHeadSubspaceSelfAttention(dim, heads)
        self.norm2 = nn.LayerNorm(dim)
        self.ista = ISTABlock(dim, ista_step, ista_lambda)

    def forward(self, z: Tensor) -> Tensor:
        z = z + self.attn(self.norm1(z))
        return self.ista(self.norm2(z))


class CRATE(TokenTransformer):
    """CRATE: ViT front end, ``depth`` :class:`CrateBlock` layers, class-token pooling, LN + Linear head.

    ``num_classes`` is the head's output size; 2 makes it a ``(yaw, pitch)`` gaze regressor.
    """

    def __init__(self, config: CrateConfig) -> None:
        super().__init__(config, lambda: CrateBlock(config.dim, config.heads, config.ista_step, config.ista_lambda))


def _crate(sizes: dict, *args: Any) -> CRATE:
    return build_token_model(CRATE, CrateConfig, sizes, *args)


@register_model
def crate_tiny(
    image_size: int | tuple[int, int] = 224,
    patch_size: int | tuple[int, int] = 16,
    num_classes: int = 1000,
    num_outputs: int | None = None,
    **overrides,
) -> CRATE:
    """CRATE-T: dim 384, depth 12, 6 heads; 6.09 M parameters at 224/16/1000."""
    return _crate(dict(dim=384, depth=12, heads=6), image_size, patch_size, num_classes, num_outputs, overrides)


@register_model
def crate_small(
    image_size: int | tuple[int, int] = 224,
    patch_size: int | tuple[int, int] = 16,
    num_classes: int = 1000,
    num_outputs: int | None = None,
    **overrides,
) -> CRATE:
    """CRATE-S: dim 576, depth 12, 12 heads; 13.12 M parameters at 224/16/1000."""
    return _crate(dict(dim=576, depth=12, heads=12), image_size, patch_size, num_classes, num_outputs, overrides)


@register_model
def crate_base(
    image_size: int | tuple[int, int] = 224,
    patch_size: int | tuple[int, int] = 16,
    num_classes: int = 1000,
    num_outputs: int | None = None,
    **overrides,
) -> CRATE:
    """CRATE-B: dim 768, depth 12, 12 heads; 22.80 M parameters at 224/16/1000."""
    return _crate(dict(dim=768, depth=12, heads=12), image_size, patch_size, num_classes, num_outputs, overrides)


@register_model
def crate_large(
    image_size: int | tuple[int, int] = 224,
    patch_size: int | tuple[int, int] = 16,
    num_classes: int = 1000,
    num_outputs: int | None = None,
    **overrides,
) -> CRATE:
    """CRATE-L: dim 1024, depth 24, 16 heads; 77.64 M parameters at 224/16/1000."""
    return _crate(dict(dim=1024, depth=24, heads=16), image_size, patch_size, num_classes, num_outputs, overrides)
