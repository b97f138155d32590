"""What the gaze service accepts from a request, checked in the order that keeps a hostile request cheap: the
declared body size before any byte is read, the image's format and dimensions from its header before any pixel
is decoded, the pixel count before :meth:`PIL.Image.Image.load`; user ids by charset and length before any file
is looked up. Every refusal is a :class:`ServiceError` carrying the HTTP status and a message that names no
server-side path. The HTTP layer (:mod:`.server`) and any route added later share these checks.
"""

from __future__ import annotations

import io
import re
import warnings
from dataclasses import dataclass
from typing import Any

import numpy as np

from alfa.fileio import usable_cpus

from ..camera.photo import PILLOW_WARNINGS_LOCK

__all__ = [
    "ServiceError",
    "ServiceLimits",
    "TOKEN_ENV",
    "check_token",
    "content_length",
    "decode_image",
    "max_workers",
    "open_image",
    "user_id",
    "valid_token",
]

TOKEN_ENV = "ALFA_SERVE_TOKEN"
"""The environment variable ``alfa serve`` reads its token from when ``--token`` is not given (an option is
visible to every user of the machine in the process list; the environment is not)."""

# fileio.PORTABLE_CHARS, the characters of an adapter's file name, starting with a letter or digit; ASCII
# ranges, so that every id taken names its file unchanged.
USER_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
TOKEN = re.compile(r"[!-~]+")  # printable ASCII, no spaces: what an Authorization header carries unchanged
MIN_TOKEN_CHARS = 16
CHALLENGE = {"WWW-Authenticate": "Bearer"}


