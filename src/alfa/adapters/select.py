"""Which modules of a model an adapter config selects: the layers it adapts, the modules it trains in full."""

from __future__ import annotations

import contextlib
import contextvars
import warnings
from collections.abc import Iterator, Sequence

from torch import nn

from ..layers import is_dense_eligible, is_factorized, layer_spec, own_forward
from ..surgery import first_entry_left_out, shared_parameters, tie_refusal
from .config import AdapterConfig, target_matches

__all__ = [
    "candidate_layers",
    "modules_to_save",
    "check_sizes",
    "warn_sizes",
    "sizes_said_before",
    "largest_layer",
    "SIZE_OPTIONS",
]


def _module_order(model: nn.Module) -> dict[str, int]:
    return {n: i for i, (n, _) in enumerate(model.named_modules())}


def modules_to_save(model: nn.Module, config: AdapterConfig) -> list[str]:
    """The outermost modules named by ``config.modules_to_save``, in model order; refuses a name that matches
    nothing and a module whose parameters are tied to one outside it (its copy would untie them)."""
    if not config.modules_to_save:
        return []
    names = [n for n, _ in model.named_modules() if n]
    hits: set[str] = set()
    for entry in config.modules_to_save:
        found = [n for n in names if target_matches((entry,), n)]
        if not found:
            raise ValueError(f"modules_to_save: the model has no module named {entry!r} (nor ending in '.{entry}')")
        hits.update(found)
    order = _module_order(model)
    chosen = [n for n in sorted(hits, key=order.__getitem__) if not any(n.startswith(o + ".") for o in hits)]
    ties = shared_parameters(model)
    for name in chosen:
        for holder, others in ties.items():
            inside = holder == name or holder.startswith(name + ".")
            outside = [o for o in others if not o.startswith(name + ".")]
            if inside and outside:
                raise ValueError("modules_to_save: " + tie_refusal(name, outside, "train a copy of"))
    return chosen


def candidate_layers(model: nn.Module, config: AdapterConfig, saved: Sequence[str] = ()) -> list[str]:
    """The names of the layers ``config`` adapts, in model order: its ``layers`` kind, matched by its ``target``,
    outside the modules to save ``saved``. Tied layers are left out with a ``UserWarning`` (refused when named by
    ``target``); a selection of nothing raises ``ValueError`` with a hint."""
    factorized, dense, custom = [], [], []
    for name, mod in model.named_modules():
        if any(name == s or name.startswith(s + ".") for s in saved):
            continue  # trained in full as a module to save: nothing inside it is adapted
        if is_factorized(mod):
            factorized.append(name)
        elif is_dense_eligible(mod):
            dense.append(name)
        elif own_forward(mod) is not None:
            custom.append(name)
    mode = config.layers
    if mode == "auto":
        mode = "factorized" if factorized else "dense"
    names = {"factorized": factorized, "dense": dense, "all": factorized + dense}[mode]
    order = _module_order(model)
    names = sorted(names, key=order.__getitem__)
    if config.target is not None:
        names = [n for n in names if target_matches(config.target, n)]
    if names:
        _refuse_entries_left_out(model, config, names, saved)
    ties = shared_parameters(model)
    tied = [n for n in names if n in ties]
    if tied and config.target is not None:  # asked for by name: refuse now rather than untie on merge
        raise ValueError(f"{config.method}: " + tie_refusal(tied[0], ties[tied[0]], "adapt (and later merge)"))
    if tied and not _SIZES_SAID_BEFORE.get():  # load_adapter: said when the file's adapter was attached
        listed = "; ".join(f"{n} (tied to {', '.join(ties[n])})" for n in tied)
        warnings.warn(
            f"alfa.attach ({config.method}) leaves out {len(tied)} layer(s) whose parameters are tied to another "
            f"module: {listed}. Merging an adapter into them would untie the weights",
            UserWarning,
            stacklevel=4,
        )
    if tied:
        names = [n for n in names if n not in ties]
    if not names:
        hint = ""
        if mode == "factorized" and not factorized:
            hint = " (the model has no factorized layers: call alfa.truncate first)"
        elif mode == "factorized" and config.target is not None:
            only_dense = [n for n in dense if target_matches(config.target, n)]
            if only_dense:
                hint = (
                    f" among the factorized layers; it matches only layers left dense ({', '.join(only_dense[:4])}): "
                    "pass layers='dense' or layers='all' to adapt those"
                )
        if config.target is not None and not hint:
            other = [
                (n, m)
                for n, m in model.named_modules()
                if n and target_matches(config.target, n) and not (is_factorized(m) or is_dense_eligible(m))
            ]
            if other:
                hint = f"; it names {other[0][0]}, {not_adaptable(other[0][1])}"
        if custom and mode != "factorized" and not hint:
            listed = _named_classes(model, custom)
            hint = f"; the dense layers' classes have a forward of their own, which an adapter would bypass: {listed}"
        if tied and not hint:
            hint = f" but layers with tied parameters ({', '.join(tied[:4])}), which are not adapted"
        if saved and not hint:
            hint = f" outside modules_to_save ({', '.join(saved[:4])})"
        raise ValueError(f"no layer to adapt: layers={config.layers!r}, target={config.target!r} matched nothing{hint}")
    _warn_custom_left_out(model, config, custom if mode != "factorized" else [])
    return names


