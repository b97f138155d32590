"""Model checkpoints: safetensors weights plus a JSON config header, written atomically.

The config records how to rebuild the model (registered name, constructor arguments, ranks of the
factorized layers), so :func:`load_model` can rebuild and fill it, and a checkpoint of another
model is refused with a message naming what differs. Nothing is unpickled.

Tied parameters (one tensor under two names, e.g. GPT-2's ``lm_head.weight`` and
``transformer.wte.weight``) are stored once, under their first name; the header lists the other names
and reading fills them back in.

:func:`save_pretrained` / :func:`load_pretrained` do the same for Hugging Face transformers models
(which no registered name rebuilds): the model's own ``config.json`` next to an alfa checkpoint, so a
truncated model comes back with its factorized layers, which ``from_pretrained`` cannot rebuild.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open
from torch import Tensor, nn

from .adapters.io import refuse_non_finite, tensor_checksum
from .adapters.state import adapted_layers
from .fileio import kind_of_file, require_path, write_safetensors
from .models import create_model, list_models
from .surgery import require_flags
from .truncate import factorized_ranks, restore_structure

__all__ = [
    "CheckpointError",
    "save_model",
    "refuse_unregistered_model",
    "model_checksum",
    "load_model",
    "read_checkpoint",
    "load_state",
    "load_backbone",
    "write_tagged",
    "read_tagged",
    "optimizer_tensors",
    "load_optimizer_tensors",
    "save_pretrained",
    "load_pretrained",
    "PRETRAINED_FILE",
]

FORMAT = "alfa-checkpoint"
PRETRAINED_FILE = "alfa-model.safetensors"  # what save_pretrained writes next to config.json
TRANSFORMERS_WEIGHTS = (
    "model.safetensors",
    "model-*-of-*.safetensors",
    "model.safetensors.index.json",
    "pytorch_model.bin",
    "pytorch_model-*-of-*.bin",
    "pytorch_model.bin.index.json",
)
"""The weight files transformers' ``save_pretrained`` writes (one file, or shards and their index)."""


class CheckpointError(ValueError):
    """A checkpoint that is corrupt, of another format, or for another model."""


def write_tagged(path: str | os.PathLike, tensors: dict[str, Tensor], fmt: str, meta: dict[str, Any]) -> Path:
    """Write ``tensors`` atomically as safetensors with a ``format`` tag and a JSON ``meta`` header: the
    file kind other modules use for their own state (figure data, TPGaze meta-training)."""
    path = Path(path)
    return write_safetensors(path, tensors, {"format": fmt, "meta": json.dumps(meta)})


def read_tagged(path: str | os.PathLike, fmt: str, what: str) -> tuple[dict[str, Tensor], dict[str, Any]]:
    """Read what :func:`write_tagged` wrote; a :class:`CheckpointError` (a ``ValueError``) naming the file
    if it is unreadable, of another kind (``what`` says which was expected) or has a damaged header."""
    path = Path(path)
    try:
        with safe_open(str(path), framework="pt") as f:
            raw = f.metadata() or {}
            tensors = {k: f.get_tensor(k) for k in f.keys()}
    except (SafetensorError, OSError) as e:
        raise CheckpointError(f"{path}: not a readable safetensors file ({kind_of_file(path) or e})") from e
    if raw.get("format") != fmt:
        raise CheckpointError(f"{path}: not {what} (no '{fmt}' header)")
    try:
        return tensors, json.loads(raw["meta"])
    except (KeyError, json.JSONDecodeError) as e:
        raise CheckpointError(f"{path}: damaged header ({e})") from e


def optimizer_tensors(optimizer: torch.optim.Optimizer | None, prefix: str) -> dict[str, Tensor]:
    """The per-parameter state of ``optimizer`` (Adam's moments and step count) as tensors named
    ``prefix/<parameter index>/<key>``, for a :func:`write_tagged` file; nothing for ``None`` or a stateless one.
    Its hyperparameters are not stored: a resumed run rebuilds the optimizer from its own (checked) config."""
    if optimizer is None:
        return {}
    out = {}
    for index, state in optimizer.state_dict()["state"].items():
        for key, value in state.items():
            out[f"{prefix}/{index}/{key}"] = torch.as_tensor(value).detach().cpu().contiguous()
    return out


