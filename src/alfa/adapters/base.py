"""The adapter life cycle shared by every method: attach, merge, detach, parameter groups.

A method is a small config dataclass (a subclass of :class:`AdapterConfig`, registered with
:func:`register_method`) plus, for methods that act on layers, an :class:`AdaptedLayer` that wraps
one base layer at the same module path. Methods that train existing parameters (BitFit, full
fine-tuning) set ``scope = "model"`` and only say which parameters to train.

The base layer inside an :class:`AdaptedLayer` is never modified, so :func:`detach` restores the
model bit for bit.
"""

from __future__ import annotations

import dataclasses
import re
import warnings
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal, get_args

import torch
from torch import Tensor, nn

from ..layers import LayerSpec, dense_matrix, is_dense_eligible, is_factorized, layer_spec
from ..truncate import guard_save_pretrained, replace_module, shared_parameters, tie_refusal

__all__ = [
    "AdapterConfig",
    "AdaptedLayer",
    "AdapterState",
    "MergeError",
    "MergeKind",
    "MERGE_KINDS",
    "METHODS",
    "register_method",
    "config_from_dict",
    "attach",
    "merge",
    "merge_form",
    "MERGE_FORMS",
    "merged_layer",
    "detach",
    "param_groups",
    "adapter_state",
    "adapted_layers",
    "adapter_parameters",
]

METHODS: dict[str, type[AdapterConfig]] = {}
_LAYER_CHOICES = ("auto", "factorized", "dense", "all")

MergeKind = Literal["factors", "low-rank", "none"]
"""How an adapted layer folds into a plain layer (declared by each :class:`AdaptedLayer` subclass):

- ``"factors"``: the update stays in the layer's rank-``d`` factorization; the layer implements
  :meth:`~AdaptedLayer.effective_factors` (the new factors) and :meth:`~AdaptedLayer.effective_weight`.
- ``"low-rank"``: the update is a low-rank ``m×n`` term; the layer implements
  :meth:`~AdaptedLayer.extended_factors` (the exact factorization of rank ``d + r``, for
  ``merge(extend=True)``) and :meth:`~AdaptedLayer.effective_weight` (for ``merge(densify=True)``).
- ``"none"``: the layer cannot be folded into one (TPGaze's prompts); it implements
  :meth:`~AdaptedLayer.merge_refusal`, the reason :func:`merge` gives.

Model-scope methods (BitFit, full fine-tuning) wrap no layer: their trained parameters already are
the merged model ("in place", see :func:`merge_form`).
"""
MERGE_KINDS: tuple[MergeKind, ...] = get_args(MergeKind)


class MergeError(RuntimeError):
    """Raised when an adapter cannot be merged the way it was asked to."""


def register_method(cls: type[AdapterConfig]) -> type[AdapterConfig]:
    """Class decorator: make a config known by its ``method`` name (for saving and loading)."""
    if not cls.method:
        raise ValueError(f"{cls.__name__} needs a non-empty `method` name")
    if not cls.display_name or not cls.family:
        raise ValueError(f"{cls.__name__} needs a `display_name` and a `family`")
    if cls.method in METHODS and METHODS[cls.method] is not cls:
        raise ValueError(f"method name {cls.method!r} is already registered by {METHODS[cls.method].__name__}")
    METHODS[cls.method] = cls
    return cls


@dataclass
class AdapterConfig:
    """Options every method shares.

    ``target``: a regular expression; only modules whose dotted name it matches (``re.search``)
    are adapted (e.g. ``r"layer[34]\\."``). ``layers``: which layers are candidates —
    ``"factorized"``, ``"dense"`` (plain Linear/Conv2d), ``"all"``, or ``"auto"`` (the factorized
    layers if the model has any, else the dense ones).
    """

    method: ClassVar[str] = ""
    display_name: ClassVar[str] = ""  # how tables and reports name the method
    family: ClassVar[str] = ""  # "dictionary", "lora", "spectral", "parameters" or "prompt": which tables group it
    scope: ClassVar[str] = "layer"  # "layer": wraps layers; "model": trains existing parameters

    target: str | None = None
    layers: str = "auto"

    def __post_init__(self) -> None:
        # A bad option fails where the config is written, not at attach (dataclasses.replace and
        # from_dict go through __init__ too). attach validates again: fields may be set afterwards.
        self.validate()

    def validate(self) -> None:
        """Raise ``ValueError`` on an invalid option."""
        if self.layers not in _LAYER_CHOICES:
            raise ValueError(f"layers must be one of {_LAYER_CHOICES}, got {self.layers!r}")
        if self.target is not None:
            try:
                re.compile(self.target)
            except re.error as e:
                raise ValueError(f"target {self.target!r} is not a valid regular expression: {e}") from e
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.type in ("int", int) and (isinstance(value, bool) or not isinstance(value, int)):
                raise ValueError(f"{type(self).__name__}.{f.name} must be an integer, got {value!r}")

    def build(self, base: nn.Module) -> AdaptedLayer:
        """Wrap one base layer (layer-scope methods)."""
        raise NotImplementedError(f"{type(self).__name__} does not wrap layers")

    def select_parameters(self, model: nn.Module) -> list[str]:
        """Names of the existing parameters to train (model-scope methods)."""
        raise NotImplementedError(f"{type(self).__name__} does not train existing parameters")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> AdapterConfig:
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - names)
        if unknown:
            raise ValueError(f"unknown {cls.__name__} options: {unknown}")
        return cls(**data)


