"""Coding rates of a set of tokens and the gradient step that lowers them (spec crate.md §1).

Tokens are the **columns** of ``Z`` of shape ``(..., p, n)`` (leading dimensions are batches);
rates are in bits. Everything runs in float64 internally: ``log det`` of ``I + c Z Zᵀ`` is
well conditioned, but the differences ``ΔR = R − R_c`` of nearly equal rates are not, in float32.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = [
    "coding_rate",
    "clustered_coding_rate",
    "rate_reduction",
    "coding_rate_step",
    "head_coding_rates",
]

_LN2 = math.log(2.0)


def _check_tokens(Z: Tensor, what: str = "Z") -> None:
    if not isinstance(Z, Tensor):
        raise TypeError(f"{what} must be a torch.Tensor of shape (..., p, n), got {type(Z).__name__}")
    if Z.ndim < 2 or Z.shape[-1] == 0 or Z.shape[-2] == 0:
        raise ValueError(f"{what} must have shape (..., p, n) with p, n > 0 (tokens are columns), got {tuple(Z.shape)}")


def _check_eps(eps: float) -> None:
    if not eps > 0:
        raise ValueError(f"eps must be positive, got {eps}")


def _half_log2_det_identity_plus(Z: Tensor, scale: float | Tensor) -> Tensor:
    """``½ log2 det(I_p + scale · Z Zᵀ)``, through the smaller of the two Gram matrices
    (``det(I_p + c Z Zᵀ) = det(I_n + c Zᵀ Z)``)."""
    Z = Z.to(torch.float64)
    p, n = Z.shape[-2], Z.shape[-1]
    gram = Z @ Z.transpose(-1, -2) if p <= n else Z.transpose(-1, -2) @ Z
    eye = torch.eye(gram.shape[-1], dtype=gram.dtype, device=gram.device)
    if isinstance(scale, Tensor):
        scale = scale.to(gram.dtype)[..., None, None]
    # I + c·(PSD) is positive definite: the sign is +1 and log|det| is log det.
    return 0.5 * torch.linalg.slogdet(eye + scale * gram).logabsdet / _LN2


def coding_rate(Z: Tensor, eps: float) -> Tensor:
    """``R(Z; ε) = ½ log2 det(I_p + p/(n ε²) · Z Zᵀ)`` for tokens in the columns of ``Z`` (..., p, n)."""
    _check_tokens(Z)
    _check_eps(eps)
    p, n = Z.shape[-2], Z.shape[-1]
    return _half_log2_det_identity_plus(Z, p / (n * eps**2))


def _cluster_indices(labels: Tensor | list[int], n: int) -> list[Tensor]:
    labels = torch.as_tensor(labels)
    if labels.ndim != 1 or labels.numel() != n:
        raise ValueError(
            f"labels must be a 1-d sequence of length n = {n} (one per token), got shape {tuple(labels.shape)}"
        )
    return [torch.nonzero(labels == value).flatten() for value in torch.unique(labels)]


def clustered_coding_rate(Z: Tensor, labels: Tensor | list[int], eps: float) -> Tensor:
    """``R_c(Z; ε) = Σ_j (n_j/n) · ½ log2 det(I_p + p/(n_j ε²) · Z_j Z_jᵀ)`` where ``Z_j`` are the
    tokens (columns) with the ``j``-th distinct value of ``labels``."""
    _check_tokens(Z)
    _check_eps(eps)
    p, n = Z.shape[-2], Z.shape[-1]
    total = torch.zeros(Z.shape[:-2], dtype=torch.float64, device=Z.device)
    for idx in _cluster_indices(labels, n):
        n_j = idx.numel()
        total = total + (n_j / n) * _half_log2_det_identity_plus(Z[..., idx], p / (n_j * eps**2))
    return total


def rate_reduction(Z: Tensor, labels: Tensor | list[int], eps: float) -> Tensor:
    """``ΔR = R − R_c``: large when the whole set is spread out and each cluster is thin."""
    return coding_rate(Z, eps) - clustered_coding_rate(Z, labels, eps)


def coding_rate_step(Z: Tensor, eps: float, kappa: float) -> Tensor:
    """One gradient step lowering ``R``: ``Z − κ c (I + c Z Zᵀ)⁻¹ Z`` with ``c = p/(n ε²)``.

    In each eigen-direction of ``c Z Zᵀ`` (eigenvalue ``λ``) it scales ``Z`` by ``1 − κc/(1 + λ)``,
    so thin directions shrink more than wide ones. Returns a tensor of ``Z``'s dtype.
    """
    _check_tokens(Z)
    _check_eps(eps)
    p, n = Z.shape[-2], Z.shape[-1]
    c = p / (n * eps**2)
    Z64 = Z.to(torch.float64)
    eye = torch.eye(p, dtype=torch.float64, device=Z.device)
    step = torch.linalg.solve(eye + c * (Z64 @ Z64.transpose(-1, -2)), Z64)
    return (Z64 - kappa * c * step).to(Z.dtype)


def head_coding_rates(head_tokens: Tensor, eps: float) -> Tensor:
    """Per-head coding rate of the tokens as the CRATE probe measures it (spec crate.md §3).

    ``head_tokens`` has shape ``(batch, heads, n, q)``: row ``i`` of head ``k`` is ``U_kᵀ z_i``.
    Each token is scaled to unit length (so the rate measures directions, not magnitudes), then
    ``R`` is taken per image and head with ``p = q``. Returns ``(batch, heads)`` in bits; summing over
    heads gives the layer's ``R_c``.
    """
    if head_tokens.ndim != 4:
        raise ValueError(f"head_tokens must have shape (batch, heads, n, q), got {tuple(head_tokens.shape)}")
    _check_eps(eps)
    unit = F.normalize(head_tokens.to(torch.float64), dim=-1)
    return coding_rate(unit.transpose(-1, -2), eps)
