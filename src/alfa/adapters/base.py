"""The adapter life cycle shared by every method: attach, merge, detach, parameter groups.

A method is a small config dataclass (a subclass of :class:`AdapterConfig`, registered with
:func:`register_method`) plus, for methods that act on layers, an :class:`AdaptedLayer` that wraps
one base layer at the same module path. Methods that train existing parameters (BitFit, full
fine-tuning) set ``scope = "model"`` and only say which parameters to train.

The base layer inside an :class:`AdaptedLayer` is never modified, so :func:`detach` restores the
model bit for bit.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import functools
import itertools
import re
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal, get_args

import torch
from torch import Tensor, nn

from ..layers import LayerSpec, dense_matrix, is_dense_eligible, is_factorized, layer_spec
from ..truncate import guard_save_pretrained, replace_module, shared_parameters, tie_refusal

__all__ = [
    "AdapterConfig",
    "AdaptedLayer",
    "ConfigError",
    "DEFAULT_ADAPTER",
    "active_adapter",
    "adapter_names",
    "adapter_tensors",
    "delete_adapter",
    "disable_adapters",
    "set_adapter",
    "target_matches",
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
DEFAULT_ADAPTER = "default"
"""The name :func:`attach` and :func:`load_adapter` give an adapter when none is asked for."""

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


class ConfigError(ValueError, TypeError):
    """An unknown option given to a config class. A ``ValueError`` like every other invalid option; also a
    ``TypeError``, which is what a plain dataclass raised for it before, so older ``except TypeError`` still works."""


def _refuse_unknown_options(cls: type[AdapterConfig]) -> None:
    # The dataclass __init__ would raise "unexpected keyword argument", which names the option but not the
    # ones that exist; refuse before it with the list, as from_dict does.
    init = cls.__dict__["__init__"]
    names = {f.name for f in dataclasses.fields(cls)}

    @functools.wraps(init)
    def __init__(self: AdapterConfig, *args: Any, **kwargs: Any) -> None:
        unknown = sorted(set(kwargs) - names)
        if unknown:
            raise ConfigError(f"unknown {cls.__name__} option(s) {unknown}; the options are {sorted(names)}")
        init(self, *args, **kwargs)

    cls.__init__ = __init__  # type: ignore[method-assign]


def register_method(cls: type[AdapterConfig]) -> type[AdapterConfig]:
    """Class decorator: make a config known by its ``method`` name (for saving and loading)."""
    if not cls.method:
        raise ValueError(f"{cls.__name__} needs a non-empty `method` name")
    if not cls.display_name or not cls.family:
        raise ValueError(f"{cls.__name__} needs a `display_name` and a `family`")
    if cls.method in METHODS and METHODS[cls.method] is not cls:
        raise ValueError(f"method name {cls.method!r} is already registered by {METHODS[cls.method].__name__}")
    if dataclasses.is_dataclass(cls) and "__init__" in cls.__dict__:
        _refuse_unknown_options(cls)
    METHODS[cls.method] = cls
    return cls


def target_matches(target: str | Sequence[str] | None, name: str) -> bool:
    """Whether a module (or, for model-scope methods, parameter) ``name`` is selected by ``target``: ``None``
    selects everything; a string is a regular expression (``re.search``); a list of names selects ``name`` when
    it equals one of them or ends with ``"." + `` one (PEFT's convention: ``["fc", "conv2"]``)."""
    if target is None:
        return True
    if isinstance(target, str):
        return re.search(target, name) is not None
    return any(name == s or name.endswith("." + s) for s in target)


def _check_names(field_name: str, value: Any) -> None:
    if isinstance(value, str) or not isinstance(value, (list, tuple)):
        raise ValueError(f"{field_name} must be a list of module names, got {value!r}")
    for s in value:
        if not isinstance(s, str) or not s or s.startswith(".") or s.endswith("."):
            raise ValueError(
                f"{field_name} entries must be non-empty module names (no leading or trailing '.'), got {s!r}"
            )


@dataclass
class AdapterConfig:
    """Options every method shares.

    ``target``: which modules are adapted — a regular expression over the dotted module name
    (``re.search``, e.g. ``r"layer[34]\\."``), or a list of module-name suffixes (PEFT's convention: a
    module matches when its name equals one or ends with ``"." + `` one, e.g. ``["conv1", "fc"]``); see
    :func:`target_matches`. ``layers``: which layers are candidates — ``"factorized"``, ``"dense"``
    (plain Linear/Conv2d), ``"all"``, or ``"auto"`` (the factorized layers if the model has any, else the
    dense ones). ``modules_to_save``: module names (matched like a list ``target``) trained in full next to
    the adapter, e.g. a new regression head ``["fc"]``: each adapter gets its own trainable copy, the original
    stays for the base (see :func:`attach`). Every option is checked when the config is made
    (``ValueError`` naming the option; unknown options raise :class:`ConfigError`, a ``ValueError``).
    """

    method: ClassVar[str] = ""
    display_name: ClassVar[str] = ""  # how tables and reports name the method
    family: ClassVar[str] = ""  # "dictionary", "lora", "spectral", "parameters" or "prompt": which tables group it
    scope: ClassVar[str] = "layer"  # "layer": wraps layers; "model": trains existing parameters

    target: str | Sequence[str] | None = None
    layers: str = "auto"
    modules_to_save: Sequence[str] = ()

    def __post_init__(self) -> None:
        # Lists become tuples, so that a config read back from JSON equals the one written.
        if isinstance(self.target, list):
            self.target = tuple(self.target)
        if isinstance(self.modules_to_save, list):
            self.modules_to_save = tuple(self.modules_to_save)
        # A bad option fails where the config is written, not at attach (dataclasses.replace and
        # from_dict go through __init__ too). attach validates again: fields may be set afterwards.
        self.validate()

    def validate(self) -> None:
        """Raise ``ValueError`` on an invalid option."""
        if self.layers not in _LAYER_CHOICES:
            raise ValueError(f"layers must be one of {_LAYER_CHOICES}, got {self.layers!r}")
        if isinstance(self.target, str):
            try:
                re.compile(self.target)
            except re.error as e:
                raise ValueError(f"target {self.target!r} is not a valid regular expression: {e}") from e
        elif self.target is not None:
            if not isinstance(self.target, (list, tuple)):
                raise ValueError(
                    f"target must be a regular expression (str) or a list of module names, got {self.target!r}"
                )
            if not self.target:
                raise ValueError("target is an empty list: it would adapt nothing (None adapts every candidate)")
            _check_names("target", self.target)
        _check_names("modules_to_save", self.modules_to_save)
        if self.modules_to_save and self.scope == "model":
            raise ValueError(
                f"modules_to_save applies to methods that wrap layers; {self.method} already trains the model's own "
                "parameters (widen its target to train more of them)"
            )
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            kind = f.type if isinstance(f.type, str) else getattr(f.type, "__name__", "")
            if kind.endswith(" | None") and value is None:
                continue
            kind = kind.removesuffix(" | None")
            if kind == "int" and (isinstance(value, bool) or not isinstance(value, int)):
                raise ValueError(f"{type(self).__name__}.{f.name} must be an integer, got {value!r}")
            if kind == "float" and (isinstance(value, bool) or not isinstance(value, (int, float))):
                raise ValueError(f"{type(self).__name__}.{f.name} must be a number, got {value!r}")

    def build(self, base: nn.Module) -> AdaptedLayer:
        """Wrap one base layer (layer-scope methods)."""
        raise NotImplementedError(f"{type(self).__name__} does not wrap layers")

    def select_parameters(self, model: nn.Module) -> list[str]:
        """Names of the existing parameters to train (model-scope methods)."""
        raise NotImplementedError(f"{type(self).__name__} does not train existing parameters")

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        # Left out when unused, so that the dict of every config written before the option existed (what
        # adapter files and the gaze stack's cache keys hold) stays the same.
        if not d["modules_to_save"]:
            del d["modules_to_save"]
        else:
            d["modules_to_save"] = list(d["modules_to_save"])
        if isinstance(d["target"], tuple):
            d["target"] = list(d["target"])
        return d

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
    """Book-keeping of one attached adapter, kept on the model: the active one as ``_alfa_adapter`` (what
    :func:`adapter_state` returns), every one by name in ``_alfa_adapters``."""

    config: AdapterConfig
    targets: list[str]  # adapted module names, or trained parameter names for model-scope methods
    requires_grad: dict[str, bool] = field(default_factory=dict)  # as before the first attach
    originals: dict[str, Tensor] = field(default_factory=dict)  # model scope: values before training
    name: str = DEFAULT_ADAPTER
    # The adapter's own modules, held here as well as in the model: while another adapter is active (or
    # inside disable_adapters) they are out of the model and this is where they live.
    layers: dict[str, AdaptedLayer] = field(default_factory=dict)  # target name -> its wrapper
    saved: dict[str, nn.Module] = field(default_factory=dict)  # modules_to_save name -> this adapter's copy
    saved_originals: dict[str, nn.Module] = field(default_factory=dict)  # modules_to_save name -> the base's module


def adapter_state(model: nn.Module) -> AdapterState | None:
    """The active adapter of ``model``, or ``None``."""
    return getattr(model, "_alfa_adapter", None)


def _registry(model: nn.Module) -> dict[str, AdapterState]:
    registry = getattr(model, "_alfa_adapters", None)
    if registry is None:
        state = adapter_state(model)
        registry = {} if state is None else {state.name: state}
    return registry


def _refuse_if_disabled(model: nn.Module, action: str) -> None:
    if getattr(model, "_alfa_disabled", False):
        raise RuntimeError(f"cannot {action} inside alfa.disable_adapters(model): the adapters are out of the model")


def _require_state(model: nn.Module, action: str) -> AdapterState:
    state = adapter_state(model)
    if state is None:
        raise RuntimeError(f"cannot {action}: the model has no adapter attached (use alfa.attach first)")
    _refuse_if_disabled(model, action)
    return state


def adapter_names(model: nn.Module) -> list[str]:
    """The names of the adapters attached to ``model``, in the order they were attached."""
    return list(_registry(model))


def active_adapter(model: nn.Module) -> str | None:
    """The name of the active adapter (the one in the model's forward, and that merge and save act on), or ``None``."""
    state = adapter_state(model)
    return None if state is None else state.name


def adapted_layers(model: nn.Module) -> dict[str, AdaptedLayer]:
    """Module name -> adapted layer, in model order."""
    return {n: m for n, m in model.named_modules() if isinstance(m, AdaptedLayer)}


def adapter_parameters(model: nn.Module) -> dict[str, nn.Parameter]:
    """The trainable tensors of the active adapter (what a per-user artifact stores), by name: its layers' own
    tensors and every parameter of its ``modules_to_save`` copies."""
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
    for name, module in state.saved.items():
        for pname, p in module.named_parameters():
            out[f"{name}.{pname}"] = p
    return out


def adapter_tensors(model: nn.Module) -> dict[str, Tensor]:
    """What an adapter file holds: :func:`adapter_parameters` plus the persistent buffers of the
    ``modules_to_save`` copies (a BatchNorm's running statistics are trained along with it)."""
    out: dict[str, Tensor] = dict(adapter_parameters(model))
    for name, module in _require_state(model, "list adapter tensors").saved.items():
        for bname, b in module.state_dict(keep_vars=True).items():
            out.setdefault(f"{name}.{bname}", b)
    return out


def _module_order(model: nn.Module) -> dict[str, int]:
    return {n: i for i, (n, _) in enumerate(model.named_modules())}


def _resolve_modules_to_save(model: nn.Module, config: AdapterConfig) -> list[str]:
    """The outermost modules named by ``config.modules_to_save``, in model order; refuses a name that matches
    nothing and a module whose parameters are tied to one outside it (its copy would untie them)."""
    if not config.modules_to_save:
        return []
    names = [n for n, _ in model.named_modules() if n]
    hits: set[str] = set()
    for entry in config.modules_to_save:
        found = [n for n in names if target_matches((entry,), n)]
        if not found:
            raise ValueError(f"modules_to_save: the model has no module named {entry!r} (nor ending in '.{entry}')")
        hits.update(found)
    order = _module_order(model)
    chosen = [n for n in sorted(hits, key=order.__getitem__) if not any(n.startswith(o + ".") for o in hits)]
    ties = shared_parameters(model)
    for name in chosen:
        for holder, others in ties.items():
            inside = holder == name or holder.startswith(name + ".")
            outside = [o for o in others if not o.startswith(name + ".")]
            if inside and outside:
                raise ValueError("modules_to_save: " + tie_refusal(name, outside, "train a copy of"))
    return chosen


def _candidate_layers(model: nn.Module, config: AdapterConfig, saved: Sequence[str] = ()) -> list[str]:
    factorized, dense = [], []
    for name, mod in model.named_modules():
        if any(name == s or name.startswith(s + ".") for s in saved):
            continue  # trained in full as a module to save: nothing inside it is adapted
        if is_factorized(mod):
            factorized.append(name)
        elif is_dense_eligible(mod):
            dense.append(name)
    mode = config.layers
    if mode == "auto":
        mode = "factorized" if factorized else "dense"
    names = {"factorized": factorized, "dense": dense, "all": factorized + dense}[mode]
    order = _module_order(model)
    names = sorted(names, key=order.__getitem__)
    if config.target is not None:
        names = [n for n in names if target_matches(config.target, n)]
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
            stacklevel=4,
        )
        names = [n for n in names if n not in ties]
    if not names:
        hint = ""
        if mode == "factorized" and not factorized:
            hint = " (the model has no factorized layers: call alfa.truncate first)"
        elif mode == "factorized" and config.target is not None:
            only_dense = [n for n in dense if target_matches(config.target, n)]
            if only_dense:
                hint = (
                    f" among the factorized layers; it matches only layers left dense ({', '.join(only_dense[:4])}): "
                    "pass layers='dense' or layers='all' to adapt those"
                )
        if tied and not hint:
            hint = f" but layers with tied parameters ({', '.join(tied[:4])}), which are not adapted"
        if saved and not hint:
            hint = f" outside modules_to_save ({', '.join(saved[:4])})"
        raise ValueError(f"no layer to adapt: layers={config.layers!r}, target={config.target!r} matched nothing{hint}")
    return names


