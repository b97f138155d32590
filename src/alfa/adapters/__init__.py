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
from .bitfit import BitfitConfig, FullFinetuneConfig
from .dora import DoraConfig
from .flora import FloraConfig
from .gate import DiagGateConfig, LinearMixConfig
from .io import AdapterFileError, base_fingerprint, load_adapter, read_adapter_metadata, save_adapter
from .lora import LoraConfig, MiloraConfig, PissaConfig
from .moslora import MosloraConfig
from .prompt import TPGAZE_TARGET, PromptedConv, TPGazeConfig
from .spectral import SpectralConfig

__all__ = [
    "TPGAZE_TARGET",
    "PromptedConv",
    "TPGazeConfig",
    "BitfitConfig",
    "FullFinetuneConfig",
    "DoraConfig",
    "FloraConfig",
    "DiagGateConfig",
    "LinearMixConfig",
    "LoraConfig",
    "MiloraConfig",
    "PissaConfig",
    "MosloraConfig",
    "SpectralConfig",
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
