"""A small HTTP gaze service: one shared base, every user's adapter loaded when first asked for (``alfa serve``).

    GET  /health            -> 200 {"status": "ok", "users_loaded", "input_size"}
    POST /predict?user=ID   body: a face crop (PNG or JPEG) of the base's input size
                            -> 200 {"user", "yaw", "pitch", "unit": "radians"}
    POST /predict/photo?user=ID   body: a photo of one face, any size within the pixel limit (the camera extra)
                            -> 200 {"user", "image", "camera", "convention", "faces"}

Split by role: :mod:`.limits` checks what a request may be (sizes before decoding, ids, the token),
:mod:`.model` answers it (the base and the users' adapters), :mod:`.server` speaks HTTP (a bounded worker pool,
timeouts, the route table, the access log) and :mod:`.selftest` puts the whole under load on the loopback
address. ``docs/deploy.md`` says what the service protects against and what it does not.
"""

from .limits import TOKEN_ENV, ServiceError, ServiceLimits, max_workers
from .model import GazeService
from .server import ROUTES, GazeServer, Request, Route, is_loopback, make_server

__all__ = [
    "GazeServer",
    "GazeService",
    "ROUTES",
    "Request",
    "Route",
    "ServiceError",
    "ServiceLimits",
    "TOKEN_ENV",
    "is_loopback",
    "make_server",
    "max_workers",
]
