"""The gaze stack: geometry, losses, source training, personalization and evaluation."""

from .geometry import angular_error, flip_yaw, gazehub_vector_to_pitchyaw, pitchyaw_to_vector, vector_to_pitchyaw

__all__ = ["angular_error", "flip_yaw", "gazehub_vector_to_pitchyaw", "pitchyaw_to_vector", "vector_to_pitchyaw"]
