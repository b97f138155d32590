"""The adapters of one model and their life cycle: attach, switch, disable, merge, unmerge, detach.

Everything alfa knows about a model's adapters is one :class:`ModelAdapters` object, stored on the model
as its ``_alfa_adapters`` attribute: the adapters by name (:class:`AdapterState`, in attach order), which
one is active (in the model's forward), whether they are disabled for the moment, and what
:func:`unmerge` needs to undo the last :func:`merge`. A model without adapters (and without a merge to
undo) has no such attribute.

The base layer inside an adapted layer is never modified, so :func:`detach` restores the model bit for
bit, and a merge that keeps the layers' structure can be undone exactly.
"""

from __future__ import annotations

import contextlib
import copy
import itertools
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn
from torch.nn.parameter import is_lazy

from ..surgery import (
    Attachment,
    guard_save_pretrained,
    refuse_compiled_wrapper,
    replace_module,
    require_flags,
    require_module,
    root_refusal,
    shared_parameters,
    tie_refusal,
)
from .config import AdapterConfig, MergeError
from .layer import AdaptedLayer, merged_layer
from .select import candidate_layers, check_sizes, modules_to_save, warn_sizes

__all__ = [
    "DEFAULT_ADAPTER",
    "AdapterState",
    "ModelAdapters",
    "active_adapter",
    "adapted_layers",
    "adapter_names",
    "adapter_parameters",
    "adapter_state",
    "adapter_tensors",
    "attach",
    "delete_adapter",
    "detach",
    "disable_adapters",
    "merge",
    "merge_form",
    "MERGE_FORMS",
    "UNMERGE_FORMS",
    "set_adapter",
    "unmerge",
]

DEFAULT_ADAPTER = "default"
"""The name :func:`attach` and :func:`load_adapter` give an adapter when none is asked for."""

MERGE_FORMS = ("in place", "not mergeable (kept attached)", "densified", "factorized (rank d)", "dense")
UNMERGE_FORMS = ("in place", "factorized (rank d)", "dense")
"""The merge forms (:func:`merge_form`) that :func:`unmerge` can undo: those whose merged layers are in the base
layers' own form (the trained parameters themselves, same-rank factors, dense weights of dense layers)."""

_ATTRIBUTE = "_alfa_adapters"  # where a model holds its ModelAdapters


@dataclass
class AdapterState:
    """Book-keeping of one attached adapter, held by the model's :class:`ModelAdapters`."""

    config: AdapterConfig
    targets: list[str]  # adapted module names, or trained parameter names for model-scope methods
    requires_grad: dict[str, bool] = field(default_factory=dict)  # as before the first attach
    originals: dict[str, Tensor] = field(default_factory=dict)  # model scope: values before training
    name: str = DEFAULT_ADAPTER
    # The adapter's own modules, held here as well as in the model: while another adapter is active (or
    # inside disable_adapters) they are out of the model and this is where they live.
    layers: dict[str, AdaptedLayer] = field(default_factory=dict)  # target name -> its wrapper
    saved: dict[str, nn.Module] = field(default_factory=dict)  # modules_to_save name -> this adapter's copy
    saved_originals: dict[str, nn.Module] = field(default_factory=dict)  # modules_to_save name -> the base's module


def _versions(module: nn.Module) -> list[int]:
    # Every in-place change of a tensor (an optimizer step, copy_, load_state_dict) bumps its version.
    return [t._version for t in itertools.chain(module.parameters(), module.buffers())]


@torch.no_grad()
def _sums(module: nn.Module) -> Tensor:
    """Three sums of each tensor in float64 (its values, their squares, and its values weighted by position) and,
    in a second row, a bound on the size of each (from the sum of absolute values): what sees the changes the
    version counts miss (an edit through ``.data``, tensors swapped in by ``load_state_dict(assign=True)``), values
    moved about included."""
    tensors = [t.detach() for t in itertools.chain(module.parameters(), module.buffers())]
    rows = []
    if tensors:
        # weights in [1, 2) that differ by at least a third between neighbours (the golden ratio's multiples, mod 1):
        # moving values about, two neighbours swapped too, moves this sum far beyond its rounding
        longest = max(t.numel() for t in tensors)
        weights = torch.arange(longest, dtype=torch.float64, device=tensors[0].device)
        weights.mul_(_GOLDEN).remainder_(1.0).add_(1.0)
    for t in tensors:
        flat = t.double().reshape(-1)
        magnitude, square = flat.abs().sum(), flat.square().sum()
        weighted = flat.mul(weights[: flat.numel()].to(flat.device)).sum()
        rows += [(flat.sum(), magnitude), (square, square), (weighted, 2 * magnitude)]
    if not rows:
        return torch.zeros(2, 0, dtype=torch.float64)
    return torch.tensor([[float(v) for v, _ in rows], [float(size) for _, size in rows]], dtype=torch.float64)


