"""The service's adapter folder as it changes under a running server: a recalibrated (replaced) file is served as
it is now, a deleted one is an unknown user, a damaged file or a folder in its place is said as such (the server's
fault, a 500), not as an adapter made for another base."""

from __future__ import annotations

import os
import shutil

import numpy as np
import pytest
import torch

import alfa
from alfa.checkpoint import load_model
from alfa.gaze.service import GazeService
from alfa.gaze.service.limits import ServiceError
from alfa.gaze.service.selftest import png_bytes

pytestmark = pytest.mark.usefixtures("one_thread")

FACE = np.random.default_rng(0).integers(0, 256, (16, 16, 3), dtype=np.uint8)


@pytest.fixture
def folder(service_world, tmp_path):
    shutil.copytree(service_world / "adapters", tmp_path / "adapters")
    return service_world / "base.safetensors", tmp_path / "adapters"


def _own(checkpoint, adapter) -> list[float]:
    """The user's own model's answer for FACE."""
    model, _ = load_model(checkpoint)
    alfa.load_adapter(model, adapter)
    x = torch.from_numpy(FACE).permute(2, 0, 1)[None].float() / 255.0
    with torch.no_grad():
        return model.eval()(x)[0].tolist()


def _answer(service: GazeService, user: str) -> list[float]:
    reply = service.predict(user, png_bytes(FACE))
    return [reply["yaw"], reply["pitch"]]


def _refusal(service: GazeService, user: str) -> ServiceError:
    with pytest.raises(ServiceError) as caught:
        service.predict(user, png_bytes(FACE))
    return caught.value


def test_a_recalibrated_adapter_is_served_as_it_is_now_and_a_deleted_one_is_unknown(folder):
    checkpoint, adapters = folder
    service = GazeService(checkpoint, adapters, note=lambda line: None)
    before = _answer(service, "ann")
    assert np.allclose(before, _own(checkpoint, adapters / "ann.safetensors"), rtol=1e-5, atol=1e-6)
    # ann recalibrated while the server runs: her file replaced (atomically, as alfa writes files) by another one
    model, _ = load_model(checkpoint)
    alfa.load_adapter(model, adapters / "ann.safetensors")
    with torch.no_grad():
        for p in alfa.adapter_parameters(model).values():
            p.add_(0.5)
    alfa.save_adapter(model, adapters / "ann.safetensors", about={"person": "ann"})
    after = _answer(service, "ann")
    assert not np.allclose(after, before)
    assert np.allclose(after, _own(checkpoint, adapters / "ann.safetensors"), rtol=1e-5, atol=1e-6)
    (adapters / "ann.safetensors").unlink()
    refusal = _refusal(service, "ann")
    assert (refusal.status, str(refusal)) == (404, "unknown user 'ann'")
    assert "ann" not in service.model.users  # not held in memory for a file that is gone
    assert np.allclose(_answer(service, "bob"), _own(checkpoint, adapters / "bob.safetensors"), rtol=1e-5, atol=1e-6)


