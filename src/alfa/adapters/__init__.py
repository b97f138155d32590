"""Adapter methods and their shared life cycle (attach / merge / detach / save / load).

Each method lives in its own module: a config dataclass registered by name plus, for methods that
wrap layers, an :class:`~alfa.adapters.base.AdaptedLayer` subclass that declares its merge kind.
Every registered config class is exported under its class name.
"""

# isort: off
# The modules are imported in this order on purpose: methods register in it, and tables that list
# every method (alfa.study.bench.costs) keep the registry's order within each family. LoRA's module comes
# before MoSLoRA, DoRA and FLoRA (which extend it) and Spectral (which reuses its SVD).
from . import alfa, gate, lora, moslora, dora, flora, spectral, bitfit, prompt  # noqa: F401

# isort: on
from .alfa import AlfaLayer, DictionaryAdapter
from .base import (
    DEFAULT_ADAPTER,
    MERGE_FORMS,
    MERGE_KINDS,
    METHODS,
    AdaptedLayer,
    AdapterConfig,
    ConfigError,
    MergeError,
    MergeKind,
    active_adapter,
    adapted_layers,
    adapter_names,
    adapter_parameters,
    adapter_state,
    adapter_tensors,
    attach,
    config_from_dict,
    delete_adapter,
    detach,
    disable_adapters,
    merge,
    merge_form,
    param_groups,
    register_method,
    set_adapter,
    target_matches,
)
from .io import (
    AdapterFileError,
    base_fingerprint,
    has_compact_form,
    load_adapter,
    read_adapter_metadata,
    save_adapter,
    tensor_checksum,
)
from .prompt import TPGAZE_TARGET, PromptedConv

# Every registered config class (AlfaConfig, LoraConfig, ...) by its class name: a new method is
# exported as soon as its module is imported above, with no list to keep in step.
CONFIG_CLASSES: dict[str, type[AdapterConfig]] = {cls.__name__: cls for cls in METHODS.values()}
globals().update(CONFIG_CLASSES)

__all__ = [
    *CONFIG_CLASSES,
    "CONFIG_CLASSES",
    "DEFAULT_ADAPTER",
    "MERGE_FORMS",
    "MERGE_KINDS",
    "METHODS",
    "TPGAZE_TARGET",
    "AdaptedLayer",
    "AdapterConfig",
    "AdapterFileError",
    "AlfaLayer",
    "ConfigError",
    "DictionaryAdapter",
    "MergeError",
    "MergeKind",
    "PromptedConv",
    "active_adapter",
    "adapted_layers",
    "adapter_names",
    "adapter_parameters",
    "adapter_state",
    "adapter_tensors",
    "attach",
    "base_fingerprint",
    "config_from_dict",
    "delete_adapter",
    "detach",
    "disable_adapters",
    "has_compact_form",
    "load_adapter",
    "merge",
    "merge_form",
    "param_groups",
    "read_adapter_metadata",
    "tensor_checksum",
    "register_method",
    "save_adapter",
    "set_adapter",
    "target_matches",
]