def _same_sums(a: Tensor, b: Tensor) -> bool:
    # Not bit for bit: a float64 sum's last bits move with the thread count and the memory layout (channels_last)
    # of the same values, by far less than this fraction of the sum of absolute values. A change of a weight's value
    # moves them by far more.
    if a.shape != b.shape:
        return False
    close = (a[0] - b[0]).abs() <= _SUMS_TOLERANCE * a[1].clamp_min(1.0)
    return bool((close | (a[0].isnan() & b[0].isnan())).all())


_SUMS_TOLERANCE = 1e-9
_GOLDEN = 0.6180339887498949


@dataclass
class _MergeRecord:
    """What :func:`unmerge` needs: the merged adapter as it was attached (its layers hold the base layers,
    which merging never changes) and the layers merge put in their place, with their tensors' versions at
    the merge (so that a change made since is seen, not silently discarded)."""

    state: AdapterState
    merged: dict[str, nn.Module]
    versions: dict[str, list[int]]
    sums: dict[str, Tensor]

    def __deepcopy__(self, memo: dict[int, Any]) -> _MergeRecord:
        # A copied tensor starts a version count of its own: the copy records its own counts where the
        # original layer was unchanged, and a count no tensor has where it was not.
        unchanged = {name: _versions(m) == self.versions[name] for name, m in self.merged.items()}
        state, merged = copy.deepcopy(self.state, memo), copy.deepcopy(self.merged, memo)
        versions = {name: _versions(m) if unchanged[name] else [-1] for name, m in merged.items()}
        memo[id(self)] = out = _MergeRecord(state, merged, versions, dict(self.sums))
        return out

    def change(self, model: nn.Module) -> str | None:
        """What in ``model`` differs from what the merge left, or ``None``."""
        for name, module in itertools.chain(self.merged.items(), self.state.saved.items()):
            try:
                here = model.get_submodule(name)
            except AttributeError:
                return f"the model has no module {name} any more"
            if here is not module:
                return f"{name} is no longer the module the merge left there"
        for name, module in self.merged.items():
            if _versions(module) != self.versions[name] or not _same_sums(_sums(module), self.sums[name]):
                return (
                    f"the weights of {name} changed after the merge (edited, or cast to another dtype) and unmerging "
                    "would discard that change"
                )
        params = dict(model.named_parameters()) if self.state.originals else {}
        for name, value in self.state.originals.items():
            if name not in params or params[name].shape != value.shape:
                return f"the model has no parameter {name} of shape {list(value.shape)} any more"
        return None


