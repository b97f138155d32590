"""Model-scope baselines: BitFit (biases and normalization affines) and full fine-tuning (spec §5).

These train parameters the model already has, so there is nothing to wrap and nothing to merge:
the per-user artifact is the trained tensors themselves (``alfa.save_adapter`` stores them), and
``alfa.detach`` restores their values from before training. ``target`` (a regular expression over
parameter names, ``re.search``, or a list of parameter-name suffixes) narrows the selection.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

from torch import nn

from .config import AdapterConfig, register_method, target_matches

__all__ = ["BitfitConfig", "FullFinetuneConfig", "NORM_LAYERS", "is_norm_layer"]

# Layers whose weight is an affine (scale) of a normalization, trained by BitFit along with biases.
NORM_LAYERS: tuple[type[nn.Module], ...] = (
    nn.modules.batchnorm._NormBase,  # BatchNorm*, InstanceNorm*, SyncBatchNorm
    nn.LayerNorm,
    nn.GroupNorm,
    *((nn.RMSNorm,) if hasattr(nn, "RMSNorm") else ()),
)


def is_norm_layer(module: nn.Module) -> bool:
    """A normalization layer: one of :data:`NORM_LAYERS`, or a leaf module whose class name ends in ``Norm``, as the
    model libraries name their own (``LlamaRMSNorm``, ``T5LayerNorm``, Mistral's, Qwen's, Gemma's), which are no
    subclass of torch's."""
    if isinstance(module, NORM_LAYERS):
        return True
    return type(module).__name__.endswith("Norm") and next(module.children(), None) is None


def _filter(model: nn.Module, method: str, names: list[str], target: str | Sequence[str] | None) -> list[str]:
    """The ``names`` ``target`` selects; a name in a ``target`` list that selects none of them is refused, saying
    why (misspelt, or a parameter this method does not train), as the layer methods refuse theirs."""
    chosen = [n for n in names if target_matches(target, n)]
    if isinstance(target, (list, tuple)):
        for entry in target:
            if any(target_matches((entry,), n) for n in chosen):
                continue
            others = [n for n, _ in model.named_parameters() if target_matches((entry,), n)]
            why = (
                f"names {others[0]}, which {method} does not train"
                if others
                else f"the model has no parameter named {entry!r} (nor ending in '.{entry}')"
            )
            raise ValueError(f"{method}: target {entry!r} selects no parameter: {why}")
    return chosen


@register_method
@dataclass(kw_only=True)
class BitfitConfig(AdapterConfig):
    """BitFit: train every bias and every normalization layer's affine weight, nothing else."""

    method: ClassVar[str] = "bitfit"
    display_name: ClassVar[str] = "BitFit"
    family: ClassVar[str] = "parameters"
    scope: ClassVar[str] = "model"

    def select_parameters(self, model: nn.Module) -> list[str]:
        names = []
        for mod_name, mod in model.named_modules():
            is_norm = is_norm_layer(mod)
            for p_name, _ in mod.named_parameters(recurse=False):
                if p_name == "bias" or is_norm:
                    names.append(f"{mod_name}.{p_name}" if mod_name else p_name)
        order = {n: i for i, (n, _) in enumerate(model.named_parameters())}
        return _filter(model, self.method, sorted(names, key=order.__getitem__), self.target)


@register_method
@dataclass(kw_only=True)
class FullFinetuneConfig(AdapterConfig):
    """Full fine-tuning: train every parameter of the model."""

    method: ClassVar[str] = "full"
    display_name: ClassVar[str] = "full fine-tune"
    family: ClassVar[str] = "parameters"
    scope: ClassVar[str] = "model"

    def select_parameters(self, model: nn.Module) -> list[str]:
        return _filter(model, self.method, [n for n, _ in model.named_parameters()], self.target)
