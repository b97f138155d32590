"""The HTTP gaze service, started on localhost by the test and called by a real client (urllib)."""

from __future__ import annotations

import copy
import io
import json
import threading
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import torch
from PIL import Image

import alfa
from alfa.adapters import adapter_parameters
from alfa.checkpoint import save_model

SIZE = 32


@pytest.fixture(scope="module")
def service(tmp_path_factory):
    from alfa.gaze.service import GazeService, make_server

    tmp = tmp_path_factory.mktemp("service")
    torch.manual_seed(0)
    base = alfa.models.resnet18_gaze().eval()
    alfa.truncate(base, 16)
    save_model(tmp / "base.safetensors", base, "resnet18_gaze", input_size=(SIZE, SIZE))
    users = {}
    for i, (name, config) in enumerate([("ann", alfa.AlfaConfig(heads=2, rank=2)), ("bob", alfa.LoraConfig(rank=2)),
                                        ("cat", alfa.AlfaConfig(heads=2, rank=2))]):  # fmt: skip
        model = copy.deepcopy(base)
        torch.manual_seed(i + 1)
        alfa.attach(model, config)
        with torch.no_grad():
            for p in adapter_parameters(model).values():
                p.normal_(0, 0.05)
        alfa.save_adapter(model, tmp / "adapters" / f"{name}.safetensors")
        users[name] = model
    (tmp / "adapters" / "broken.safetensors").write_bytes(b"not an adapter")
    server = make_server(GazeService(tmp / "base.safetensors", tmp / "adapters"), port=0)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}", users
    server.shutdown()
    server.server_close()


def _png(pixels: np.ndarray) -> bytes:
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, format="PNG")
    return out.getvalue()


def _face(seed: int, size: int = SIZE) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (size, size, 3), dtype=np.uint8)


def _post(url: str, user: str | None, body: bytes) -> tuple[int, dict]:
    query = f"?user={user}" if user is not None else ""
    request = urllib.request.Request(f"{url}/predict{query}", data=body, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=60) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def _expected(model, pixels: np.ndarray) -> list[float]:
    x = torch.from_numpy(pixels).permute(2, 0, 1)[None].float() / 255.0
    with torch.no_grad():
        return model(x)[0].tolist()


@pytest.mark.slow
def test_a_user_gets_their_own_models_prediction(service):
    url, users = service
    status, reply = _post(url, "ann", _png(_face(0)))
    assert status == 200 and reply["unit"] == "radians"
    assert np.allclose([reply["yaw"], reply["pitch"]], _expected(users["ann"], _face(0)), rtol=1e-5, atol=1e-6)
    with urllib.request.urlopen(f"{url}/health", timeout=30) as r:
        health = json.loads(r.read())
    assert health["input_size"] == [SIZE, SIZE] and health["users_loaded"] >= 1


@pytest.mark.parametrize(
    ("user", "body", "status", "message"),
    [
        ("zoe", _png(_face(1)), 404, "unknown user 'zoe'"),
        ("../base", _png(_face(1)), 404, "unknown user"),
        ("broken", _png(_face(1)), 404, "does not load onto this base"),
        ("ann", _png(_face(1, size=48)), 400, "the image is 48×48; this model takes 32×32"),
        ("ann", b"\x89PNG\r\n\x1a\n garbage", 400, "not a readable image"),
        ("ann", b"", 400, "empty body"),
        (None, _png(_face(1)), 400, "no user"),
    ],
)
def test_bad_requests_get_a_clear_error(service, user, body, status, message):
    url, _ = service
    got, reply = _post(url, user, body)
    assert got == status and message in reply["error"]


def test_concurrent_requests_of_several_users_are_neither_lost_nor_mixed_up(service):
    url, users = service
    jobs = [(name, seed) for seed in range(6) for name in ("ann", "bob", "cat")]

    def call(job):
        name, seed = job
        return job, _post(url, name, _png(_face(100 + seed)))

    with ThreadPoolExecutor(max_workers=6) as pool:
        results = list(pool.map(call, jobs, timeout=120))
    assert len(results) == len(jobs)
    for (name, seed), (status, reply) in results:
        assert status == 200 and reply["user"] == name
        want = _expected(users[name], _face(100 + seed))
        assert np.allclose([reply["yaw"], reply["pitch"]], want, rtol=1e-5, atol=1e-6), (name, seed)
