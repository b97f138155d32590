"""Spectral Adapter (additive): trainable corrections to the top singular vectors (spec §5).

With the layer's SVD ``W = U S Vᵀ`` split into its top ``r`` components and the rest::

    W' = (U_r + ΔU) S_r (V_r + ΔV)ᵀ + W_rest          ΔU (m×r), ΔV (n×r), both zero at init

so ``W' − W = ΔU S_r V_rᵀ + (U_r + ΔU) S_r ΔVᵀ``, a rank-``2r`` term that runs as a branch of width
``2r`` next to the frozen layer. On a factorized layer of rank ``d`` in SVD form the corrected
vectors simply replace the top ``r`` columns of ``U_d`` and rows of ``V_base``, so the adapted layer
*is* a rank-``d`` factorization: it merges without densifying and keeps the truncated parameter
count, like Alfa. The SVD is computed from the factors, so a non-canonical base is handled too.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import Tensor, nn

from .config import AdapterConfig, register_method
from .layer import AdaptedLayer, MergeKind
from .lora import LowRankUpdateLayer, svd_of_layer

__all__ = ["SpectralConfig", "SpectralLayer"]


@register_method
@dataclass(kw_only=True)
class SpectralConfig(AdapterConfig):
    """Spectral Adapter^A: additive, zero-initialized corrections ``ΔU``, ``ΔV`` to the top ``rank``
    left and right singular vectors of the weight."""

    method: ClassVar[str] = "spectral"
    display_name: ClassVar[str] = "Spectral"
    family: ClassVar[str] = "spectral"

    rank: int = 8

    def validate(self) -> None:
        super().validate()
        if self.rank <= 0:
            raise ValueError(f"rank must be positive, got {self.rank}")

    def build(self, base: nn.Module) -> AdaptedLayer:
        return SpectralLayer(base, self)


class SpectralLayer(LowRankUpdateLayer):
    """Holds ``dU`` (m×r) and ``dV`` (n×r); ``U_r``, ``S_r V_rᵀ`` and ``S_r`` are frozen buffers
    derived from the base on attach (not saved: they follow the base, see :meth:`AdaptedLayer.follow_base`).

    It runs as a low-rank branch but merges as kind ``"factors"``: the corrected top singular vectors
    replace the base's, so a factorized layer stays a rank-``d`` factorization.
    """

    merge_kind: ClassVar[MergeKind] = "factors"

    def __init__(self, base: nn.Module, config: SpectralConfig) -> None:
        super().__init__(base, config)
        r = config.rank
        self.follow_base()
        if r > self.U_r.shape[1]:
            raise ValueError(f"spectral rank {r} exceeds the layer's rank {self.U_r.shape[1]}")
        self.dU = nn.Parameter(torch.zeros_like(self.U_r))
        self.dV = nn.Parameter(torch.zeros(self.spec.n, r, device=self.U_r.device, dtype=self.U_r.dtype))

    def derive_from_base(self) -> None:
        U, SV = svd_of_layer(self.base)
        r = self.config.rank
        self.register_buffer("U_r", U[:, :r].contiguous(), persistent=False)
        self.register_buffer("SV_r", SV[:r].contiguous(), persistent=False)  # S_r V_rᵀ (r×n)
        self.register_buffer("S_r", SV[:r].norm(dim=1), persistent=False)

    def update_factors(self) -> tuple[Tensor, Tensor]:
        P = torch.cat([self.dU, self.U_r + self.dU], dim=1)
        Q = torch.cat([self.SV_r, self.S_r[:, None] * self.dV.T], dim=0)
        return P, Q

    def effective_factors(self) -> tuple[Tensor, Tensor, Tensor | None]:
        """Rank-``d`` factors: the base's SVD with its top ``r`` singular vectors corrected."""
        U, SV = svd_of_layer(self.base)
        r = self.config.rank
        U_new = torch.cat([U[:, :r] + self.dU, U[:, r:]], dim=1)
        V_new = torch.cat([SV[:r] + self.S_r[:, None] * self.dV.T, SV[r:]], dim=0)
        return U_new, V_new, self.bias

    def extra_repr(self) -> str:
        return f"rank={self.config.rank}"