class ServiceError(Exception):
    """A request the service refuses: ``status`` is the HTTP code, the message says why (and never where on the
    server), ``headers`` any the answer needs (``Retry-After``, ``WWW-Authenticate``)."""

    def __init__(self, status: int, message: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.headers = dict(headers or {})


def max_workers() -> int:
    """The most request threads ``alfa serve`` takes: 8 per CPU this process may use. A worker mostly waits on its
    client's socket (the model runs one request at a time), but each may hold a body and a decoded image at the
    limits."""
    return 8 * usable_cpus()


@dataclass(frozen=True)
class ServiceLimits:
    """The bounds of one service. Defaults suit face crops on a local network; every field is checked."""

    max_body_bytes: int = 8 * 1024 * 1024  # a request body, from its Content-Length, before reading it
    max_pixels: int = 16 * 1024 * 1024  # an image's width × height, from its header, before decoding it
    max_user_chars: int = 128  # a user id
    workers: int = 8  # threads that serve requests
    queue: int = 256  # accepted connections waiting for a worker; beyond it: 503 at once
    backlog: int = 1024  # connections the kernel holds before accepting them (capped by net.core.somaxconn)
    socket_timeout: float = 10.0  # seconds a read or write of the client's socket may wait
    request_timeout: float = 30.0  # seconds to receive a whole request, however slowly it trickles in

    def __post_init__(self) -> None:
        for name in ("max_body_bytes", "max_pixels", "max_user_chars", "workers", "queue", "backlog"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"ServiceLimits.{name} must be a whole number of at least 1, got {value!r}")
        if self.workers > max_workers():
            raise ValueError(
                f"ServiceLimits.workers {self.workers}: at most {max_workers()} (8 per CPU this process may use; each "
                f"worker may hold a {self.max_body_bytes}-byte body and its image, and the model runs one at a time)"
            )
        for name in ("socket_timeout", "request_timeout"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or not 0 < value < 3600:
                raise ValueError(f"ServiceLimits.{name} must be a number of seconds above 0 and below 3600")


def user_id(text: str | None, limits: ServiceLimits) -> str:
    """``text`` if it is a valid user id (letters, digits, ``.``, ``_``, ``-``, not starting with ``.``, ``_``
    or ``-``, at most ``limits.max_user_chars`` long): the id is the name of the user's adapter file."""
    if not text:
        raise ServiceError(
            400, "no user: add ?user=ID to the request's path (POST /predict?user=ID, /predict/photo?user=ID)"
        )
    if len(text) > limits.max_user_chars:
        raise ServiceError(400, f"the user id is {len(text)} characters; the limit is {limits.max_user_chars}")
    if not USER_ID.fullmatch(text):
        raise ServiceError(400, "a user id is letters, digits, '.', '_' and '-', and starts with a letter or digit")
    return text


def content_length(values: list[str], limits: ServiceLimits) -> int:
    """The body size a request declares (``values``: its ``Content-Length`` headers), checked before reading."""
    if not values:
        raise ServiceError(411, "no Content-Length: send the body with its length (chunked bodies are not taken)")
    if len(set(v.strip() for v in values)) > 1:
        raise ServiceError(400, "conflicting Content-Length headers")
    text = values[0].strip()
    if not text.isascii() or not text.isdigit():
        raise ServiceError(400, f"Content-Length must be a whole number of bytes, got {text[:32]!r}")
    if len(text.lstrip("0")) > 15:  # a whole number, of more bytes than any limit: read no further than that
        raise ServiceError(413, f"the body is {text[:32]} bytes; the limit is {limits.max_body_bytes}")
    length = int(text)
    if length > limits.max_body_bytes:
        raise ServiceError(413, f"the body is {length} bytes; the limit is {limits.max_body_bytes}")
    if length == 0:
        raise ServiceError(400, "empty body: send the face crop as PNG or JPEG")
    return length


def open_image(body: bytes, limits: ServiceLimits, formats: tuple[str, ...] | None = ("PNG", "JPEG")) -> Any:
    """The :class:`PIL.Image.Image` in ``body``, opened lazily: only its header is read. Refused 413 when the
    header claims more than ``limits.max_pixels`` pixels, 400 when ``body`` is not an image of ``formats``
    (``None``: any format Pillow reads). The caller closes it."""
    from PIL import Image

    what = "PNG or JPEG image" if formats == ("PNG", "JPEG") else "image"
    with PILLOW_WARNINGS_LOCK, warnings.catch_warnings():
        warnings.simplefilter("error", Image.DecompressionBombWarning)
        try:
            img = Image.open(io.BytesIO(body), formats=formats)
        except (Image.DecompressionBombError, Image.DecompressionBombWarning):
            raise ServiceError(413, f"the image has more than {limits.max_pixels} pixels") from None
        except Exception:  # noqa: BLE001 — untrusted bytes: any parser failure is the sender's, never a 500
            raise ServiceError(400, f"the body is not a readable {what}") from None
    width, height = img.size
    if width * height > limits.max_pixels:
        img.close()
        raise ServiceError(413, f"the image is {width}×{height} = {width * height} pixels; the limit is "
                           f"{limits.max_pixels}")  # fmt: skip
    return img


def decode_image(body: bytes, limits: ServiceLimits, size: tuple[int, int] | None = None) -> np.ndarray:
    """An H×W×3 uint8 array from PNG or JPEG bytes (16-bit gray: scaled by the bit depth its values use). The
    header is read first (:func:`open_image`): the format, the pixel count against ``limits.max_pixels`` and,
    where ``size`` (height, width) is given, the dimensions are checked before a single pixel is decoded."""
    from ..camera.photo import eight_bits

    with open_image(body, limits) as img:
        width, height = img.size
        if size is not None and (height, width) != tuple(size):
            raise ServiceError(400, f"the image is {width}×{height}; this model takes {size[1]}×{size[0]} face crops")
        try:
            img.load()
            # a crop of more than 8 bits (a near-infrared camera's): scaled as /predict/photo scales it, where
            # Pillow's own conversion clips at 255 and turns it white
            rgb = eight_bits(img)[0].convert("RGB")
        except Exception:  # noqa: BLE001 — a header that parsed over pixel data that does not
            raise ServiceError(400, "the body is not a readable PNG or JPEG image (damaged pixel data)") from None
    return np.asarray(rgb, dtype=np.uint8).copy()


def check_token(header: str | None, token: str) -> None:
    """Refuse (401) a request whose ``Authorization: Bearer …`` is not ``token``, compared in constant time."""
    import hmac

    scheme, _, given = (header or "").strip().partition(" ")
    if scheme.lower() != "bearer" or not given:
        raise ServiceError(401, "this service needs a token: Authorization: Bearer <token>", CHALLENGE)
    if not hmac.compare_digest(given.strip().encode("utf-8", "surrogateescape"), token.encode()):
        raise ServiceError(401, "wrong token", CHALLENGE)


def valid_token(token: str, source: str) -> str:
    """``token`` if it can serve as the service's token (``source`` names where it came from, for the message)."""
    if len(token) < MIN_TOKEN_CHARS or not TOKEN.fullmatch(token):
        raise ValueError(
            f"{source}: a token is at least {MIN_TOKEN_CHARS} printable ASCII characters without spaces (for example "
            "python -c 'import secrets; print(secrets.token_urlsafe())')"
        )
    return token
