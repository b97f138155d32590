"""The adapted-layer contract: a base layer plus a method's trainable tensors, at the base layer's path.

Every layer-scope method subclasses :class:`AdaptedLayer` and declares how it folds into a plain layer
(its :data:`MergeKind`); :func:`merged_layer` builds that plain layer from the declaration alone. The base
layer inside an :class:`AdaptedLayer` is never modified, so taking the adapted layer out of the model
(:func:`~alfa.adapters.state.detach`) restores the model bit for bit.
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal, get_args

import torch
from torch import Tensor, nn

from ..layers import (
    LayerSpec,
    ReadOnlyWeightError,
    computed_weight,
    dense_matrix,
    is_factorized,
    layer_spec,
    tensor_signature,
)
from ..surgery import LayerWrapper, short_list
from .config import AdapterConfig, MergeError

__all__ = ["AdaptedLayer", "MergeKind", "MERGE_KINDS", "merged_layer"]


MergeKind = Literal["factors", "low-rank", "none"]
"""How an adapted layer folds into a plain layer (declared by each :class:`AdaptedLayer` subclass):

- ``"factors"``: the update stays in the layer's rank-``d`` factorization; the layer implements
  :meth:`~AdaptedLayer.effective_factors` (the new factors) and :meth:`~AdaptedLayer.effective_weight`.
- ``"low-rank"``: the update is a low-rank ``m×n`` term; the layer implements
  :meth:`~AdaptedLayer.extended_factors` (the exact factorization of rank ``d + r``, for
  ``merge(extend=True)``) and :meth:`~AdaptedLayer.effective_weight` (for ``merge(densify=True)``).
