"""A small HTTP gaze service: one shared base, every user's adapter loaded when first asked for (``alfa serve``).

    POST /predict?user=ID   body: a face crop (PNG or JPEG) of the base's input size
                            -> 200 {"user", "yaw", "pitch", "unit": "radians"}
    POST /predict/photo?user=ID   body: a photo of any size (PNG, JPEG, ...) with one face; the crop is made here
                            -> 200 the fields of ``alfa predict`` (box, landmarks, head pose, normalized and
                               camera-frame gaze in degrees, the convention named), default intrinsics
    GET  /health            -> 200 {"users_loaded", "input_size"}

Unknown users (no adapter file ``<ID>.safetensors`` in the folder, or one that does not load onto the base) get
404, images that are not images or not of the input size 400, bodies over the size limit 413; every error is
a JSON ``{"error": ...}`` that says what is wrong. Predictions go through :class:`alfa.serve.MultiUserModel`, so
a user's answer is their own personalized model's. Requests are served by threads; the model runs one request
at a time under a lock (the predictions do not depend on the interleaving).
"""

from __future__ import annotations

import io
import json
import os
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlparse

import numpy as np
import torch

from alfa.checkpoint import load_model
from alfa.serve import MultiUserModel

from .evaluate import adapter_filename

__all__ = ["GazeService", "ServiceError", "make_server"]

MAX_BODY_BYTES = 8 * 1024 * 1024


class ServiceError(Exception):
    """A request the service refuses: ``status`` is the HTTP code, the message says why."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class GazeService:
    """The model side of the service: a base checkpoint and a folder of per-user adapter files."""

    def __init__(self, checkpoint: str | os.PathLike, adapters: str | os.PathLike) -> None:
        self.adapters = Path(adapters)
        if not self.adapters.is_dir():
            raise FileNotFoundError(f"adapter folder not found: {self.adapters}")
        base, saved = load_model(checkpoint)
        size = saved.get("input_size")
        if not size:
            raise ValueError(f"{checkpoint} does not record the image size it was trained on")
        self.input_size = (int(size[0]), int(size[1]))
        self.model = MultiUserModel(base.eval())
        self._lock = threading.Lock()

    def _ensure_user(self, user: str) -> None:
        if user in self.model.users:
            return
        path = self.adapters / adapter_filename(user)
        if adapter_filename(user) != f"{user}.safetensors" or not path.is_file():
            raise ServiceError(404, f"unknown user {user!r}")
        try:
            self.model.add_user(user, path)
        except (ValueError, RuntimeError) as e:
            raise ServiceError(404, f"user {user!r}: their adapter does not load onto this base ({e})") from None

    def decode(self, body: bytes) -> torch.Tensor:
        """A 1×3×H×W image in [0, 1] from PNG/JPEG bytes, of the base's input size."""
        from PIL import Image, UnidentifiedImageError

        try:
            with Image.open(io.BytesIO(body)) as img:
                img.load()
                rgb = img.convert("RGB")
        except (UnidentifiedImageError, OSError, ValueError) as e:
            raise ServiceError(400, f"the body is not a readable image ({type(e).__name__})") from None
        h, w = self.input_size
        if (rgb.height, rgb.width) != (h, w):
            raise ServiceError(400, f"the image is {rgb.height}×{rgb.width}; this model takes {h}×{w} face crops")
        array = np.asarray(rgb, dtype=np.uint8).copy()
        return torch.from_numpy(array).permute(2, 0, 1)[None].float() / 255.0

    def predict(self, user: str, body: bytes) -> dict[str, Any]:
        if not user:
            raise ServiceError(400, "no user: POST /predict?user=ID")
        image = self.decode(body)
        with self._lock:
            self._ensure_user(user)
            yaw, pitch = self.model(image, [user])[0].tolist()
        return {"user": user, "yaw": yaw, "pitch": pitch, "unit": "radians"}

    def predict_photo(self, user: str, body: bytes) -> dict[str, Any]:
        """A raw photo's answer (:func:`alfa.gaze.camera.answer_photo`): detection, normalization and the crop
        here, the user's model on it; a photo the camera path refuses (no face, several, too large) is a 400."""
        from .camera import answer_photo, model_predictor

        if not user:
            raise ServiceError(400, "no user: POST /predict/photo?user=ID")

        def predictor(crops: torch.Tensor) -> torch.Tensor:
            with self._lock:
                self._ensure_user(user)
                model = model_predictor(_OneUser(self.model, user), self.input_size)
                return model(crops)

        try:
            return {"user": user, **answer_photo(body, predictor)}
        except (ValueError, RuntimeError) as e:
            raise ServiceError(400, str(e)) from None
        except ModuleNotFoundError as e:  # the camera extra is not installed here: the request is not at fault
            missing = f"{e.name} is not installed (the camera extra)"
            raise ServiceError(501, f"this server cannot read photos: {missing}") from None

    def health(self) -> dict[str, Any]:
        return {"users_loaded": len(self.model.users), "input_size": list(self.input_size)}


class _OneUser(torch.nn.Module):
    """The shared model as one user's: what :func:`alfa.gaze.camera.model_predictor` runs."""

    def __init__(self, model: MultiUserModel, user: str) -> None:
        super().__init__()
        self.model, self.user = model, user

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.model(images, [self.user] * images.shape[0])


def make_server(service: GazeService, host: str = "127.0.0.1", port: int = 8000) -> ThreadingHTTPServer:
    """An HTTP server for ``service`` (``port=0``: any free port; ``server.server_address`` says which)."""

    class Handler(BaseHTTPRequestHandler):
        def _reply(self, status: int, payload: dict[str, Any]) -> None:
            data = json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:  # noqa: N802 (the http.server interface)
            if urlparse(self.path).path == "/health":
                self._reply(200, service.health())
            else:
                self._reply(404, {"error": "GET /health or POST /predict?user=ID"})

        def do_POST(self) -> None:  # noqa: N802
            url = urlparse(self.path)
            routes = {"/predict": service.predict, "/predict/photo": service.predict_photo}
            if url.path not in routes:
                self._reply(404, {"error": "POST /predict?user=ID or /predict/photo?user=ID"})
                return
            try:
                length = int(self.headers.get("Content-Length") or 0)
                if length > MAX_BODY_BYTES:
                    raise ServiceError(413, f"the body is {length} bytes; the limit is {MAX_BODY_BYTES}")
                if length <= 0:
                    raise ServiceError(400, "empty body: send the face crop as PNG or JPEG")
                body = self.rfile.read(length)
                user = (parse_qs(url.query).get("user") or [""])[0]
                self._reply(200, routes[url.path](user, body))
            except ServiceError as e:
                self._reply(e.status, {"error": str(e)})

        def log_message(self, format: str, *args: Any) -> None:  # quiet: one line per request is noise here
            pass

    return ThreadingHTTPServer((host, port), Handler)
