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
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch
from torch import Tensor, nn

from ..layers import LayerSpec, dense_matrix, is_dense_eligible, is_factorized, layer_spec
from ..truncate import replace_module

__all__ = [
    "AdapterConfig",
    "AdaptedLayer",
    "AdapterState",
    "MergeError",
    "METHODS",
    "register_method",
    "config_from_dict",
    "attach",
    "merge",
    "detach",
    "param_groups",
    "adapter_state",
    "adapted_layers",
    "adapter_parameters",
]

METHODS: dict[str, type[AdapterConfig]] = {}
_LAYER_CHOICES = ("auto", "factorized", "dense", "all")


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

    def validate(self) -> None:
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

    Subclasses implement ``forward`` and ``effective_weight`` (the adapted ``(m, n)`` matrix and
    bias). Methods whose update stays in the factorized form also implement ``effective_factors``
    and set ``factorized_merge = True``; they merge a factorized base back into factors of the same
    rank. The others can merge a factorized base only by densifying it.
    """

    factorized_merge: ClassVar[bool] = False

    def __init__(self, base: nn.Module, config: AdapterConfig) -> None:
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

    def effective_weight(self) -> tuple[Tensor, Tensor | None]:
        raise NotImplementedError

    def effective_factors(self) -> tuple[Tensor, Tensor, Tensor | None]:
        raise NotImplementedError

    def delta_weight(self) -> Tensor:
        """The personalized update ``ΔW`` as an ``(m, n)`` matrix (for analysis and figures)."""
        W, _ = self.effective_weight()
        return W - dense_matrix(self.base)

    @torch.no_grad()
    def merged(self, densify: bool = False) -> nn.Module:
        """A plain layer computing what this adapted layer computes."""
        if self.base_is_factorized and self.factorized_merge:
            U, V, bias = self.effective_factors()
            new = self.spec.make_factorized(U.detach(), V.detach(), None if bias is None else bias.detach())
        elif self.base_is_factorized and not densify:
            raise MergeError(
                f"{self.config.method} adds a dense {self.spec.m}×{self.spec.n} update to a factorized "
                f"layer; merging it would store the dense weight ({self.spec.m * self.spec.n} parameters "
                f"instead of {sum(p.numel() for p in self.base.parameters())}). Pass extend=True to store it "
                f"exactly as a wider factorization, densify=True to merge it densely, or keep the adapter "
                f"unmerged."
            )
        else:
            W, bias = self.effective_weight()
            new = self.spec.make_dense(W.detach(), None if bias is None else bias.detach())
        return new.train(self.training)

    def extra_repr(self) -> str:
        return f"method={self.config.method}"


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
    if not names:
        hint = " (the model has no factorized layers: call alfa.truncate first)" if mode == "factorized" else ""
        raise ValueError(f"no layer to adapt: layers={config.layers!r}, target={config.target!r} matched nothing{hint}")
    return names


def attach(model: nn.Module, config: AdapterConfig) -> list[str]:
    """Attach the method described by ``config`` to ``model``, in place, and freeze everything else.

    Returns the names of the adapted layers (or, for model-scope methods, of the trained parameters).
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
    model._alfa_adapter = state  # type: ignore[assignment]
    return list(state.targets)


def _restore_requires_grad(model: nn.Module, state: AdapterState) -> None:
    for n, p in model.named_parameters():
        p.requires_grad_(state.requires_grad.get(n, True))


def _clear(model: nn.Module) -> None:
    del model._alfa_adapter


def _merged_layer(layer: AdaptedLayer, densify: bool, extend: bool) -> nn.Module:
    extended = getattr(layer, "merged_extended", None)
    if extend and extended is not None and layer.base_is_factorized and not layer.factorized_merge:
        return extended()
    return layer.merged(densify=densify)


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
    state = _require_state(model, "merge")
    if state.config.scope == "layer":
        merged = {name: _merged_layer(model.get_submodule(name), densify, extend) for name in state.targets}
        for name, new in merged.items():
            replace_module(model, name, new)
    _restore_requires_grad(model, state)
    _clear(model)
    return list(state.targets)


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
