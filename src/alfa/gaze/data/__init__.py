"""Data: the synthetic gaze worlds (the default) and loaders for the real datasets.

``open_dataset(spec)`` is the one entry point: ``synthetic:<domain>``,
``gazehub:<mpiifacegaze|eyediap|gaze360|eth-xgaze>:<root>`` or ``xgaze-h5:<path>``. Each kind is
registered by its loader module (``@register_dataset``); the imports below load the built-in ones.
"""

from .base import GazeDataset, InMemoryGazeDataset
from .registry import PersonSubset, list_datasets, open_dataset, register_dataset, split_persons

# The built-in loaders register their spec kinds on import, in this order: the order in which error
# messages list the forms (hence the isort splits).
# isort: split
from . import synthetic  # noqa: F401

# isort: split
from . import gazehub, xgaze  # noqa: F401
from .gazehub import DatasetFormatError

__all__ = [
    "DatasetFormatError",
    "GazeDataset",
    "InMemoryGazeDataset",
    "PersonSubset",
    "list_datasets",
    "open_dataset",
    "register_dataset",
    "split_persons",
]