ADAPTED_KINDS = "Linear, transformers' Conv1D and ungrouped Conv2d layers with zero padding, and their factorized forms"
ADAPTABLE = f"cannot be adapted: alfa adapts {ADAPTED_KINDS}"


def _named_classes(model: nn.Module, names: Sequence[str]) -> str:
    """The first four of ``names`` with their classes (``0 (ScaledLinear), 2 (ScaledLinear)``) and how many more."""
    listed = ", ".join(f"{n} ({type(model.get_submodule(n)).__name__})" for n in names[:4])
    return listed + (f" and {len(names) - 4} more" if len(names) > 4 else "")


def _warn_custom_left_out(model: nn.Module, config: AdapterConfig, custom: Sequence[str]) -> None:
    """A dense layer whose class computes its own way is left out, and said so: it would be adapted were it plain."""
    names = [n for n in custom if config.target is None or target_matches(config.target, n)]
    if names:
        warnings.warn(
            f"alfa.attach ({config.method}) leaves out {len(names)} layer(s) whose class has a forward of its own, "
            f"which an adapter would bypass: {_named_classes(model, names)}",
            UserWarning,
            stacklevel=5,
        )


def not_adaptable(module: nn.Module) -> str:
    """Why ``module`` cannot be adapted, after "it is" (a subclass computing its own way says so)."""
    custom = own_forward(module)
    if custom is not None:
        bypass = "whose class has a forward of its own, which an adapter would bypass"
        return f"{_article(custom)} {custom}, {bypass}: alfa adapts {ADAPTED_KINDS}"
    name = type(module).__name__
    return f"{_article(name)} {name}, which {ADAPTABLE}"


def _article(name: str) -> str:
    """``a`` or ``an`` before a class name, by its first letter ("an Embedding", "a Conv2d")."""
    return "an" if name[:1].lower() in "aeio" else "a"


def _refuse_entries_left_out(
    model: nn.Module, config: AdapterConfig, selected: Sequence[str], saved: Sequence[str]
) -> None:
    """A name in a ``target`` list that selects none of the layers adapted is refused, saying why (a misspelt
    name, a module of a kind that cannot be adapted, a dense layer under ``layers='factorized'``), where the
    other names would have been adapted and this one silently left out (PEFT refuses an unsupported target too)."""
    left_out = first_entry_left_out(model, config.target, selected, config.method)
    if left_out is None:
        return
    entry, name, module = left_out
    inside = [s for s in saved if name == s or name.startswith(s + ".")]
    if inside:
        why = f"is trained in full as modules_to_save {inside[0]!r}"
    elif is_factorized(module):
        why = "is factorized: pass layers='factorized' or layers='all' to adapt it"
    elif is_dense_eligible(module):
        why = f"is left dense under layers={config.layers!r}: pass layers='dense' or layers='all' to adapt it"
    else:
        why = f"is {not_adaptable(module)}"
    raise ValueError(f"{config.method}: target {entry!r} selects no layer: {name} {why}")


