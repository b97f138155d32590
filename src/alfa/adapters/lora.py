"""LoRA, PiSSA and MiLoRA on the same weights as Alfa (spec §5), plus the shared low-rank machinery.

All three add a low-rank term to the layer's weight ``W_d`` (the whole truncated weight ``U_d V_base``
on a factorized layer, the plain weight on a dense one)::

    LoRA     W' = W_d + s · B A            A (r×n) Kaiming-uniform, B (m×r) zeros, s = alpha / r
    PiSSA    W' = (W_d − s·B₀A₀) + s · B A  B₀ = U_r √(S_r/s), A₀ = √(S_r/s) V_rᵀ: top-r SVD triplets
    MiLoRA   the same with the r smallest triplets of W_d

(PiSSA divides ``S_r`` by ``s`` as PEFT does, so that ``s·B₀A₀ = U_r S_r V_rᵀ`` for any ``alpha``; with
``alpha = rank`` (the default's at rank 8) this is the paper's ``B = U_r √S_r``.) On a conv, ``A`` runs as a conv with
the layer's kernel, stride, padding and dilation (``in -> r``) and ``B`` as a 1×1 conv (``r -> m``),
so the low-rank branch never builds the dense ``m×n`` weight.

Merging: the update is a dense ``m×n`` term, so on a factorized layer :func:`alfa.merge` stores the
layer densely, and only when asked (``densify=True``). The same weight can also be stored exactly as
a factorization of rank ``d + r`` (``[U_d, s·B] [V_base; A]``), or of rank ``d`` for PiSSA/MiLoRA
(whose frozen residual has rank ``d − r``): ``alfa.merge(model, extend=True)``, from
:meth:`LowRankUpdateLayer.extended_factors`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import Tensor, nn

from ..layers import canonicalize_factors, dense_matrix, is_factorized, svd_factors
from .config import AdapterConfig, register_method
from .layer import AdaptedLayer, MergeKind

__all__ = [
    "LowRankUpdateLayer",
    "LoraConfig",
    "LoraLayer",
    "PissaConfig",
    "MiloraConfig",
    "PissaLayer",
    "svd_of_layer",
    "kaiming_uniform",
]


def kaiming_uniform(rows: int, cols: int, like: Tensor) -> Tensor:
    """A ``(rows, cols)`` matrix with ``nn.Linear``'s default init (what PEFT gives LoRA's ``A``)."""
    t = torch.empty(rows, cols, device=like.device, dtype=like.dtype)
    nn.init.kaiming_uniform_(t, a=math.sqrt(5))
    return t


def svd_of_layer(base: nn.Module) -> tuple[Tensor, Tensor]:
    """``(U, S Vᵀ)``: the thin SVD of the layer's ``(m, n)`` weight, largest singular value first.

    For a factorized layer this is computed from the factors (QR of each, SVD of the small core), so it
    is right even when ``U`` is not orthonormal (after recovery fine-tuning) and never builds ``W``.
    Singular values are the row norms of the second factor.
    """
    if is_factorized(base):
        return canonicalize_factors(base.U, base.V)
    W = dense_matrix(base).detach()
    return svd_factors(W, min(W.shape))


class LowRankUpdateLayer(AdaptedLayer):
    """A frozen weight plus a trainable low-rank term: ``W' = W_0 + P Q`` with ``P`` (m×k), ``Q`` (k×n).

    Subclasses say how ``P`` and ``Q`` are made from their parameters (``update_factors``) and, if the
    frozen part is not the base layer itself (PiSSA's residual), override ``frozen_forward`` and
    ``frozen_factors``/``frozen_dense``. The branch runs as ``input_op(x, Q)`` then ``output_op(·, P)``,
    so on convs it is a conv with the layer's geometry followed by a 1×1 conv.

    Merge kind ``"low-rank"``: :meth:`effective_weight` (densified) and :meth:`extended_factors` (the
    exact factorization of rank ``rank(W_0) + k``) both follow from ``update_factors``.
    """

    merge_kind: ClassVar[MergeKind] = "low-rank"

    def update_factors(self) -> tuple[Tensor, Tensor]:
        raise NotImplementedError

    def frozen_forward(self, x: Tensor) -> Tensor:
        return self.base(x)

    def frozen_factors(self) -> tuple[Tensor, Tensor]:
        """``(U_0, V_0)`` of the frozen part (factorized bases)."""
        return self.base.U, self.base.V

    def frozen_dense(self) -> Tensor:
        """The frozen part as an ``(m, n)`` matrix."""
        if self.base_is_factorized:
            U0, V0 = self.frozen_factors()
            return U0 @ V0
        return dense_matrix(self.base)

    def branch(self, x: Tensor) -> Tensor:
        P, Q = self.update_factors()
        return self.spec.output_op(self.spec.input_op(x, Q), P)

    def forward(self, x: Tensor) -> Tensor:
        # Two separate paths: with P = 0 the branch adds exact zeros, so the adapted model starts as the base.
        return self.frozen_forward(x) + self.branch(x)

    def effective_weight(self) -> tuple[Tensor, Tensor | None]:
        P, Q = self.update_factors()
        return self.frozen_dense() + P @ Q, self.bias

    def extended_factors(self) -> tuple[Tensor, Tensor, Tensor | None]:
        """``(U', V', bias)`` with ``U' V' = W'`` exactly: ``[U_0, P]`` and ``[V_0; Q]`` (factorized bases).

        This stores a low-rank update of a factorized layer without densifying it (LoRA: rank ``d + r``;
        PiSSA/MiLoRA: rank ``d``, their frozen residual having rank ``d − r``).
        """
        U0, V0 = self.frozen_factors()
        P, Q = self.update_factors()
        return torch.cat([U0, P], dim=1), torch.cat([V0, Q], dim=0), self.bias


@register_method
@dataclass(kw_only=True)
class LoraConfig(AdapterConfig):
    """LoRA: ``W' = W + (alpha/rank) B A`` with ``A`` Kaiming-uniform and ``B = 0`` (PEFT's default init)."""

    method: ClassVar[str] = "lora"
    display_name: ClassVar[str] = "LoRA"
    family: ClassVar[str] = "lora"

    rank: int = 8
    alpha: float = 16.0

    def validate(self) -> None:
        super().validate()
        if self.rank <= 0:
            raise ValueError(f"rank must be positive, got {self.rank}")
        if not self.alpha > 0:
            raise ValueError(f"alpha must be positive, got {self.alpha}")

    @property
    def scaling(self) -> float:
        return self.alpha / self.rank

    def build(self, base: nn.Module) -> AdaptedLayer:
        return LoraLayer(base, self)


class LoraLayer(LowRankUpdateLayer):
    """LoRA's ``A`` (r×n, the layer's kernel for convs) and ``B`` (m×r, a 1×1 conv for convs)."""

    def __init__(self, base: nn.Module, config: LoraConfig) -> None:
        super().__init__(base, config)
        ref = next(base.parameters())
        r, m, n = config.rank, self.spec.m, self.spec.n
        self.A = nn.Parameter(kaiming_uniform(r, n, ref))
        self.B = nn.Parameter(torch.zeros(m, r, device=ref.device, dtype=ref.dtype))

    def update_factors(self) -> tuple[Tensor, Tensor]:
        return self.config.scaling * self.B, self.A

    def extra_repr(self) -> str:
        return f"rank={self.config.rank}, alpha={self.config.alpha}"


@register_method
@dataclass(kw_only=True)
class PissaConfig(LoraConfig):
    """PiSSA: LoRA whose ``B A`` starts as the top-``rank`` SVD part of the weight; the residual is frozen.

    Default ``alpha = 8``: at the default ``rank = 8`` the scale is 1, as in the PiSSA paper, so ``B = U_r √S_r``,
    ``A = √S_r V_rᵀ``. ``alpha`` does not follow ``rank`` (as PEFT's ``lora_alpha`` does not): at another rank the
    scale is ``8 / rank`` and ``S_r`` is divided by it, which keeps ``s B₀ A₀ = U_r S_r V_rᵀ`` but splits it
    differently between ``B`` and ``A``; pass ``alpha=rank`` for the paper's split at any rank.
    """

    method: ClassVar[str] = "pissa"
    display_name: ClassVar[str] = "PiSSA"
    family: ClassVar[str] = "lora"
    changes_base: ClassVar[bool] = True  # the frozen part is the weight less its top-rank SVD part
    components: ClassVar[str] = "largest"

    alpha: float = 8.0

    def build(self, base: nn.Module) -> AdaptedLayer:
        return PissaLayer(base, self)


@register_method
@dataclass(kw_only=True)
class MiloraConfig(PissaConfig):
    """MiLoRA: PiSSA's construction with the ``rank`` *smallest* singular triplets of the weight."""

    method: ClassVar[str] = "milora"
    display_name: ClassVar[str] = "MiLoRA"
    family: ClassVar[str] = "lora"
    components: ClassVar[str] = "smallest"


class PissaLayer(LowRankUpdateLayer):
    """A LoRA branch initialized from ``rank`` SVD triplets of the weight, over the frozen residual.

    On a factorized layer of rank ``d`` the residual is itself factorized (the other ``d − rank``
    components), so nothing dense is built; on a dense layer it is the dense ``W − s B₀ A₀``. The
    residual is derived from the frozen base (not saved: it follows the base, see :meth:`AdaptedLayer.follow_base`).
    """

    def __init__(self, base: nn.Module, config: PissaConfig) -> None:
        super().__init__(base, config)
        factors = self._principal_factors()
        A, B, U, _, _ = factors
        k, r = U.shape[1], config.rank
        # A factorized residual needs at least one component; a dense one may be (numerically) zero.
        limit = k - 1 if self.base_is_factorized else k
        if r > limit:
            kind = "factorized layer's rank" if self.base_is_factorized else "layer's rank"
            raise ValueError(f"{config.method} rank {r} is too large for this {kind} {k} (at most {limit})")
        self.A = nn.Parameter(A)
        self.B = nn.Parameter(B)
        self._keep_residual(*factors)  # what follow_base would derive, from the SVD just made
        self.mark_derived()

    def _principal_factors(self) -> tuple[Tensor, Tensor, Tensor, Tensor, slice]:
        """``(A₀, B₀, U, V, keep)``: the branch's starting factors from the ``rank`` chosen triplets, the base's SVD
        ``U V`` and which triplets were chosen; a function of the base alone, so the residual can be derived again."""
        U, V = svd_of_layer(self.base)  # U (m×k) orthonormal, V = S Vᵀ (k×n)
        k, r, s = U.shape[1], self.config.rank, self.config.scaling
        keep = slice(0, r) if self.config.components == "largest" else slice(k - r, k)
        S = V[keep].double().norm(dim=1)
        Vh = V[keep].double() / S.clamp_min(torch.finfo(torch.float64).tiny)[:, None]
        root = (S / s).sqrt()
        return (root[:, None] * Vh).to(V.dtype), (U[:, keep].double() * root).to(U.dtype), U, V, keep

    def derive_from_base(self) -> None:
        self._keep_residual(*self._principal_factors())

    def _keep_residual(self, A: Tensor, B: Tensor, U: Tensor, V: Tensor, keep: slice) -> None:
        """The frozen residual: the other triplets of a factorized base, or ``W − s B₀ A₀`` of a dense one."""
        if self.base_is_factorized:
            rest = torch.ones(U.shape[1], dtype=torch.bool)
            rest[keep] = False
            self.register_buffer("U_res", U[:, rest].contiguous(), persistent=False)
            self.register_buffer("V_res", V[rest].contiguous(), persistent=False)
        else:
            W = dense_matrix(self.base).detach()
            residual = W.double() - self.config.scaling * B.double() @ A.double()
            self.register_buffer("W_res", residual.to(W.dtype), persistent=False)

    def update_factors(self) -> tuple[Tensor, Tensor]:
        return self.config.scaling * self.B, self.A

    def frozen_factors(self) -> tuple[Tensor, Tensor]:
        return self.U_res, self.V_res

    def frozen_dense(self) -> Tensor:
        return self.U_res @ self.V_res if self.base_is_factorized else self.W_res

    def frozen_forward(self, x: Tensor) -> Tensor:
        if self.base_is_factorized:
            return self.spec.output_op(self.spec.input_op(x, self.V_res), self.U_res, self.bias)
        return self.spec.dense_op(x, self.W_res, self.bias)

    def extra_repr(self) -> str:
        return f"rank={self.config.rank}, alpha={self.config.alpha}, components={self.config.components}"
