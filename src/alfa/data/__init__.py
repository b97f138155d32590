"""Data: the synthetic gaze worlds (the default) and loaders for the real datasets."""

from .base import GazeDataset, InMemoryGazeDataset

__all__ = ["GazeDataset", "InMemoryGazeDataset"]
