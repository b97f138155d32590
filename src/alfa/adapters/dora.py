"""DoRA: LoRA on the direction of each output filter, with a trainable magnitude (spec §5).

``W' = mag ⊙ (W + s B A) / ‖W + s B A‖`` with the norm taken per output channel (the row norm of
the ``m×n`` matrix; for a conv, over ``in×kh×kw``), ``mag`` initialized to the row norms of ``W``,
``A`` Kaiming-uniform, ``B = 0``, ``s = alpha / rank``. As in PEFT (and section 4.3 of the DoRA
paper) the norm is treated as a constant in the backward pass: it is recomputed every forward but
detached, so gradients reach ``mag`` and, through the direction's numerator only, ``A`` and ``B``.

The output is ``g ⊙ (W x + s B A x) + bias`` with ``g = mag / ‖W + s B A‖``: the frozen layer (without
its bias) and the LoRA branch run as usual and never build ``W``. The row norms of a factorized weight
``[U, sB] [V; A]`` come from the small Gram matrix of ``[V; A]`` (``diag(L G Lᵀ)``), so DoRA on a
factorized layer builds no ``m×n`` matrix either. Merging scales the rows, so a factorized layer
merges only by densifying (or exactly as a rank-``d + r`` factorization, ``merge(extend=True)``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import Tensor, nn

from ..layers import dense_matrix
from .config import register_method
from .layer import AdaptedLayer
from .lora import LoraConfig, LowRankUpdateLayer, kaiming_uniform

__all__ = ["DoraConfig", "DoraLayer"]


@register_method
@dataclass(kw_only=True)
class DoraConfig(LoraConfig):
    """DoRA: a LoRA update of the weight's direction plus a trainable per-output-channel magnitude."""

    method: ClassVar[str] = "dora"
    display_name: ClassVar[str] = "DoRA"
    family: ClassVar[str] = "lora"
    changes_base: ClassVar[bool] = True  # each output row rescaled to a trained magnitude

    def build(self, base: nn.Module) -> AdaptedLayer:
        return DoraLayer(base, self)


class DoraLayer(LowRankUpdateLayer):
    """LoRA's ``A`` and ``B`` plus ``magnitude`` (m,)."""

    def __init__(self, base: nn.Module, config: DoraConfig) -> None:
        super().__init__(base, config)
        ref = next(base.parameters())
        r, m, n = config.rank, self.spec.m, self.spec.n
        self.A = nn.Parameter(kaiming_uniform(r, n, ref))
        self.B = nn.Parameter(torch.zeros(m, r, device=ref.device, dtype=ref.dtype))
        self.magnitude = nn.Parameter(self.weight_norm())

    def update_factors(self) -> tuple[Tensor, Tensor]:
        return self.config.scaling * self.B, self.A

    @torch.no_grad()
    def weight_norm(self) -> Tensor:
        """``‖W + s B A‖`` per output channel (no gradient)."""
        if self.base_is_factorized:
            L, K, _ = LowRankUpdateLayer.extended_factors(self)
            L, K = L.double(), K.double()
            squared = ((L @ (K @ K.T)) * L).sum(dim=1)
            return squared.clamp_min(0).sqrt().to(self.A.dtype)
        return LowRankUpdateLayer.effective_weight(self)[0].norm(dim=1)

    def channel_scale(self) -> Tensor:
        """``g = mag / ‖W + s B A‖`` (the norm detached, as in PEFT)."""
        return self.magnitude / self.weight_norm()

    def forward(self, x: Tensor) -> Tensor:
        g = self.channel_scale()
        # The frozen path and the branch run separately, so autograd never asks for the frozen kernel's
        # weight gradient (a single conv over [V; A] would compute it for all d + r channels).
        if self.base_is_factorized:
            U0, V0 = self.frozen_factors()
            y = self.spec.output_op(self.spec.input_op(x, V0), U0)
        else:
            y = self.spec.dense_op(x, dense_matrix(self.base))
        shape = (-1,) if self.spec.kind == "linear" else (-1, 1, 1)
        y = (y + self.branch(x)) * g.view(shape)
        return y if self.bias is None else y + self.bias.view(shape)

    def effective_weight(self) -> tuple[Tensor, Tensor | None]:
        W, bias = LowRankUpdateLayer.effective_weight(self)
        return self.channel_scale()[:, None] * W, bias

    def extended_factors(self) -> tuple[Tensor, Tensor, Tensor | None]:
        """``diag(g) [U, sB]`` and ``[V; A]``: the exact rank-``d + r`` form of the DoRA weight."""
        L, K, bias = LowRankUpdateLayer.extended_factors(self)
        return self.channel_scale()[:, None] * L, K, bias

    def extra_repr(self) -> str:
        return f"rank={self.config.rank}, alpha={self.config.alpha}"