SIZE_OPTIONS = ("rank", "heads", "dense_rank")
"""The options of a method that size its tensors by the layer (a rank, a number of heads, the SVD rank of a dense
layer's dictionary)."""


def largest_layer(
    model: nn.Module, config: AdapterConfig, names: Sequence[str] | None = None
) -> tuple[str, int, int] | None:
    """The layer ``config`` adapts (of ``names``, default: the layers it selects) with the largest rank, as ``(name,
    outputs, inputs)``; ``None`` where no layer has a plain shape."""
    if names is None:
        names = candidate_layers(model, config, modules_to_save(model, config))
    sizes: dict[str, tuple[int, int]] = {}
    for name in names:
        try:
            spec = layer_spec(model.get_submodule(name))
        except (ValueError, TypeError, AttributeError):
            continue  # a layer of another kind: its method says what it accepts
        sizes[name] = (spec.m, spec.n)
    if not sizes:
        return None
    largest = max(sizes, key=lambda n: min(sizes[n]))
    return largest, *sizes[largest]


def check_sizes(model: nn.Module, config: AdapterConfig, names: Sequence[str] | None = None) -> None:
    """Refuse, before anything is built, a ``rank``, ``heads`` or ``dense_rank`` larger than every layer ``config``
    adapts (of ``names``, default: the layers it selects): a rank cannot exceed ``min(out, in)`` of a layer, and a
    far larger one would allocate for minutes before anything else is said. A dictionary method's ``rank`` above
    the dictionary size ``d`` of every layer is refused too (:func:`dictionary_sizes`). ``ValueError`` saying the
    bound."""
    if names is None:
        names = candidate_layers(model, config, modules_to_save(model, config))
    found = largest_layer(model, config, names)
    if found is None:
        return
    largest, m, n = found
    # a file's adapter, made where the dictionary's bound was not refused yet, loads as made; otherwise a dictionary
    # method's rank is bounded by the dictionary's d (at most the layer's min(out, in)), said below, not the looser
    # layer's bound here, which a rank under it would then meet as another bound
    said_before = _SIZES_SAID_BEFORE.get()
    dictionary_rank = None if said_before else _dictionary_rank(config)
    bound = min(m, n)
    for option in SIZE_OPTIONS:
        value = getattr(config, option, None)
        if option == "rank" and dictionary_rank is not None:
            continue
        if isinstance(value, int) and not isinstance(value, bool) and value > bound:
            raise ValueError(
                f"{config.method}: {option} {value} is larger than every layer it adapts (the largest, {largest}, "
                f"maps {n} inputs to {m} outputs): at most {bound}"
            )
    if not said_before:
        _refuse_rank_above_every_dictionary(model, config, names)


def _refuse_rank_above_every_dictionary(model: nn.Module, config: AdapterConfig, names: Sequence[str]) -> None:
    rank, sizes = _dictionary_rank(config), dictionary_sizes(model, config, names)
    if rank is not None and sizes and rank > max(sizes.values()):
        widest = max(sizes, key=sizes.__getitem__)
        raise ValueError(
            f"{config.method}: rank {rank} is larger than the dictionary of every layer it adapts (the largest, "
            f"{widest}, has d = {sizes[widest]}): at most {sizes[widest]}. Its low-rank terms act on a layer's "
            "d-dimensional dictionary, so a rank above d adds parameters, not an update rank d cannot express"
        )


