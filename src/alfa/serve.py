"""Many users in one batch on one shared base: :class:`MultiUserModel`.

A factorized layer computes ``y = U (V x) + b``. Alfa (and every dictionary method) personalizes it as
``V_adapt = (I + T_u) V``, one ``d×d`` matrix per user and layer, so for a batch that mixes users the layer can
run the **shared** ``V`` for the whole batch, mix each sample's ``d`` channels with its own ``I + T_u``, and apply
the shared ``U``: nothing of the base is copied per user, and a user costs its ``T`` matrices. LoRA-family users
(``W' = W + P_u Q_u``) are served the same way with a per-sample low-rank branch (the S-LoRA idea: the shared
layer once, each sample's own ``P_u Q_u`` on the side). A user calibration (the ``correction`` method: a dense
``ΔW_u, Δb_u`` on a small head, e.g. a per-person offset or affine map of the output, or FAZE's adapted gaze MLP)
is served the same way on the layers it corrects, which stay dense: ``layer(h) + ΔW_u h + Δb_u`` per sample; it
needs no factorization, so a dense base serves such users too. Every output equals that user's own adapted
(or merged) model up to float round-off; a sample of no known user is refused, and ``None`` runs the base.
The layers are Conv2d (channels right after the batch, N×C×H×W) or Linear (channels last, with any number of
dimensions between: a transformer's N×tokens×C), so CNNs and the registry's CRATE and ViT models are served alike.
"""

from __future__ import annotations

import contextlib
import copy
import os
import tempfile
import threading
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from .adapters import adapter_state, detach, load_adapter, save_adapter
from .adapters.alfa import DictionaryAdapter
from .adapters.config import AdapterConfig
from .adapters.correction import CorrectionLayer
from .adapters.lora import LowRankUpdateLayer
from .adapters.state import _refuse_if_disabled
from .layers import is_dense_layer, is_factorized, layer_spec, refuse_scripting
from .surgery import is_compiled_wrapper, replace_module, require_module

__all__ = ["MethodNotServed", "MultiUserModel", "MixedBatchModel", "UnknownUserError", "UserTerms", "serve_refusal"]

UserTerms = dict[str, tuple[Tensor, ...]]
"""Per layer name, a user's terms: ``(T,)`` for a dictionary method, ``(P, Q)`` for a low-rank one, ``(P, Q, Δb)``
for a correction with a bias term."""


class MethodNotServed(ValueError):
    """An adapter of a method that a shared base cannot serve per sample, whatever the file holds
    (:func:`serve_refusal` says why): the file fits, the method does not."""


class UnknownUserError(KeyError, ValueError):
    """A user id that the :class:`MultiUserModel` does not serve. A ``KeyError`` (what callers that look users up
    catch, the HTTP service among them) and a ``ValueError`` (what the library raises for bad input)."""

    def __str__(self) -> str:
        # KeyError's own str is the repr of its argument: the message would print inside quotes.
        return str(self.args[0]) if self.args else ""


def _user_list(users: Sequence[str | None]) -> list[str | None]:
    """``users`` as a list, refusing a bare str (a sequence of characters, not of user ids)."""
    if isinstance(users, str):
        raise ValueError(f"users must be a list of user ids, one per sample, not the str {users!r} (pass [{users!r}])")
    return list(users)


def _refuse_unknown(users: Sequence[str | None], known: dict[str, list[str]]) -> None:
    # Kept in order of first appearance: ids of mixed types (a str and an int) do not sort.
    unknown = list(dict.fromkeys(u for u in users if u is not None and (not isinstance(u, str) or u not in known)))
    if unknown:
        raise UnknownUserError(f"unknown user(s): {unknown[:5]}")


def _refuse_train_mode(served: nn.Module) -> None:
    """A served model runs in eval mode: in train mode a BatchNorm would move the statistics every user shares."""
    if any(m.training for m in served.modules()):
        raise RuntimeError(
            f"{type(served).__name__} serves in eval mode: call .eval() (in train mode the base's BatchNorm "
            "statistics would change for every user)"
        )


