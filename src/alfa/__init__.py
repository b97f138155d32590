"""alfa: Attentive Low-rank Filter Adaptation, and the tools around it.

The data flow, one module per stage::

    alfa.data      synthetic gaze worlds and loaders for the real datasets
    alfa.models    ResNet-18 gaze regressor, CRATE, ViT (named constructors)
    alfa.truncate  SVD truncation into FactorizedConv2d / FactorizedLinear
    alfa.adapters  Alfa and the baselines: attach / merge / detach / save / load
    alfa.gaze      geometry, losses, source training, personalization, evaluation
    alfa.bench     the benchmark runner and the generated report

Quick start::

    import alfa
    model = alfa.models.resnet18_gaze()
    alfa.truncate(model, rank=64)
    alfa.attach(model, alfa.AlfaConfig(heads=8, rank=8))
    ...  # train the adapter parameters
    alfa.save_adapter(model, "user-17.safetensors")
    alfa.merge(model)
"""

from . import models
from .adapters import (
    METHODS,
    AdaptedLayer,
    AdapterConfig,
    AdapterFileError,
    AlfaConfig,
    BitfitConfig,
    DiagGateConfig,
    DictionaryMixConfig,
    DoraConfig,
    FloraConfig,
    FullFinetuneConfig,
    LinearMixConfig,
    LoraConfig,
    MergeError,
    MiloraConfig,
    MosloraConfig,
    PissaConfig,
    SpectralConfig,
    TPGazeConfig,
    adapter_parameters,
    adapter_state,
    attach,
    detach,
    load_adapter,
    merge,
    param_groups,
    read_adapter_metadata,
    register_method,
    save_adapter,
)
from .layers import FactorizedConv2d, FactorizedLinear
from .summary import ParameterSummary, parameter_summary
from .truncate import TruncationReport, canonicalize, truncate

__version__ = "0.1.0"

__all__ = [
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
    "DictionaryMixConfig",
    "FactorizedConv2d",
    "FactorizedLinear",
    "MergeError",
    "ParameterSummary",
    "TruncationReport",
    "adapter_parameters",
    "adapter_state",
    "attach",
    "canonicalize",
    "detach",
    "load_adapter",
    "merge",
    "models",
    "param_groups",
    "parameter_summary",
    "read_adapter_metadata",
    "register_method",
    "save_adapter",
    "truncate",
]
