"""Model families, one per file, created by name through a small registry (``create_model``)."""

from __future__ import annotations

from collections.abc import Callable

from torch import nn

_REGISTRY: dict[str, Callable[..., nn.Module]] = {}


def register_model(fn: Callable[..., nn.Module]) -> Callable[..., nn.Module]:
    """Decorator: make a model constructor available to :func:`create_model` under its name."""
    if fn.__name__ in _REGISTRY:
        raise ValueError(f"model {fn.__name__!r} is already registered")
    _REGISTRY[fn.__name__] = fn
    return fn


def list_models() -> list[str]:
    return sorted(_REGISTRY)


def create_model(name: str, **kwargs) -> nn.Module:
    """Build a registered model by name, e.g. ``create_model("resnet18_gaze")``."""
    if name not in _REGISTRY:
        raise ValueError(f"unknown model {name!r}; known: {list_models()}")
    return _REGISTRY[name](**kwargs)


# Each family registers its named constructors on import.
from . import crate, vit  # noqa: E402
from .resnet import ResNet, resnet18_gaze  # noqa: E402

__all__ = ["ResNet", "crate", "create_model", "list_models", "register_model", "resnet18_gaze", "vit"]
