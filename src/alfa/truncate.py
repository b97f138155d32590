"""SVD truncation of a model's Linear/Conv2d (and transformers Conv1D) layers into factorized layers (spec §2).

The safeguards every structural change shares (tied parameters left alone, transformers' ``save_pretrained``
guarded while alfa layers are in the model, a change refused while something attached to the model
forbids it) are :mod:`alfa.surgery`'s.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from torch import nn
from torch.nn.parameter import is_lazy

from .layers import FactorizedConv2d, FactorizedLinear, is_dense_layer, is_factorized, layer_spec, own_forward
from .surgery import (
    check_target,
    first_entry_left_out,
    guard_save_pretrained,
    refuse_compiled_wrapper,
    replace_module,
    require_module,
    shared_parameters,
    structure_refusal,
    target_matches,
    tie_refusal,
)

__all__ = [
    "DEFAULT_RANK",
    "truncate",
    "canonicalize",
    "TruncationReport",
    "factorized_ranks",
    "restore_structure",
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
        count = len(self.factorized)
        lines = [f"truncated {count} layer{'s' * (count != 1)} at rank {self.rank}"]
        for name, reason in self.left_dense.items():
            lines.append(f"  left dense: {name} ({reason})")
        return "\n".join(lines)


def _skip_reason(module: nn.Module, rank: int) -> str | None:
    if any(is_lazy(p) for p in module.parameters(recurse=False)):
        return "a lazy layer not yet initialized: run a forward pass first"
    custom = own_forward(module)
    if custom is not None:
        return f"{custom} has a forward of its own, which a factorized layer would drop"
    if isinstance(module, nn.Conv2d):
        if module.groups != 1:
            return f"grouped conv (groups={module.groups})"
        if module.padding_mode != "zeros":
            return f"padding_mode={module.padding_mode!r}"
    spec = layer_spec(module)
    m, n = spec.m, spec.n
    d = min(rank, m, n)
    if d * (m + n) >= m * n:
        # a rank above the layer's own is held at min(m, n): the sum is said at the d it was taken with
        capped = "" if d == rank else f" (d = min(m, n) = {d}: the rank asked is above the layer's)"
        return f"no saving: d·(m+n) = {d * (m + n)} ≥ m·n = {m * n}{capped}"
    return None


@torch.no_grad()
def truncate(
    model: nn.Module, rank: int, target: str | Sequence[str] | None = None, *, weights: bool = True
) -> TruncationReport:
    """Replace, in place, every Linear/Conv2d (and transformers ``Conv1D``) whose rank-``rank`` factorization
    is smaller by a :class:`FactorizedLinear`/:class:`FactorizedConv2d` holding its truncated SVD.

    ``target`` selects the modules considered, in the same forms as an adapter config's ``target``
    (:func:`alfa.surgery.target_matches`): a regular expression over the dotted module name (``re.search``), or
    a list of module names, each matching a module named so or ending in ``"." + `` it (``["fc", "conv1"]``);
    a name in the list that selects no layer to truncate is refused (``ValueError``), as attach refuses one.
    Layers where factorizing saves nothing, grouped convs, convs with
    non-zero padding modes and layers whose parameters are tied to another module (see
    :func:`shared_parameters`) are left dense and listed in the returned report; a ``target`` that
    matches a tied layer is refused with a ``ValueError`` (nothing is changed).

    ``weights=False`` makes the same layers, ranks and report without computing any SVD: the factors and biases
    are left as freshly built layers hold them, for counting what truncation would save (``alfa summary``) or for
    a model a truncated checkpoint is then loaded into.
    """
    require_module(model, "truncate")
    refuse_compiled_wrapper(model, "truncate")
    if isinstance(rank, bool) or not isinstance(rank, int) or rank <= 0:
        raise ValueError(f"rank must be a positive integer, got {rank!r}")
    try:
        check_target(target)
    except ValueError as e:
        raise ValueError(f"alfa.truncate: {e}") from None
    refusal = structure_refusal(model, "truncate")
    if refusal is not None:
        raise RuntimeError(refusal)
    _refuse_another_rank(model, rank, target)
    report = TruncationReport(rank=rank)
    candidates = [
        (name, mod)
        for name, mod in model.named_modules()
        if is_dense_layer(mod) and not is_factorized(mod) and target_matches(target, name)
    ]
    _refuse_names_left_out(model, target, [name for name, _ in candidates])
    ties = shared_parameters(model)
    tied = [name for name, _ in candidates if name in ties]
    if tied and target is not None:  # asked for by name: an error, before anything changes
        raise ValueError("alfa.truncate: " + tie_refusal(tied[0], ties[tied[0]], "truncate"))
    for name, mod in candidates:
        if name in ties:
            report.left_dense[name] = f"tied to {', '.join(ties[name])} (shared parameter; truncating would untie it)"
            continue
        reason = _skip_reason(mod, rank)
        if reason is not None:
            report.left_dense[name] = reason
            continue
        if not weights:  # the structure alone: the rank from_dense would keep, no SVD
            spec = layer_spec(mod)
            restore_structure(model, {name: min(rank, spec.m, spec.n)})
            model.get_submodule(name).train(mod.training)
            report.factorized[name] = model.get_submodule(name).rank  # type: ignore[assignment]
            continue
        cls = FactorizedConv2d if isinstance(mod, nn.Conv2d) else FactorizedLinear
        new = cls.from_dense(mod, rank)  # type: ignore[arg-type]
        new.train(mod.training)
        replace_module(model, name, new)
        report.factorized[name] = new.rank
    if not report.factorized:
        already = factorized_ranks(model)
        if already and any(target_matches(target, n) for n in already):
            ranks = sorted(set(already.values()))
            raise ValueError(
                f"the model is already truncated ({len(already)} factorized layers at rank "
                f"{'/'.join(map(str, ranks))}); the layers left dense gain nothing at rank {rank}. Truncate the "
                "dense model again to change the rank"
            )
        reasons = [f"{n}: {r}" for n, r in report.left_dense.items()]
        more = f"; and {len(reasons) - 3} more" if len(reasons) > 3 else ""
        none = "no Linear/Conv2d layer matches it" if target is not None else "no Linear/Conv2d layers"
        detail = "; ".join(reasons[:3]) + more or none
        where = f" matching {target!r}" if target is not None else ""
        raise ValueError(f"no layer{where} can be truncated at rank {rank} ({detail})")
    guard_save_pretrained(model)
    return report


def _refuse_another_rank(model: nn.Module, rank: int, target: str | Sequence[str] | None) -> None:
    """A model truncated at one rank, truncated again at another over the same layers, would keep the first rank
    where it was and give the second only to the layers then left dense: refused before anything changes."""
    other = {
        name: mod.rank
        for name, mod in model.named_modules()
        if is_factorized(mod) and target_matches(target, name) and mod.rank != min(rank, mod.spec.m, mod.spec.n)
    }
    if other:
        first = next(iter(other))
        raise ValueError(
            f"the model is already truncated ({first} at rank {other[first]}, {len(other)} layer"
            f"{'s' * (len(other) != 1)} at another rank than {rank}); truncating again would leave them so and give "
            f"rank {rank} only to the layers still dense. Truncate the dense model once, at the rank you want, or "
            "select the layers to truncate with target="
        )


def _refuse_names_left_out(model: nn.Module, target: object, candidates: list[str]) -> None:
    """A name of a list ``target`` that selects no candidate layer is refused, saying what it names, where the other
    names would have been truncated and this one silently left out (a regular expression selects what it
    matches)."""
    left_out = first_entry_left_out(model, target, candidates, "alfa.truncate")
    if left_out is None:
        return
    entry, name, module = left_out
    if is_factorized(module):
        why = "is factorized already"
    elif any(True for _ in module.children()):
        pattern = "^" + re.escape(name) + r"\."
        why = (
            f"is a {type(module).__name__}: a name selects the module of that name, not the layers inside it "
            f"(the regular expression {pattern!r} selects those)"
        )
    else:
        why = f"is a {type(module).__name__}: truncate factorizes Linear, Conv2d and transformers' Conv1D layers"
    raise ValueError(f"alfa.truncate: target {entry!r} selects no layer to truncate: {name} {why}")


@torch.no_grad()
def canonicalize(model: nn.Module) -> int:
    """Bring every factorized layer back to SVD form (``U`` orthonormal, ``V = S Vᵀ``) without
    changing its weight; call after fine-tuning the factors. Returns the number of layers touched. Refused
    while an adapter is attached: its layers and files name the factors as they are."""
    require_module(model, "canonicalize")
    refusal = structure_refusal(model, "canonicalize")
    if refusal is not None:
        raise RuntimeError(refusal)
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