def load_optimizer_tensors(optimizer: torch.optim.Optimizer | None, tensors: dict[str, Tensor], prefix: str) -> None:
    """Put back into ``optimizer`` the state :func:`optimizer_tensors` stored under ``prefix``."""
    if optimizer is None:
        return
    state: dict[int, dict[str, Tensor]] = {}
    for name, value in tensors.items():
        head, _, rest = name.partition("/")
        if head != prefix:
            continue
        index, _, key = rest.partition("/")
        state.setdefault(int(index), {})[key] = value
    optimizer.load_state_dict({"state": state, "param_groups": optimizer.state_dict()["param_groups"]})


def _refuse_attached_adapter(model: nn.Module, saver: str) -> None:
    layers = adapted_layers(model)
    if layers:
        raise CheckpointError(
            f"{saver} saves a model, not an adapter ({len(layers)} adapted layers are attached): save the adapter "
            "with alfa.save_adapter(model, 'adapter.safetensors'), then alfa.detach(model) (or alfa.merge(model)) "
            "and save the model"
        )


def refuse_unregistered_model(model_name: str, who: str) -> None:
    """``ValueError`` where no constructor is registered as ``model_name``: :func:`load_model` could not rebuild a
    file saved under it (checked before a training run that will save one, not after its first epoch)."""
    if model_name not in list_models() and not model_name.startswith("transformers:"):  # (save_pretrained's own)
        raise ValueError(
            f"{who}: no model is registered as {model_name!r}, so load_model could not rebuild its file; register "
            f"its constructor first (@alfa.models.register_model on a function named {model_name!r} that builds it "
            f"from model_kwargs). Registered: {', '.join(list_models())}"
        )


def save_model(
    path: str | os.PathLike,
    model: nn.Module,
    model_name: str,
    model_kwargs: dict | None = None,
    extra: dict[str, Any] | None = None,
    input_size: tuple[int, int] | None = None,
    input_scaling: str | None = None,
) -> Path:
    """Save ``model`` (buffers included) with what is needed to rebuild it; ``extra`` is any
    JSON-serializable information to keep alongside (training config, metrics); ``input_size`` the
    (height, width) of the images it was trained on and ``input_scaling`` how their pixels were scaled, which
    the gaze commands check data against. The file
    records a checksum of its tensors, verified on load. An attached adapter is refused (the file could not be
    rebuilt: its adapted layers are no model's), as :func:`save_pretrained` refuses it."""
    _refuse_attached_adapter(model, "alfa.checkpoint.save_model")
    refuse_unregistered_model(model_name, "alfa.checkpoint.save_model")
    tensors, tied = _file_tensors(model)
    config = {
        "model": model_name,
        "model_kwargs": model_kwargs or {},
        "factorized": factorized_ranks(model),
        "extra": extra or {},
        "checksum": tensor_checksum(tensors),
    }
    if tied:
        config["tied"] = tied
    if input_size is not None:
        config["input_size"] = [int(input_size[0]), int(input_size[1])]
    if input_scaling is not None:
        config["input_scaling"] = input_scaling
    path = Path(path)
    refuse_non_finite(tensors, path)  # a diverged model is refused here, not when it is loaded again
    return write_safetensors(path, tensors, {"format": FORMAT, "config": json.dumps(config, sort_keys=True)})


def _file_tensors(model: nn.Module) -> tuple[dict[str, Tensor], dict[str, str]]:
    """The tensors :func:`save_model` writes (on the CPU, contiguous) and the tied names it leaves out."""
    tensors = {k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()}
    # safetensors refuses tensors that share memory: keep one name per tied tensor, list the others.
    tied = {alias: first for alias, first in _aliases(model).items() if alias in tensors and first in tensors}
    for alias in tied:
        del tensors[alias]
    return tensors, tied


def model_checksum(model: nn.Module) -> str:
    """The checksum :func:`save_model` would record for ``model`` (its ``"checksum"`` header entry): which weights a
    file derived from it was made from, whatever device or memory layout they are in now."""
    return tensor_checksum(_file_tensors(model)[0])


def _aliases(model: nn.Module) -> dict[str, str]:
    """Every later name of a parameter or buffer the model holds under several names -> its first name."""
    first: dict[int, str] = {}
    out: dict[str, str] = {}
    named = [*model.named_parameters(remove_duplicate=False), *model.named_buffers(remove_duplicate=False)]
    for name, t in named:
        if id(t) in first:
            out[name] = first[id(t)]
        else:
            first[id(t)] = name
    return out


_BESIDE = "model.safetensors"  # the model the training commands write beside their resumable state

