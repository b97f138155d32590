"""Alfa: multi-head attention over the rows of the semantic basis dictionary ``V_base`` (spec §3).

For a factorized layer ``W_d = U_d V_base`` (``V_base = S_d V_dᵀ``, d×n), per head ``h``::

    Q_h     = B_q[h] A_q[h] V_base            K = V_base,  V = V_baseᵀ
    Attn_h  = softmax(Q_h Kᵀ / sqrt(n))        (d×d, row-wise)
    Z       = [Z_1ᵀ; ...; Z_Hᵀ],  Z_hᵀ = Attn_h V_base       (H·d × n)
    V_adapt = V_base + B_p A_p Z

We read the paper's merge formula as ``Ŵ = U_d V_adapt`` (the update is ``ΔW = U_d B_p A_p Z``);
the literal ``W_d + U_d V_Alfa`` would double the base weight at initialization (spec §3).

Everything above depends only on the weights, so it runs once per forward call, whatever the
batch size. It is also computed without ever forming ``Z``: with ``G = V_base V_baseᵀ`` (d×d),
``A_p Z = (Σ_h A_p[:, h] Attn_h) V_base``, so the update is a d×d mix of the dictionary's rows,
``V_adapt = (I + B_p Σ_h A_p[:, h] Attn_h) V_base`` — cheap, and exact.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import Tensor, nn

from ..layers import dense_matrix, svd_factors
from .base import AdaptedLayer, AdapterConfig, register_method

__all__ = ["AlfaConfig", "AlfaLayer", "alfa_mixing"]


@register_method
@dataclass
class AlfaConfig(AdapterConfig):
    """Alfa with ``heads`` attention heads of low rank ``rank``; ``init_std`` is σ of the Gaussian
    init of ``A_q`` and ``A_p`` (``B_q`` and ``B_p`` start at zero, so the adapted model starts as
    the base). On a dense layer the dictionary comes from the layer's SVD, of rank ``dense_rank``
    (``None``: full rank, i.e. no truncation), and merging writes the dense weight back."""

    method: ClassVar[str] = "alfa"

    heads: int = 8
    rank: int = 8
    init_std: float = 0.02
    dense_rank: int | None = None

    def validate(self) -> None:
        super().validate()
        if self.heads <= 0 or self.rank <= 0:
            raise ValueError(f"heads and rank must be positive, got heads={self.heads}, rank={self.rank}")
        if not self.init_std >= 0:
            raise ValueError(f"init_std must be non-negative, got {self.init_std}")
        if self.dense_rank is not None and self.dense_rank <= 0:
            raise ValueError(f"dense_rank must be positive or None, got {self.dense_rank}")

    def build(self, base: nn.Module) -> AlfaLayer:
        return AlfaLayer(base, self)


def alfa_mixing(A_q: Tensor, B_q: Tensor, A_p: Tensor, B_p: Tensor, V_base: Tensor) -> Tensor:
    """The ``(d, d)`` matrix ``T`` with ``V_adapt = V_base + T V_base``."""
    H, d = A_q.shape[0], V_base.shape[0]
    n = V_base.shape[1]
    gram = V_base @ V_base.T  # K Qᵀ's shared part: Q_h Kᵀ = B_q A_q (V_base V_baseᵀ)
    logits = (B_q @ A_q) @ gram / math.sqrt(n)  # (H, d, d)
    attn = torch.softmax(logits, dim=-1)
    mix = torch.einsum("khd,hde->ke", A_p.view(A_p.shape[0], H, d), attn)  # Σ_h A_p[:, h] Attn_h
    return B_p @ mix


class AlfaLayer(AdaptedLayer):
    """A factorized (or dense) layer whose right factor is re-weighted by Alfa's attention."""

    factorized_merge: ClassVar[bool] = True

    def __init__(self, base: nn.Module, config: AlfaConfig) -> None:
        super().__init__(base, config)
        if self.base_is_factorized:
            d = base.V.shape[0]
            ref = base.V
        else:
            W = dense_matrix(base).detach()
            d = min(config.dense_rank or min(W.shape), *W.shape)
            U, V = svd_factors(W, d)
            # Derived from the frozen weight on attach, so not saved with the model.
            self.register_buffer("U_svd", U, persistent=False)
            self.register_buffer("V_svd", V, persistent=False)
            ref = W
        H, r = config.heads, config.rank
        kw = {"device": ref.device, "dtype": ref.dtype}
        self.A_q = nn.Parameter(torch.randn(H, r, d, **kw) * config.init_std)
        self.B_q = nn.Parameter(torch.zeros(H, d, r, **kw))
        self.A_p = nn.Parameter(torch.randn(r * H, H * d, **kw) * config.init_std)
        self.B_p = nn.Parameter(torch.zeros(d, r * H, **kw))

    @property
    def U_d(self) -> Tensor:
        return self.base.U if self.base_is_factorized else self.U_svd

    @property
    def V_base(self) -> Tensor:
        return self.base.V if self.base_is_factorized else self.V_svd

    def delta_V(self) -> Tensor:
        """``V_adapt − V_base = B_p A_p Z`` (d×n)."""
        V = self.V_base
        return alfa_mixing(self.A_q, self.B_q, self.A_p, self.B_p, V) @ V

    def adapted_V(self) -> Tensor:
        """The adapted dictionary ``V_adapt = V_base + B_p A_p Z`` (d×n)."""
        return self.V_base + self.delta_V()

    def forward(self, x: Tensor) -> Tensor:
        if self.base_is_factorized:
            return self.base.forward_with(x, self.adapted_V())
        # Dense base: W + U ΔV keeps the base exactly at init (no SVD round-off in the output).
        W = dense_matrix(self.base) + self.U_d @ self.delta_V()
        return self.spec.dense_op(x, W, self.base.bias)

    def effective_factors(self) -> tuple[Tensor, Tensor, Tensor | None]:
        return self.base.U, self.adapted_V(), self.base.bias

    def effective_weight(self) -> tuple[Tensor, Tensor | None]:
        if self.base_is_factorized:
            return self.base.U @ self.adapted_V(), self.base.bias
        return dense_matrix(self.base) + self.U_d @ self.delta_V(), self.base.bias

    def extra_repr(self) -> str:
        c = self.config
        return f"heads={c.heads}, rank={c.rank}, d={self.A_q.shape[-1]}"