class _CallLock:
    """A re-entrant lock held for a served model's call. Its layers keep one call's state (the batch's users, a
    mix) while the model runs, so two threads inside one instance at once would give one thread's samples the
    other's users. A copy of the model (``copy.deepcopy``, pickle) gets a lock of its own: a lock cannot be copied,
    and a copy shares no call with the original."""

    def __init__(self) -> None:
        self._lock = threading.RLock()

    def __enter__(self) -> None:
        self._lock.acquire()

    def __exit__(self, *exc: object) -> None:
        self._lock.release()

    def __reduce__(self):  # noqa: ANN204 — pickle's protocol
        return (_CallLock, ())

    def around_call(self) -> Any:
        """The context a served model's call runs in: this lock, or none while torch traces the call (a graph
        traced for export or compilation holds no Python lock, and strict ``torch.export`` refuses one)."""
        if torch.compiler.is_compiling() or torch.jit.is_tracing():
            return contextlib.nullcontext()
        return self


def _with_locks(module: nn.Module, state: dict[str, Any], names: tuple[str, ...]) -> None:
    """``nn.Module.__setstate__`` plus the call locks a model pickled before they existed lacks (each copy gets
    locks of its own, as :class:`_CallLock` does in a pickle)."""
    nn.Module.__setstate__(module, state)
    for name in names:
        if name not in module.__dict__:
            module.__dict__[name] = _CallLock()


def _refuse_unservable_base(base: nn.Module, cls: str) -> None:
    """A ``TypeError`` in one line for a base that is no module (a path, a config) or a ``torch.compile`` wrapper
    (whose layer names all start with ``_orig_mod.``, so no user's adapter file, made on the model itself, fits
    it), rather than an ``AttributeError`` here or a refusal naming ``alfa.load_adapter`` at the next user."""
    require_module(base, cls)
    note = (  # its users are a list of str: torch.compile guards on it
        " (it compiles again for each new list of users in a batch, up to torch's recompile limit, then runs the "
        "others uncompiled)"
        if cls == "MultiUserModel"
        else ""
    )
    if is_compiled_wrapper(base):
        raise TypeError(
            f"alfa.{cls}: the base is a torch.compile wrapper, whose layer names all start with '_orig_mod.' (no "
            f"user's adapter fits them): give the uncompiled module (base._orig_mod), and compile the served model "
            f"if wanted, torch.compile(alfa.{cls}(base)){note}"
        )


def _wrap_factorized(base: nn.Module, wrapper: type[_ServedLayer]) -> tuple[nn.Module, dict[str, _ServedLayer]]:
    """A copy of ``base`` in eval mode with every factorized layer inside ``wrapper(layer)``; the wrappers by name."""
    model = copy.deepcopy(base).eval()
    names = [n for n, m in model.named_modules() if is_factorized(m)]
    for name in names:
        replace_module(model, name, wrapper(model.get_submodule(name), name))
    return model, {n: model.get_submodule(n) for n in names}  # type: ignore[misc]


_READ_THROUGH = frozenset(
    ("in_features", "out_features", "nx", "nf", "in_channels", "out_channels", "kernel_size", "stride", "padding")
    + ("dilation", "groups", "padding_mode")
)
"""What model code reads off a layer besides its weight and bias, answered by the served layer's base."""


