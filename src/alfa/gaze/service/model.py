"""The model side of the gaze service: one shared base and a folder of per-user adapter files, each user's
adapter loaded the first time they ask (through :class:`alfa.serve.MultiUserModel`, so a user's answer is their
own personalized model's) and loaded again when its file changes (a recalibration), dropped when it is deleted.
The model runs one request at a time under a lock: predictions do not depend on how requests interleave.
"""

from __future__ import annotations

import os
import stat
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from alfa.adapters import AdapterFileDamaged, read_adapter_metadata
from alfa.checkpoint import load_model
from alfa.serve import MethodNotServed, MultiUserModel

from ..evaluate import adapter_filename
from ..tta import CalibrationUnderTTA, tta_kind
from .limits import ServiceError, ServiceLimits, decode_image, open_image, user_id

if TYPE_CHECKING:
    from ..camera import PhotoOptions

__all__ = ["GazeService"]


def _to_stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


class GazeService:
    """A base checkpoint and a folder of ``<user>.safetensors`` adapters, served within ``limits``.

    ``note`` receives the server-side detail of a refusal (an adapter's path and why it does not load): the
    client is told only that the user cannot be served, never a path of this machine. ``tta`` names a test-time
    augmentation of :data:`alfa.gaze.tta.TTA_KINDS` that every answer is made with (its forward passes per request
    instead of one), on crops and photos alike. ``photo_options`` reads the photos of ``/predict/photo``: the
    camera's intrinsics and the screen's geometry where given (one camera and screen for every user, as at a
    kiosk), exactly one face.
    """

    def __init__(
        self,
        checkpoint: str | os.PathLike,
        adapters: str | os.PathLike,
        limits: ServiceLimits | None = None,
        note: Callable[[str], None] = _to_stderr,
        tta: str | None = None,
        photo_options: PhotoOptions | None = None,
    ) -> None:
        self.adapters = Path(adapters)
        if self.adapters.is_file():
            raise NotADirectoryError(
                f"{self.adapters} is a file, not a folder: the adapters are a folder of <user>.safetensors files"
            )
        if not self.adapters.is_dir():
            raise FileNotFoundError(f"adapter folder not found: {self.adapters}")
        base, saved = load_model(checkpoint)
        size = saved.get("input_size")
        if not size:
            raise ValueError(f"{checkpoint} does not record the image size it was trained on")
        self.input_size = (int(size[0]), int(size[1]))
        self.tta = None if tta is None else tta_kind(tta)
        if self.tta is not None:
            self.tta.check_size(self.input_size)
        self.limits = limits or ServiceLimits()
        self.photo_options = photo_options  # an alfa.gaze.camera.PhotoOptions (None: the defaults, one face)
        self.model = MultiUserModel(base.eval())
        self.note = note
        self._lock = threading.Lock()  # held around _ensure_user and the model's call: the two dicts below too
        # Each loaded user's file stamp (inode, mtime, size, ctime) when it was loaded: a file replaced since (a
        # recalibration) is loaded again, a deleted one drops the user, at their next request (one stat a request).
        # The ctime is there for a chmod, which changes nothing else: a file refused as unreadable is read again.
        self._loaded: dict[str, tuple[int, int, int, int]] = {}
        # Users whose adapter was refused, with the file's stamp then and the answer: not re-read on every request,
        # so a client cannot make the server parse a broken file again and again (a changed file is tried again).
        self._refused: dict[str, tuple[tuple[int, int, int, int], int, str]] = {}

    def _ensure_user(self, user: str) -> None:
        """``user``'s adapter served as its file is now; a :class:`ServiceError` saying why it cannot be."""
        path = self.adapters / adapter_filename(user)
        try:
            info = path.stat()
        except OSError:  # no file (or deleted since it was loaded): nobody to serve, nothing left to hold
            self._drop(user)
            raise ServiceError(404, f"unknown user {user!r}") from None
        stamp = (info.st_ino, info.st_mtime_ns, info.st_size, info.st_ctime_ns)  # a rename gives a new inode
        if self._loaded.get(user) == stamp:
            return
        self._drop(user)  # a changed file is this user's adapter now, or none if it does not load
        if user in self._refused and self._refused[user][0] == stamp:
            raise ServiceError(*self._refused[user][1:])
        try:
            self._check_file(path, info)
            self._check_person(user, path)
            self.model.add_user(user, path)
        except FileNotFoundError:  # deleted between the stat and the read: a user with no file, as above
            raise ServiceError(404, f"unknown user {user!r}") from None
        except (ValueError, RuntimeError, OSError, KeyError) as e:
            refusal = _refusal(user, e)
            # the log gets the whole reason; a calibration's already says what the answer says
            said = (
                str(e)
                if isinstance(e, CalibrationUnderTTA)
                else f"{refusal}" + ("" if str(e) in str(refusal) else f": {e}")
            )
            self.note(f"alfa serve: {said}")
            self._refused[user] = (stamp, refusal.status, str(refusal))
            raise refusal from None
        self._loaded[user] = stamp
        self._refused.pop(user, None)

    def _drop(self, user: str) -> None:
        self._loaded.pop(user, None)
        self.model.remove_user(user, missing_ok=True)

    @staticmethod
    def _check_file(path: Path, info: os.stat_result) -> None:
        """A folder (or a pipe, a device) in place of the file is named as such, not as a missing file (the name
        is there) nor read (a pipe would hold the service's lock for as long as nobody writes to it)."""
        if not stat.S_ISREG(info.st_mode):
            raise _NotAFile(path, "a folder" if stat.S_ISDIR(info.st_mode) else "not a regular file")

    def _check_person(self, user: str, path: Path) -> None:
        """An adapter that records its person (``alfa personalize`` does) is served only under that person's id:
        a file copied or renamed to another user's name would answer for the wrong person. Under ``--tta`` a
        calibration from labelled images is refused (:meth:`alfa.gaze.tta.TTAKind.refuse_calibration`)."""
        about = read_adapter_metadata(path)["about"]
        person = about.get("person")
        if person is not None and adapter_filename(str(person)) != adapter_filename(user):
            raise ValueError(f"{path} records person {person!r}, not {user!r}")
        if self.tta is not None:  # refused, not served with part of its correction undone
            self.tta.refuse_calibration(about, f"the adapter of user {user!r}")

    def decode(self, body: bytes) -> torch.Tensor:
        """A 1×3×H×W image in [0, 1] from PNG/JPEG bytes of the base's input size (checked before decoding)."""
        array = decode_image(body, self.limits, self.input_size)
        return torch.from_numpy(array).permute(2, 0, 1)[None].float() / 255.0

    def predict(self, user: str | None, body: bytes) -> dict[str, Any]:
        """``user``'s gaze for the face crop in ``body``: ``{"user", "yaw", "pitch", "unit": "radians"}``."""
        user = user_id(user, self.limits)
        image = self.decode(body)
        with self._lock:
            self._ensure_user(user)
            yaw, pitch = self._user_model(user)(image)[0].tolist()
        return {"user": user, "yaw": yaw, "pitch": pitch, "unit": "radians"}

    def predict_photo(self, user: str | None, body: bytes) -> dict[str, Any]:
        """A raw photo's answer (:func:`alfa.gaze.camera.answer_photo`): the face found, normalized and cropped
        here, the user's model on the crop. A photo over the pixel limit (read from its header, as for
        ``/predict``) is a 413; one the camera path refuses, or one without exactly one face, is a 400; a server
        without the camera extra answers 501."""
        user = user_id(user, self.limits)
        open_image(body, self.limits, formats=None).close()  # before the camera path decodes a single pixel
        with self._lock:
            self._ensure_user(user)  # an unknown user is a 404 before any face is searched for

        def predictor(crops: torch.Tensor) -> torch.Tensor:
            with self._lock:
                self._ensure_user(user)
                return model_predictor(self._user_model(user), self.input_size)(crops)

        try:
            from ..camera import PhotoOptions, SeveralFaces, answer_photo, model_predictor

            answer = answer_photo(body, predictor, self.photo_options or PhotoOptions(faces="one"))
        # (the first clause matches a failed import before the second names what it would have imported)
        except ModuleNotFoundError as e:  # the camera extra (OpenCV) is not installed here: not the request's fault
            raise ServiceError(501, f"this server cannot read photos: {e.name} is not installed") from None
        except SeveralFaces as e:  # refused before any face is normalized or the model runs
            raise ServiceError(400, f"{e}: the photo must show exactly one face") from None
        except ValueError as e:
            raise ServiceError(400, str(e)) from None
        return {"user": user, **answer}

    def _user_model(self, user: str) -> torch.nn.Module:
        """The shared model as ``user``'s, with the service's test-time augmentation when it has one."""
        model = _OneUser(self.model, user)
        return model if self.tta is None else self.tta.wrap(model)

    def health(self) -> dict[str, Any]:
        tta = {"tta": self.tta.name, "forward_passes": self.tta.passes} if self.tta else {"forward_passes": 1}
        return {"status": "ok", "users_loaded": len(self.model.users), "input_size": list(self.input_size), **tta}


