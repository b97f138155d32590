"""FLoRA: a Tucker-structured update that keeps the weight's tensor shape (spec §5).

For a conv weight of shape ``(m, in, kh, kw)``::

    ΔW = s · G ×₁ P_out ×₂ P_in ×₃ P_kh ×₄ P_kw
    G (r_out, r_in, r_kh, r_kw) zeros;  P_out (m×r_out), P_in (in×r_in), P_kh (kh×r_kh), P_kw (kw×r_kw)
    Kaiming-normal (a = √3, as in the FLoRA reference code); r_out = r_in = rank, r_kh = min(kh, kernel_rank)

and for a linear layer the two-mode version ``ΔW = s · P_out G P_inᵀ`` (``G`` rank×rank). The default
scale ``s = 1`` is the reference code's default.

The matricized update is ``ΔW = (s P_out) · Q`` with ``Q = G_(1) (P_in ⊗ P_kh ⊗ P_kw)ᵀ`` (r_out × n), so
the branch runs like LoRA's: a conv with kernel ``Q`` (built from the small Tucker factors each
forward, ``r_out × n``) followed by a 1×1 conv ``s P_out``. No ``m×n`` weight is built in the forward;
merging into a factorized layer needs ``densify=True`` (or the exact rank-``d + r_out`` form).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import Tensor, nn

from .config import AdapterConfig, register_method
from .layer import AdaptedLayer
from .lora import LowRankUpdateLayer

__all__ = ["FloraConfig", "FloraLayer"]


@register_method
@dataclass(kw_only=True)
class FloraConfig(AdapterConfig):
    """FLoRA: Tucker update with core rank ``rank`` on the channel modes (``kernel_rank`` on the
    kernel modes, ``None`` = full kernel size) and scale ``scale``; the core starts at zero."""

    method: ClassVar[str] = "flora"
    display_name: ClassVar[str] = "FLoRA"
    family: ClassVar[str] = "lora"

    rank: int = 8
    kernel_rank: int | None = None
    scale: float = 1.0

    def validate(self) -> None:
        super().validate()
        if self.rank <= 0:
            raise ValueError(f"rank must be positive, got {self.rank}")
        if self.kernel_rank is not None and (isinstance(self.kernel_rank, bool) or self.kernel_rank <= 0):
            raise ValueError(f"kernel_rank must be a positive integer or None, got {self.kernel_rank!r}")
        if not self.scale > 0:
            raise ValueError(f"scale must be positive, got {self.scale}")

    def build(self, base: nn.Module) -> AdaptedLayer:
        return FloraLayer(base, self)


def _kaiming_normal(rows: int, cols: int, like: Tensor) -> Tensor:
    t = torch.empty(rows, cols, device=like.device, dtype=like.dtype)
    nn.init.kaiming_normal_(t, a=math.sqrt(3))
    return t


class FloraLayer(LowRankUpdateLayer):
    """Core ``G`` and factors ``P_out``, ``P_in`` (+ ``P_kh``, ``P_kw`` for convs)."""

    def __init__(self, base: nn.Module, config: FloraConfig) -> None:
        super().__init__(base, config)
        ref = next(base.parameters())
        r = config.rank
        spec = self.spec
        self.P_out = nn.Parameter(_kaiming_normal(spec.m, r, ref))
        self.P_in = nn.Parameter(_kaiming_normal(spec.in_features, r, ref))
        if spec.kind == "linear":
            self.G = nn.Parameter(torch.zeros(r, r, device=ref.device, dtype=ref.dtype))
        else:
            kh, kw = spec.kernel_size
            r_kh, r_kw = (min(k, config.kernel_rank or k) for k in (kh, kw))
            self.P_kh = nn.Parameter(_kaiming_normal(kh, r_kh, ref))
            self.P_kw = nn.Parameter(_kaiming_normal(kw, r_kw, ref))
            self.G = nn.Parameter(torch.zeros(r, r, r_kh, r_kw, device=ref.device, dtype=ref.dtype))

    def update_factors(self) -> tuple[Tensor, Tensor]:
        if self.spec.kind == "linear":
            Q = self.G @ self.P_in.T
        else:
            # Q[p, (i, a, b)] = Σ G[p, q, u, v] P_in[i, q] P_kh[a, u] P_kw[b, v]: the row-major order of
            # weight.reshape(m, -1), i.e. (in, kh, kw).
            Q = torch.einsum("pquv,iq,au,bv->piab", self.G, self.P_in, self.P_kh, self.P_kw)
            Q = Q.reshape(Q.shape[0], -1)
        return self.config.scale * self.P_out, Q

    def tucker_delta(self) -> Tensor:
        """``ΔW`` in the weight's own shape (``(m, in, kh, kw)`` for convs), for analysis and tests."""
        s = self.config.scale
        if self.spec.kind == "linear":
            return s * self.P_out @ self.G @ self.P_in.T
        return s * torch.einsum("pquv,op,iq,au,bv->oiab", self.G, self.P_out, self.P_in, self.P_kh, self.P_kw)

    def extra_repr(self) -> str:
        return f"core={tuple(self.G.shape)}, scale={self.config.scale}"