def test_a_damaged_adapter_file_or_a_folder_in_its_place_is_the_servers_fault_said_as_such(folder):
    checkpoint, adapters = folder
    notes: list[str] = []
    service = GazeService(checkpoint, adapters, note=notes.append)
    (adapters / "eve.safetensors").write_bytes(b"not an adapter")
    (adapters / "p02.safetensors").mkdir()
    refusal = _refusal(service, "eve")
    assert (refusal.status, str(refusal)) == (
        500,
        "user 'eve': their adapter file is damaged (the server's log has the details)",
    )
    assert "eve.safetensors: not a readable safetensors file" in notes[-1]
    refusal = _refusal(service, "p02")
    assert (refusal.status, str(refusal)) == (500, "user 'p02': their adapter file is a folder on this server")
    assert notes[-1].endswith("p02.safetensors is a folder, not an adapter file"), notes[-1]
    assert _refusal(service, "eve").status == 500 and len(notes) == 2  # refused again without reading it again
    # a served user's file damaged in place (a copy cut short): dropped, and said as damaged
    _answer(service, "bob")
    data = (adapters / "bob.safetensors").read_bytes()
    (adapters / "bob.safetensors").write_bytes(data[: len(data) // 2])
    assert _refusal(service, "bob").status == 500 and "bob" not in service.model.users


def _raising(error: OSError):
    def fail(*args, **kwargs):
        raise error

    return fail


@pytest.mark.parametrize("where", ["header", "load"])
def test_an_adapter_file_deleted_between_the_stat_and_the_read_is_an_unknown_user(folder, monkeypatch, where):
    """The file is there when stat'ed and gone when read (deleted in between): answered as a user with no file,
    not as a damaged or foreign adapter, and not remembered as refused."""
    checkpoint, adapters = folder
    notes: list[str] = []
    service = GazeService(checkpoint, adapters, note=notes.append)
    gone = FileNotFoundError(2, "No such file or directory", str(adapters / "ann.safetensors"))
    if where == "header":
        monkeypatch.setattr("alfa.gaze.service.model.read_adapter_metadata", _raising(gone))
    else:
        monkeypatch.setattr(service.model, "add_user", _raising(gone))
    refusal = _refusal(service, "ann")
    assert (refusal.status, str(refusal)) == (404, "unknown user 'ann'")
    no_file = _refusal(service, "zed")  # a user who never had a file: the same answer
    assert (no_file.status, str(no_file)) == (404, "unknown user 'zed'")
    assert "ann" not in service.model.users and "ann" not in service._refused and notes == []
    monkeypatch.undo()  # the file reads again: served at the next request
    assert np.allclose(_answer(service, "ann"), _own(checkpoint, adapters / "ann.safetensors"), rtol=1e-5, atol=1e-6)


UNREADABLE = "user 'ann': their adapter file cannot be read on this server (permission denied)"


@pytest.mark.parametrize("where", ["header", "load"])
def test_an_adapter_file_the_server_may_not_read_is_said_as_such_not_as_damaged(folder, monkeypatch, where):
    checkpoint, adapters = folder
    notes: list[str] = []
    service = GazeService(checkpoint, adapters, note=notes.append)
    denied = PermissionError(13, "Permission denied", str(adapters / "ann.safetensors"))
    if where == "header":
        monkeypatch.setattr("alfa.gaze.service.model.read_adapter_metadata", _raising(denied))
    else:
        monkeypatch.setattr(service.model, "add_user", _raising(denied))
    refusal = _refusal(service, "ann")
    assert (refusal.status, str(refusal)) == (500, UNREADABLE)
    assert "damaged" not in str(refusal) and "Permission denied" in notes[-1]


def test_an_unreadable_safetensors_file_raises_permission_error_not_damaged(folder, monkeypatch):
    """safetensors says "No such file or directory" of every file it cannot open: the library asks the file
    itself, so one it may not read is a PermissionError (the server's 500 above), not a damaged file."""
    import builtins

    from alfa.adapters import io as adapter_io

    _, adapters = folder
    path = adapters / "ann.safetensors"
    real_open = builtins.open

    def open_denied(file, *args, **kwargs):
        if str(file) == str(path):
            raise PermissionError(13, "Permission denied", str(path))
        return real_open(file, *args, **kwargs)

    def safetensors_open(file, *args, **kwargs):
        raise FileNotFoundError(f"No such file or directory: {file}")  # what safetensors 0.8 raises for EACCES

    monkeypatch.setattr(builtins, "open", open_denied)
    monkeypatch.setattr(adapter_io, "safe_open", safetensors_open)
    with pytest.raises(PermissionError, match="Permission denied"):
        alfa.read_adapter_metadata(path)


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() == 0, reason="root reads a file whatever its mode")
def test_a_chmod_000_adapter_file_is_unreadable_and_served_once_readable_again(folder):
    checkpoint, adapters = folder
    path = adapters / "ann.safetensors"
    service = GazeService(checkpoint, adapters, note=lambda line: None)
    path.chmod(0)
    try:
        refusal = _refusal(service, "ann")
        assert (refusal.status, str(refusal)) == (500, UNREADABLE)
    finally:
        path.chmod(0o644)  # a chmod changes only the file's ctime: read again at the next request
    assert np.allclose(_answer(service, "ann"), _own(checkpoint, path), rtol=1e-5, atol=1e-6)