class _ServedLayer(nn.Module):
    """A layer of the shared base inside a served model: it answers what model code reads off the layer it
    replaced (``weight``, ``bias``, the geometry), as the base does, and counts the weight's reads and its own
    calls, so that a user's term on a layer the model computes with through ``.weight`` alone (as
    ``nn.MultiheadAttention`` does with its ``out_proj``) is refused rather than silently left out."""

    def __init__(self, base: nn.Module, name: str) -> None:
        super().__init__()
        self.base = base
        self.layer_name = name
        self.calls = self.weight_reads = 0

    @property
    def weight(self) -> Tensor:
        self.weight_reads += 1
        return self.base.weight

    @property
    def bias(self) -> Tensor | None:
        return self.base.bias

    def __prepare_scriptable__(self) -> nn.Module:  # torch.jit.script's hook: refused in one line
        return refuse_scripting(
            self,
            "a served layer",
            "compile the served model (torch.compile), or export MixedBatchModel (torch.export; ONNX with "
            "alfa.export.export_onnx_with_inputs)",
        )

    def __getattr__(self, name: str):  # noqa: ANN204 — nn.Module's own lookup first, then the base's geometry
        try:
            return super().__getattr__(name)
        except AttributeError:
            if name in _READ_THROUGH:
                return getattr(super().__getattr__("base"), name)
            raise


def _mixed(z: Tensor, T: Tensor, kind: str) -> Tensor:
    """Each sample's ``d`` dictionary channels mixed by its own ``I + T`` (``T``: B×d×d).

    Where the channels sit depends on the layer: a conv's ``z`` is B×d×H×W (channels right after the batch), a
    linear layer's is B×…×d (channels last, any number of token dimensions between, e.g. B×tokens×d in a
    transformer). Each layout gets its own contraction, so neither is permuted or copied to fit the other.
    """
    if kind == "linear":
        return z + torch.einsum("bij,b...j->b...i", T, z)
    return z + torch.einsum("bij,bj...->bi...", T, z)


class _SharedLayer(_ServedLayer):
    """A factorized layer of the shared base plus every user's terms for it, applied per sample."""

    def __init__(self, base: nn.Module, name: str) -> None:
        super().__init__(base, name)
        self.spec = layer_spec(base)
        self.terms: dict[str, tuple[Tensor, ...]] = {}
        self.batch_users: list[str | None] | None = None  # set by MultiUserModel.forward for one call

    def _apply(self, fn, recurse: bool = True):  # noqa: ANN001, ANN202 — nn.Module's signature
        # the users' terms are plain tensors, not buffers: they follow .to(), .double() and .cuda() here
        super()._apply(fn, recurse)
        self.terms = {user: tuple(fn(t) for t in terms) for user, terms in self.terms.items()}
        return self

    def forward(self, x: Tensor) -> Tensor:
        users = self.batch_users
        if users is None:
            raise RuntimeError("call MultiUserModel(images, users), not the layer directly")
        if len(users) != x.shape[0]:
            raise RuntimeError(
                f"{self.layer_name} was given an input whose first axis is {x.shape[0]}, not the batch of "
                f"{len(users)}: MultiUserModel serves models whose layers take the batch first"
            )
        self.calls += 1
        mixes = [self.terms.get(u) if u is not None else None for u in users]
        if is_factorized(self.base):
            spec, U, V, bias = self.base.spec, self.base.U, self.base.V, self.base.bias
            z = spec.input_op(x, V)  # the shared dictionary, once for the whole batch
            if any(t is not None and len(t) == 1 for t in mixes):
                eye = torch.zeros(U.shape[1], U.shape[1], dtype=z.dtype, device=z.device)
                T = torch.stack([t[0] if t is not None and len(t) == 1 else eye for t in mixes])
                z = _mixed(z, T, spec.kind)
            y = spec.output_op(z, U, bias)
        else:  # a dense layer (a head) some user corrects: the shared layer once, the corrections on the side
            y = self.base(x)
        low_rank = [t if t is not None and len(t) >= 2 else None for t in mixes]
        if any(t is not None for t in low_rank):
            y = y + _low_rank_branch(self.spec, x, low_rank)
        return y