_OTHER_FILES = {
    "alfa-source-train-state": ("the resumable training state of alfa pretrain or alfa truncate", _BESIDE),
    "alfa-faze-state": ("the resumable training state of alfa faze train or alfa faze meta-train", _BESIDE),
    "alfa-tpgaze-meta": ("the resumable state of alfa tpgaze meta-train", "prompts.safetensors"),
}
"""The other alfa files a checkpoint's place may be given (by the ``format`` of their header): what each is, and the
file beside it that a command takes instead."""


def _what_it_is(path: Path, meta: dict[str, str]) -> str:
    """What the alfa file at ``path`` (header ``meta``, not a checkpoint's) is and which option takes it; for any
    other file, the header it lacks."""
    fmt = meta.get("format")
    if fmt == "alfa-adapter":
        if meta.get("method") == "tpgaze":
            return (
                "it holds TPGaze prompts, an adapter: meta-trained ones go to alfa tpgaze personalize --meta, a "
                "person's are read from an --adapters folder"
            )
        return (
            f"it is a person's {meta.get('method', '?')} adapter: give it to --adapter (alfa predict, alfa export) or "
            "put it in an --adapters folder (alfa evaluate, alfa serve), with the base it was made on as --checkpoint"
        )
    if fmt in _OTHER_FILES:
        what, beside = _OTHER_FILES[fmt]
        which = "prompts, for alfa tpgaze personalize --meta" if beside != _BESIDE else "model, for --checkpoint"
        there = f"; its {which}, is {path.parent / beside}" if (path.parent / beside).is_file() else ""
        return f"it is {what}, kept to resume the run{there}"
    return f"no '{FORMAT}' header"


def read_checkpoint(path: str | os.PathLike, *, header_only: bool = False) -> tuple[dict[str, Tensor], dict[str, Any]]:
    """The tensors and config of a checkpoint written by :func:`save_model` (``header_only``: the config
    and no tensor, without reading the weights)."""
    path = Path(path)
    if path.is_dir():
        hint = f" (the model the training commands write there is {path / 'model.safetensors'})"
        hint = hint if (path / "model.safetensors").is_file() else ""
        raise FileNotFoundError(f"checkpoint {path} is a folder, not a checkpoint file{hint}")
    if path.exists() and not path.is_file():
        raise ValueError(f"checkpoint {path} is not a regular file (a device, pipe or socket): name a checkpoint file")
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint not found: {path}")
    if not os.access(path, os.R_OK):  # safetensors would call an unreadable file a missing one
        raise PermissionError(f"checkpoint {path}: not readable (permission denied)")
    try:
        with safe_open(str(path), framework="pt") as f:
            meta = f.metadata() or {}
            if meta.get("format") != FORMAT:
                raise CheckpointError(f"{path}: not an alfa checkpoint ({_what_it_is(path, meta)})")
            tensors = {} if header_only else {k: f.get_tensor(k) for k in f.keys()}
    except (SafetensorError, OSError) as e:
        raise CheckpointError(f"{path}: not a readable safetensors file ({kind_of_file(path) or e})") from e
    try:
        config = json.loads(meta["config"])
    except (KeyError, json.JSONDecodeError) as e:
        raise CheckpointError(f"{path}: damaged checkpoint header ({e})") from e
    if not isinstance(config, dict):
        raise CheckpointError(f"{path}: damaged checkpoint header (its config is not a JSON object)")
    _check_config(path, config)
    # files written before checksums have none
    if not header_only and config.get("checksum") is not None and tensor_checksum(tensors) != config["checksum"]:
        raise CheckpointError(f"{path}: damaged tensor data (its checksum does not match the one it was saved with)")
    if not header_only:
        for alias, first in config.get("tied", {}).items():
            if first not in tensors:
                raise CheckpointError(f"{path}: {alias} is tied to {first}, which the file does not hold")
            tensors[alias] = tensors[first]
    return tensors, config