def _swap(model: nn.Module, name: str, new: nn.Module) -> None:
    """Put ``new`` at ``name`` on the device and in the train/eval mode of the module it replaces: a parked
    adapter did not follow ``model.to(...)`` or ``model.eval()`` while it was out of the model."""
    old = model.get_submodule(name)
    if old is new:
        return
    ref = next(itertools.chain(old.parameters(), old.buffers()), None)
    tensors = list(itertools.chain(new.parameters(), new.buffers()))
    if ref is not None and any(t.device != ref.device for t in tensors):
        new.to(ref.device)
    if (
        ref is not None
        and ref.is_floating_point()
        and any(t.is_floating_point() and t.dtype != ref.dtype for t in tensors)
    ):
        new.to(ref.dtype)  # Module.to(dtype) casts floating-point tensors only
    new.train(old.training)
    replace_module(model, name, new)


def _park(model: nn.Module, state: AdapterState) -> None:
    """Take the adapter's modules out of the model, putting the base's back (the base is then exactly as before)."""
    for name, layer in state.layers.items():
        _swap(model, name, layer.base)
    for name, original in state.saved_originals.items():
        _swap(model, name, original)


def _activate(model: nn.Module, state: AdapterState) -> None:
    for name, layer in state.layers.items():
        _swap(model, name, layer)
    for name, module in state.saved.items():
        _swap(model, name, module)
    if state.layers:
        guard_save_pretrained(model)
    model._alfa_adapter = state  # type: ignore[assignment]