def _low_rank_branch(spec, x: Tensor, terms: list[tuple[Tensor, ...] | None]) -> Tensor:
    """``P_u (Q_u x) + Δb_u`` per sample; samples without a term get zeros.

    A batch of one user (the common case of a service that batches per user) runs the layer's own two ops on its
    samples, as a merged model would; a batch of several users stacks each sample's factors (one stack of
    references to the users' tensors, ranks padded to the largest) and runs them in one batched call."""
    distinct = list({id(t): t for t in terms if t is not None}.values())
    if len(distinct) == 1:
        return _one_user_branch(spec, x, terms, distinct[0])
    P, Q, shift = _per_sample_factors(terms, distinct, x)
    if spec.kind == "linear":
        y = torch.einsum("b...r,bmr->b...m", torch.einsum("b...n,brn->b...r", x, Q), P)
        return y if shift is None else y + shift.reshape(len(terms), *([1] * (y.ndim - 2)), spec.m)
    b, c, r = x.shape[0], x.shape[1], Q.shape[1]
    kernel = Q.reshape(b * r, spec.in_features, *spec.kernel_size)  # one group per sample
    h = F.conv2d(x.reshape(1, b * c, *x.shape[2:]), kernel, None, spec.stride, spec.padding, spec.dilation, groups=b)
    y = torch.bmm(P, h.reshape(b, r, -1)).reshape(b, spec.m, *h.shape[2:])
    return y if shift is None else y + shift[:, :, None, None]


def _one_user_branch(spec, x: Tensor, terms: list[tuple[Tensor, ...] | None], term: tuple[Tensor, ...]) -> Tensor:
    """The branch of a batch whose samples with a term all share ``term``: its ``Q`` then its ``P`` as the layer's
    own ops, on those samples only (the others, the base's, get zeros)."""
    rows = [i for i, t in enumerate(terms) if t is not None]
    own = x if len(rows) == len(terms) else x[rows]
    y = spec.output_op(spec.input_op(own, term[1]), term[0], term[2] if len(term) == 3 else None)
    if len(rows) == len(terms):
        return y
    out = y.new_zeros(len(terms), *y.shape[1:])
    out[rows] = y
    return out


def _per_sample_factors(
    terms: list[tuple[Tensor, ...] | None], distinct: list[tuple[Tensor, ...]], x: Tensor
) -> tuple[Tensor, Tensor, Tensor | None]:
    """Each sample's ``P`` (B×m×r), ``Q`` (B×r×n) and ``Δb`` (B×m, or ``None`` if no term has one): zeros for a
    sample without a term, ranks padded with zeros to the largest (only the distinct terms are padded, once)."""
    r = max(t[1].shape[0] for t in distinct)
    m, n = distinct[0][0].shape[0], distinct[0][1].shape[1]
    padded = {
        id(t): t
        if t[1].shape[0] == r
        else (F.pad(t[0], (0, r - t[0].shape[1])), F.pad(t[1], (0, 0, 0, r - t[1].shape[0])), *t[2:])
        for t in distinct
    }
    no_term = (x.new_zeros(m, r), x.new_zeros(r, n), x.new_zeros(m))
    rows = [padded[id(t)] if t is not None else no_term for t in terms]
    P, Q = torch.stack([row[0] for row in rows]), torch.stack([row[1] for row in rows])
    if not any(len(t) == 3 for t in distinct):
        return P, Q, None
    return P, Q, torch.stack([row[2] if len(row) == 3 else no_term[2] for row in rows])