@dataclass
class ModelAdapters(Attachment):
    """Everything alfa keeps on a model about its adapters, in one object (the model's ``_alfa_adapters``).

    ``adapters``: every attached adapter by name, in attach order; ``active``: the name of the one in the
    model's forward; ``disabled``: inside :func:`disable_adapters`; after a :func:`merge`, what
    :func:`unmerge` needs to undo it, or why it cannot; ``norm_statistics``: the base's normalization buffers
    (running mean and variance) as the first attach found them, which no adapter holds (:func:`moved_statistics`).
    """

    adapters: dict[str, AdapterState] = field(default_factory=dict)
    active: str | None = None
    disabled: bool = False
    merged: _MergeRecord | None = None
    unmerge_refusal: str | None = None
    norm_statistics: list[tuple[nn.Module, str, Tensor]] = field(default_factory=list)

    def __getstate__(self) -> dict[str, Any]:
        self._refuse_a_copy_while_disabled()  # pickling makes the same copy
        return dict(self.__dict__)

    def _refuse_a_copy_while_disabled(self) -> None:
        if self.disabled:  # the copy's adapter would stay parked, and the copy refuse every change, for good
            raise RuntimeError(
                "cannot copy a model inside alfa.disable_adapters(model): copy it before or after the block"
            )

    def __deepcopy__(self, memo: dict[int, Any]) -> ModelAdapters:
        self._refuse_a_copy_while_disabled()
        copied = object.__new__(type(self))
        memo[id(self)] = copied
        for name, value in self.__dict__.items():
            setattr(copied, name, copy.deepcopy(value, memo))
        return copied

    def active_state(self) -> AdapterState | None:
        """The active adapter's book-keeping (what :func:`adapter_state` returns), or ``None``."""
        return None if self.active is None else self.adapters[self.active]

    def structure_refusal(self, action: str) -> str | None:
        """Attached adapters name the model's layers and parameters: truncating under them is refused."""
        if self.adapters:
            return f"{action} the base model before attaching an adapter (call alfa.detach first)"
        return None

    def holds_nothing(self) -> bool:
        """No adapter and no merge to speak of: the model then carries no ``_alfa_adapters`` at all."""
        return not self.adapters and self.merged is None and self.unmerge_refusal is None


def _adapters(model: nn.Module) -> ModelAdapters | None:
    return getattr(model, _ATTRIBUTE, None)


@contextlib.contextmanager
def merge_kept_on_error(model: nn.Module) -> Iterator[None]:
    """Within it, an attach clears the model's undo of its last merge as ever, and an error puts it back: an
    attach made only to check a file (:func:`alfa.load_adapter`) must leave a merged model undoable on failure."""
    registry = _adapters(model)
    kept = (registry.merged, registry.unmerge_refusal) if registry is not None else (None, None)
    try:
        yield
    except BaseException:
        if registry is not None and kept != (None, None):
            # the same object attach and detach worked on (its normalization statistics with it)
            registry.merged, registry.unmerge_refusal = kept
            _store(model, _adapters(model) or registry)
        raise


def _store(model: nn.Module, registry: ModelAdapters) -> None:
    """Keep ``registry`` on the model, or remove the attribute when it holds nothing (as before any attach)."""
    if not registry.holds_nothing():
        setattr(model, _ATTRIBUTE, registry)
    elif _ATTRIBUTE in vars(model):
        delattr(model, _ATTRIBUTE)


def adapter_state(model: nn.Module) -> AdapterState | None:
    """The active adapter of ``model``, or ``None``."""
    registry = _adapters(model)
    return None if registry is None else registry.active_state()


def _states(model: nn.Module) -> dict[str, AdapterState]:
    registry = _adapters(model)
    return {} if registry is None else registry.adapters


def _refuse_if_disabled(model: nn.Module, action: str) -> None:
    registry = _adapters(model)
    if registry is not None and registry.disabled:
        raise RuntimeError(f"cannot {action} inside alfa.disable_adapters(model): the adapters are out of the model")


def _require_active(model: nn.Module, action: str) -> tuple[ModelAdapters, AdapterState]:
    registry = _adapters(model)
    state = None if registry is None else registry.active_state()
    if registry is None or state is None:
        if registry is not None and registry.merged is not None:  # a second merge, a save after the merge
            raise RuntimeError(f"cannot {action}: the model's adapter is merged already (alfa.unmerge undoes that)")
        raise RuntimeError(f"cannot {action}: the model has no adapter attached (use alfa.attach first)")
    _refuse_if_disabled(model, action)
    return registry, state


def _require_state(model: nn.Module, action: str) -> AdapterState:
    return _require_active(model, action)[1]


def adapter_names(model: nn.Module) -> list[str]:
    """The names of the adapters attached to ``model``, in the order they were attached."""
    return list(_states(model))


def active_adapter(model: nn.Module) -> str | None:
    """The name of the active adapter (the one in the model's forward, and that merge and save act on), or ``None``."""
    state = adapter_state(model)
    return None if state is None else state.name


def adapted_layers(model: nn.Module) -> dict[str, AdaptedLayer]:
    """Module name -> adapted layer, in model order."""
    return {n: m for n, m in model.named_modules() if isinstance(m, AdaptedLayer)}


