"""alfa: Attentive Low-rank Filter Adaptation, and the tools around it.

The library, for any PyTorch model (what ``import alfa`` loads)::

    alfa.models    ResNet-18 gaze regressor, CRATE, ViT (named constructors)
    alfa.truncate  SVD truncation into FactorizedConv2d / FactorizedLinear
    alfa.adapters  Alfa and the baselines: attach / merge / unmerge / detach / save / load
    alfa.serve, alfa.export, alfa.checkpoint   many users per batch, ONNX / torch.export, safetensors checkpoints

Built on it, and never imported by it: the gaze application ``alfa.gaze`` (data, training, personalization,
calibration, evaluation, the camera path and the service) and the study ``alfa.study`` (the benchmark and the
generated pages); docs/architecture.md has the layers.

Quick start::

    import alfa
    model = alfa.models.resnet18_gaze()
    alfa.truncate(model, rank=64)
    alfa.attach(model, alfa.AlfaConfig(heads=8, rank=8))
    ...  # train the adapter parameters
    alfa.save_adapter(model, "user-17.safetensors")
    alfa.merge(model)
"""

import os as _os
import sys as _sys


def _wait_passively(modules: dict = _sys.modules, environ: dict = _os.environ) -> None:
    """Ask OpenMP's threads to sleep while they wait for work (``OMP_WAIT_POLICY=PASSIVE``) where nothing chose
    yet: its default, spinning, made a ResNet-18 training step about 4× as slow on the 2-core machine when other
    processes ran beside it, where alone it saved 6 % (docs/gaze.md § OpenMP's waits; the same numbers either
    way). OpenMP reads it once, as torch loads it, so a process that imported torch before alfa, or set the
    variable itself, keeps what it has."""
    if "torch" not in modules:
        environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


_wait_passively()

try:
    from . import models
    from .adapters import (
        DEFAULT_ADAPTER,
        METHODS,
        AdaptedLayer,
        AdapterConfig,
        AdapterFileDamaged,
        AdapterFileError,
        AlfaConfig,
        BitfitConfig,
        ConfigError,
        CorrectionConfig,
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
        active_adapter,
        adapter_names,
        adapter_parameters,
        adapter_state,
        attach,
        delete_adapter,
        detach,
        disable_adapters,
        load_adapter,
        merge,
        merge_form,
        param_groups,
        read_adapter_metadata,
        register_method,
        save_adapter,
        set_adapter,
        unmerge,
    )
    from .checkpoint import load_pretrained, save_pretrained
    from .layers import FactorizedConv2d, FactorizedLinear
    from .serve import MultiUserModel, UnknownUserError
    from .summary import ParameterSummary, parameter_summary, print_trainable_parameters, trainable_parameters_line
    from .surgery import UnsupportedSaveError
    from .truncate import TruncationReport, canonicalize, truncate
except KeyboardInterrupt:
    # ``python -m alfa`` (the way torchrun starts it) imports this package before its ``__main__`` can answer a
    # Ctrl-C; while the module is being located, ``sys.argv[0]`` is "-m". ``import alfa`` elsewhere keeps the
    # interrupt for its caller.
    if _sys.argv[:1] == ["-m"]:
        print("interrupted", file=_sys.stderr)
        raise SystemExit(130) from None
    raise

__version__ = "0.1.0"

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
    "DEFAULT_ADAPTER",
    "METHODS",
    "AdaptedLayer",
    "AdapterConfig",
    "AdapterFileDamaged",
    "AdapterFileError",
    "ConfigError",
    "FactorizedConv2d",
    "FactorizedLinear",
    "MergeError",
    "ParameterSummary",
    "TruncationReport",
    "UnknownUserError",
    "UnsupportedSaveError",
    "active_adapter",
    "adapter_names",
    "adapter_parameters",
    "adapter_state",
    "attach",
    "canonicalize",
    "delete_adapter",
    "detach",
    "disable_adapters",
    "load_adapter",
    "load_pretrained",
    "merge",
    "merge_form",
    "models",
    "param_groups",
    "parameter_summary",
    "print_trainable_parameters",
    "trainable_parameters_line",
    "MultiUserModel",
    "read_adapter_metadata",
    "register_method",
    "save_adapter",
    "save_pretrained",
    "set_adapter",
    "truncate",
    "unmerge",
]
