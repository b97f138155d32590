"""Model checkpoints: safetensors weights plus a JSON config header, written atomically.

The config records how to rebuild the model (registered name, constructor arguments, ranks of the
factorized layers), so :func:`load_model` can rebuild and fill it, and a checkpoint of another
model is refused with a message naming what differs. Nothing is unpickled.
"""

from __future__ import annotations

import json
import os
import pickle
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file
from torch import Tensor, nn

from .adapters.io import tensor_checksum
from .fileio import atomic_path
from .models import create_model
from .truncate import factorized_ranks, restore_structure

__all__ = [
    "CheckpointError",
    "save_model",
    "load_model",
    "read_checkpoint",
    "load_state",
    "load_backbone",
    "write_tagged",
    "read_tagged",
]

FORMAT = "alfa-checkpoint"


class CheckpointError(ValueError):
    """A checkpoint that is corrupt, of another format, or for another model."""


def write_tagged(path: str | os.PathLike, tensors: dict[str, Tensor], fmt: str, meta: dict[str, Any]) -> Path:
    """Write ``tensors`` atomically as safetensors with a ``format`` tag and a JSON ``meta`` header: the
    file kind other modules use for their own state (figure data, TPGaze meta-training)."""
    path = Path(path)
    with atomic_path(path) as tmp:
        save_file(tensors, str(tmp), metadata={"format": fmt, "meta": json.dumps(meta)})
    return path


def read_tagged(path: str | os.PathLike, fmt: str, what: str) -> tuple[dict[str, Tensor], dict[str, Any]]:
    """Read what :func:`write_tagged` wrote; a :class:`CheckpointError` (a ``ValueError``) naming the file
    if it is unreadable, of another kind (``what`` says which was expected) or has a damaged header."""
    path = Path(path)
    try:
        with safe_open(str(path), framework="pt") as f:
            raw = f.metadata() or {}
            tensors = {k: f.get_tensor(k) for k in f.keys()}
    except (SafetensorError, OSError) as e:
        raise CheckpointError(f"{path}: not a readable safetensors file ({e})") from e
    if raw.get("format") != fmt:
        raise CheckpointError(f"{path}: not {what} (no '{fmt}' header)")
    try:
        return tensors, json.loads(raw["meta"])
    except (KeyError, json.JSONDecodeError) as e:
        raise CheckpointError(f"{path}: damaged header ({e})") from e


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
    records a checksum of its tensors, verified on load."""
    tensors = {k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()}
    config = {
        "model": model_name,
        "model_kwargs": model_kwargs or {},
        "factorized": factorized_ranks(model),
        "extra": extra or {},
        "checksum": tensor_checksum(tensors),
    }
    if input_size is not None:
        config["input_size"] = [int(input_size[0]), int(input_size[1])]
    if input_scaling is not None:
        config["input_scaling"] = input_scaling
    path = Path(path)
    with atomic_path(path) as tmp:
        save_file(tensors, str(tmp), metadata={"format": FORMAT, "config": json.dumps(config, sort_keys=True)})
    return path


def read_checkpoint(path: str | os.PathLike, *, header_only: bool = False) -> tuple[dict[str, Tensor], dict[str, Any]]:
    """The tensors and config of a checkpoint written by :func:`save_model` (``header_only``: the config
    and no tensor, without reading the weights)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint not found: {path}")
    try:
        with safe_open(str(path), framework="pt") as f:
            meta = f.metadata() or {}
            if meta.get("format") != FORMAT:
                raise CheckpointError(f"{path}: not an alfa checkpoint (no '{FORMAT}' header)")
            tensors = {} if header_only else {k: f.get_tensor(k) for k in f.keys()}
    except (SafetensorError, OSError) as e:
        raise CheckpointError(f"{path}: not a readable safetensors file ({e})") from e
    try:
        config = json.loads(meta["config"])
    except (KeyError, json.JSONDecodeError) as e:
        raise CheckpointError(f"{path}: damaged checkpoint header ({e})") from e
    # files written before checksums have none
    if not header_only and config.get("checksum") is not None and tensor_checksum(tensors) != config["checksum"]:
        raise CheckpointError(f"{path}: damaged tensor data (its checksum does not match the one it was saved with)")
    return tensors, config


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
    """Load backbone weights saved by another tool (e.g. torchvision's ImageNet ResNet-18 ``.pth``,
    or a safetensors file) into a dense model, leaving parameters whose names start with ``skip``
    (the regression head) as they are. ``.pth`` files are read with ``weights_only=True``.
    Returns the names loaded."""
    path = Path(path)
    if path.suffix == ".safetensors":
        with safe_open(str(path), framework="pt") as f:
            tensors = {k: f.get_tensor(k) for k in f.keys()}
    else:
        try:  # weights_only: tensors and plain containers, never code (torch's hint to disable it is not shown)
            obj = torch.load(path, map_location="cpu", weights_only=True)
        except (pickle.UnpicklingError, RuntimeError, EOFError, OSError) as e:
            raise CheckpointError(
                f"{path} does not load as a plain state dict ({type(e).__name__}): only tensors are read, never "
                "pickled code; save it as .safetensors"
            ) from None
        tensors = obj.get("state_dict", obj) if isinstance(obj, dict) else None
        if not isinstance(tensors, dict):
            raise CheckpointError(f"{path}: expected a state dict")
    tensors = {k.removeprefix("module."): v for k, v in tensors.items() if not k.startswith(skip)}
    load_state(model, tensors, source=str(path), skip=skip)
    return sorted(tensors)
