"""The camera path: from a photo (or a video's frames) to a normalized face crop, its gaze in the camera
frame, and the point on a screen it looks at (``alfa predict``, and ``alfa serve``'s ``/predict/photo``).

- :mod:`~alfa.gaze.camera.detect`: faces and four landmarks, by OpenCV's Haar cascades;
- :mod:`~alfa.gaze.camera.normalize`: head pose by ``solvePnP``, the normalization warp and its inverse,
  and the angle convention every output states;
- :mod:`~alfa.gaze.camera.screen`: screen points by ray–plane intersection or a calibration fit;
- :mod:`~alfa.gaze.camera.photo`: photo bytes or files (and video frames) to every printed field.

OpenCV comes with the ``camera`` extra (``pip install -e ".[camera]"``); it is imported inside the functions
that use it, so importing this package needs only the application's packages.
"""

from .detect import FaceDetection, detect_faces
from .normalize import (
    CONVENTION,
    LANDMARK_NAMES,
    Camera,
    HeadPose,
    Normalization,
    NormalizationConfig,
    angles_to_gaze_vector,
    default_camera,
    estimate_head_pose,
    gaze_vector_to_angles,
    load_camera,
    normalization_of,
    warp_to_camera,
    warp_to_normalized,
)
from .photo import (
    PhotoOptions,
    SeveralFaces,
    analyse_photo,
    analyse_video,
    answer_photo,
    calibration_gaze,
    decode_photo,
    model_predictor,
    normalized_faces,
    read_photo,
    resized_crops,
)
from .screen import (
    CalibrationPoints,
    Screen,
    ScreenFit,
    fit_screen,
    load_screen,
    load_screen_fit,
    read_calibration_points,
)

__all__ = [
    "CONVENTION",
    "CalibrationPoints",
    "LANDMARK_NAMES",
    "Camera",
    "FaceDetection",
    "HeadPose",
    "Normalization",
    "NormalizationConfig",
    "PhotoOptions",
    "Screen",
    "ScreenFit",
    "analyse_photo",
    "analyse_video",
    "angles_to_gaze_vector",
    "answer_photo",
    "SeveralFaces",
    "calibration_gaze",
    "decode_photo",
    "default_camera",
    "detect_faces",
    "estimate_head_pose",
    "fit_screen",
    "gaze_vector_to_angles",
    "load_camera",
    "load_screen",
    "load_screen_fit",
    "model_predictor",
    "normalized_faces",
    "resized_crops",
    "normalization_of",
    "read_calibration_points",
    "read_photo",
    "warp_to_camera",
    "warp_to_normalized",
]