- ``"none"``: the layer cannot be folded into one (TPGaze's prompts); it implements
  :meth:`~AdaptedLayer.merge_refusal`, the reason :func:`~alfa.adapters.state.merge` gives.

Model-scope methods (BitFit, full fine-tuning) wrap no layer: their trained parameters already are
the merged model ("in place", see :func:`~alfa.adapters.state.merge_form`). Which merges
:func:`~alfa.adapters.state.unmerge` can undo follows from the kind: see its docstring.
"""
MERGE_KINDS: tuple[MergeKind, ...] = get_args(MergeKind)


class AdaptedLayer(LayerWrapper):
    """A base layer plus a method's trainable tensors, at the base layer's module path.

    Every subclass implements ``forward`` and declares its :data:`MergeKind` as ``merge_kind``;
    :func:`merged_layer` (and so :func:`~alfa.adapters.state.merge`) dispatches on that declaration alone and calls only
    the methods the kind needs: ``effective_weight`` (the adapted ``(m, n)`` matrix and bias: a dense
    base, or a densified merge) plus ``effective_factors`` (kind ``"factors"``) or
    ``extended_factors`` (kind ``"low-rank"``); kind ``"none"`` implements ``merge_refusal``.

    It also answers what model code reads off the layer it replaced: ``weight`` (read-only, the
    *effective* dense weight, see :attr:`weight`), ``bias`` (the base's), ``in_features``/``out_features``
    for linear layers (plus ``nx``/``nf`` for a ``Conv1D``), and ``in_channels``/``out_channels``/
    ``kernel_size``/``stride``/``padding``/``dilation``/``groups`` for convs.
    """

    merge_kind: ClassVar[MergeKind]

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        declared = cls.__dict__.get("merge_kind")
        if declared is not None and declared not in MERGE_KINDS:
            raise TypeError(f"{cls.__name__}.merge_kind must be one of {MERGE_KINDS}, got {declared!r}")

    def __init__(self, base: nn.Module, config: AdapterConfig) -> None:
        if getattr(type(self), "merge_kind", None) not in MERGE_KINDS:
            # Checked here rather than in __init_subclass__: abstract intermediate classes need not declare.
            raise TypeError(f"{type(self).__name__} must declare merge_kind (one of {MERGE_KINDS})")
        super().__init__()
        self.base = base
        self.config = config
        self.spec: LayerSpec = layer_spec(base)
        self._derived_from: list[list[float]] | None = None  # the base's values derive_from_base derived from
        self.register_load_state_dict_post_hook(_rederive_after_load)

    def derive_from_base(self) -> None:
        """(Re)compute the values this layer derives from its frozen base: buffers not saved with it, as they
        follow from the base (PiSSA's residual, a dense base's SVD). None here; a subclass with such values
        overrides this and has its ``__init__`` call :meth:`follow_base`."""

    def follow_base(self) -> None:
        """Derive the base's values now, and again whenever they no longer match the base: after a
        ``load_state_dict`` that changed the base's values (a strict load of another model's state into an
        attached model would otherwise run on the old base's residual), and when a parked adapter is made
        active again (:meth:`refresh_derived`). A cast that keeps the values re-derives nothing."""
        self.derive_from_base()
        self.mark_derived()

    def mark_derived(self) -> None:
        """Record the base's values as those the derived values follow (for an ``__init__`` that derived them
        itself from a computation it needed anyway, rather than through :meth:`follow_base`)."""
        self._derived_from = self._base_signature()

    def refresh_derived(self) -> None:
        """Re-derive the base's values if the base's values changed since they were derived."""
        if self._derived_from is not None and self._base_signature() != self._derived_from:
            self.follow_base()

    def _base_signature(self) -> list[list[float]] | None:
        """The base's values, as signatures; ``None`` for a base without values (meta or fake tensors: a model
        built to count its costs), which nothing can load values into."""
        from torch._subclasses.fake_tensor import is_fake

        tensors = [t for t in self.base.state_dict().values() if t.is_floating_point()]
        if any(t.is_meta or is_fake(t) for t in tensors):
            return None
        return [tensor_signature(t) for t in tensors]

    @property
    def base_is_factorized(self) -> bool:
        return is_factorized(self.base)

    @property
    def bias(self) -> Tensor | None:
        return self.base.bias

    @property
    def weight(self) -> Tensor:
        """Read-only: the dense weight this layer computes with now (base plus the adapter's update: what
        ``merge(densify=True)`` would store), in the base layer's layout (``(out, in)``, ``(out, in, kh, kw)``,
        or ``(in, out)`` for a ``Conv1D``); built on each access. The frozen base weight is ``base.weight``.

        The effective weight rather than the base's (PEFT's choice), so that model code computing with
        ``layer.weight`` keeps the adapter instead of silently dropping it; dtype, device and shape are the
        same either way. A prompt adapter (merge kind ``"none"``) leaves the weight as it is.

        A write into it (``nn.init.zeros_(layer.weight)``, ``layer.weight.mul_(0)``) or an assignment raises
        :class:`~alfa.layers.ReadOnlyWeightError`, since it would change nothing the layer computes.
        """
        W = dense_matrix(self.base) if self.merge_kind == "none" else self.effective_weight()[0]
        return computed_weight(self.spec.dense_layout(W), self._weight_refusal)

    def _weight_refusal(self, action: str) -> str:
        layer = f"{type(self).__name__} ({self.config.method} adapter on a {type(self.base).__name__}).weight"
        if self.merge_kind == "none":  # a prompt adapter: the weight is the base's own (its storage, for a dense one)
            return (
                f"{layer} is the base layer's weight (a prompt adapter changes the inputs, not the weight), so "
                f"{action} is refused here: write the base's own parameters (layer.base) if that is meant; a "
                "prompt adapter cannot be merged"
            )
        return (
            f"{layer} is the base weight plus the adapter's update, computed on each read, so {action} would "
            "change nothing the layer computes: write the base's own parameters (layer.base) or the adapter's, or "
            "alfa.merge(model) first and write the merged layer"
        )

    def __setattr__(self, name: str, value: Any) -> None:
        if name == "weight":
            raise ReadOnlyWeightError(self._weight_refusal("assigning it"))
        super().__setattr__(name, value)

    def _geometry(self, kind: str, field_name: str, public: str) -> Any:
        if self.spec.kind != kind:
            # nn.Module.__getattr__ then reports the attribute as missing, so hasattr() answers False.
            raise AttributeError(f"a {self.spec.kind} layer has no {public!r}")
        return getattr(self.spec, field_name)

    @property
    def in_features(self) -> int:
        return self._geometry("linear", "in_features", "in_features")

    @property
    def out_features(self) -> int:
        return self._geometry("linear", "out_features", "out_features")

    @property
    def nx(self) -> int:  # transformers Conv1D's names: nx inputs, nf outputs
        if not self.spec.transposed:
            raise AttributeError(f"{type(self).__name__} does not adapt a Conv1D, which has no 'nx'")
        return self.spec.in_features

    @property
    def nf(self) -> int:
        if not self.spec.transposed:
            raise AttributeError(f"{type(self).__name__} does not adapt a Conv1D, which has no 'nf'")
        return self.spec.out_features

    @property
    def in_channels(self) -> int:
        return self._geometry("conv2d", "in_features", "in_channels")

    @property
    def out_channels(self) -> int:
        return self._geometry("conv2d", "out_features", "out_channels")

    @property
    def kernel_size(self) -> tuple[int, int]:
        return self._geometry("conv2d", "kernel_size", "kernel_size")

    @property
    def stride(self) -> tuple[int, int]:
        return self._geometry("conv2d", "stride", "stride")

    @property
    def padding(self) -> tuple[int, int] | str:
        return self._geometry("conv2d", "padding", "padding")

    @property
    def dilation(self) -> tuple[int, int]:
        return self._geometry("conv2d", "dilation", "dilation")

    @property
    def groups(self) -> int:
        self._geometry("conv2d", "kernel_size", "groups")
        return 1  # only ungrouped convs are adapted

    def effective_weight(self) -> tuple[Tensor, Tensor | None]:
        """The adapted layer's ``(m, n)`` weight and its bias."""
        raise NotImplementedError(f"{type(self).__name__} does not implement effective_weight")

    def effective_factors(self) -> tuple[Tensor, Tensor, Tensor | None]:
        """Kind ``"factors"``: ``(U, V, bias)`` of the same rank as the factorized base, ``U V = W'``."""
        raise NotImplementedError(f"{type(self).__name__} (merge kind {self.merge_kind!r}) has no same-rank factors")

    def extended_factors(self) -> tuple[Tensor, Tensor, Tensor | None]:
        """Kind ``"low-rank"``: ``(U', V', bias)`` with ``U' V' = W'`` exactly, of rank ``d + r`` (or less)."""
        raise NotImplementedError(f"{type(self).__name__} (merge kind {self.merge_kind!r}) has no extended factors")

    def merge_refusal(self) -> str:
        """Kind ``"none"``: why the layer cannot be merged (the :class:`MergeError` message)."""
        raise NotImplementedError(f"{type(self).__name__} (merge kind {self.merge_kind!r}) can be merged")

    def delta_weight(self) -> Tensor:
        """The personalized update ``ΔW`` as an ``(m, n)`` matrix (for analysis and figures)."""
        W, _ = self.effective_weight()
        return W - dense_matrix(self.base)

    def merged(self, *, densify: bool = False, extend: bool = False) -> nn.Module:
        """A plain layer computing what this adapted layer computes (see :func:`merged_layer`)."""
        return merged_layer(self, densify=densify, extend=extend)

    def extra_repr(self) -> str:
        return f"method={self.config.method}"

    @classmethod
    def save_pretrained_refusal(cls, model_class: str, wrapped: dict[str, nn.Module], truncated: bool) -> str:
        """The ``save_pretrained`` guard's message (:func:`alfa.surgery.save_pretrained_problem`): the adapter
        would be lost; save it with ``alfa.save_adapter``, or detach or merge it before saving the model."""
        methods = sorted({getattr(getattr(m, "config", None), "method", type(m).__name__) for m in wrapped.values()})
        base_hint = (
            "alfa.save_pretrained(model, directory) (the base is truncated: load it with "
            f"alfa.load_pretrained({model_class}, directory))"
            if truncated
            else "model.save_pretrained(directory)"
        )
        return (
            f"{model_class}.save_pretrained would lose the {'/'.join(methods)} adapter (alfa) on {len(wrapped)} "
            f"layers ({short_list(list(wrapped))}): from_pretrained would re-initialize those layers at random, "
            "without an error. Save the adapter with alfa.save_adapter(model, 'adapter.safetensors') (restore it "
            "with alfa.load_adapter); to save the model itself, alfa.detach(model) or alfa.merge(model) first, then "
            f"{base_hint}"
        )


