"""Per-user adapter files: safetensors tensors plus a small JSON metadata header.

The header records the method, its config, the adapted layer (or parameter) names and a
fingerprint of the frozen base those tensors were trained on: its adapted layers, and the rest of it.
Loading checks all of them and refuses, with a message naming the mismatch, an adapter made for
another base, method or layer set. Nothing is unpickled.
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import itertools
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open
from torch import Tensor, nn

from ..fileio import kind_of_file, require_path, write_safetensors
from ..layers import tensor_signature
from ..surgery import refuse_compiled_wrapper, require_flags
from .alfa import DictionaryAdapter, DictionaryMixConfig
from .config import METHODS, AdapterConfig, config_from_dict
from .groups import is_number
from .layer import AdaptedLayer
from .select import largest_layer, sizes_said_before
from .state import (
    DEFAULT_ADAPTER,
    _check_adapter_name,
    _require_state,
    _states,
    adapter_names,
    adapter_state,
    adapter_tensors,
    attach,
    delete_adapter,
    detach,
    merge_kept_on_error,
    moved_statistics,
    set_adapter,
)

__all__ = [
    "save_adapter",
    "load_adapter",
    "read_adapter_metadata",
    "base_fingerprint",
    "base_rest_fingerprint",
    "tensor_checksum",
    "refuse_non_finite",
    "has_compact_form",
    "AdapterFileError",
    "AdapterFileDamaged",
]

FORMAT = "alfa-adapter"
VERSION = 1
_FINGERPRINT_RTOL = 1e-3


class AdapterFileError(ValueError):
    """An adapter file that cannot be used: corrupt, not an adapter, or made for another model."""


class AdapterFileDamaged(AdapterFileError):
    """An adapter file whose bytes are damaged (not readable safetensors, a broken header, tensor data that does
    not read, does not match its checksum or is not finite): the file must be replaced. A caller may answer it
    otherwise than a file made for another model (a server: its own fault, not the request's)."""


def _attached_state(model: nn.Module) -> Any:
    state = adapter_state(model)
    if state is None:
        raise RuntimeError("the model has no adapter attached")
    return state


def _layer_tensors(model: nn.Module, state: Any) -> dict[str, Tensor]:
    """The frozen tensors :func:`base_fingerprint` covers: the adapted layers' bases (for model-scope methods,
    every parameter the method does not train)."""
    if state.config.scope == "model":
        trained = set(state.targets)
        return {n: p for n, p in model.named_parameters() if n not in trained}
    tensors = {}
    for name in state.targets:
        for pname, p in model.get_submodule(name).base.named_parameters():
            tensors[f"{name}.{pname}"] = p
    return tensors


def base_fingerprint(model: nn.Module) -> dict[str, Any]:
    """A signature of the frozen base under the attached adapter: per base tensor, its shape, norm
    and projection on a fixed random vector. Robust to float round-off, sensitive to any real
    change (a re-training, another truncation rank, flipped singular vectors)."""
    out: dict[str, Any] = {}
    for n, t in _layer_tensors(model, _attached_state(model)).items():
        out[n] = {"shape": list(t.shape), "sig": tensor_signature(t), "dtype": str(t.dtype).removeprefix("torch.")}
    return out


_REST_SAMPLE = 65_536  # elements of a larger tensor that the rest's signature reads (evenly spaced)


def _sampled(t: Tensor) -> Tensor:
    flat = t.detach().reshape(-1)
    if flat.numel() > _REST_SAMPLE:  # an embedding table of a language model: a re-training moves every element
        # Integer positions, the same on every device (a float linspace rounds differently past 2^24 elements).
        positions = torch.arange(_REST_SAMPLE, dtype=torch.int64) * (flat.numel() - 1) // (_REST_SAMPLE - 1)
        flat = flat[positions.to(flat.device)]
    return flat.to(torch.float64)


def _covered_prefixes(state: Any) -> tuple[str, ...]:
    """Module names whose tensors the rest's fingerprint leaves out: the adapted layers (their frozen bases are in
    :func:`base_fingerprint`, the rest is the adapter) and the ``modules_to_save`` (the adapter's own copies)."""
    layers = state.targets if state.config.scope == "layer" else []
    return tuple(f"{n}." for n in [*layers, *state.saved])


def base_rest_fingerprint(model: nn.Module) -> dict[str, list[list[float]]]:
    """A signature of the rest of the frozen base, per module: for each of its floating-point parameters and saved
    buffers (a head, a BatchNorm's statistics, an embedding) outside the adapted layers, the trained parameters and
    the ``modules_to_save``, its norm and projection (seven digits: a short header, about 2 KiB for a ResNet-18).
    Each tensor keeps its own scale, so a bias is not hidden behind a large variance beside it; integer buffers (a
    BatchNorm's step counter, which no eval-mode output reads) are left out. Tensors over 65,536 elements are read
    at that many evenly spaced elements, which a re-training or a cast moves; a change of a few elements of such a
    tensor can go unseen."""
    out: dict[str, list[list[float]]] = {}
    for module, t in _rest_tensors(model):
        out.setdefault(module, []).append([float(f"{v:.7g}") for v in tensor_signature(_sampled(t))])
    return out


def _rest_dtypes(model: nn.Module) -> dict[str, str]:
    """Per module of :func:`base_rest_fingerprint`, its tensors' dtypes (``"float32"``, ``"float16/float32"``): a
    changed rest then says when the base was cast, as a changed layer does."""
    dtypes: dict[str, set[str]] = {}
    for module, t in _rest_tensors(model):
        dtypes.setdefault(module, set()).add(str(t.dtype).removeprefix("torch."))
    return {m: "/".join(sorted(d)) for m, d in dtypes.items()}


def _rest_tensors(model: nn.Module) -> Iterator[tuple[str, Tensor]]:
    """``(module, tensor)`` of every tensor :func:`base_rest_fingerprint` reads, in the state dict's order."""
    state = _attached_state(model)
    skip = _covered_prefixes(state)
    params = dict(model.named_parameters())
    covered = set(_layer_tensors(model, state)) | (set(state.targets) if state.config.scope == "model" else set())
    covered_ids = {id(params[n]) for n in covered if n in params}  # a tied alias (lm_head of wte) is that tensor
    for n, t in model.state_dict(keep_vars=True).items():
        if n in covered or id(t) in covered_ids or n.startswith(skip) or not t.is_floating_point():
            continue
        yield n.rpartition(".")[0] or "(model)", t


def _compare_rest(
    saved: dict[str, list[list[float]]],
    current: dict[str, list[list[float]]],
    saved_dtypes: dict[str, str] | None = None,
    current_dtypes: dict[str, str] | None = None,
) -> list[str]:
    """What differs between the rest of the adapter's base and this model's, per module (with the dtypes, where the
    file has them: whether the base was cast)."""
    problems = []
    for m in sorted(set(saved) | set(current)):
        if m not in current or m not in saved:
            where = "the adapter's base" if m in saved else "this model"
            problems.append(f"{m}: its tensors are in {where} only")
        elif len(saved[m]) != len(current[m]):
            problems.append(f"{m}: {len(current[m])} tensors here, {len(saved[m])} in the adapter's base")
        elif any(_differ(a, b) for a, b in zip(saved[m], current[m])):
            # older files: no dtypes
            problems.append(_different_values(m, (saved_dtypes or {}).get(m), (current_dtypes or {}).get(m)))
    return problems


def _different_values(name: str, was: str | None, now: str | None) -> str:
    """The problem of a layer or module whose values differ, naming a cast where both dtypes are known (the message
    it goes into says the adapter was made for another base, once for all of them)."""
    cast = f" (this base is {now}, the adapter's was {was}: cast it back)" if was and now and was != now else ""
    return f"{name}: different values{cast}"


def _is_signature(value: Any) -> bool:
    """A layer's signature as :func:`tensor_signature` writes it: two numbers."""
    return isinstance(value, list) and len(value) == 2 and all(is_number(v) for v in value)


def _differ(saved: list[float], current: list[float]) -> bool:
    (norm_a, proj_a), (norm_b, proj_b) = saved, current
    scale = max(norm_a, norm_b, 1e-12)
    return abs(norm_a - norm_b) > _FINGERPRINT_RTOL * scale or abs(proj_a - proj_b) > _FINGERPRINT_RTOL * scale


def _compare_fingerprints(saved: dict[str, Any], current: dict[str, Any]) -> list[str]:
    problems = []
    for n in sorted(set(saved) | set(current)):
        if n not in current:
            problems.append(f"{n}: in the adapter's base but not in this model")
        elif n not in saved:
            problems.append(f"{n}: in this model but not in the adapter's base")
        elif saved[n]["shape"] != current[n]["shape"]:
            problems.append(f"{n}: shape {current[n]['shape']} here, {saved[n]['shape']} in the adapter's base")
        elif _differ(saved[n]["sig"], current[n]["sig"]):
            # a file of the first format holds no dtype: its difference is told by values alone
            problems.append(_different_values(n, saved[n].get("dtype"), current[n].get("dtype")))
    return problems


def tensor_checksum(tensors: dict[str, Tensor]) -> str:
    """SHA-256 over the tensors' names, dtypes, shapes and bytes (in name order): what an adapter or checkpoint
    file records so that damaged tensor data is refused on load instead of silently changing a prediction."""
    h = hashlib.sha256()
    for name in sorted(tensors):
        t = tensors[name].detach().cpu().contiguous()
        h.update(f"{name}|{t.dtype}|{list(t.shape)}|".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def _refuse_meta(model: nn.Module, action: str) -> None:
    """A model on the ``meta`` device has shapes but no values: said as such, not as torch's internal error."""
    if any(t.is_meta for t in itertools.chain(model.parameters(), model.buffers())):
        raise ValueError(
            f"the model's tensors are on the meta device (shapes, no values): cannot {action}; materialize it "
            "first (model.to_empty(device=...) and load its weights)"
        )


def save_adapter(
    model: nn.Module,
    path: str | os.PathLike,
    *,
    compact: bool = False,
    about: dict[str, Any] | None = None,
    name: str | None = None,
) -> Path:
    """Write the active adapter of ``model`` (or the adapter ``name``) to ``path`` (safetensors), atomically.

    The file holds that one adapter: its trained tensors, including its ``modules_to_save`` copies (parameters
    and buffers), and a header with its name, config and targets. Saving another adapter than the active one
    switches to it for the save and back afterwards.

    ``compact=True`` stores, instead of the trainable tensors, what the personalization amounts to:
    one ``d×d`` mixing matrix per layer (``V_adapt = V_base + T V_base``; for Alfa with the defaults
    at ``d = 64`` that is about 11× smaller). Such a file loads back as the ``dictionary_mix``
    method, with the same outputs; it serves inference and merging, not further training of the
    original parameters. Only dictionary methods (Alfa and its variants) can be stored this way.

    ``about`` is stored with it and read back by :func:`read_adapter_metadata` (the gaze stack records the
    dataset and the person, so an adapter is never applied to another dataset's person of the same name). The
    file also records a checksum of its tensors, verified by :func:`load_adapter`.

    Every option is keyword-only; ``compact`` must be ``True`` or ``False`` and ``path`` a ``str`` or
    ``os.PathLike`` (``TypeError`` otherwise).
    """
    path = require_path(path, "save_adapter")
    require_flags("save_adapter", compact=compact)
    _refuse_meta(model, "save an adapter from it")
    if about is not None and not isinstance(about, dict):  # read back as a JSON object: refused now, not then
        raise TypeError(f"save_adapter: about must be a dict (stored as a JSON object), got {type(about).__name__}")
    try:
        json.dumps(about)
    except (TypeError, ValueError) as e:  # a tensor, a set, a circular reference: said as about's, before any work
        raise TypeError(f"save_adapter: about must hold JSON values only (numbers, strings, lists, dicts): {e}") from e
    if Path(path).is_dir():  # else os.replace fails at the end, naming the temporary file instead of this path
        raise AdapterFileError(
            f"{path} is a folder: an adapter is saved to one file (e.g. {Path(path) / 'adapter.safetensors'})"
        )
    refuse_compiled_wrapper(model, "save_adapter")
    current = _require_state(model, "save")
    if name is not None and name != current.name:
        set_adapter(model, name)
        try:
            return save_adapter(model, path, compact=compact, about=about)
        finally:
            set_adapter(model, current.name)
    state = current
    config = state.config
    moved = moved_statistics(model)
    if moved:
        raise ValueError(
            f"the base's normalization statistics moved while the adapter was attached ({', '.join(moved[:3])}"
            f"{' and more' if len(moved) > 3 else ''}: a forward pass in train mode); an adapter file does not "
            "hold them, so it would not reproduce this model: train with the model in eval mode, or put those "
            "layers in modules_to_save to train and save their statistics with the adapter"
        )
    saved = {n: t.detach().cpu().contiguous() for n, t in adapter_tensors(model).items() if _in_saved(n, state.saved)}
    if compact:
        layers = _compact_layers(model)
        if layers is None:
            raise ValueError(f"{config.method} adapters have no compact form (only dictionary methods such as alfa)")
        tensors = {f"{n}.T": layer.mixing().detach().cpu().contiguous() for n, layer in layers.items()}
        tensors.update(saved)  # the trained copies are part of what the personalization amounts to
        # Every dictionary config has dense_rank (how a dense layer's dictionary is cut), and the mix
        # must use the same one to rebuild the same dictionary.
        config = DictionaryMixConfig(
            target=config.target,
            layers=config.layers,
            dense_rank=getattr(config, "dense_rank", None),
            modules_to_save=config.modules_to_save,
        )
    else:
        tensors = {n: t.detach().cpu().contiguous() for n, t in adapter_tensors(model).items()}
    metadata = {
        "format": FORMAT,
        "version": str(VERSION),
        "method": config.method,
        "config": json.dumps(config.to_dict(), sort_keys=True),
        "targets": json.dumps(state.targets),
        "fingerprint": json.dumps(base_fingerprint(model)),
        "rest_fingerprint": json.dumps(base_rest_fingerprint(model)),
        "rest_dtypes": json.dumps(_rest_dtypes(model)),
        "checksum": tensor_checksum(tensors),
        "name": state.name,
    }
    if state.saved:
        metadata["modules_to_save"] = json.dumps(list(state.saved))
    if about:
        metadata["about"] = json.dumps(about, sort_keys=True)
    if compact:
        metadata["compact_of"] = state.config.method
    refuse_non_finite(tensors, path)
    return write_safetensors(path, tensors, metadata)


def refuse_non_finite(tensors: dict[str, Tensor], path: str | os.PathLike) -> None:
    """Refuse to write ``tensors`` to ``path`` if a floating-point one holds NaN or an infinite value (a file that
    only fails when it is loaded again hides where training went wrong): ``FloatingPointError`` naming them."""
    bad = [name for name, t in tensors.items() if t.is_floating_point() and not bool(torch.isfinite(t).all())]
    if bad:
        shown = ", ".join(bad[:4]) + (f" and {len(bad) - 4} more" if len(bad) > 4 else "")
        raise FloatingPointError(
            f"{path} not written: {len(bad)} of {len(tensors)} tensors hold NaN or infinite values ({shown}); the "
            "training that made them diverged (a lower learning rate may help)"
        )


def _in_saved(tensor_name: str, saved: dict[str, nn.Module]) -> bool:
    return any(tensor_name.startswith(s + ".") for s in saved)


def _compact_layers(model: nn.Module) -> dict[str, DictionaryAdapter] | None:
    """The adapted layers by name if every one is a dictionary adapter (the contract that has a
    ``d×d`` mix), else ``None``. Model-scope methods have no layers, hence no compact form."""
    state = adapter_state(model)
    if state is None or state.config.scope != "layer":
        return None
    layers: dict[str, AdaptedLayer] = {name: model.get_submodule(name) for name in state.targets}
    if not layers or not all(isinstance(layer, DictionaryAdapter) for layer in layers.values()):
        return None
    return layers  # type: ignore[return-value]


def has_compact_form(model: nn.Module) -> bool:
    """Whether the attached adapter can be saved with ``save_adapter(..., compact=True)``: every
    adapted layer is a :class:`~alfa.adapters.alfa.DictionaryAdapter` (Alfa and its variants)."""
    return _compact_layers(model) is not None


def _open_error(path: Path) -> OSError | None:
    """Why ``path`` does not open for reading, or ``None`` where it does. Asked when safetensors fails to open a
    file: it says "No such file or directory" of every file it cannot open, one it may not read included."""
    try:
        with open(path, "rb"):
            return None
    except OSError as e:
        return e


def read_adapter_metadata(path: str | os.PathLike) -> dict[str, Any]:
    """The decoded header of an adapter file (method, config, targets, fingerprint)."""
    path = require_path(path, "read_adapter_metadata")
    if not path.is_file():
        raise FileNotFoundError(f"adapter file not found: {path}")
    try:
        with safe_open(str(path), framework="pt") as f:
            raw = f.metadata() or {}
    except (SafetensorError, OSError, ValueError) as e:
        unopened = _open_error(path)
        if unopened is not None:  # the file does not open (permission denied, or gone since): not its bytes
            raise unopened from e
        raise AdapterFileDamaged(f"{path}: not a readable safetensors file ({kind_of_file(path) or e})") from e
    if raw.get("format") == "alfa-checkpoint":  # checkpoint.FORMAT: a model, given where an adapter goes
        raise AdapterFileError(
            f"{path}: a whole model (an alfa checkpoint), not an adapter: give it as the model (--checkpoint), with no "
            "adapter"
        )
    if raw.get("format") != FORMAT:
        raise AdapterFileError(f"{path}: not an alfa adapter file (no '{FORMAT}' header)")
    if raw.get("version") != str(VERSION):
        raise AdapterFileError(f"{path}: adapter format version {raw.get('version')}, this alfa reads {VERSION}")
    try:
        header = {
            "method": raw["method"],
            "config": json.loads(raw["config"]),
            "targets": json.loads(raw["targets"]),
            "fingerprint": json.loads(raw["fingerprint"]),
            # absent from the first format's files; its forerunner "base_rest" is not read (one signature per
            # module, which a step counter or a large variance could dominate)
            "rest_fingerprint": json.loads(raw["rest_fingerprint"]) if "rest_fingerprint" in raw else None,
            # absent from files that predate it
            "rest_dtypes": json.loads(raw["rest_dtypes"]) if "rest_dtypes" in raw else None,
            "checksum": raw.get("checksum"),  # files written before checksums have none
            "about": json.loads(raw.get("about", "{}")),
            "name": raw.get("name", DEFAULT_ADAPTER),  # files written before named adapters: the default
            "modules_to_save": json.loads(raw.get("modules_to_save", "[]")),
        }
    except (KeyError, json.JSONDecodeError) as e:
        raise AdapterFileDamaged(f"{path}: damaged adapter header ({e})") from e
    _check_header_kinds(path, header)
    return header


def _names(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(n, str) for n in value)


def _shape(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in value)


def _check_header_kinds(path: Path, header: dict[str, Any]) -> None:
    """Valid JSON of the wrong kind is damage too: named here, with the file and the entry, rather than met as a
    traceback where it is read (comparing the base, matching the layers)."""

    def damaged(what: str) -> AdapterFileError:
        return AdapterFileDamaged(f"{path}: damaged adapter header (its {what})")

    for key, kind in {"config": dict, "targets": list, "fingerprint": dict, "about": dict}.items():
        if not isinstance(header[key], kind):
            raise damaged(f"{key!r} is not a JSON {'object' if kind is dict else 'list'}")
    for key in ("targets", "modules_to_save"):
        if not _names(header[key]):
            raise damaged(f"{key!r} is not a JSON list of names")
    for name, entry in header["fingerprint"].items():  # each layer's entry is read by key where it is compared
        if not (isinstance(entry, dict) and _shape(entry.get("shape")) and _is_signature(entry.get("sig"))):
            raise damaged(f"fingerprint of {name!r} is not a signature")
    rest, dtypes = header["rest_fingerprint"], header["rest_dtypes"]
    if rest is not None and not isinstance(rest, dict):
        raise damaged("'rest_fingerprint' is not a JSON object")
    for module, signatures in (rest or {}).items():
        if not (isinstance(signatures, list) and all(_is_signature(s) for s in signatures)):
            raise damaged(f"rest fingerprint of {module!r} is not a list of signatures")
    if dtypes is not None and not (isinstance(dtypes, dict) and all(isinstance(d, str) for d in dtypes.values())):
        raise damaged("'rest_dtypes' is not a JSON object of module names to dtypes")


def load_adapter(
    model: nn.Module,
    path: str | os.PathLike,
    *,
    name: str = DEFAULT_ADAPTER,
    replace: bool = False,
    method: str | None = None,
) -> list[str]:
    """Attach the adapter stored at ``path`` to ``model`` (the shared base) as the adapter ``name``, make it
    active, and load its tensors (its ``modules_to_save`` copies included).

    The model must be the base the adapter was trained on: same adapted layers, same frozen
    weights (checked by fingerprint). ``name`` is the name on this model (by default ``"default"``, whatever
    name the file was saved under); other adapters already attached stay. With ``replace=True`` an adapter
    already attached under ``name`` is removed first (after the file has been checked on a copy). ``method``,
    if given, is the method the caller expects the file to hold. On any error the model is left as it was.
    Every option is keyword-only (``load_adapter(model, path, "carol")`` is a ``TypeError``, not
    ``replace=True``); ``replace`` must be ``True`` or ``False`` and ``path`` a ``str`` or ``os.PathLike``.
    """
    path = require_path(path, "load_adapter")
    require_flags("load_adapter", replace=replace)
    _check_adapter_name(name)  # the caller's mistake, said as such (not as a file that does not fit)
    refuse_compiled_wrapper(model, "load_adapter")
    _refuse_meta(model, "load an adapter onto it (it is checked against the base's values)")
    if path.is_dir():
        raise AdapterFileError(
            f"{path} is a folder: an adapter is one file (alfa personalize writes <person>.safetensors)"
        )
    if method is not None and method not in METHODS:  # the caller's slip, not the file's
        raise ValueError(f"load_adapter: method {method!r} is no adapter method; the methods: {', '.join(METHODS)}")
    meta = read_adapter_metadata(path)
    if method is not None and meta["method"] != method:
        raise AdapterFileError(f"{path}: holds an adapter of method {meta['method']!r}, expected {method!r}")
    try:
        config = config_from_dict(meta["method"], meta["config"])
    except (ValueError, TypeError) as e:
        raise AdapterFileError(f"{path}: {e}") from e
    current = _states(model).get(name)
    if current is not None and not replace:
        raise RuntimeError(
            f"the model already has an adapter named {name!r} (method {current.config.method!r}); pass replace=True, "
            f"another name=, or call alfa.detach"
        )
    active = adapter_state(model)
    if current is not None:
        # Check the file fully before touching the model's current adapter.
        probe = _copy_for_check(model)
        load_adapter(probe, path)
        delete_adapter(model, name)
    with sizes_said_before():  # its layers' choice warns as attach does: said when the file's adapter was made
        config = _bounded_dense_rank(model, config)
    with merge_kept_on_error(model):  # a merged model stays undoable when the file turns out not to fit
        try:
            with sizes_said_before():  # said when the file's adapter was attached
                targets = attach(model, config, name=name)
        except (ValueError, TypeError) as e:
            raise AdapterFileError(f"{path}: the adapter does not fit this model: {e}") from e
        try:
            _check_and_load(model, path, meta, targets)
        except BaseException:
            delete_adapter(model, name)
            if active is not None and active.name in adapter_names(model):
                set_adapter(model, active.name)
            raise
    return targets


def _bounded_dense_rank(model: nn.Module, config: AdapterConfig) -> AdapterConfig:
    """A file saved before a ``dense_rank`` above every layer was refused meant each layer's full SVD: the same
    layers as the largest layer's rank (what attach accepts now)."""
    dense_rank = getattr(config, "dense_rank", None)
    found = largest_layer(model, config) if isinstance(dense_rank, int) else None
    if found is None or dense_rank <= min(found[1:]):
        return config
    return dataclasses.replace(config, dense_rank=min(found[1:]))


def _copy_for_check(model: nn.Module) -> nn.Module:
    probe = copy.deepcopy(model)
    detach(probe)
    return probe


def _saved_structure(meta: dict[str, Any], path: Path) -> tuple[dict[str, int], set[str]]:
    """The adapter's base, as far as its file tells: the rank of each factorized layer it names, and the dense
    layers it names. A full fine-tune names its base's tensors as its own (its fingerprint is empty); the others
    fingerprint the layers they adapt."""
    shapes = {n: s["shape"] for n, s in meta["fingerprint"].items()}
    tensors = [t for t in meta["targets"] if t.endswith((".U", ".V", ".weight"))]
    if tensors and not shapes:
        try:
            with safe_open(str(path), framework="pt") as f:
                names = set(f.keys())
                shapes = {t: f.get_slice(t).get_shape() for t in tensors if t in names}
        except SafetensorError:
            pass  # a damaged file: the tensors' own checks say so
    ranks = {n.removesuffix(".U"): shape[-1] for n, shape in shapes.items() if n.endswith(".U") and shape}
    return ranks, {n.removesuffix(".weight") for n in shapes if n.endswith(".weight")}


def _rank_mismatch(meta: dict[str, Any], path: Path, model: nn.Module) -> str | None:
    """Where the adapter's base and ``model`` are truncated differently, the words for it: "truncated at rank 32,
    this model at rank 64", "...; this model is not truncated", "not truncated; this model is ..."."""
    from ..truncate import factorized_ranks

    here = {n.removesuffix(".base"): r for n, r in factorized_ranks(model).items()}  # under an attached adapter
    there, dense_there = _saved_structure(meta, path)
    if there and not here:
        return f"truncated at rank {'/'.join(sorted({str(r) for r in there.values()}))}; this model is not truncated"
    if not there and dense_there & set(here):
        ranks = "/".join(sorted({str(here[n]) for n in dense_there & set(here)}))
        return f"that was not truncated; this model is truncated at rank {ranks}"
    common = [n for n in here if n in there and here[n] != there[n]]
    if not common:
        return None
    saved, current = ("/".join(sorted({str(ranks[n]) for n in common})) for ranks in (there, here))
    return f"truncated at rank {saved}, this model at rank {current}"


def _check_and_load(model: nn.Module, path: Path, meta: dict[str, Any], targets: list[str]) -> None:
    ranks = _rank_mismatch(meta, path, model)  # the cause of every mismatch below, said as such
    if ranks:
        raise AdapterFileError(f"{path}: the adapter was made on a base {ranks} (load it onto the base it was made on)")
    missing = [t for t in meta["targets"] if t not in targets]
    extra = [t for t in targets if t not in meta["targets"]]
    if missing or extra:
        parts = []
        if missing:
            parts.append(f"layers in the adapter but not adaptable in this model: {missing}")
        if extra:
            parts.append(f"layers this model adapts that the adapter lacks: {extra}")
        raise AdapterFileError(f"{path}: layer mismatch ({'; '.join(parts)})")
    problems = _compare_fingerprints(meta["fingerprint"], base_fingerprint(model))
    if meta.get("rest_fingerprint") is not None:
        problems += _compare_rest(
            meta["rest_fingerprint"], base_rest_fingerprint(model), meta.get("rest_dtypes"), _rest_dtypes(model)
        )
    if problems:
        shown = "; ".join(problems[:5]) + (f"; and {len(problems) - 5} more" if len(problems) > 5 else "")
        raise AdapterFileError(f"{path}: the adapter was made for a different base model ({shown})")
    saved_here = list(adapter_state(model).saved)  # type: ignore[union-attr]
    if meta["modules_to_save"] != saved_here:
        raise AdapterFileError(
            f"{path}: modules_to_save differ (the adapter has {meta['modules_to_save']}, this model {saved_here})"
        )
    params = adapter_tensors(model)
    try:
        with safe_open(str(path), framework="pt") as f:
            keys = set(f.keys())
            if keys != set(params):
                raise AdapterFileError(
                    f"{path}: tensor names differ from this method's tensors "
                    f"(missing {sorted(set(params) - keys)[:5]}, unexpected {sorted(keys - set(params))[:5]})"
                )
            loaded = {k: f.get_tensor(k) for k in keys}
    except SafetensorError as e:
        raise AdapterFileDamaged(f"{path}: corrupt tensor data ({e})") from e
    except OSError as e:  # the file no longer opens (its permissions changed, or it went) since its header was read
        raise (_open_error(path) or e) from e
    if meta.get("checksum") is not None and tensor_checksum(loaded) != meta["checksum"]:
        raise AdapterFileDamaged(f"{path}: damaged tensor data (its checksum does not match the one it was saved with)")
    for k, t in loaded.items():
        if t.shape != params[k].shape:
            raise AdapterFileError(f"{path}: {k} has shape {list(t.shape)}, expected {list(params[k].shape)}")
        if not torch.isfinite(t).all():
            raise AdapterFileDamaged(f"{path}: {k} contains NaN or infinite values")
    with torch.no_grad():
        for k, t in loaded.items():
            params[k].copy_(t)