def _dictionary_rank(config: AdapterConfig) -> int | None:
    """The ``rank`` of a dictionary method (Alfa's heads, LinearMix's mix): bounded by each layer's ``d``."""
    rank = getattr(config, "rank", None)
    if config.family != "dictionary" or isinstance(rank, bool) or not isinstance(rank, int):
        return None
    return rank


def dictionary_sizes(model: nn.Module, config: AdapterConfig, names: Sequence[str]) -> dict[str, int]:
    """The dictionary size ``d`` a dictionary method gets on each of the layers ``names``: a factorized layer's rank,
    or for a dense layer the rank of its SVD, ``dense_rank`` clamped to ``min(m, n)`` (spec §2)."""
    dense_rank = getattr(config, "dense_rank", None)
    sizes: dict[str, int] = {}
    for name in names:
        module = model.get_submodule(name)
        if is_factorized(module):
            sizes[name] = int(module.rank)  # type: ignore[arg-type]
            continue
        try:
            spec = layer_spec(module)
        except (ValueError, TypeError, AttributeError):
            continue  # a layer of another kind: its method says what it accepts
        sizes[name] = min(dense_rank or min(spec.m, spec.n), spec.m, spec.n)
    return sizes


_SIZES_SAID_BEFORE = contextvars.ContextVar("alfa_sizes_said_before", default=False)


@contextlib.contextmanager
def sizes_said_before() -> Iterator[None]:
    """Within it, :func:`warn_sizes` and the note of tied layers left out say nothing and :func:`check_sizes` does
    not refuse a dictionary rank above ``d``: ``load_adapter`` attaches a file's config, on the base that file was
    made on, where attaching it said so then (a server loading each user's file would repeat it), and a file made
    before that refusal existed (alfa accepted such a rank until 2026-12-06) must still load as it was made."""
    token = _SIZES_SAID_BEFORE.set(True)
    try:
        yield
    finally:
        _SIZES_SAID_BEFORE.reset(token)


def warn_sizes(model: nn.Module, config: AdapterConfig, names: Sequence[str]) -> None:
    """Say, once per attach, which layers do not get a size option in full (after :func:`check_sizes`, which refuses
    one that no layer gets): a ``dense_rank`` above a dense layer's rank gives that layer its full SVD (the spec's
    clamp of ``d`` to ``min(m, n)``), and a dictionary method's ``rank`` above a layer's ``d`` makes its low-rank
    terms full rank there (rank ``d`` would express the same updates with fewer parameters). ``UserWarning``
    naming the layers and their ``d``."""
    if _SIZES_SAID_BEFORE.get():
        return
    dense_rank = getattr(config, "dense_rank", None)
    sizes = dictionary_sizes(model, config, names) if config.family == "dictionary" else {}
    if isinstance(dense_rank, int):
        clipped = [n for n, d in sizes.items() if d < dense_rank and not is_factorized(model.get_submodule(n))]
        if clipped:
            warnings.warn(
                f"alfa.attach ({config.method}): dense_rank {dense_rank} is above the rank of {len(clipped)} dense "
                f"layer(s), whose dictionary is their full SVD instead: {_with_sizes(clipped, sizes)}",
                UserWarning,
                stacklevel=4,
            )
    rank = _dictionary_rank(config)
    above = [n for n, d in sizes.items() if rank is not None and d < rank]
    if above:
        warnings.warn(
            f"alfa.attach ({config.method}): rank {rank} is above the dictionary size d of {len(above)} layer(s), "
            f"where its low-rank terms are full rank (rank d would express the same updates with fewer parameters): "
            f"{_with_sizes(above, sizes)}",
            UserWarning,
            stacklevel=4,
        )


def _with_sizes(names: Sequence[str], sizes: dict[str, int]) -> str:
    """``a (d = 96), b (d = 96)`` for the first four of ``names``, and how many more."""
    listed = ", ".join(f"{n} (d = {sizes[n]})" for n in names[:4])
    return listed + (f" and {len(names) - 4} more" if len(names) > 4 else "")
