"""Alfa's ablations (spec §6): the attention replaced by simpler maps of the dictionary ``V_base``.

Both adapt only the right factor, like Alfa, so a factorized layer stays a rank-``d`` factorization
and merges back with the truncated parameter count::

    DiagGate   V_adapt = diag(1 + γ) V_base           γ (d,) zeros: one gain per dictionary row
    LinearMix  V_adapt = V_base + B A V_base          A (r×d) N(0, σ²), B (d×r) zeros

``LinearMix`` is Alfa's low-rank projection with the attention and softmax removed (the rows are
mixed linearly). Both build on :class:`~alfa.adapters.alfa.DictionaryAdapter`: on a dense layer they
use the layer's SVD ``W = U_d V_base`` of rank ``dense_rank`` (``None``: full rank, i.e. no
truncation), add ``U_d ΔV`` to the dense weight, and merge densely; and like Alfa they can be saved
compactly as one ``d×d`` mix ``T`` per layer (``V_adapt = V_base + T V_base``), though for these two
the trained tensors are already smaller (``d`` and ``2rd`` numbers against ``d²``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import Tensor, nn

from .alfa import DictionaryAdapter, check_dense_rank
from .config import AdapterConfig, register_method
from .layer import AdaptedLayer

__all__ = ["DiagGateConfig", "DiagGateLayer", "LinearMixConfig", "LinearMixLayer"]


@register_method
@dataclass(kw_only=True)
class DiagGateConfig(AdapterConfig):
    """Ablation (a): a per-row gain on the dictionary, ``V_adapt = diag(1 + γ) V_base``, ``γ = 0`` at init."""

    method: ClassVar[str] = "diag_gate"
    display_name: ClassVar[str] = "diagonal gate"
    family: ClassVar[str] = "dictionary"

    dense_rank: int | None = None

    def validate(self) -> None:
        super().validate()
        check_dense_rank(self.dense_rank)

    def build(self, base: nn.Module) -> AdaptedLayer:
        return DiagGateLayer(base, self)


class DiagGateLayer(DictionaryAdapter):
    """``gamma`` (d,): ``d`` parameters per layer."""

    def __init__(self, base: nn.Module, config: DiagGateConfig) -> None:
        super().__init__(base, config)
        ref = self.V_base
        self.gamma = nn.Parameter(torch.zeros(self.dictionary_size, device=ref.device, dtype=ref.dtype))

    def mixing(self) -> Tensor:
        """``T = diag(γ)``, with ``V_adapt = V_base + T V_base``."""
        return torch.diag(self.gamma)

    def delta_V(self) -> Tensor:
        return self.gamma[:, None] * self.V_base

    def extra_repr(self) -> str:
        return f"d={self.dictionary_size}"


@register_method
@dataclass(kw_only=True)
class LinearMixConfig(AdapterConfig):
    """Ablation (b): a low-rank linear mix of the dictionary's rows, ``V_adapt = V_base + B A V_base``
    (Alfa without attention or softmax); ``A`` is ``N(0, init_std²)``, ``B = 0``."""

    method: ClassVar[str] = "linear_mix"
    display_name: ClassVar[str] = "linear mix"
    family: ClassVar[str] = "dictionary"

    rank: int = 8
    init_std: float = 0.02
    dense_rank: int | None = None

    def validate(self) -> None:
        super().validate()
        if self.rank <= 0:
            raise ValueError(f"rank must be positive, got {self.rank}")
        if not self.init_std >= 0:
            raise ValueError(f"init_std must be non-negative, got {self.init_std}")
        check_dense_rank(self.dense_rank)

    def build(self, base: nn.Module) -> AdaptedLayer:
        return LinearMixLayer(base, self)


class LinearMixLayer(DictionaryAdapter):
    """``A`` (r×d) and ``B`` (d×r)."""

    def __init__(self, base: nn.Module, config: LinearMixConfig) -> None:
        super().__init__(base, config)
        ref, d = self.V_base, self.dictionary_size
        kw = {"device": ref.device, "dtype": ref.dtype}
        self.A = nn.Parameter(torch.randn(config.rank, d, **kw) * config.init_std)
        self.B = nn.Parameter(torch.zeros(d, config.rank, **kw))

    def mixing(self) -> Tensor:
        """``T = B A``, with ``V_adapt = V_base + T V_base``."""
        return self.B @ self.A

    def delta_V(self) -> Tensor:
        return self.B @ (self.A @ self.V_base)

    def extra_repr(self) -> str:
        return f"rank={self.config.rank}, d={self.dictionary_size}"