class MultiUserModel(nn.Module):
    """A base model that serves many users in one batch: ``model(images, users)``.

    Users are added from their adapter files (:func:`alfa.save_adapter`, compact ones included) or from a
    model with the adapter attached, and removed, without touching anyone else. Served methods: every
    dictionary method (Alfa, its gate and mix variants, compact ``dictionary_mix`` files) and the low-rank
    methods whose frozen part is the base itself (LoRA, MoSLoRA, FLoRA), on the factorized layers of a truncated
    base; and the ``correction`` method (user calibrations: ``ΔW_u h + Δb_u`` beside the shared layer) on any
    layer, dense ones included. The others (PiSSA/MiLoRA change the frozen part, DoRA rescales it, full
    fine-tuning, BitFit and TPGaze touch more than layers) are refused with a message — merge those per user.

    The base need not be truncated: a dense base (no factorized layer) serves its calibrated users, whose
    corrections need no factorization, and refuses the methods that do, when such a user is added. It may be a
    CNN or a token transformer (Linear layers on batch × tokens × channels): every method above serves on both.
    Keyword arguments of a call go to the base (``served(ids, users, attention_mask=mask)`` for a padded batch of
    a language model's users). The base is a module, not a ``torch.compile`` wrapper (compile the served model).

    Its layers must take the batch first: one run on tokens × batch × channels (``nn.Transformer``'s default
    layout) is refused where the two sizes differ, and cannot be told from a batch where they agree, so such a
    model mixes its users' samples. A layer the model computes with through its ``.weight`` without calling it
    (``nn.MultiheadAttention``'s ``out_proj``) serves the base, and a batch with a user who has a term there is
    refused. ``.to()``, ``.double()`` and the like move the users' terms with the model.

    One instance may be shared by threads (a web framework's pool): a call runs under the instance's lock, since
    its layers hold that call's users while it runs, so calls into one instance run one at a time (for calls in
    parallel, give each thread its own instance). Adding and removing users takes the same lock, so a call sees a
    user's whole adapter or none of it; a file is read and checked before the lock is taken.
    """

    def __init__(self, base: nn.Module) -> None:
        super().__init__()
        _refuse_unservable_base(base, "MultiUserModel")
        if adapter_state(base) is not None:
            raise RuntimeError("MultiUserModel takes the base without an adapter (call alfa.detach)")
        # Where each user's file is loaded and checked, against the base as it was given: kept out of the module
        # tree (not a second copy of the base in state_dict(), nor moved by .to(): the terms are moved as added).
        object.__setattr__(self, "_scratch", copy.deepcopy(base).eval())
        # A dense base has no factorized layer to share: its layers are shared as users' corrections reach them.
        self.model, self._layers = _wrap_factorized(base, _SharedLayer)
        self._users: dict[str, list[str]] = {}
        self._lock = _CallLock()  # the served state: the layers' per-call users, the users' terms
        self._load_lock = _CallLock()  # the scratch copy a file is loaded into
        self.eval()  # it serves; .train() is refused at the next forward

    def __setstate__(self, state: dict[str, Any]) -> None:
        _with_locks(self, state, ("_lock", "_load_lock"))

    @property
    def users(self) -> list[str]:
        with self._lock:
            return list(self._users)

    def add_user(self, user: str, adapter: str | os.PathLike | nn.Module, replace: bool = False) -> None:
        """Add ``user`` from an adapter file (checked against the base like :func:`alfa.load_adapter`) or from a
        model with its adapter attached (it must be this base)."""
        if not isinstance(user, str):
            raise ValueError(f"a user id must be a str, got {user!r} ({type(user).__name__})")
        self._refuse_served(user, replace)
        if isinstance(adapter, nn.Module):
            # disabled, the model holds its base layers in the adapted ones' place: no term to read there
            _refuse_if_disabled(adapter, "add a user from a model")
            user_terms(adapter)  # refuse an unservable method before writing anything
            with tempfile.TemporaryDirectory() as tmp:  # through a file: the same checks against this base
                file = Path(tmp) / "user.safetensors"
                try:
                    terms = self._terms_from_file(save_adapter(adapter, file))
                except ValueError as e:  # said of the model given, not of a temporary file the caller never saw
                    raise type(e)(f"user {user!r}: " + str(e).replace(str(file), "the given model's adapter")) from e
        else:
            terms = self._terms_from_file(Path(adapter))
        with self._lock:  # installed whole between two calls: no call sees half of a user's layers
            self._refuse_served(user, replace)  # again: another thread may have added them meanwhile
            self._install(user, terms)

    def _refuse_served(self, user: str, replace: bool) -> None:
        if user in self._users and not replace:
            raise ValueError(f"user {user!r} is already served (pass replace=True to swap their adapter)")

    def _install(self, user: str, terms: UserTerms) -> None:
        unknown = sorted(set(terms) - set(self._layers) - set(self._dense_layers()))
        if unknown:
            raise ValueError(f"user {user!r}: the adapter adapts layers this base does not have: {unknown[:4]}")
        for name in sorted(set(terms) - set(self._layers)):  # a head some user corrects: shared from now on
            replace_module(self.model, name, _SharedLayer(self.model.get_submodule(name), name).train(self.training))
            self._layers[name] = self.model.get_submodule(name)
        self.remove_user(user, missing_ok=True)
        for name, t in terms.items():  # in the served model's dtype and device, whatever .to() it has had
            like = next(self._layers[name].base.parameters())
            self._layers[name].terms[user] = tuple(x.detach().to(like.device, like.dtype, copy=True) for x in t)
        self._users[user] = sorted(terms)

    def _dense_layers(self) -> list[str]:
        """The dense layers of the served model not yet shared (a correction may adapt them)."""
        return [n for n, m in self.model.named_modules() if is_dense_layer(m) and not isinstance(m, _SharedLayer)]

    def _terms_from_file(self, path: Path) -> UserTerms:
        with self._load_lock:  # one scratch copy: one file at a time, while calls go on
            load_adapter(self._scratch, path)  # checks the layers and the base fingerprint, the checksum
            try:
                return user_terms(self._scratch)
            finally:
                detach(self._scratch)

    def remove_user(self, user: str, missing_ok: bool = False) -> None:
        """Stop serving ``user`` (an :class:`UnknownUserError` if they are not served, unless ``missing_ok``)."""
        with self._lock:
            if user not in self._users:
                if missing_ok:
                    return
                raise UnknownUserError(f"unknown user {user!r}")
            for name in self._users.pop(user):
                self._layers[name].terms.pop(user, None)

    def user_bytes(self, user: str) -> int:
        """The memory a user adds: the bytes of their terms."""
        with self._lock:
            if user not in self._users:
                raise UnknownUserError(f"unknown user {user!r}")
            return sum(t.numel() * t.element_size() for n in self._users[user] for t in self._layers[n].terms[user])

    @torch.no_grad()
    def forward(self, images: Tensor, users: Sequence[str | None], **kwargs: Any) -> Any:
        """Predictions for a batch in which sample ``i`` belongs to ``users[i]`` (``None``: the base).

        ``images`` is what the base takes first, batch first (images; token ids for a language model); keyword
        arguments go to the base's forward as they are (a padded batch's ``attention_mask``), and the base's output
        comes back as it is (a transformers model's output object)."""
        users = _user_list(users)
        if len(users) != images.shape[0]:
            raise ValueError(f"{images.shape[0]} images but {len(users)} user ids")
        with self._lock.around_call():  # the layers hold this call's users until it returns (the class docstring)
            _refuse_unknown(users, self._users)
            _refuse_train_mode(self)
            for layer in self._layers.values():
                layer.batch_users, layer.calls, layer.weight_reads = users, 0, 0
            try:
                out = self.model(images, **kwargs)
            finally:
                for layer in self._layers.values():
                    layer.batch_users = None
            _refuse_terms_left_out(self._layers.values(), users)
        return out


