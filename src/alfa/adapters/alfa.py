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
from .config import AdapterConfig, register_method
from .layer import AdaptedLayer, MergeKind

__all__ = ["AlfaConfig", "AlfaLayer", "DictionaryAdapter", "DictionaryMixConfig", "DictionaryMixLayer", "alfa_mixing"]


@register_method
@dataclass(kw_only=True)
class AlfaConfig(AdapterConfig):
    """Alfa with ``heads`` attention heads of low rank ``rank``; ``init_std`` is σ of the Gaussian
    init of ``A_q`` and ``A_p`` (``B_q`` and ``B_p`` start at zero, so the adapted model starts as
    the base). On a dense layer the dictionary comes from the layer's SVD, of rank ``dense_rank``
    (``None``: full rank, i.e. no truncation), and merging writes the dense weight back.

    ``rank`` is bounded by a layer's dictionary size ``d`` (a rank-``r`` term on a ``d``-dimensional dictionary has
    rank at most ``d``): above every adapted layer's ``d`` it is refused, above some layers' a ``UserWarning``
    names them. A ``dense_rank`` above a dense layer's rank gives it its full SVD, named likewise
    (:func:`alfa.adapters.select.warn_sizes`)."""

    method: ClassVar[str] = "alfa"
    display_name: ClassVar[str] = "Alfa"
    family: ClassVar[str] = "dictionary"

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
        check_dense_rank(self.dense_rank)

    def build(self, base: nn.Module) -> AlfaLayer:
        return AlfaLayer(base, self)


def check_dense_rank(dense_rank: int | None) -> None:
    """The dictionary methods' ``dense_rank``: the SVD rank of a dense layer's dictionary, or ``None`` (full)."""
    if dense_rank is not None and (isinstance(dense_rank, bool) or not isinstance(dense_rank, int) or dense_rank <= 0):
        raise ValueError(f"dense_rank must be a positive integer or None, got {dense_rank!r}")


def alfa_mixing(A_q: Tensor, B_q: Tensor, A_p: Tensor, B_p: Tensor, V_base: Tensor) -> Tensor:
    """The ``(d, d)`` matrix ``T`` with ``V_adapt = V_base + T V_base``."""
    return B_p @ _head_mix(A_q, B_q, A_p, V_base)


def _head_mix(A_q: Tensor, B_q: Tensor, A_p: Tensor, V_base: Tensor) -> Tensor:
    """``Σ_h A_p[:, h] Attn_h`` (``r·H × d``): ``T = B_p`` times this."""
    H, d = A_q.shape[0], V_base.shape[0]
    n = V_base.shape[1]
    gram = V_base @ V_base.T  # K Qᵀ's shared part: Q_h Kᵀ = B_q A_q (V_base V_baseᵀ)
    # B_q (A_q G), not (B_q A_q) G: H·r·d² multiply-adds instead of H·d³ (d/r times fewer)
    logits = B_q @ (A_q @ gram) / math.sqrt(n)  # (H, d, d)
    attn = torch.softmax(logits, dim=-1)
    return torch.einsum("khd,hde->ke", A_p.view(A_p.shape[0], H, d), attn)  # Σ_h A_p[:, h] Attn_h