class _NotAFile(OSError):
    """Something other than a file where a user's adapter file should be: ``what`` it is."""

    def __init__(self, path: Path, what: str) -> None:
        super().__init__(f"{path} is {what}, not an adapter file")
        self.what = what


def _refusal(user: str, e: Exception) -> ServiceError:
    """The answer to a user whose adapter does not serve. A file that is damaged or no file is the server's fault,
    which only its operator can mend: a 500, as a broken adapter's non-finite answer is, not a 404 that says the
    user is not served here (and that a client or proxy may cache as such)."""
    if isinstance(e, AdapterFileDamaged):
        return ServiceError(500, f"user {user!r}: their adapter file is damaged (the server's log has the details)")
    if isinstance(e, PermissionError):  # the file is there, but this server may not read it: no damage to it
        return ServiceError(500, f"user {user!r}: their adapter file cannot be read on this server (permission denied)")
    if isinstance(e, _NotAFile):
        return ServiceError(500, f"user {user!r}: their adapter file is {e.what} on this server")
    if isinstance(e, CalibrationUnderTTA):  # the user is there, and served without --tta: not a 404's "no such user"
        return ServiceError(
            409, f"user {user!r}: a calibration from labelled images, which this server's --tta would undo"
        )
    if isinstance(e, MethodNotServed):  # the file fits this base; its method is what a shared base cannot serve
        return ServiceError(404, f"user {user!r}: their adapter cannot be served here: {e}")
    return ServiceError(404, f"user {user!r}: their adapter does not load onto this base")


class _OneUser(torch.nn.Module):
    """The shared model as one user's: what :func:`alfa.gaze.camera.model_predictor` runs."""

    def __init__(self, model: MultiUserModel, user: str) -> None:
        super().__init__()
        self.model, self.user = model, user

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.model(images, [self.user] * images.shape[0])