def adapter_parameters(model: nn.Module) -> dict[str, nn.Parameter]:
    """The trainable tensors of the active adapter (what a per-user artifact stores), by name: its layers' own
    tensors and every parameter of its ``modules_to_save`` copies."""
    state = _require_state(model, "list adapter parameters")
    params = dict(model.named_parameters())
    if state.config.scope == "model":
        return {n: params[n] for n in state.targets}
    out: dict[str, nn.Parameter] = {}
    for name in state.targets:
        layer = model.get_submodule(name)
        for pname, p in layer.named_parameters():
            if not pname.startswith("base."):
                out[f"{name}.{pname}"] = p
    for name, module in state.saved.items():
        for pname, p in module.named_parameters():
            out[f"{name}.{pname}"] = p
    return out


def adapter_tensors(model: nn.Module) -> dict[str, Tensor]:
    """What an adapter file holds: :func:`adapter_parameters` plus the persistent buffers of the
    ``modules_to_save`` copies (a BatchNorm's running statistics are trained along with it)."""
    out: dict[str, Tensor] = dict(adapter_parameters(model))
    for name, module in _require_state(model, "list adapter tensors").saved.items():
        for bname, b in module.state_dict(keep_vars=True).items():
            out.setdefault(f"{name}.{bname}", b)
    return out


def _swap(model: nn.Module, name: str, new: nn.Module) -> None:
    """Put ``new`` at ``name`` on the device and in the train/eval mode of the module it replaces: a parked
    adapter did not follow ``model.to(...)`` or ``model.eval()`` while it was out of the model."""
    old = model.get_submodule(name)
    if old is new:
        return
    ref = next(itertools.chain(old.parameters(), old.buffers()), None)
    tensors = list(itertools.chain(new.parameters(), new.buffers()))
    if ref is not None and any(t.device != ref.device for t in tensors):
        new.to(ref.device)
    if (
        ref is not None
        and ref.is_floating_point()
        and any(t.is_floating_point() and t.dtype != ref.dtype for t in tensors)
    ):
        new.to(ref.dtype)  # Module.to(dtype) casts floating-point tensors only
    new.train(old.training)
    replace_module(model, name, new)


def _park(model: nn.Module, state: AdapterState) -> None:
    """Take the adapter's modules out of the model, putting the base's back (the base is then exactly as before)."""
    for name, layer in state.layers.items():
        _swap(model, name, layer.base)
    for name, original in state.saved_originals.items():
        _swap(model, name, original)


def _activate(model: nn.Module, state: AdapterState) -> None:
    """Put the adapter's modules into the model (the caller records it as the active one)."""
    for name, layer in state.layers.items():
        _swap(model, name, layer)
        layer.refresh_derived()  # a load_state_dict while it was parked may have changed its base
    for name, module in state.saved.items():
        _swap(model, name, module)
    if state.layers:
        guard_save_pretrained(model)  # transformers' save_pretrained would drop the adapted layers


def _train_only(model: nn.Module, state: AdapterState) -> None:
    """``requires_grad`` on exactly the adapter's tensors: every other parameter in the model is frozen."""
    if state.config.scope == "model":
        for n, p in model.named_parameters():
            p.requires_grad_(n in state.originals)
        return
    for p in model.parameters():
        p.requires_grad_(False)
    for layer in state.layers.values():
        for pname, p in layer.named_parameters():
            p.requires_grad_(not pname.startswith("base."))
    for module in state.saved.values():
        for p in module.parameters():
            p.requires_grad_(True)


def _restore_requires_grad(model: nn.Module, state: AdapterState) -> None:
    for n, p in model.named_parameters():
        p.requires_grad_(state.requires_grad.get(n, True))


def _check_adapter_name(name: Any) -> None:
    if not isinstance(name, str) or not name:
        raise ValueError(f"an adapter name must be a non-empty string, got {name!r}")


