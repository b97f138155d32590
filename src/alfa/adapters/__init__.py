"""Adapter methods and their shared life cycle (attach / merge / unmerge / detach / save / load).

The core, by role: :mod:`~alfa.adapters.config` (the options every method shares, the registry of methods
by name, the errors), :mod:`~alfa.adapters.layer` (the adapted-layer contract and its merge kinds),
:mod:`~alfa.adapters.select` (which modules a config selects), :mod:`~alfa.adapters.state` (a model's
adapters: attach, switch, disable, merge, unmerge, detach), :mod:`~alfa.adapters.groups` (optimizer
parameter groups) and :mod:`~alfa.adapters.io` (adapter files). Each method lives in its own module: a
config dataclass registered by name plus, for methods that wrap layers, an
:class:`~alfa.adapters.layer.AdaptedLayer` subclass that declares its merge kind. Every registered config
class is exported under its class name (``tests/test_adapter_contract.py`` checks that none is missing).
"""

# isort: off
# The modules are imported in this order on purpose: methods register in it, and tables that list
# every method (alfa.study.bench.costs) keep the registry's order within each family. LoRA's module comes
# before MoSLoRA, DoRA and FLoRA (which extend it) and Spectral (which reuses its SVD).
from .alfa import AlfaConfig, AlfaLayer, DictionaryAdapter, DictionaryMixConfig
from .gate import DiagGateConfig, LinearMixConfig
from .lora import LoraConfig, MiloraConfig, PissaConfig
from .moslora import MosloraConfig
from .dora import DoraConfig
from .flora import FloraConfig
from .spectral import SpectralConfig
from .bitfit import BitfitConfig, FullFinetuneConfig
from .prompt import TPGAZE_TARGET, PromptedConv, TPGazeConfig
from .correction import CorrectionConfig  # user calibration's form; last, so the others keep their order

# isort: on
from .config import METHODS, AdapterConfig, ConfigError, MergeError, config_from_dict, register_method, target_matches
from .groups import param_groups
from .io import (
    AdapterFileDamaged,
    AdapterFileError,
    base_fingerprint,
    base_rest_fingerprint,
    has_compact_form,
    load_adapter,
    read_adapter_metadata,
    save_adapter,
    tensor_checksum,
)
from .layer import MERGE_KINDS, AdaptedLayer, MergeKind, merged_layer
from .state import (
    DEFAULT_ADAPTER,
    MERGE_FORMS,
    UNMERGE_FORMS,
    AdapterState,
    ModelAdapters,
    active_adapter,
    adapted_layers,
    adapter_names,
    adapter_parameters,
    adapter_state,
    adapter_tensors,
    attach,
    delete_adapter,
    detach,
    disable_adapters,
    merge,
    merge_form,
    set_adapter,
    unmerge,
)

# Every registered config class by its class name (what the report tables and the command look up).
CONFIG_CLASSES: dict[str, type[AdapterConfig]] = {cls.__name__: cls for cls in METHODS.values()}

__all__ = [
    "AlfaConfig",
    "BitfitConfig",
    "CorrectionConfig",
    "DiagGateConfig",
    "DictionaryMixConfig",
    "DoraConfig",
    "FloraConfig",
    "FullFinetuneConfig",
    "LinearMixConfig",
    "LoraConfig",
    "MiloraConfig",
    "MosloraConfig",
    "PissaConfig",
    "SpectralConfig",
    "TPGazeConfig",
    "CONFIG_CLASSES",
    "DEFAULT_ADAPTER",
    "MERGE_FORMS",
    "MERGE_KINDS",
    "METHODS",
    "TPGAZE_TARGET",
    "UNMERGE_FORMS",
    "AdaptedLayer",
    "AdapterConfig",
    "AdapterFileDamaged",
    "AdapterFileError",
    "AdapterState",
    "AlfaLayer",
    "ConfigError",
    "DictionaryAdapter",
    "MergeError",
    "MergeKind",
    "ModelAdapters",
    "PromptedConv",
    "active_adapter",
    "adapted_layers",
    "adapter_names",
    "adapter_parameters",
    "adapter_state",
    "adapter_tensors",
    "attach",
    "base_fingerprint",
    "base_rest_fingerprint",
    "config_from_dict",
    "delete_adapter",
    "detach",
    "disable_adapters",
    "has_compact_form",
    "load_adapter",
    "merge",
    "merge_form",
    "merged_layer",
    "param_groups",
    "read_adapter_metadata",
    "tensor_checksum",
    "register_method",
    "save_adapter",
    "set_adapter",
    "target_matches",
    "unmerge",
]
