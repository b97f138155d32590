"""The gaze stack: geometry, losses, source training, personalization and evaluation."""

# faze registers its model (faze_gaze) with alfa.models, so a FAZE checkpoint loads wherever a gaze one does.
from . import faze  # noqa: F401
from .geometry import angular_error, flip_yaw, gazehub_vector_to_pitchyaw, pitchyaw_to_vector, vector_to_pitchyaw

__all__ = ["angular_error", "flip_yaw", "gazehub_vector_to_pitchyaw", "pitchyaw_to_vector", "vector_to_pitchyaw"]
