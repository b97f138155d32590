"""The model registry: named constructors, filled by the family modules as they are imported.

Kept apart from :mod:`alfa.models` so a family module imports only this (``from .registry import
register_model``) and never its own package, whose ``__init__`` imports the families.
"""

from __future__ import annotations

from collections.abc import Callable

from torch import nn

__all__ = ["register_model", "list_models", "create_model"]

_REGISTRY: dict[str, Callable[..., nn.Module]] = {}


def register_model(fn: Callable[..., nn.Module]) -> Callable[..., nn.Module]:
    """Decorator: make a model constructor available to :func:`create_model` under its name."""
    if fn.__name__ in _REGISTRY:
        raise ValueError(f"model {fn.__name__!r} is already registered")
    _REGISTRY[fn.__name__] = fn
    return fn


def list_models() -> list[str]:
    """The registered constructor names, sorted."""
    return sorted(_REGISTRY)


def create_model(name: str, **kwargs) -> nn.Module:
    """Build a registered model by name, e.g. ``create_model("resnet18_gaze")``."""
    if name not in _REGISTRY:
        raise ValueError(f"unknown model {name!r}; known: {', '.join(list_models())}")
    return _REGISTRY[name](**kwargs)