def _count(value: Any) -> bool:
    """A whole number of at least 1 (JSON's ``true`` is not one)."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


_CONFIG_KINDS: dict[str, tuple[Callable[[Any], bool], str, bool]] = {
    "model": (lambda v: isinstance(v, str), "a model name", False),
    "model_kwargs": (lambda v: isinstance(v, dict), "a JSON object", False),
    "factorized": (
        lambda v: isinstance(v, dict) and all(_count(r) for r in v.values()),
        "a JSON object of layer names to ranks",
        False,
    ),
    "extra": (lambda v: isinstance(v, dict), "a JSON object", False),
    "tied": (
        lambda v: isinstance(v, dict) and all(isinstance(n, str) for n in v.values()),
        "a JSON object of tensor names to tensor names",
        False,
    ),
    "input_size": (
        lambda v: isinstance(v, list) and len(v) == 2 and all(_count(n) for n in v),
        "[height, width] in pixels",
        True,
    ),
    "input_scaling": (lambda v: isinstance(v, str), "a text", True),
    "checksum": (lambda v: isinstance(v, str), "a text", True),
}
"""Per entry of a checkpoint's config that is read: its check, what it should be, and whether null stands for
its absence (files from before it was recorded)."""


def _check_config(path: Path, config: dict[str, Any]) -> None:
    """Valid JSON of the wrong kind in a checkpoint's config is damage too: named here, with the file and the
    entry, rather than met as a traceback where the entry is read (rebuilding the model, checking the data)."""
    for key, (fits, what, nullable) in _CONFIG_KINDS.items():
        if key not in config or (nullable and config[key] is None) or fits(config[key]):
            continue
        raise CheckpointError(f"{path}: damaged checkpoint header (its {key!r} is not {what})")


def load_state(
    model: nn.Module, tensors: dict[str, Tensor], source: str = "checkpoint", skip: tuple[str, ...] = ()
) -> None:
    """Load tensors into ``model`` strictly (except entries whose names start with ``skip``), with an
    error that names every mismatch."""
    own = {k: v for k, v in model.state_dict().items() if not k.startswith(skip)}
    missing = sorted(set(own) - set(tensors))
    unexpected = sorted(set(tensors) - set(own))
    shapes = [
        f"{k}: {list(tensors[k].shape)} vs {list(own[k].shape)}"
        for k in own
        if k in tensors and tensors[k].shape != own[k].shape
    ]
    if missing or unexpected or shapes:
        raise CheckpointError(
            f"{source} does not fit this model: missing {missing[:6]}, unexpected {unexpected[:6]}, "
            f"shape mismatches {shapes[:6]}"
        )
    bad = [k for k, v in tensors.items() if v.is_floating_point() and not torch.isfinite(v).all()]
    if bad:
        raise CheckpointError(f"{source} holds NaN or infinite values in {bad[:6]}")
    model.load_state_dict(tensors, strict=not skip)


def load_model(path: str | os.PathLike, expect_model: str | None = None) -> tuple[nn.Module, dict[str, Any]]:
    """Rebuild the model saved at ``path`` (truncated layers included) and load its weights."""
    tensors, config = read_checkpoint(path)
    name = config.get("model")
    if expect_model is not None and name != expect_model:
        raise CheckpointError(f"{path}: a checkpoint of {name!r}, expected {expect_model!r}")
    try:
        model = create_model(name, **config.get("model_kwargs", {}))
        restore_structure(model, {k: int(v) for k, v in config.get("factorized", {}).items()})
    except (ValueError, TypeError) as e:
        raise CheckpointError(f"{path}: cannot rebuild the model: {e}") from e
    load_state(model, tensors, source=str(path))
    return model, config


def load_backbone(model: nn.Module, path: str | os.PathLike, skip: tuple[str, ...] = ("fc.",)) -> list[str]:
    """Load backbone weights saved by another tool as a safetensors file (e.g. torchvision's ImageNet ResNet-18,
    converted once) into a dense model, leaving parameters whose names start with ``skip`` (the regression head)
    as they are. A ``.pth`` file is a pickle, which alfa never loads: the error says how to convert it, a step
    its owner takes knowing where it came from. Returns the names loaded."""
    path = Path(path)
    if path.suffix != ".safetensors":
        raise CheckpointError(
            f"{path}: alfa reads backbones as .safetensors only (a .pth file is a pickle, which it never loads); "
            'convert a file you trust once: python -c "import torch, safetensors.torch as s; '
            f"s.save_file(torch.load('{path}', weights_only=True), '{path.with_suffix('.safetensors')}')\""
        )
    try:
        with safe_open(str(path), framework="pt") as f:
            tensors = {k: f.get_tensor(k) for k in f.keys()}
    except (SafetensorError, OSError) as e:
        raise CheckpointError(f"{path}: not a readable safetensors file ({kind_of_file(path) or e})") from e
    tensors = {k.removeprefix("module."): v for k, v in tensors.items() if not k.startswith(skip)}
    load_state(model, tensors, source=str(path), skip=skip)
    return sorted(tensors)


def save_pretrained(
    model: nn.Module, directory: str | os.PathLike, *, extra: dict[str, Any] | None = None, overwrite: bool = False
) -> Path:
    """Save a Hugging Face transformers model, truncated or not, so that :func:`load_pretrained` rebuilds it
    exactly: its config (``config.json``, written by the model's own config) and an alfa checkpoint
    (``alfa-model.safetensors``: every tensor, the ranks of the factorized layers, a checksum).

    This is what to use instead of ``model.save_pretrained`` once :func:`alfa.truncate` changed the model:
    ``from_pretrained`` cannot rebuild factorized layers (it would initialize them at random). An attached
    adapter is refused: save it with :func:`alfa.save_adapter`, and save the base after
    :func:`alfa.detach` (or the merged model after :func:`alfa.merge`). Returns the directory.

    A folder that already holds an earlier ``save_pretrained`` is replaced, as transformers does. A folder
    holding another model's ``config.json`` (``model.save_pretrained``'s, a download) is refused unless
    ``overwrite=True``: replacing its config would leave its weights under a config that is not theirs, so
    ``overwrite=True`` also deletes transformers' weight files there (:data:`TRANSFORMERS_WEIGHTS`).
    """
    directory = require_path(directory, "save_pretrained", "directory")
    require_flags("save_pretrained", overwrite=overwrite)
    _refuse_attached_adapter(model, "alfa.save_pretrained")
    hf_config = getattr(model, "config", None)
    if not callable(getattr(hf_config, "save_pretrained", None)):
        raise TypeError(
            f"{type(model).__name__} is not a transformers model (no config.save_pretrained); save it with "
            "alfa.checkpoint.save_model"
        )
    if (directory / "config.json").is_file() and not (directory / PRETRAINED_FILE).is_file() and not overwrite:
        raise CheckpointError(
            f"{directory} holds another model's config.json (not one alfa.save_pretrained wrote): writing this "
            "model's config there would leave that model's weights under it; save into a new folder, or pass "
            "overwrite=True"
        )
    directory.mkdir(parents=True, exist_ok=True)
    if overwrite:  # the other model's weights go with its config: from_pretrained would read them under ours
        for pattern in TRANSFORMERS_WEIGHTS:
            for stale in directory.glob(pattern):
                stale.unlink()
    hf_config.save_pretrained(directory)
    save_model(directory / PRETRAINED_FILE, model, model_name=f"transformers:{type(model).__name__}", extra=extra)
    return directory


def load_pretrained(model_class: Any, directory: str | os.PathLike) -> nn.Module:
    """Rebuild a model written by :func:`save_pretrained`: ``model_class`` (a transformers model class such as
    ``GPT2LMHeadModel``, or an ``AutoModel…`` class) is built from the saved config, its truncated layers
    are factorized again at their saved ranks (:func:`alfa.truncate.restore_structure`), and every tensor is
    loaded strictly (an error names any mismatch). The model is returned in eval mode, as from_pretrained does.
    """
    if not isinstance(model_class, type):  # a model instance: the class builds the saved one
        raise TypeError(
            f"load_pretrained takes a model class (e.g. GPT2LMHeadModel or AutoModelForCausalLM), got an instance of "
            f"{type(model_class).__name__}: pass type(model)"
        )
    directory = require_path(directory, "load_pretrained", "directory")
    path = directory / PRETRAINED_FILE
    if not path.is_file():
        raise FileNotFoundError(
            f"{path} not found: load_pretrained reads what alfa.save_pretrained wrote "
            "(a folder saved by model.save_pretrained loads with from_pretrained)"
        )
    tensors, config = read_checkpoint(path)
    own_config = getattr(model_class, "config_class", None)
    if own_config is not None:  # a model class: built from its config, random weights (overwritten below)
        model = model_class(own_config.from_pretrained(directory))
    else:  # an AutoModel… class; transformers is loaded, since the caller holds one of its classes
        model = model_class.from_config(sys.modules["transformers"].AutoConfig.from_pretrained(directory))
    saved = str(config.get("model", "")).removeprefix("transformers:")
    if saved != type(model).__name__:
        raise CheckpointError(
            f"{path}: a checkpoint of {saved!r}, but {model_class.__name__} builds a {type(model).__name__}"
        )
    try:
        restore_structure(model, {k: int(v) for k, v in config.get("factorized", {}).items()})
    except (ValueError, TypeError) as e:
        raise CheckpointError(f"{path}: cannot rebuild the model: {e}") from e
    dtypes = {t.dtype for t in tensors.values() if t.is_floating_point()}
    if len(dtypes) == 1:
        model.to(dtypes.pop())  # keep the saved precision (the config builds float32)
    load_state(model, tensors, source=str(path))
    return model.eval()
