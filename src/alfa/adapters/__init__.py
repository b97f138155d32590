"""Adapter methods and their shared life cycle (attach / merge / detach / save / load).

Each method lives in its own module: a config dataclass registered by name plus, for methods that
wrap layers, an :class:`~alfa.adapters.base.AdaptedLayer` subclass.
"""

from .alfa import AlfaConfig, AlfaLayer, DictionaryMixConfig
from .base import (
    METHODS,
    AdaptedLayer,
    AdapterConfig,
    MergeError,
    adapted_layers,
    adapter_parameters,
    adapter_state,
    attach,
    config_from_dict,
    detach,
    merge,
    param_groups,
    register_method,
)
from .io import AdapterFileError, base_fingerprint, load_adapter, read_adapter_metadata, save_adapter

__all__ = [
    "METHODS",
    "AdaptedLayer",
    "AdapterConfig",
    "AdapterFileError",
    "AlfaConfig",
    "AlfaLayer",
    "DictionaryMixConfig",
    "MergeError",
    "adapted_layers",
    "adapter_parameters",
    "adapter_state",
    "attach",
    "base_fingerprint",
    "config_from_dict",
    "detach",
    "load_adapter",
    "merge",
    "param_groups",
    "read_adapter_metadata",
    "register_method",
    "save_adapter",
]
