"""A full additive correction of a layer's weight and bias, ``y' = layer(x) + ΔW x + Δb``: the form every
user-calibration map of a regression head takes (the gaze application's ``alfa calibrate``).

A per-person offset is ``ΔW = 0, Δb = c``; an affine map ``A ŷ + c`` of the head's output ``ŷ = W h + b`` is
``ΔW = (A − I) W, Δb = (A − I) b + c``; a ridge regression of the penultimate features, or the head fine-tuned,
is the new head less the old one. All of them are one ``m×n`` update plus a bias, so one method carries them
through saving, loading, merging (``W + ΔW``, ``b + Δb``: exact), export and per-sample serving
(:class:`alfa.serve.MultiUserModel` adds ``ΔW_u h + Δb_u`` per sample on the shared head).

It is a low-rank update in the LoRA family's sense with ``P = I_m`` and ``Q = ΔW`` (merge kind ``"low-rank"``:
a factorized layer merges densely or as the exact factorization ``[U, I] [V; ΔW]``), plus the bias term. A
layer without a bias gets no ``Δb`` (merging keeps every layer's structure). Meant for small heads (``m`` is
the number of outputs); on a wide layer the update is as large as the layer itself.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import Tensor, nn

from .config import AdapterConfig, register_method
from .layer import AdaptedLayer
from .lora import LowRankUpdateLayer

__all__ = ["CorrectionConfig", "CorrectionLayer"]


@register_method
@dataclass(kw_only=True)
class CorrectionConfig(AdapterConfig):
    """A dense additive correction ``(ΔW, Δb)`` of each targeted layer, zero at the start (the layer as it was).

    Not a personalization method of the benchmark (its family, ``"correction"``, is in no table): it is how a
    user calibration from labelled images is stored. Target the head, e.g. ``CorrectionConfig(target=["fc"],
    layers="dense")``."""

    method: ClassVar[str] = "correction"
    display_name: ClassVar[str] = "head correction"
    family: ClassVar[str] = "correction"

    def build(self, base: nn.Module) -> AdaptedLayer:
        return CorrectionLayer(base, self)


class CorrectionLayer(LowRankUpdateLayer):
    """``weight_update`` (``ΔW``, m×n, the layer's kernel for convs) and ``bias_update`` (``Δb``, m; only if the
    layer has a bias)."""

    def __init__(self, base: nn.Module, config: CorrectionConfig) -> None:
        super().__init__(base, config)
        ref = next(base.parameters())
        m, n = self.spec.m, self.spec.n
        self.weight_update = nn.Parameter(torch.zeros(m, n, device=ref.device, dtype=ref.dtype))
        self.bias_update = (
            nn.Parameter(torch.zeros(m, device=ref.device, dtype=ref.dtype)) if base.bias is not None else None
        )

    def update_factors(self) -> tuple[Tensor, Tensor]:
        eye = torch.eye(self.spec.m, device=self.weight_update.device, dtype=self.weight_update.dtype)
        return eye, self.weight_update

    def branch(self, x: Tensor) -> Tensor:
        # ΔW applied directly (P is the identity): one op instead of two.
        y = self.spec.input_op(x, self.weight_update)
        if self.bias_update is None:
            return y
        return y + (self.bias_update[:, None, None] if self.spec.kind == "conv2d" else self.bias_update)

    @property
    def bias(self) -> Tensor | None:
        if self.base.bias is None:
            return None
        return self.base.bias + self.bias_update

    def extra_repr(self) -> str:
        return f"m={self.spec.m}, n={self.spec.n}, bias={self.bias_update is not None}"