def attach(model: nn.Module, config: AdapterConfig, name: str = DEFAULT_ADAPTER) -> list[str]:
    """Attach the method described by ``config`` to ``model`` as the adapter ``name``, in place, make it the
    active adapter, and freeze everything else.

    Returns the names of the adapted layers (or, for model-scope methods, of the trained parameters).
    Layers whose parameters are tied to another module are left out with a ``UserWarning`` (merging into
    them would untie the weights); a ``target`` that matches one is refused with a ``ValueError``.

    Several adapters may be attached under different names (each on the base model: the active one is
    taken out while the new one is built); :func:`set_adapter` switches between them. Model-scope methods
    (BitFit, full fine-tuning) train the model's own parameters in place and so refuse to share the model
    with another adapter. ``config.modules_to_save`` modules get a trainable copy of their own, in the
    model while this adapter is active; no layer inside them is adapted. Attaching to a merged model makes
    that merge final (:func:`unmerge` then has nothing to undo). Nothing is changed if an error is raised. The
    adapter keeps a copy of ``config``: changing that object afterwards (to attach it elsewhere) changes neither
    this model nor what :func:`save_adapter` writes.
    """
    if not isinstance(config, AdapterConfig):
        raise TypeError(f"expected an adapter config (e.g. alfa.AlfaConfig()), got {type(config).__name__}")
    require_module(model, "attach")
    refuse_compiled_wrapper(model, "attach")
    lazy = [n for n, p in model.named_parameters() if is_lazy(p)]
    if lazy:
        raise ValueError(
            f"alfa.attach: the model's lazy layers are not initialized yet ({lazy[0]}): run a forward pass first"
        )
    config.validate()
    config = copy.deepcopy(config)
    _check_adapter_name(name)
    _refuse_if_disabled(model, "attach an adapter")
    registry = _adapters(model) or ModelAdapters()
    if not registry.adapters:  # the first adapter on this base (a merge before it is now the base's own)
        registry.norm_statistics = _norm_statistics(model)
    if name in registry.adapters:
        existing = registry.adapters[name]
        raise RuntimeError(
            f"the model already has an adapter named {name!r} (method {existing.config.method!r}) on "
            f"{len(existing.targets)} layer{'s' * (len(existing.targets) != 1)}; call alfa.merge or alfa.detach (or "
            "alfa.delete_adapter) before attaching another, or attach it under another name"
        )
    if registry.adapters:
        model_scope = [s for s in [config, *(s.config for s in registry.adapters.values())] if s.scope == "model"]
        if model_scope:
            raise ValueError(
                f"{model_scope[0].method} trains the model's own parameters in place, so it cannot share the model "
                f"with another adapter (attached: {', '.join(registry.adapters)}); several named adapters need "
                f"methods that wrap layers"
            )
    previous = registry.active_state()
    if previous is not None:
        _park(model, previous)
        requires_grad = previous.requires_grad
    else:
        requires_grad = {n: p.requires_grad for n, p in model.named_parameters()}
    try:
        state = _build_state(model, config, name, requires_grad)
    except BaseException:
        if previous is not None:
            _activate(model, previous)
        else:  # a failure after the base was frozen leaves its flags as they were
            for n, p in model.named_parameters():
                p.requires_grad_(requires_grad.get(n, p.requires_grad))
        raise
    registry.adapters[name] = state
    registry.active = name
    registry.merged = registry.unmerge_refusal = None
    _store(model, registry)
    return list(state.targets)


def _norm_statistics(model: nn.Module) -> list[tuple[nn.Module, str, Tensor]]:
    """A copy of each normalization layer's buffers (BatchNorm's running mean, variance and count), with the
    layer they belong to: the base's, trained by no adapter, yet moved by any forward pass in train mode."""
    return [
        (module, name, buffer.detach().clone())
        for module in model.modules()
        if isinstance(module, nn.modules.batchnorm._NormBase)
        for name, buffer in module.named_buffers(recurse=False)
        if buffer is not None
    ]


def moved_statistics(model: nn.Module) -> list[str]:
    """The base's normalization layers whose running statistics moved since the first adapter was attached (a
    forward pass in train mode): an adapter file does not hold them, so it would not reproduce this model."""
    registry = _adapters(model)
    if registry is None:
        return []
    names = {id(m): n for n, m in model.named_modules()}
    moved = {id(m): m for m, buffer, kept in registry.norm_statistics if _moved(getattr(m, buffer), kept)}
    return [names.get(key, type(m).__name__) for key, m in moved.items()]


