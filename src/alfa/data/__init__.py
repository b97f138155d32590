"""Data: the synthetic gaze worlds (the default) and loaders for the real datasets.

``open_dataset(spec)`` is the one entry point: ``synthetic:<domain>``,
``gazehub:<mpiifacegaze|eyediap|gaze360|eth-xgaze>:<root>`` or ``xgaze-h5:<path>``.
"""

from .base import GazeDataset, InMemoryGazeDataset
from .gazehub import DatasetFormatError
from .registry import PersonSubset, open_dataset, split_persons

__all__ = ["DatasetFormatError", "GazeDataset", "InMemoryGazeDataset", "PersonSubset", "open_dataset", "split_persons"]