def _check_adapter_name(name: Any) -> None:
    if not isinstance(name, str) or not name:
        raise ValueError(f"an adapter name must be a non-empty string, got {name!r}")


def attach(model: nn.Module, config: AdapterConfig, name: str = DEFAULT_ADAPTER) -> list[str]:
    """Attach the method described by ``config`` to ``model`` as the adapter ``name``, in place, make it the
    active adapter, and freeze everything else.

    Returns the names of the adapted layers (or, for model-scope methods, of the trained parameters).
    Layers whose parameters are tied to another module are left out with a ``UserWarning`` (merging into
    them would untie the weights); a ``target`` that matches one is refused with a ``ValueError``.

    Several adapters may be attached under different names (each on the base model: the active one is
    taken out while the new one is built); :func:`set_adapter` switches between them. Model-scope methods
    (BitFit, full fine-tuning) train the model's own parameters in place and so refuse to share the model
    with another adapter. ``config.modules_to_save`` modules get a trainable copy of their own, in the
    model while this adapter is active; no layer inside them is adapted. Nothing is changed if an error is
    raised.
    """
    if not isinstance(config, AdapterConfig):
        raise TypeError(f"expected an adapter config (e.g. alfa.AlfaConfig()), got {type(config).__name__}")
    config.validate()
    _check_adapter_name(name)
    _refuse_if_disabled(model, "attach an adapter")
    registry = _registry(model)
    if name in registry:
        existing = registry[name]
        raise RuntimeError(
            f"the model already has a {existing.config.method!r} adapter named {name!r} on {len(existing.targets)} "
            f"layers; call alfa.merge or alfa.detach (or alfa.delete_adapter) before attaching another, or attach "
            f"it under another name"
        )
    if registry:
        model_scope = [s for s in [config, *(s.config for s in registry.values())] if s.scope == "model"]
        if model_scope:
            raise ValueError(
                f"{model_scope[0].method} trains the model's own parameters in place, so it cannot share the model "
                f"with another adapter (attached: {', '.join(registry)}); several named adapters need methods that "
                f"wrap layers"
            )
    previous = adapter_state(model)
    if previous is not None:
        _park(model, previous)
        requires_grad = previous.requires_grad
    else:
        requires_grad = {n: p.requires_grad for n, p in model.named_parameters()}
    try:
        state = _build_state(model, config, name, requires_grad)
    except BaseException:
        if previous is not None:
            _activate(model, previous)
        raise
    registry[name] = state
    model._alfa_adapters = registry  # type: ignore[assignment]
    model._alfa_adapter = state  # type: ignore[assignment]
    return list(state.targets)