def _moved(now: Tensor, kept: Tensor) -> bool:
    """Whether a buffer differs from its copy, compared where it is now and in its dtype now (the model may
    have been moved or cast since the attach); a meta tensor holds no values to compare."""
    if now.is_meta or kept.is_meta:
        return False
    return not torch.equal(now, kept.to(device=now.device, dtype=now.dtype))


def _build_state(model: nn.Module, config: AdapterConfig, name: str, requires_grad: dict[str, bool]) -> AdapterState:
    state = AdapterState(config=config, targets=[], requires_grad=requires_grad, name=name)
    if config.scope == "model":
        names = config.select_parameters(model)
        params = dict(model.named_parameters())
        if not names:
            raise ValueError(f"{config.method}: the model has no parameters this method trains")
        state.originals = {n: params[n].detach().clone() for n in names}
        state.targets = list(names)
        _train_only(model, state)
        return state
    saved = modules_to_save(model, config)
    names = candidate_layers(model, config, saved)
    check_sizes(model, config, names)
    layer_config = config.resolved_for(model, names)
    if "" in names:  # said before anything is built or frozen
        raise ValueError(root_refusal(model))
    built: dict[str, AdaptedLayer] = {}
    failed: dict[str, ValueError | TypeError] = {}
    for layer_name in names:  # build every wrapper before touching the model
        try:
            built[layer_name] = layer_config.build(model.get_submodule(layer_name))
        except (ValueError, TypeError) as e:
            failed[layer_name] = e
    if failed:
        first, e = next(iter(failed.items()))
        if len(failed) < len(names):  # one small layer (a 3-output head) fails the whole attach: how to leave it out
            raise type(e)(f"{first}: {e} (target= can leave it out: the other layers are adapted alike)") from None
        where = first if len(names) == 1 else f"every layer it adapts (the first, {first})"
        raise type(e)(f"{where}: {e}") from None
    warn_sizes(model, config, names)  # once every layer is built: an attach that fails says only why
    state.targets = names
    state.layers = built
    state.saved = {s: copy.deepcopy(model.get_submodule(s)) for s in saved}
    state.saved_originals = {s: model.get_submodule(s) for s in saved}
    _train_only(model, state)  # while the base's modules are in the model: they are frozen too
    _activate(model, state)
    return state


def set_adapter(model: nn.Module, name: str) -> None:
    """Make the adapter ``name`` the active one: the model's forward, :func:`merge`, :func:`save_adapter` and
    :func:`adapter_parameters` then use it. The others stay attached, out of the model, with their tensors and
    ``requires_grad`` flags as they were (an optimizer built on the model's parameters trains only the active one)."""
    _refuse_if_disabled(model, "switch adapters")
    registry = _adapters(model) or ModelAdapters()
    if name not in registry.adapters:
        raise ValueError(f"no adapter named {name!r}; the model has {list(registry.adapters) or 'none'}")
    current = registry.active_state()
    if current is registry.adapters[name]:
        return
    if current is not None:
        _park(model, current)
    _activate(model, registry.adapters[name])
    registry.active = name


def delete_adapter(model: nn.Module, name: str) -> list[str]:
    """Remove the adapter ``name``; the others are untouched. If it was the active one, the first remaining
    adapter (in attach order) becomes active; if it was the only one this is :func:`detach`. Returns the names
    of the adapters left."""
    _refuse_if_disabled(model, "delete an adapter")
    registry = _adapters(model) or ModelAdapters()
    if name not in registry.adapters:
        raise ValueError(f"no adapter named {name!r}; the model has {list(registry.adapters) or 'none'}")
    if len(registry.adapters) == 1:
        detach(model)
        return []
    state = registry.adapters.pop(name)
    if registry.active == name:
        _park(model, state)
        successor = next(iter(registry.adapters.values()))
        _activate(model, successor)
        registry.active = successor.name
    return list(registry.adapters)