def _refuse_terms_left_out(layers: Iterable[_SharedLayer], users: list[str | None]) -> None:
    """A layer the model computed with through its ``.weight`` and never called would have left its users' terms
    out of their predictions: refused."""
    for layer in layers:
        left_out = sorted({u for u in users if u is not None and u in layer.terms})
        if left_out and layer.weight_reads and not layer.calls:
            raise RuntimeError(
                f"{layer.layer_name}: the model computes with its .weight directly (as nn.MultiheadAttention does "
                f"with its out_proj), so the terms of user(s) {left_out[:5]} there cannot be applied per sample: "
                "serve them with their own model (alfa.load_adapter onto a copy of the base), or leave that layer "
                "out of their adapters"
            )


def serve_refusal(method: AdapterConfig | type[AdapterConfig]) -> str | None:
    """Why :class:`MultiUserModel` refuses every user of ``method`` (a config or its class), whatever their
    adapter holds, or ``None`` where it serves them (on a truncated base: a dense one serves corrections only).
    Known from the method alone, so a command can say it before it adapts anyone."""
    name = method.method
    if method.scope != "layer":
        return f"{name} adapts the whole model and cannot share a base: merge it per user"
    if method.family == "prompt":
        return (
            f"{name}'s prompts pad each adapted layer's input per user and cannot be merged: serve each such user "
            "with their own model (alfa.load_adapter onto a copy of the base)"
        )
    if method.changes_base:
        return f"{name} changes the shared weight itself and cannot be served per sample: merge it per user"
    return None