def _build_state(model: nn.Module, config: AdapterConfig, name: str, requires_grad: dict[str, bool]) -> AdapterState:
    state = AdapterState(config=config, targets=[], requires_grad=requires_grad, name=name)
    if config.scope == "model":
        names = config.select_parameters(model)
        params = dict(model.named_parameters())
        if not names:
            raise ValueError(f"{config.method}: the model has no parameters this method trains")
        state.originals = {n: params[n].detach().clone() for n in names}
        for n, p in params.items():
            p.requires_grad_(n in state.originals)
        state.targets = list(names)
        return state
    saved = _resolve_modules_to_save(model, config)
    names = _candidate_layers(model, config, saved)
    built: dict[str, AdaptedLayer] = {}
    for layer_name in names:  # build every wrapper before touching the model
        base = model.get_submodule(layer_name)
        try:
            built[layer_name] = config.build(base)
        except (ValueError, TypeError) as e:
            raise type(e)(f"{layer_name}: {e}") from e
    copies = {s: copy.deepcopy(model.get_submodule(s)) for s in saved}
    for p in model.parameters():
        p.requires_grad_(False)
    for layer in built.values():
        for pname, p in layer.named_parameters():
            p.requires_grad_(not pname.startswith("base."))
    for module in copies.values():
        for p in module.parameters():
            p.requires_grad_(True)
    state.targets = names
    state.layers = built
    state.saved = copies
    state.saved_originals = {s: model.get_submodule(s) for s in saved}
    _activate(model, state)  # transformers' save_pretrained would drop the adapted layers: guarded there
    return state