@contextlib.contextmanager
def disable_adapters(model: nn.Module) -> Iterator[nn.Module]:
    """``with alfa.disable_adapters(model): ...`` runs the base model: the active adapter's layers and its
    ``modules_to_save`` copies are taken out (the base's modules put back) and restored on leaving, also when
    the block raises. Inside, the outputs are the base's exactly; attaching, switching, merging and saving are
    refused. For model-scope methods (BitFit, full fine-tuning) the trained values are swapped with the base's."""
    registry, state = _require_active(model, "disable adapters")
    trained: dict[str, Tensor] = {}
    if state.config.scope == "model":
        params = dict(model.named_parameters())
        with torch.no_grad():
            for n, value in state.originals.items():
                trained[n] = params[n].detach().clone()
                params[n].copy_(value)
    else:
        _park(model, state)
    registry.disabled = True
    try:
        yield model
    finally:
        registry.disabled = False
        if state.config.scope == "model":
            params = dict(model.named_parameters())
            with torch.no_grad():
                for n, value in trained.items():
                    params[n].copy_(value)
        else:
            _activate(model, state)


def merge(model: nn.Module, *, densify: bool = False, extend: bool = False) -> list[str]:
    """Fold the attached adapter into the model, in place, and remove it.

    Methods whose update lives in the factorized form (Alfa and its gate/mix variants, Spectral)
    merge back into factors of the same rank: the result has exactly the truncated model's structure
    and parameter count. Methods that add a low-rank ``m×n`` term (the LoRA family) cannot keep a
    factorized layer at its rank: with ``extend=True`` each such layer becomes one exact factorization
    of rank ``d + r`` (PiSSA/MiLoRA: ``d``), with ``densify=True`` a dense layer; without either a
    :class:`MergeError` explains why. The adapter's ``modules_to_save`` copies stay in the model in place
    of the originals. With several adapters attached, merging refuses (:class:`MergeError`): the others
    were trained on the unmerged base; :func:`delete_adapter` them first. Nothing is changed if an error
    is raised. Returns the merged layer (or parameter) names. ``densify`` and ``extend`` are keyword-only and must
    be ``True`` or ``False`` (``TypeError`` otherwise).

    For the merge forms :func:`unmerge` can undo (:data:`UNMERGE_FORMS`: merged layers in the base layers' own
    form), the model keeps the adapter aside, with the base layers it replaced (memory the adapter held while
    attached), until :func:`unmerge` puts it back or another adapter is attached. A low-rank update merged
    into factorized layers (form ``"densified"``, with ``densify=True`` or ``extend=True``) replaces them by
    another representation; merge keeps nothing of them.
    """
    require_flags("merge", densify=densify, extend=extend)
    if densify and extend:
        raise ValueError("merge: pass densify=True (dense layers) or extend=True (wider factorizations), not both")
    registry, state = _require_active(model, "merge")
    others = [n for n in registry.adapters if n != state.name]
    if others:
        raise MergeError(
            f"merge folds the active adapter {state.name!r} into the base, but the model also has the adapter(s) "
            f"{others}, trained on the unmerged base; alfa.delete_adapter them (after alfa.save_adapter if you "
            f"need them) before merging"
        )
    form = merge_form(model)
    merged: dict[str, nn.Module] = {}
    if state.config.scope == "layer":
        # attach leaves tied layers out, but a tie made afterwards (transformers' tie_weights) would break here.
        ties = shared_parameters(model)
        for name in state.targets:
            if f"{name}.base" in ties:
                raise MergeError(tie_refusal(name, ties[f"{name}.base"], "merge an adapter into"))
        merged = {
            name: merged_layer(model.get_submodule(name), densify=densify, extend=extend) for name in state.targets
        }
        for name, new in merged.items():
            replace_module(model, name, new)
    _restore_requires_grad(model, state)
    registry.adapters.clear()
    registry.active = None
    if form in UNMERGE_FORMS:
        versions, sums = {n: _versions(m) for n, m in merged.items()}, {n: _sums(m) for n, m in merged.items()}
        registry.merged = _MergeRecord(state, merged, versions, sums)
    else:
        stored = "densely (densify=True)" if densify else "in new factors that hold it (extend=True)"
        kept = ", ".join(repr(f) for f in UNMERGE_FORMS)
        registry.unmerge_refusal = (
            f"cannot unmerge: merging the {state.config.method} adapter {state.name!r} stored the low-rank update of "
            f"its factorized layers {stored}, a 'densified' merge for which merge keeps no copy of the base layers "
            f"(it keeps one only for the merge forms {kept}), so attach or load the adapter on the base model again "
            "instead"
        )
    _store(model, registry)
    return list(state.targets)


