"""SVD truncation of a model's Linear/Conv2d (and transformers Conv1D) layers into factorized layers (spec §2).

Also the two model-level safeguards every structural change of alfa shares: tied parameters are found
generically (:func:`shared_parameters`) so that no layer whose weight another module also holds is
replaced (that would silently untie them), and a transformers model that alfa changed refuses its own
``save_pretrained`` while alfa layers are in it (:func:`guard_save_pretrained`), since
``from_pretrained`` would rebuild those layers dense and re-initialize them at random without an error.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from .layers import FactorizedConv2d, FactorizedLinear, is_dense_layer, is_factorized, layer_spec

__all__ = [
    "DEFAULT_RANK",
    "truncate",
    "canonicalize",
    "TruncationReport",
    "replace_module",
    "factorized_ranks",
    "restore_structure",
    "shared_parameters",
    "tie_refusal",
    "guard_save_pretrained",
    "save_pretrained_problem",
    "UnsupportedSaveError",
]

# The paper's SVD rank d for ResNet-18 (spec §2): the one default every command and config reads.
DEFAULT_RANK = 64


@dataclass
class TruncationReport:
    """What :func:`truncate` did: which layers it factorized and which it left dense, and why."""

    rank: int
    factorized: dict[str, int] = field(default_factory=dict)  # name -> rank kept
    left_dense: dict[str, str] = field(default_factory=dict)  # name -> reason

    def __str__(self) -> str:
        lines = [f"truncated {len(self.factorized)} layers at rank {self.rank}"]
        for name, reason in self.left_dense.items():
            lines.append(f"  left dense: {name} ({reason})")
        return "\n".join(lines)


def replace_module(model: nn.Module, name: str, new: nn.Module) -> None:
    """Put ``new`` at the dotted path ``name`` inside ``model``."""
    parent_name, _, child = name.rpartition(".")
    parent = model.get_submodule(parent_name) if parent_name else model
    setattr(parent, child, new)


def shared_parameters(model: nn.Module) -> dict[str, list[str]]:
    """Module name -> the other places (``module.param``) that hold one of the module's own parameters.

    Found by object identity, not by names: a weight tied to another module (GPT-2's ``lm_head.weight``
    is ``transformer.wte.weight``) and a module reachable under two names (a layer shared across depth)
    both show up. Replacing such a module at one of its names would silently untie it.
    """
    owners: dict[int, list[str]] = {}
    own: list[tuple[str, str, int]] = []
    for mod_name, mod in model.named_modules(remove_duplicate=False):
        for p_name, p in mod.named_parameters(recurse=False):
            full = f"{mod_name}.{p_name}" if mod_name else p_name
            owners.setdefault(id(p), []).append(full)
            own.append((mod_name, full, id(p)))
    out: dict[str, list[str]] = {}
    for mod_name, full, key in own:
        for other in owners[key]:
            if other != full and other not in out.setdefault(mod_name, []):
                out[mod_name].append(other)
    return {name: others for name, others in out.items() if others}


def tie_refusal(name: str, others: list[str], action: str) -> str:
    """The message that refuses to ``action`` (truncate, adapt, merge) a layer whose parameters are shared."""
    return (
        f"{name} shares its parameters with {', '.join(others)} (the same Parameter object: tied weights); "
        f"to {action} it alfa would have to replace its weight, which silently unties them (the model grows "
        "and the two copies diverge). Leave it out of `target`; to change it anyway, untie it first (for a "
        "transformers model: tie_word_embeddings=False in its config)"
    )


def _skip_reason(module: nn.Module, rank: int) -> str | None:
    if isinstance(module, nn.Conv2d):
        if module.groups != 1:
            return f"grouped conv (groups={module.groups})"
        if module.padding_mode != "zeros":
            return f"padding_mode={module.padding_mode!r}"
    spec = layer_spec(module)
    m, n = spec.m, spec.n
    d = min(rank, m, n)
    if d * (m + n) >= m * n:
        return f"no saving: d·(m+n) = {d * (m + n)} ≥ m·n = {m * n}"
    return None


@torch.no_grad()
def truncate(model: nn.Module, rank: int, target: str | None = None) -> TruncationReport:
    """Replace, in place, every Linear/Conv2d (and transformers ``Conv1D``) whose rank-``rank`` factorization
    is smaller by a :class:`FactorizedLinear`/:class:`FactorizedConv2d` holding its truncated SVD.

    ``target`` is an optional regular expression; only modules whose dotted name it matches
    (``re.search``) are considered. Layers where factorizing saves nothing, grouped convs, convs with
    non-zero padding modes and layers whose parameters are tied to another module (see
    :func:`shared_parameters`) are left dense and listed in the returned report; a ``target`` that
    matches a tied layer is refused with a ``ValueError`` (nothing is changed).
    """
    if isinstance(rank, bool) or not isinstance(rank, int) or rank <= 0:
        raise ValueError(f"rank must be a positive integer, got {rank!r}")
    if getattr(model, "_alfa_adapter", None) is not None:
        raise RuntimeError("truncate the base model before attaching an adapter (call alfa.detach first)")
    pattern = re.compile(target) if target is not None else None
    report = TruncationReport(rank=rank)
    candidates = [
        (name, mod)
        for name, mod in model.named_modules()
        if is_dense_layer(mod) and not is_factorized(mod) and (pattern is None or pattern.search(name))
    ]
    ties = shared_parameters(model)
    tied = [name for name, _ in candidates if name in ties]
    if tied and pattern is not None:  # asked for by name: an error, before anything changes
        raise ValueError("alfa.truncate: " + tie_refusal(tied[0], ties[tied[0]], "truncate"))
    for name, mod in candidates:
        if name in ties:
            report.left_dense[name] = f"tied to {', '.join(ties[name])} (shared parameter; truncating would untie it)"
            continue
        reason = _skip_reason(mod, rank)
        if reason is not None:
            report.left_dense[name] = reason
            continue
        cls = FactorizedConv2d if isinstance(mod, nn.Conv2d) else FactorizedLinear
        new = cls.from_dense(mod, rank)  # type: ignore[arg-type]
        new.train(mod.training)
        replace_module(model, name, new)
        report.factorized[name] = new.rank
    if not report.factorized:
        already = factorized_ranks(model)
        if already and (pattern is None or any(pattern.search(n) for n in already)):
            ranks = sorted(set(already.values()))
            raise ValueError(
                f"the model is already truncated ({len(already)} factorized layers at rank "
                f"{'/'.join(map(str, ranks))}); the layers left dense gain nothing at rank {rank}. Truncate the "
                "dense model again to change the rank"
            )
        detail = "; ".join(f"{n}: {r}" for n, r in report.left_dense.items()) or "no Linear/Conv2d layers"
        where = f" matching {target!r}" if target is not None else ""
        raise ValueError(f"no layer{where} can be truncated at rank {rank} with a saving ({detail})")
    guard_save_pretrained(model)
    return report


@torch.no_grad()
def canonicalize(model: nn.Module) -> int:
    """Bring every factorized layer back to SVD form (``U`` orthonormal, ``V = S Vᵀ``) without
    changing its weight; call after fine-tuning the factors. Returns the number of layers touched."""
    count = 0
    for mod in model.modules():
        if is_factorized(mod):
            mod.canonicalize_()  # type: ignore[operator]
            count += 1
    return count


def factorized_ranks(model: nn.Module) -> dict[str, int]:
    """Name -> rank of every factorized layer (the structure a checkpoint must record)."""
    return {name: mod.rank for name, mod in model.named_modules() if is_factorized(mod)}


def restore_structure(model: nn.Module, ranks: dict[str, int]) -> None:
    """Swap the named dense layers for empty factorized layers of the given ranks, so that a
    checkpoint of a truncated model can be loaded into a freshly built dense one."""
    for name, rank in ranks.items():
        try:
            mod = model.get_submodule(name)
        except AttributeError as e:
            raise ValueError(f"the model has no layer {name!r} to factorize") from e
        if is_dense_layer(mod) and not isinstance(mod, nn.Conv2d):  # Linear, or Conv1D (transposed)
            spec = layer_spec(mod)
            new: nn.Module = FactorizedLinear(
                spec.in_features, spec.out_features, rank, bias=mod.bias is not None, transposed=spec.transposed
            )
        elif isinstance(mod, nn.Conv2d) and mod.groups == 1:
            new = FactorizedConv2d(
                mod.in_channels,
                mod.out_channels,
                mod.kernel_size,
                rank,
                mod.stride,
                mod.padding,
                mod.dilation,
                bias=mod.bias is not None,
            )
        else:
            raise ValueError(f"layer {name!r} ({type(mod).__name__}) cannot hold a factorized weight")
        ref = next(mod.parameters())
        replace_module(model, name, new.to(device=ref.device, dtype=ref.dtype))
    if ranks:
        guard_save_pretrained(model)


class UnsupportedSaveError(ValueError):
    """Raised by a transformers model's ``save_pretrained`` while alfa layers are in it (see
    :func:`guard_save_pretrained`); the message names what to use instead."""


# Set on alfa.adapters.AdaptedLayer (a layer above this module): how the guard recognizes an adapted layer
# in a model without importing the adapters.
ADAPTED_LAYER_MARK = "is_alfa_adapted_layer"


def _shown(names: list[str]) -> str:
    return ", ".join(names[:3]) + (f", … ({len(names)} in all)" if len(names) > 3 else "")


def save_pretrained_problem(model: nn.Module) -> str | None:
    """Why ``model.save_pretrained`` would not round-trip through ``from_pretrained``, or ``None``.

    Adapted layers and factorized layers are stored under alfa's own names (``base.weight``, ``U``,
    ``V``), which a freshly built transformers model does not have: ``from_pretrained`` would report
    them as missing only in a log line and initialize them at random. Model-scope methods (BitFit, full
    fine-tuning) train the model's own parameters in place, so they round-trip and are allowed.
    """
    cls = type(model).__name__
    adapted = [n for n, m in model.named_modules() if getattr(m, ADAPTED_LAYER_MARK, False)]
    if adapted:
        methods = sorted({m.config.method for m in model.modules() if getattr(m, ADAPTED_LAYER_MARK, False)})
        truncated = any(is_factorized(m) for m in model.modules())
        base_hint = (
            "alfa.save_pretrained(model, directory) (the base is truncated: load it with "
            f"alfa.load_pretrained({cls}, directory))"
            if truncated
            else "model.save_pretrained(directory)"
        )
        return (
            f"{cls}.save_pretrained would lose the {'/'.join(methods)} adapter (alfa) on {len(adapted)} layers "
            f"({_shown(adapted)}): from_pretrained would re-initialize those layers at random, without an error. "
            "Save the adapter with alfa.save_adapter(model, 'adapter.safetensors') (restore it with "
            f"alfa.load_adapter); to save the model itself, alfa.detach(model) or alfa.merge(model) first, then "
            f"{base_hint}"
        )
    factorized = [n for n, m in model.named_modules() if is_factorized(m)]
    if factorized:
        return (
            f"{cls}.save_pretrained would lose the {len(factorized)} layers alfa.truncate factorized "
            f"({_shown(factorized)}): from_pretrained would rebuild them dense and initialize them at random, "
            f"without an error. Use alfa.save_pretrained(model, directory) and alfa.load_pretrained({cls}, "
            "directory), which record the factorized structure"
        )
    return None


class _CheckedSavePretrained:
    """An instance-level ``save_pretrained`` that refuses while alfa layers are in the model, and otherwise
    calls the class's own. A plain object rather than a closure, so that ``copy.deepcopy`` of the model
    copies it pointing at the copy (the memo maps the model to its copy)."""

    def __init__(self, model: nn.Module) -> None:
        self.model = model

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        problem = save_pretrained_problem(self.model)
        if problem is not None:
            raise UnsupportedSaveError(problem)
        return type(self.model).save_pretrained(self.model, *args, **kwargs)


def guard_save_pretrained(model: nn.Module) -> None:
    """Make ``save_pretrained`` of ``model`` and of every transformers model inside it (duck-typed: a class
    with a ``save_pretrained`` method) raise :class:`UnsupportedSaveError` while alfa layers are in it.

    Called by every function that puts alfa layers into a model (truncate, restore_structure, attach). Only
    the model given and the models inside it are guarded: after ``alfa.truncate(model.vit, …)``,
    ``model.vit.save_pretrained`` refuses but the outer ``model.save_pretrained`` does not (alfa never sees
    the outer model); give alfa the model you will save.
    """
    for mod in model.modules():
        if callable(getattr(type(mod), "save_pretrained", None)) and "save_pretrained" not in vars(mod):
            # Module.__setattr__ stores a plain object in the instance dict, where it shadows the class method.
            mod.save_pretrained = _CheckedSavePretrained(mod)