def user_terms(model: nn.Module) -> UserTerms:
    """The per-sample terms of the adapter attached to ``model``, per adapted layer (factorized ones; dense ones
    only for a correction); a ``ValueError`` for a method that cannot be served from a shared base."""
    state = adapter_state(model)
    if state is None:
        raise ValueError("the model has no adapter attached")
    refusal = serve_refusal(state.config)
    if refusal is not None:
        raise MethodNotServed(refusal)
    if state.saved:  # a trained copy of whole modules (a new head) is no per-sample term of a shared layer
        raise ValueError(
            f"the adapter trains whole modules ({', '.join(state.saved)}; modules_to_save), which a shared base "
            "cannot serve per sample: merge it per user"
        )
    out: UserTerms = {}
    for name in state.targets:
        layer = model.get_submodule(name)
        if isinstance(layer, CorrectionLayer):  # dense or factorized: the update and Δb on the side
            P, Q = layer.update_factors()
            out[name] = (P, Q) if layer.bias_update is None else (P, Q, layer.bias_update)
            continue
        if not layer.base_is_factorized:
            raise ValueError(
                f"{name}: {state.config.method} adapts a dense layer, which is served per sample only as a "
                "correction (a user calibration); truncate the base (alfa.truncate) for the other methods, or "
                "merge this user's adapter per user"
            )
        if isinstance(layer, DictionaryAdapter):
            out[name] = (layer.mixing(),)
        elif isinstance(layer, LowRankUpdateLayer) and all(
            getattr(type(layer), f) is getattr(LowRankUpdateLayer, f) for f in ("forward", "frozen_forward")
        ):  # the frozen part is the base itself and the update is purely additive
            out[name] = tuple(layer.update_factors())
        else:
            raise ValueError(
                f"{state.config.method} ({type(layer).__name__}) changes the shared weight itself and cannot be served "
                "per sample: merge it per user"
            )
    return out


class _MixInputLayer(_ServedLayer):
    """A factorized layer whose per-sample mix ``T`` (B×d×d) is handed in by :class:`MixedBatchModel`."""

    def __init__(self, base: nn.Module, name: str) -> None:
        super().__init__(base, name)
        self.mix: Tensor | None = None

    def forward(self, x: Tensor) -> Tensor:
        spec, U, V, bias = self.base.spec, self.base.U, self.base.V, self.base.bias
        return spec.output_op(_mixed(spec.input_op(x, V), self.mix, spec.kind), U, bias)