def _restore_requires_grad(model: nn.Module, state: AdapterState) -> None:
    for n, p in model.named_parameters():
        p.requires_grad_(state.requires_grad.get(n, True))


def _clear(model: nn.Module) -> None:
    del model._alfa_adapter
    if hasattr(model, "_alfa_adapters"):
        del model._alfa_adapters


def set_adapter(model: nn.Module, name: str) -> None:
    """Make the adapter ``name`` the active one: the model's forward, :func:`merge`, :func:`save_adapter` and
    :func:`adapter_parameters` then use it. The others stay attached, out of the model, with their tensors and
    ``requires_grad`` flags as they were (an optimizer built on the model's parameters trains only the active one)."""
    _refuse_if_disabled(model, "switch adapters")
    registry = _registry(model)
    if name not in registry:
        raise ValueError(f"no adapter named {name!r}; the model has {list(registry) or 'none'}")
    current = adapter_state(model)
    if current is registry[name]:
        return
    if current is not None:
        _park(model, current)
    _activate(model, registry[name])


def delete_adapter(model: nn.Module, name: str) -> list[str]:
    """Remove the adapter ``name``; the others are untouched. If it was the active one, the first remaining
    adapter (in attach order) becomes active; if it was the only one this is :func:`detach`. Returns the names
    of the adapters left."""
    _refuse_if_disabled(model, "delete an adapter")
    registry = _registry(model)
    if name not in registry:
        raise ValueError(f"no adapter named {name!r}; the model has {list(registry) or 'none'}")
    if len(registry) == 1:
        detach(model)
        return []
    state = registry.pop(name)
    if adapter_state(model) is state:
        _park(model, state)
        _activate(model, next(iter(registry.values())))
    return list(registry)