def config_from_dict(method: str, data: dict[str, Any]) -> AdapterConfig:
    """Rebuild a config from its method name and :meth:`AdapterConfig.to_dict` output."""
    if method not in METHODS:
        raise ValueError(f"unknown adapter method {method!r}; known: {sorted(METHODS)}")
    return METHODS[method].from_dict(data)


class AdaptedLayer(nn.Module):
    """A base layer plus a method's trainable tensors, at the base layer's module path.

    Every subclass implements ``forward`` and declares its :data:`MergeKind` as ``merge_kind``;
    :func:`merged_layer` (and so :func:`merge`) dispatches on that declaration alone and calls only
    the methods the kind needs: ``effective_weight`` (the adapted ``(m, n)`` matrix and bias: a dense
    base, or a densified merge) plus ``effective_factors`` (kind ``"factors"``) or
    ``extended_factors`` (kind ``"low-rank"``); kind ``"none"`` implements ``merge_refusal``.

    It also answers what model code reads off the layer it replaced: ``weight`` (read-only, the
    *effective* dense weight, see :attr:`weight`), ``bias`` (the base's), ``in_features``/``out_features``
    for linear layers (plus ``nx``/``nf`` for a ``Conv1D``), and ``in_channels``/``out_channels``/
    ``kernel_size``/``stride``/``padding``/``dilation``/``groups`` for convs.
    """

    merge_kind: ClassVar[MergeKind]
    # How the save_pretrained guard (alfa.truncate.ADAPTED_LAYER_MARK) recognizes an adapted layer: the
    # truncate module sits below this one and cannot import the class.
    is_alfa_adapted_layer: ClassVar[bool] = True

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
        """
        W = dense_matrix(self.base) if self.merge_kind == "none" else self.effective_weight()[0]
        return self.spec.dense_layout(W)

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

    def merged(self, densify: bool = False, extend: bool = False) -> nn.Module:
        """A plain layer computing what this adapted layer computes (see :func:`merged_layer`)."""
        return merged_layer(self, densify=densify, extend=extend)

    def extra_repr(self) -> str:
        return f"method={self.config.method}"


@torch.no_grad()
def merged_layer(layer: AdaptedLayer, densify: bool = False, extend: bool = False) -> nn.Module:
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


@dataclass
class AdapterState:
    """Book-keeping that :func:`attach` leaves on a model (attribute ``_alfa_adapter``)."""

    config: AdapterConfig
    targets: list[str]  # adapted module names, or trained parameter names for model-scope methods
    requires_grad: dict[str, bool] = field(default_factory=dict)  # as before attach
    originals: dict[str, Tensor] = field(default_factory=dict)  # model scope: values before training


def adapter_state(model: nn.Module) -> AdapterState | None:
    """The adapter attached to ``model``, or ``None``."""
    return getattr(model, "_alfa_adapter", None)


def _require_state(model: nn.Module, action: str) -> AdapterState:
    state = adapter_state(model)
    if state is None:
        raise RuntimeError(f"cannot {action}: the model has no adapter attached (use alfa.attach first)")
    return state


def adapted_layers(model: nn.Module) -> dict[str, AdaptedLayer]:
    """Module name -> adapted layer, in model order."""
    return {n: m for n, m in model.named_modules() if isinstance(m, AdaptedLayer)}


def adapter_parameters(model: nn.Module) -> dict[str, nn.Parameter]:
    """The tensors that make up the attached adapter (what a per-user artifact stores), by name."""
    state = _require_state(model, "list adapter parameters")
    params = dict(model.named_parameters())
    if state.config.scope == "model":
        return {n: params[n] for n in state.targets}
    out: dict[str, nn.Parameter] = {}
    for name in state.targets:
        layer = model.get_submodule(name)
        for pname, p in layer.named_parameters():
            if not pname.startswith("base."):
                out[f"{name}.{pname}"] = p
    return out


def _candidate_layers(model: nn.Module, config: AdapterConfig) -> list[str]:
    factorized, dense = [], []
    for name, mod in model.named_modules():
        if is_factorized(mod):
            factorized.append(name)
        elif is_dense_eligible(mod):
            dense.append(name)
    mode = config.layers
    if mode == "auto":
        mode = "factorized" if factorized else "dense"
    names = {"factorized": factorized, "dense": dense, "all": factorized + dense}[mode]
    order = {n: i for i, (n, _) in enumerate(model.named_modules())}
    names = sorted(names, key=order.__getitem__)
    if config.target is not None:
        pattern = re.compile(config.target)
        names = [n for n in names if pattern.search(n)]
    ties = shared_parameters(model)
    tied = [n for n in names if n in ties]
    if tied and config.target is not None:  # asked for by name: refuse now rather than untie on merge
        raise ValueError(f"{config.method}: " + tie_refusal(tied[0], ties[tied[0]], "adapt (and later merge)"))
    if tied:
        listed = "; ".join(f"{n} (tied to {', '.join(ties[n])})" for n in tied)
        warnings.warn(
            f"alfa.attach ({config.method}) leaves out {len(tied)} layer(s) whose parameters are tied to another "
            f"module: {listed}. Merging an adapter into them would untie the weights",
            UserWarning,
            stacklevel=3,
        )
        names = [n for n in names if n not in ties]
    if not names:
        hint = ""
        if mode == "factorized" and not factorized:
            hint = " (the model has no factorized layers: call alfa.truncate first)"
        elif mode == "factorized" and config.target is not None:
            only_dense = [n for n in dense if pattern.search(n)]
            if only_dense:
                hint = (
                    f" among the factorized layers; it matches only layers left dense ({', '.join(only_dense[:4])}): "
                    "pass layers='dense' or layers='all' to adapt those"
                )
        if tied and not hint:
            hint = f" but layers with tied parameters ({', '.join(tied[:4])}), which are not adapted"
        raise ValueError(f"no layer to adapt: layers={config.layers!r}, target={config.target!r} matched nothing{hint}")
    return names


def attach(model: nn.Module, config: AdapterConfig) -> list[str]:
    """Attach the method described by ``config`` to ``model``, in place, and freeze everything else.

    Returns the names of the adapted layers (or, for model-scope methods, of the trained parameters).
    Layers whose parameters are tied to another module are left out with a ``UserWarning`` (merging into
    them would untie the weights); a ``target`` that matches one is refused with a ``ValueError``.
    Nothing is changed if an error is raised.
    """
    if not isinstance(config, AdapterConfig):
        raise TypeError(f"expected an adapter config (e.g. alfa.AlfaConfig()), got {type(config).__name__}")
    config.validate()
    existing = adapter_state(model)
    if existing is not None:
        raise RuntimeError(
            f"the model already has a {existing.config.method!r} adapter on {len(existing.targets)} "
            f"layers; call alfa.merge or alfa.detach before attaching another"
        )
    requires_grad = {n: p.requires_grad for n, p in model.named_parameters()}
    state = AdapterState(config=config, targets=[], requires_grad=requires_grad)
    if config.scope == "model":
        names = config.select_parameters(model)
        params = dict(model.named_parameters())
        if not names:
            raise ValueError(f"{config.method}: the model has no parameters this method trains")
        state.originals = {n: params[n].detach().clone() for n in names}
        for n, p in params.items():
            p.requires_grad_(n in state.originals)
        state.targets = list(names)
    else:
        names = _candidate_layers(model, config)
        built: dict[str, AdaptedLayer] = {}
        for name in names:  # build every wrapper before touching the model
            base = model.get_submodule(name)
            try:
                built[name] = config.build(base)
            except (ValueError, TypeError) as e:
                raise type(e)(f"{name}: {e}") from e
        for p in model.parameters():
            p.requires_grad_(False)
        for name, layer in built.items():
            layer.train(layer.base.training)
            replace_module(model, name, layer)
            for pname, p in layer.named_parameters():
                p.requires_grad_(not pname.startswith("base."))
        state.targets = names
        guard_save_pretrained(model)  # transformers' save_pretrained would drop the adapted layers
    model._alfa_adapter = state  # type: ignore[assignment]
    return list(state.targets)


def _restore_requires_grad(model: nn.Module, state: AdapterState) -> None:
    for n, p in model.named_parameters():
        p.requires_grad_(state.requires_grad.get(n, True))


def _clear(model: nn.Module) -> None:
    del model._alfa_adapter


def merge(model: nn.Module, densify: bool = False, extend: bool = False) -> list[str]:
    """Fold the attached adapter into the model, in place, and remove it.

    Methods whose update lives in the factorized form (Alfa and its gate/mix variants, Spectral)
    merge back into factors of the same rank: the result has exactly the truncated model's structure
    and parameter count. Methods that add a low-rank ``m×n`` term (the LoRA family) cannot keep a
    factorized layer at its rank: with ``extend=True`` each such layer becomes one exact factorization
    of rank ``d + r`` (PiSSA/MiLoRA: ``d``), with ``densify=True`` a dense layer; without either a
    :class:`MergeError` explains why. Nothing is changed if an error is raised. Returns the merged
    layer (or parameter) names.
    """
    if densify and extend:
        raise ValueError("merge: pass densify=True (dense layers) or extend=True (wider factorizations), not both")
    state = _require_state(model, "merge")
    if state.config.scope == "layer":
        # attach leaves tied layers out, but a tie made afterwards (transformers' tie_weights) would break here.
        ties = shared_parameters(model)
        for name in state.targets:
            if f"{name}.base" in ties:
                raise MergeError(tie_refusal(name, ties[f"{name}.base"], "merge an adapter into"))
        merged = {name: merged_layer(model.get_submodule(name), densify, extend) for name in state.targets}
        for name, new in merged.items():
            replace_module(model, name, new)
    _restore_requires_grad(model, state)
    _clear(model)
    return list(state.targets)


MERGE_FORMS = ("in place", "not mergeable (kept attached)", "densified", "factorized (rank d)", "dense")


def merge_form(model: nn.Module) -> str:
    """How the adapter attached to ``model`` ends up after ``merge(model, densify=True)``, one of
    :data:`MERGE_FORMS`: ``"in place"`` (model-scope methods: the trained parameters are the model),
    ``"not mergeable (kept attached)"`` (some layer's kind is ``"none"``: merging raises),
    ``"densified"`` (a low-rank update of a factorized layer is stored densely; ``merge`` needs
    ``densify=True``), ``"factorized (rank d)"`` (every factorized layer keeps its rank) or ``"dense"``
    (no adapted layer is factorized). Read from the layers' declared merge kinds; nothing is merged.
    """
    state = _require_state(model, "describe how the adapter merges")
    if state.config.scope == "model":
        return "in place"
    layers = [model.get_submodule(name) for name in state.targets]
    if any(layer.merge_kind == "none" for layer in layers):
        return "not mergeable (kept attached)"
    factorized = [layer for layer in layers if layer.base_is_factorized]
    if any(layer.merge_kind == "low-rank" for layer in factorized):
        return "densified"
    return "factorized (rank d)" if factorized else "dense"


@torch.no_grad()
def detach(model: nn.Module) -> list[str]:
    """Remove the attached adapter, in place, restoring the base model exactly as it was."""
    state = _require_state(model, "detach")
    if state.config.scope == "layer":
        for name in state.targets:
            replace_module(model, name, model.get_submodule(name).base)
    else:
        params = dict(model.named_parameters())
        for n, value in state.originals.items():
            params[n].copy_(value)
    _restore_requires_grad(model, state)
    _clear(model)
    return list(state.targets)


def param_groups(
    model: nn.Module,
    lr: float,
    lr_scale: dict[str, float] | None = None,
    weight_decay: float = 0.0,
) -> list[dict[str, Any]]:
    """Optimizer-ready parameter groups of the trainable parameters, split by name.

    ``lr_scale`` maps a regular expression over parameter names to a learning-rate factor; the
    first pattern that matches wins, e.g. ``{r"^layer[34]\\.": 10.0}`` gives ResNet-18's last two
    stages a 10× learning rate (the paper's recipe). Each group carries a ``name``.
    """
    scales = dict(lr_scale or {})
    compiled = {pat: re.compile(pat) for pat in scales}
    groups: dict[str, list[nn.Parameter]] = {"default": []}
    groups.update({pat: [] for pat in scales})
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        key = next((pat for pat, rx in compiled.items() if rx.search(name)), "default")
        groups[key].append(p)
    if not any(groups.values()):
        raise ValueError("the model has no trainable parameters (attach an adapter first)")
    return [
        {"name": key, "params": ps, "lr": lr * scales.get(key, 1.0), "weight_decay": weight_decay}
        for key, ps in groups.items()
        if ps
    ]