class MixedBatchModel(nn.Module):
    """The shared base with every factorized layer's per-sample mix as an explicit input:
    ``forward(images, T_1, …, T_L, **kwargs)``, ``T_l`` of shape B×d_l×d_l (zeros: the base; keyword arguments go
    to the base). What exports (ONNX,
    ``torch.export``) for dictionary users: a server then gathers each request's ``T`` matrices itself.
    :meth:`mixes` builds those inputs from a :class:`MultiUserModel` for a list of users.

    One instance may be shared by threads: its layers hold a call's mixes while it runs, so a call runs under the
    instance's lock, one at a time (give each thread its own instance for calls in parallel)."""

    def __init__(self, base: nn.Module) -> None:
        super().__init__()
        _refuse_unservable_base(base, "serve.MixedBatchModel")
        self.model, self._layers = _wrap_factorized(base, _MixInputLayer)
        self.layer_names = list(self._layers)
        self._lock = _CallLock()
        self.eval()

    def __setstate__(self, state: dict[str, Any]) -> None:
        _with_locks(self, state, ("_lock",))

    def forward(self, images: Tensor, *mixes: Tensor, **kwargs: Any) -> Any:
        """The base on ``images`` (batch first), each factorized layer mixing sample ``i``'s channels by
        ``I + mixes[l][i]``; keyword arguments go to the base's forward as they are (an ``attention_mask``)."""
        if len(mixes) != len(self.layer_names):
            raise ValueError(f"expected {len(self.layer_names)} mixes (one per factorized layer), got {len(mixes)}")
        _refuse_train_mode(self)
        for name, layer, mix in zip(self.layer_names, self._layers.values(), mixes):
            d = layer.base.U.shape[1]
            if tuple(mix.shape) != (images.shape[0], d, d):  # a broadcast would give one user's mix to every sample
                raise ValueError(f"{name}: the mix is {tuple(mix.shape)}, expected ({images.shape[0]}, {d}, {d}): one "
                                 "d×d matrix per image")  # fmt: skip
            if mix.dtype != layer.base.U.dtype:
                raise ValueError(f"{name}: the mix is {mix.dtype}, the model {layer.base.U.dtype}")
        with self._lock.around_call():  # the layers hold this call's mixes until it returns (the class docstring)
            for layer, mix in zip(self._layers.values(), mixes):
                layer.mix = mix
            try:
                return self.model(images, **kwargs)
            finally:  # a layer keeps no batch's mix (nor its memory) past the call, and an export sees none left set
                for layer in self._layers.values():
                    layer.mix = None

    def mixes(self, served: MultiUserModel, users: Sequence[str | None]) -> list[Tensor]:
        """Per layer, the B×d×d stack of each user's ``T`` (zeros for ``None`` and for layers a user leaves)."""
        users = _user_list(users)
        if not users:
            raise ValueError("users is empty: a batch has one user id (or None) per sample")
        with served._lock:  # the users' terms as of one moment, not half of a user being added
            return self._mixes(served, users)

    def _mixes(self, served: MultiUserModel, users: list[str | None]) -> list[Tensor]:
        _refuse_unknown(users, served._users)  # else an unknown user would get zeros: the base, silently
        for user in dict.fromkeys(u for u in users if u is not None):
            outside = [n for n in served._users[user] if n not in self._layers]
            if outside:  # their term there would be left out: their prediction silently the base's
                raise ValueError(
                    f"user {user!r} adapts {outside[0]}, which is no factorized layer: only dictionary mixes of "
                    "factorized layers are handed in (serve them with MultiUserModel, or export their merged model)"
                )
        out = []
        for name in self.layer_names:
            layer = served._layers[name]
            U = layer.base.U
            d = U.shape[1]
            rows = []
            for u in users:
                t = layer.terms.get(u) if u is not None else None
                if t is not None and len(t) != 1:
                    raise ValueError(
                        f"user {u!r} has a low-rank update or a correction on {name}: only dictionary users have a mix "
                        "to hand in"
                    )
                rows.append(t[0] if t is not None else torch.zeros(d, d, dtype=U.dtype, device=U.device))
            out.append(torch.stack(rows))
        return out