class DictionaryAdapter(AdaptedLayer):
    """Shared machinery of the methods that adapt only the dictionary: ``V_adapt = V_base + T V_base``.

    On a factorized layer the dictionary is its right factor ``V`` and ``U_d`` its left factor; on a
    dense layer both come from the layer's SVD (rank ``config.dense_rank``, full if ``None``) and
    the update is added to the exact dense weight, so a zero update reproduces the base bit for bit.

    The contract: a subclass implements :meth:`mixing`, the ``d×d`` matrix ``T`` — all a user's
    personalization of the layer amounts to, and what ``save_adapter(..., compact=True)`` stores
    (only layers of this class can be stored that way). It may override :meth:`delta_V` with a
    cheaper product than ``T V_base``. The merge kind is ``"factors"``: the adapted layer is still
    ``U_d V_adapt``, of rank ``d``.
    """

    merge_kind: ClassVar[MergeKind] = "factors"

    def __init__(self, base: nn.Module, config: AdapterConfig) -> None:
        super().__init__(base, config)
        if not self.base_is_factorized:
            self.follow_base()

    def derive_from_base(self) -> None:
        W = dense_matrix(self.base).detach()
        d = min(getattr(self.config, "dense_rank", None) or min(W.shape), *W.shape)
        U, V = svd_factors(W, d)
        # Derived from the frozen weight, so not saved with the model (they follow the base: follow_base).
        self.register_buffer("U_svd", U, persistent=False)
        self.register_buffer("V_svd", V, persistent=False)

    @property
    def dictionary_size(self) -> int:
        return self.V_base.shape[0]

    @property
    def U_d(self) -> Tensor:
        return self.base.U if self.base_is_factorized else self.U_svd

    @property
    def V_base(self) -> Tensor:
        return self.base.V if self.base_is_factorized else self.V_svd

    def mixing(self) -> Tensor:
        """The ``(d, d)`` matrix ``T`` with ``V_adapt = V_base + T V_base``."""
        raise NotImplementedError(f"{type(self).__name__} must implement mixing()")

    def delta_V(self) -> Tensor:
        """``V_adapt − V_base = T V_base`` (d×n)."""
        return self.mixing() @ self.V_base

    def adapted_V(self) -> Tensor:
        """The adapted dictionary ``V_adapt = V_base + ΔV`` (d×n)."""
        return self.V_base + self.delta_V()

    def forward(self, x: Tensor) -> Tensor:
        if self.base_is_factorized:
            return self.base.forward_with(x, self.adapted_V())
        if self._low_rank_is_cheaper(x):
            # W x + U_d (ΔV x): the m×n update is never built (a transformer's Linear with a top-k dictionary)
            return self.base(x) + self.spec.output_op(self.spec.input_op(x, self.delta_V()), self.U_d)
        # (W + U_d ΔV) x: building the update once beats running it per position (a conv over an image)
        return self.spec.dense_op(x, self.effective_weight()[0], self.base.bias)

    def _low_rank_is_cheaper(self, x: Tensor) -> bool:
        """Whether ``U_d (ΔV x)`` per position costs fewer multiply-adds than building ``W + U_d ΔV`` once."""
        spec, d = self.spec, self.dictionary_size
        if spec.kind == "linear":
            positions = x.numel() // spec.in_features
        else:  # output positions of the conv, over the batch
            h, w = x.shape[-2:]
            (kh, kw), (sh, sw), (dh, dw) = spec.kernel_size, spec.stride, spec.dilation
            if isinstance(spec.padding, tuple):
                ph, pw = spec.padding
            else:  # "valid" pads nothing; "same" keeps the size at stride 1, as this padding does
                ph, pw = (0, 0) if spec.padding == "valid" else (kh // 2 * dh, kw // 2 * dw)
            out_h = (h + 2 * ph - dh * (kh - 1) - 1) // sh + 1
            out_w = (w + 2 * pw - dw * (kw - 1) - 1) // sw + 1
            positions = (x.numel() // (spec.in_features * h * w)) * max(out_h, 0) * max(out_w, 0)
        return positions * (d * spec.n + spec.m * d) < spec.m * d * spec.n

    def effective_factors(self) -> tuple[Tensor, Tensor, Tensor | None]:
        return self.base.U, self.adapted_V(), self.base.bias

    def effective_weight(self) -> tuple[Tensor, Tensor | None]:
        if self.base_is_factorized:
            return self.base.U @ self.adapted_V(), self.base.bias
        return dense_matrix(self.base) + self.U_d @ self.delta_V(), self.base.bias


class AlfaLayer(DictionaryAdapter):
    """A factorized (or dense) layer whose dictionary is re-weighted by Alfa's attention."""

    def __init__(self, base: nn.Module, config: AlfaConfig) -> None:
        super().__init__(base, config)
        d, H, r = self.dictionary_size, config.heads, config.rank
        kw = {"device": self.V_base.device, "dtype": self.V_base.dtype}
        self.A_q = nn.Parameter(torch.randn(H, r, d, **kw) * config.init_std)
        self.B_q = nn.Parameter(torch.zeros(H, d, r, **kw))
        self.A_p = nn.Parameter(torch.randn(r * H, H * d, **kw) * config.init_std)
        self.B_p = nn.Parameter(torch.zeros(d, r * H, **kw))

    def mixing(self) -> Tensor:
        """``T = B_p Σ_h A_p[:, h] Attn_h``, so that ``T V_base = B_p A_p Z`` (see :func:`alfa_mixing`)."""
        return alfa_mixing(self.A_q, self.B_q, self.A_p, self.B_p, self.V_base)

    def delta_V(self) -> Tensor:
        mix = _head_mix(self.A_q, self.B_q, self.A_p, self.V_base)
        if 2 * mix.shape[0] < self.dictionary_size:
            # B_p (mix V_base): 2·r·H·d·n multiply-adds instead of T V_base's d²·n, for a large dictionary (the
            # full SVD of a 4096-wide layer: 32× fewer); the gaze default (d = 64, r·H = 64) keeps T V_base
            return self.B_p @ (mix @ self.V_base)
        return (self.B_p @ mix) @ self.V_base

    def extra_repr(self) -> str:
        c = self.config
        return f"heads={c.heads}, rank={c.rank}, d={self.dictionary_size}"


@register_method
@dataclass(kw_only=True)
class DictionaryMixConfig(AdapterConfig):
    """A free ``d×d`` mix of the dictionary's rows: ``V_adapt = V_base + T V_base``, ``T`` zero-init.

    Every Alfa update has this form (see :func:`alfa_mixing`), so a trained Alfa adapter can be
    stored as its ``T`` per layer (``save_adapter(..., compact=True)``) and is loaded back as this
    method; trained directly, it is Alfa without attention and without the low-rank constraint."""

    method: ClassVar[str] = "dictionary_mix"
    display_name: ClassVar[str] = "dictionary_mix"
    family: ClassVar[str] = "dictionary"

    dense_rank: int | None = None

    def validate(self) -> None:
        super().validate()
        check_dense_rank(self.dense_rank)

    def build(self, base: nn.Module) -> DictionaryMixLayer:
        return DictionaryMixLayer(base, self)


class DictionaryMixLayer(DictionaryAdapter):
    """``V_adapt = V_base + T V_base`` with a trainable ``T`` (d×d)."""

    def __init__(self, base: nn.Module, config: DictionaryMixConfig) -> None:
        super().__init__(base, config)
        d = self.dictionary_size
        self.T = nn.Parameter(torch.zeros(d, d, device=self.V_base.device, dtype=self.V_base.dtype))

    def mixing(self) -> Tensor:
        return self.T