@contextlib.contextmanager
def disable_adapters(model: nn.Module) -> Iterator[nn.Module]:
    """``with alfa.disable_adapters(model): ...`` runs the base model: the active adapter's layers and its
    ``modules_to_save`` copies are taken out (the base's modules put back) and restored on leaving, also when
    the block raises. Inside, the outputs are the base's exactly; attaching, switching, merging and saving are
    refused. For model-scope methods (BitFit, full fine-tuning) the trained values are swapped with the base's."""
    state = _require_state(model, "disable adapters")
    trained: dict[str, Tensor] = {}
    if state.config.scope == "model":
        params = dict(model.named_parameters())
        with torch.no_grad():
            for n, value in state.originals.items():
                trained[n] = params[n].detach().clone()
                params[n].copy_(value)
    else:
        _park(model, state)
    model._alfa_disabled = True  # type: ignore[assignment]
    try:
        yield model
    finally:
        del model._alfa_disabled
        if state.config.scope == "model":
            params = dict(model.named_parameters())
            with torch.no_grad():
                for n, value in trained.items():
                    params[n].copy_(value)
        else:
            _activate(model, state)


def merge(model: nn.Module, densify: bool = False, extend: bool = False) -> list[str]:
    """Fold the attached adapter into the model, in place, and remove it.

    Methods whose update lives in the factorized form (Alfa and its gate/mix variants, Spectral)
    merge back into factors of the same rank: the result has exactly the truncated model's structure
    and parameter count. Methods that add a low-rank ``m×n`` term (the LoRA family) cannot keep a
    factorized layer at its rank: with ``extend=True`` each such layer becomes one exact factorization
    of rank ``d + r`` (PiSSA/MiLoRA: ``d``), with ``densify=True`` a dense layer; without either a
    :class:`MergeError` explains why. The adapter's ``modules_to_save`` copies stay in the model in place
    of the originals. With several adapters attached, merging refuses (:class:`MergeError`): the others
    were trained on the unmerged base; :func:`delete_adapter` them first. Nothing is changed if an error
    is raised. Returns the merged layer (or parameter) names.
    """
    if densify and extend:
        raise ValueError("merge: pass densify=True (dense layers) or extend=True (wider factorizations), not both")
    state = _require_state(model, "merge")
    others = [n for n in _registry(model) if n != state.name]
    if others:
        raise MergeError(
            f"merge folds the active adapter {state.name!r} into the base, but the model also has the adapter(s) "
            f"{others}, trained on the unmerged base; alfa.delete_adapter them (after alfa.save_adapter if you "
            f"need them) before merging"
        )
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
    """Remove every attached adapter, in place, restoring the base model exactly as it was (the original
    ``modules_to_save`` modules included). Returns the active adapter's layer (or parameter) names. To remove one
    of several adapters, use :func:`delete_adapter`."""
    state = _require_state(model, "detach")
    if state.config.scope == "layer":
        _park(model, state)
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
    weight_decay: float | None = 0.0,
) -> list[dict[str, Any]]:
    """Optimizer-ready parameter groups of the trainable parameters, split by name.

    ``lr_scale`` maps a regular expression over parameter names to a learning-rate factor; the
    first pattern that matches wins, e.g. ``{r"^layer[34]\\.": 10.0}`` gives ResNet-18's last two
    stages a 10× learning rate (the paper's recipe). Each group carries a ``name``.

    ``weight_decay`` is written into every group, so it **overrides the optimizer's own default**
    (``torch.optim.AdamW`` alone would decay by 0.01). The default, ``0.0``, is what this function has always
    written, so the callers that do not pass it (the cost and speed benchmarks, the library tour) keep their
    numbers; the gaze stack passes its configs' value explicitly (``PersonalizeConfig.weight_decay``, 0.01 by
    default). Pass ``None`` to leave the key out and let the optimizer's ``weight_decay`` apply.
    """
    if not lr > 0:
        raise ValueError(f"param_groups: lr must be positive, got {lr!r}")
    if weight_decay is not None and not weight_decay >= 0:
        raise ValueError(f"param_groups: weight_decay must be non-negative or None, got {weight_decay!r}")
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
    out = []
    for key, ps in groups.items():
        if ps:
            group: dict[str, Any] = {"name": key, "params": ps, "lr": lr * scales.get(key, 1.0)}
            if weight_decay is not None:
                group["weight_decay"] = weight_decay
            out.append(group)
    return out
