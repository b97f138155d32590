"""What every adapter method's config shares: options, validation, and the registry of methods by name.

A method is a small config dataclass (a subclass of :class:`AdapterConfig`, registered with
:func:`register_method`) plus, for methods that act on layers, an adapted layer
(:class:`~alfa.adapters.layer.AdaptedLayer`) that wraps one base layer at the same module path. Methods
that train existing parameters (BitFit, full fine-tuning) set ``scope = "model"`` and only say which
parameters to train. The model-level life cycle (attach, merge, unmerge, detach) is
:mod:`alfa.adapters.state`'s.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import math
import types
import typing
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, get_args, get_origin

from torch import nn

from ..surgery import check_names, check_target, target_matches

__all__ = [
    "AdapterConfig",
    "ConfigError",
    "MergeError",
    "METHODS",
    "register_method",
    "config_from_dict",
    "target_matches",
]

METHODS: dict[str, type[AdapterConfig]] = {}
_LAYER_CHOICES = ("auto", "factorized", "dense", "all")


class MergeError(RuntimeError):
    """Raised when an adapter cannot be merged (or a merge undone) the way it was asked to."""


class ConfigError(ValueError, TypeError):
    """An unknown option given to a config class. A ``ValueError`` like every other invalid option; also a
    ``TypeError``, which is what a plain dataclass raised for it before, so older ``except TypeError`` still works."""


def unknown_options_message(cls: type, unknown: list[str], names: set[str]) -> str:
    """The line refusing ``unknown`` options of config class ``cls``: the options it has (``names``), and for each
    unknown one the closest of them where one is close (a misspelling)."""
    close = {u: difflib.get_close_matches(u, sorted(names), n=1) for u in unknown}
    hints = [f"{u!r}: did you mean {c[0]!r}?" for u, c in close.items() if c]
    return f"unknown {cls.__name__} options: {', '.join(unknown)}; the options are {', '.join(sorted(names))}" + (
        f" ({'; '.join(hints)})" if hints else ""
    )


def _refuse_unknown_options(cls: type[AdapterConfig]) -> None:
    # The dataclass __init__ would raise "unexpected keyword argument", which names the option but not the
    # ones that exist; refuse before it with the list, as from_dict does.
    init = cls.__dict__["__init__"]
    names = {f.name for f in dataclasses.fields(cls)}

    @functools.wraps(init)
    def __init__(self: AdapterConfig, *args: Any, **kwargs: Any) -> None:
        unknown = sorted(set(kwargs) - names)
        if unknown:
            raise ConfigError(unknown_options_message(cls, unknown, names))
        init(self, *args, **kwargs)

    cls.__init__ = __init__  # type: ignore[method-assign]


def register_method(cls: type[AdapterConfig]) -> type[AdapterConfig]:
    """Class decorator: make a config known by its ``method`` name (for saving and loading).

    ``cls`` must be a subclass of :class:`AdapterConfig` (a dataclass of the method's options) with the class
    attributes ``method`` (its name), ``display_name`` and ``family``; anything else is a ``TypeError``."""
    if not (isinstance(cls, type) and issubclass(cls, AdapterConfig)):
        what = f"the class {cls.__name__}" if isinstance(cls, type) else f"a {type(cls).__name__} ({cls!r})"
        raise TypeError(
            "alfa.register_method takes a subclass of alfa.AdapterConfig (a dataclass of the method's options with "
            f"the class attributes method, display_name and family: class MyConfig(alfa.AdapterConfig)), got {what}"
        )
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


@functools.cache
def _number_fields(cls: type) -> dict[str, tuple[type, bool]]:
    """The int and float fields of a config class: name -> (``int`` or ``float``, whether ``None`` is allowed).

    Read from the resolved annotations, not their text: a class written without ``from __future__ import
    annotations`` holds real types (``float``, ``float | None``) and ``Optional[float]`` is other text, and
    each of them went unchecked while the text was matched.
    """
    try:
        hints = typing.get_type_hints(cls)
    except (NameError, TypeError):
        # A name only a type checker sees (imported under TYPE_CHECKING): resolve field by field, so that
        # the number fields beside it are still checked.
        hints = {}
        for f in dataclasses.fields(cls):
            try:
                hints[f.name] = typing.get_type_hints(_annotated(f.name, cls))["x"]
            except (NameError, TypeError, SyntaxError):
                continue
    out = {}
    for f in dataclasses.fields(cls):
        hint, optional = hints.get(f.name), False
        if get_origin(hint) in (typing.Union, types.UnionType):
            args = get_args(hint)
            optional = type(None) in args
            rest = [a for a in args if a is not type(None)]
            hint = rest[0] if len(rest) == 1 else None
        if hint is int or hint is float:
            out[f.name] = (hint, optional)
    return out


def _annotated(name: str, cls: type) -> type:
    # A stand-in holding one field's annotation in the module of the class that wrote it, for get_type_hints.
    owner = next(c for c in cls.__mro__ if name in c.__dict__.get("__annotations__", {}))
    annotation = owner.__dict__["__annotations__"][name]
    return type("_OneField", (), {"__annotations__": {"x": annotation}, "__module__": owner.__module__})


@dataclass(kw_only=True)
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
    # Trains input prompts with an optimizer and recipe of its own (TPGaze), not the weights through the shared one.
    trains_prompts: ClassVar[bool] = False
    # Changes the frozen base weights themselves (PiSSA and MiLoRA rewrite them, DoRA rescales them): its users
    # cannot share one base, so alfa.serve refuses them, and a command can say so before it trains any.
    changes_base: ClassVar[bool] = False

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
        check_target(self.target)
        check_names("modules_to_save", self.modules_to_save)
        if self.modules_to_save and self.scope == "model":
            raise ValueError(
                f"modules_to_save applies to methods that wrap layers; {self.method} already trains the model's own "
                "parameters (widen its target to train more of them)"
            )
        for name, (kind, optional) in _number_fields(type(self)).items():
            value = getattr(self, name)
            if optional and value is None:
                continue
            if kind is int and (isinstance(value, bool) or not isinstance(value, int)):
                raise ValueError(f"{type(self).__name__}.{name} must be an integer, got {value!r}")
            if kind is float and (isinstance(value, bool) or not isinstance(value, (int, float))):
                raise ValueError(f"{type(self).__name__}.{name} must be a number, got {value!r}")
            # An infinite scale or σ passes every sign check and turns the attached model's outputs into NaN.
            if kind is float and isinstance(value, float) and not math.isfinite(value):
                raise ValueError(f"{type(self).__name__}.{name} must be a finite number, got {value!r}")

    def build(self, base: nn.Module) -> nn.Module:
        """Wrap one base layer in the method's :class:`~alfa.adapters.layer.AdaptedLayer` (layer-scope methods)."""
        raise NotImplementedError(f"{type(self).__name__} does not wrap layers")

    def resolved_for(self, model: nn.Module, targets: Sequence[str]) -> AdapterConfig:
        """The config :func:`~alfa.adapters.state.attach` builds the layers ``targets`` of ``model`` with.

        ``self`` for a method whose options say everything its layers need. A method whose layers need a fact
        of the model that the options leave open returns a copy that knows it (TPGaze measures its prompts'
        input sizes on the model). ``self`` is never changed: it stays the adapter's recorded (and saved)
        config, and a copy compares equal to it.
        """
        return self

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
        if unknown:  # the constructor's class of error, whichever way the config is made
            raise ConfigError(unknown_options_message(cls, unknown, names))
        return cls(**data)


def config_from_dict(method: str, data: dict[str, Any]) -> AdapterConfig:
    """Rebuild a config from its method name and :meth:`AdapterConfig.to_dict` output."""
    if method not in METHODS:
        raise ValueError(f"unknown adapter method {method!r}; known: {', '.join(sorted(METHODS))}")
    return METHODS[method].from_dict(data)
