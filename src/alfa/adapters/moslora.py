"""MoSLoRA: LoRA with a trainable ``r×r`` mixer between the two factors (spec §5).

``W' = W_d + s · B M A`` with ``A`` (r×n) and ``M`` (r×r) Kaiming-uniform, ``B`` (m×r) zeros and
``s = alpha / rank``. Like LoRA, the branch runs as a conv with the layer's kernel (``A``) followed by
a 1×1 conv (``B M``), and merging into a factorized layer needs ``densify=True`` (or the exact
rank-``d + r`` form of :meth:`~alfa.adapters.lora.LowRankUpdateLayer.extended_factors`, ``extend=True``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import Tensor, nn

from .config import register_method
from .layer import AdaptedLayer
from .lora import LoraConfig, LowRankUpdateLayer, kaiming_uniform

__all__ = ["MosloraConfig", "MosloraLayer"]


@register_method
@dataclass(kw_only=True)
class MosloraConfig(LoraConfig):
    """MoSLoRA: ``W' = W + (alpha/rank) B M A``; ``A`` and the mixer ``M`` Kaiming-uniform, ``B = 0``."""

    method: ClassVar[str] = "moslora"
    display_name: ClassVar[str] = "MoSLoRA"
    family: ClassVar[str] = "lora"

    def build(self, base: nn.Module) -> AdaptedLayer:
        return MosloraLayer(base, self)


class MosloraLayer(LowRankUpdateLayer):
    """LoRA's ``A`` and ``B`` plus the mixer ``M`` (r×r)."""

    def __init__(self, base: nn.Module, config: MosloraConfig) -> None:
        super().__init__(base, config)
        ref = next(base.parameters())
        r, m, n = config.rank, self.spec.m, self.spec.n
        self.A = nn.Parameter(kaiming_uniform(r, n, ref))
        self.M = nn.Parameter(kaiming_uniform(r, r, ref))
        self.B = nn.Parameter(torch.zeros(m, r, device=ref.device, dtype=ref.dtype))

    def update_factors(self) -> tuple[Tensor, Tensor]:
        return self.config.scaling * (self.B @ self.M), self.A

    def extra_repr(self) -> str:
        return f"rank={self.config.rank}, alpha={self.config.alpha}"
