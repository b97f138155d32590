"""Model families, one per file, created by name through a small registry (``create_model``).

The registry lives in :mod:`alfa.models.registry`; each family module registers its named
constructors there on import, and the imports below load every family.
"""

from __future__ import annotations

from . import crate, vit
from .registry import create_model, list_models, register_model
from .resnet import ResNet, resnet18_gaze

__all__ = ["ResNet", "crate", "create_model", "list_models", "register_model", "resnet18_gaze", "vit"]