def merge_form(model: nn.Module) -> str:
    """How the adapter attached to ``model`` ends up after ``merge(model, densify=True)``, one of
    :data:`MERGE_FORMS`: ``"in place"`` (model-scope methods: the trained parameters are the model),
    ``"not mergeable (kept attached)"`` (some layer's kind is ``"none"``: merging raises),
    ``"densified"`` (a low-rank update of a factorized layer is stored densely; ``merge`` needs
    ``densify=True``), ``"factorized (rank d)"`` (every factorized layer keeps its rank) or ``"dense"``
    (no adapted layer is factorized). Read from the layers' declared merge kinds; nothing is merged.
    """
    state = _require_state(model, "describe how the adapter merges")
    if state.config.scope == "model":
        return "in place"
    layers = [model.get_submodule(name) for name in state.targets]
    if any(layer.merge_kind == "none" for layer in layers):
        return "not mergeable (kept attached)"
    factorized = [layer for layer in layers if layer.base_is_factorized]
    if any(layer.merge_kind == "low-rank" for layer in factorized):
        return "densified"
    return "factorized (rank d)" if factorized else "dense"


def unmerge(model: nn.Module) -> list[str]:
    """Undo the last :func:`merge` of ``model`` exactly: the adapter is attached again as it was before the
    merge (active, its tensors trainable, everything else frozen), and the model computes what the adapted
    model computed, bit for bit. Returns the adapter's layer (or parameter) names.

    Which merges can be undone follows from the merge form (:func:`merge_form`, read before merging):

    - ``"in place"`` (BitFit, full fine-tuning): nothing was folded; the trained values are still the
      model's parameters, and the values before training were kept, so they are the adapter again
      (changes made to them since the merge are the adapter's).
    - ``"factorized (rank d)"`` (merge kind ``"factors"``: Alfa, its variants, Spectral) and ``"dense"``
      (any kind on dense layers): the merged layers have the base layers' structure, and merge kept the
      adapted layers aside with the base layers they hold, which merging never changes; unmerge puts them
      back. If a merged layer was replaced or its weights changed since, unmerge refuses rather than
      discard the change.
    - ``"densified"`` (kind ``"low-rank"``, the LoRA family, on factorized layers): the update was stored
      densely or, with ``extend=True``, in new factors that hold it; either replaces the factorized layers by
      another representation, and merge kept no copy of them: :class:`MergeError`.
    - ``"not mergeable (kept attached)"`` (kind ``"none"``, TPGaze): merge refused, so there is nothing to undo.

    Only the last merge can be undone, and only until another adapter is attached; nothing is changed if an
    error is raised.
    """
    registry = _adapters(model)
    if registry is None or (registry.merged is None and registry.unmerge_refusal is None):
        raise MergeError(
            "cannot unmerge: the model holds no merge to undo (alfa.merge was not called on it, or an adapter was "
            "attached or unmerged since)"
        )
    if registry.merged is None:
        raise MergeError(registry.unmerge_refusal)
    record = registry.merged
    problem = record.change(model)
    if problem is not None:
        raise MergeError(f"cannot unmerge: {problem}")
    state = record.state
    _train_only(model, state)
    _activate(model, state)
    registry.merged = None
    registry.adapters[state.name] = state
    registry.active = state.name
    _store(model, registry)
    return list(state.targets)


@torch.no_grad()
def detach(model: nn.Module) -> list[str]:
    """Remove every attached adapter, in place, restoring the base model exactly as it was (the original
    ``modules_to_save`` modules included, and normalization statistics a forward pass in train mode moved).
    Returns the active adapter's layer (or parameter) names. To remove one of several adapters, use
    :func:`delete_adapter`."""
    state = _require_state(model, "detach")
    if state.config.scope == "layer":
        _park(model, state)
    else:
        params = dict(model.named_parameters())
        for n, value in state.originals.items():
            params[n].copy_(value)
    _restore_requires_grad(model, state)
    for module, buffer, kept in _adapters(model).norm_statistics:  # as the first attach found them
        getattr(module, buffer).copy_(kept)
    delattr(model, _ATTRIBUTE)
    return list(state.targets)