@torch.no_grad()
def _rederive_after_load(layer: nn.Module, incompatible_keys: Any) -> None:
    """``load_state_dict``'s post-hook (a function of the module, not a closure, so a deep copy keeps it right)."""
    layer.refresh_derived()  # type: ignore[operator]


def merged_layer(layer: AdaptedLayer, *, densify: bool = False, extend: bool = False) -> nn.Module:
    """The plain layer that ``layer`` folds into, chosen by its declared ``merge_kind``.

    A dense base always gives a dense layer. A factorized base gives, for kind ``"factors"``, a
    factorization of the same rank; for kind ``"low-rank"``, with ``extend`` the exact wider
    factorization, with ``densify`` a dense layer, and otherwise a :class:`MergeError`. Kind
    ``"none"`` always raises :class:`MergeError`.
    """
    kind, spec = layer.merge_kind, layer.spec
    if kind == "none":
        raise MergeError(layer.merge_refusal())
    if layer.base_is_factorized and (kind == "factors" or extend):
        U, V, bias = layer.effective_factors() if kind == "factors" else layer.extended_factors()
        new = spec.make_factorized(U.detach(), V.detach(), None if bias is None else bias.detach())
    elif layer.base_is_factorized and not densify:
        raise MergeError(
            f"{layer.config.method} adds a dense {spec.m}×{spec.n} update to a factorized "
            f"layer; merging it would store the dense weight ({spec.m * spec.n} parameters "
            f"instead of {sum(p.numel() for p in layer.base.parameters())}). Pass extend=True to store it "
            f"exactly as a wider factorization, densify=True to merge it densely, or keep the adapter "
            f"unmerged."
        )
    else:
        W, bias = layer.effective_weight()
        new = spec.make_dense(W.detach(), None if bias is None else bias.detach())
    return new.train(layer.training)
