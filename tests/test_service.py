"""The HTTP gaze service, started on localhost by the test and called by real clients (urllib, raw sockets):
right answers per user, a JSON error with no server path for every hostile request, sizes refused before
decoding, timeouts that free the worker, a full queue answered 503, the token, the access log, the load test."""

from __future__ import annotations

import contextlib
import io
import json
import re
import select
import shutil
import socket
import struct
import threading
import time
import urllib.error
import urllib.request
import zlib

import numpy as np
import pytest
import torch

import alfa
from alfa.checkpoint import load_model
from alfa.cli import main
from alfa.gaze.service import ROUTES, GazeServer, GazeService, Route, ServiceLimits, is_loopback, make_server
from alfa.gaze.service.selftest import png_bytes

pytestmark = pytest.mark.usefixtures("one_thread")

SIZE = 16
TOKEN = "a-test-token-of-24-chars"


@contextlib.contextmanager
def serving(service: GazeService, server_out: list | None = None, **kwargs):
    server = make_server(service, port=0, **kwargs)
    if server_out is not None:
        server_out.append(server)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture(scope="module")
def world(service_world, tmp_path_factory):
    """The shared world's adapters plus a broken file and ann's adapter copied to another user's name."""
    folder = tmp_path_factory.mktemp("service")
    shutil.copytree(service_world / "adapters", folder / "adapters")
    (folder / "adapters" / "broken.safetensors").write_bytes(b"not an adapter")
    shutil.copy(folder / "adapters" / "ann.safetensors", folder / "adapters" / "dan.safetensors")
    return service_world / "base.safetensors", folder / "adapters"


@pytest.fixture(scope="module")
def served(world):
    notes, log = [], io.StringIO()
    service = GazeService(*world, ServiceLimits(workers=4), note=notes.append)
    with serving(service, access_log=log) as port:
        yield port, notes, log


def _face(seed: int, size: int = SIZE) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (size, size, 3), dtype=np.uint8)


def _png_header(width: int, height: int) -> bytes:
    """A PNG claiming ``width``×``height`` with a few bytes of pixel data (decoding it would fail, or first
    allocate width × height × 3 bytes)."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(bytes(64)))


def _request(path: str, body: bytes | None = None, headers: dict | None = None, method: str = "POST") -> bytes:
    head = {"Content-Length": str(len(body))} if body is not None else {}
    head.update(headers or {})
    lines = [f"{method} {path} HTTP/1.0", *(f"{k}: {v}" for k, v in head.items())]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + (body or b"")


def _exchange(port: int, data: bytes, timeout: float = 10.0) -> tuple[int, dict, dict]:
    """Send ``data`` on a fresh connection and read the whole answer: status, headers, JSON body."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        s.sendall(data)
        return _answer(s)


def _answer(s: socket.socket) -> tuple[int, dict, dict]:
    raw = b""
    while chunk := s.recv(65536):
        raw += chunk
    head, _, body = raw.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = dict(line.split(": ", 1) for line in lines[1:])
    return int(lines[0].split()[1]), headers, json.loads(body)


def _user_model(world, user: str) -> torch.nn.Module:
    base, _ = load_model(world[0])
    alfa.load_adapter(base, world[1] / f"{user}.safetensors")
    return base.eval()


def test_a_user_gets_their_own_models_prediction(world, served):
    port, _, _ = served
    for user in ("ann", "bob"):  # Alfa and LoRA
        status, _, reply = _exchange(port, _request(f"/predict?user={user}", png_bytes(_face(0))))
        x = torch.from_numpy(_face(0)).permute(2, 0, 1)[None].float() / 255.0
        with torch.no_grad():
            want = _user_model(world, user)(x)[0].tolist()
        assert status == 200 and reply["user"] == user and reply["unit"] == "radians"
        assert np.allclose([reply["yaw"], reply["pitch"]], want, rtol=1e-5, atol=1e-6)
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=10) as r:
        health = json.loads(r.read())
    assert health["status"] == "ok" and health["input_size"] == [SIZE, SIZE] and health["users_loaded"] >= 2


PNG = png_bytes(_face(1))
BAD_REQUESTS = {
    "unknown user": (_request("/predict?user=zoe", PNG), 404, "unknown user 'zoe'"),
    "a path as id": (_request("/predict?user=../base", PNG), 400, "a user id is letters"),
    "a 5000-character id": (_request(f"/predict?user={'a' * 5000}", PNG), 400, "5000 characters; the limit is 128"),
    "the id twice": (_request("/predict?user=ann&user=bob", PNG), 400, "'user' given 2 times"),
    "no id": (_request("/predict", PNG), 400, "no user"),
    "a broken adapter": (_request("/predict?user=broken", PNG), 404, "does not load onto this base"),
    "another person's adapter": (_request("/predict?user=dan", PNG), 404, "does not load onto this base"),
    "another image size": (_request("/predict?user=ann", png_bytes(_face(1, 48))), 400, "the image is 48×48"),
    "not an image": (_request("/predict?user=ann", b"\x89PNG\r\n\x1a\n garbage"), 400, "not a readable PNG"),
    # dimensions are refused from the header alone: decoding these would fail (no pixel data) or take gigabytes
    "a big image": (_request("/predict?user=ann", _png_header(4000, 4000)), 400, "the image is 4000×4000"),
    "a huge image": (_request("/predict?user=ann", _png_header(20000, 20000)), 413, "pixels"),
    "an empty body": (_request("/predict?user=ann", b""), 400, "empty body"),
    "a word as length": (_request("/predict?user=ann", headers={"Content-Length": "abc"}), 400, "Content-Length"),
    "a negative length": (_request("/predict?user=ann", headers={"Content-Length": "-5"}), 400, "Content-Length"),
    "a body over the limit": (_request("/predict?user=ann", headers={"Content-Length": str(9 << 20)}), 413, "limit"),
    "no length": (_request("/predict?user=ann"), 411, "Content-Length"),
    "a chunked body": (_request("/predict?user=ann", PNG, {"Transfer-Encoding": "chunked"}), 411, "chunked"),
    "a GET of /predict": (_request("/predict?user=ann", method="GET"), 405, "/predict takes POST"),
    "no such endpoint": (_request("/admin", method="GET"), 404, "no such endpoint"),
    "an unknown method": (_request("/predict", method="BREW"), 501, "Unsupported method"),
    "a malformed request line": (b"garbage\r\n\r\n", 400, "Bad request"),
}


@pytest.mark.parametrize("case", list(BAD_REQUESTS))
def test_a_bad_request_gets_a_json_error_without_server_paths(served, world, case):
    port, notes, _ = served
    data, want_status, message = BAD_REQUESTS[case]
    status, headers, reply = _exchange(port, data)
    assert (status, reply["status"]) == (want_status, want_status) and message in reply["error"], reply
    assert headers["Content-Type"] == "application/json"
    assert str(world[1].parent) not in json.dumps(reply)
    if case == "another person's adapter":  # the detail, with the path, goes to the server's side only
        assert any("records person 'ann', not 'dan'" in line for line in notes), notes


QUICK = ServiceLimits(workers=1, queue=1, socket_timeout=0.2, request_timeout=0.5)


def test_a_body_shorter_than_its_length_times_out_and_frees_the_worker(world):
    service = GazeService(*world, QUICK)
    with serving(service, limits=QUICK) as port:
        began = time.monotonic()
        status, _, reply = _exchange(port, _request("/predict?user=ann", headers={"Content-Length": "1000"}) + PNG[:9])
        assert status == 408 and "after 9 of its 1000 bytes" in reply["error"] and time.monotonic() - began < 3
        assert _exchange(port, _request("/predict?user=ann", PNG))[0] == 200  # the only worker is free again
        status, _, reply = _exchange(port, b"POST /predict?user=ann HTTP/1.0\r\n")  # headers that never end
        assert status == 408 and "did not arrive" in reply["error"]


def test_a_trickled_request_is_cut_at_the_request_timeout(world):
    service = GazeService(*world, QUICK)
    with serving(service, limits=QUICK) as port, socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        began, answer = time.monotonic(), b""
        with contextlib.suppress(OSError):
            for byte in _request("/predict?user=ann", PNG):  # a byte per 0.1 s: each read is within its timeout
                s.sendall(bytes([byte]))
                if select.select([s], [], [], 0.1)[0]:
                    answer = s.recv(65536)
                    break
                if time.monotonic() - began > 4:
                    break
        assert time.monotonic() - began < 2, "the connection outlived the request timeout"
        assert answer == b"" or answer.startswith(b"HTTP/1.1 4"), answer


def _until(condition, seconds: float = 10.0) -> None:
    end = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < end, "timed out waiting"
        time.sleep(0.01)


def test_a_full_queue_is_answered_503_at_once_and_the_queued_request_still_served(world, monkeypatch):
    """One worker held by a route that waits for the test (a route is one entry of the table), one connection in
    the queue of one: the next is answered 503 while both wait, and both are served once the worker is free."""
    entered, release = threading.Event(), threading.Event()

    def wait(service, request):
        entered.set()
        release.wait(10)
        return {"waited": True}

    monkeypatch.setitem(ROUTES, "/wait", {"GET": Route(wait)})
    limits = ServiceLimits(workers=1, queue=1)
    with serving(GazeService(*world, limits), limits=limits, server_out=(servers := [])) as port:
        holder = socket.create_connection(("127.0.0.1", port), timeout=10)
        holder.sendall(_request("/wait", method="GET"))
        _until(entered.is_set)  # the one worker is in the route
        queued = socket.create_connection(("127.0.0.1", port), timeout=10)
        queued.sendall(_request("/predict?user=ann", PNG))
        _until(lambda: servers[0]._pending.qsize() == 1)  # accepted, waiting in the queue of one
        status, headers, reply = _exchange(port, _request("/predict?user=ann", PNG))
        assert status == 503 and headers["Retry-After"] == "1" and "busy" in reply["error"]
        release.set()  # only now is the worker free
        with holder, queued:
            assert _answer(holder)[:3:2] == (200, {"waited": True}) and _answer(queued)[0] == 200


def test_a_token_is_needed_for_predictions_but_not_for_health(world):
    service = GazeService(*world)
    with serving(service, token=TOKEN) as port:
        status, headers, reply = _exchange(port, _request("/predict?user=ann", PNG))
        assert status == 401 and headers["WWW-Authenticate"] == "Bearer" and "needs a token" in reply["error"]
        wrong = _request("/predict?user=ann", PNG, {"Authorization": "Bearer " + "x" * 24})
        assert _exchange(port, wrong)[0] == 401
        right = _request("/predict?user=ann", PNG, {"Authorization": f"Bearer {TOKEN}"})
        assert _exchange(port, right)[0] == 200
        assert _exchange(port, _request("/health", method="GET"))[0] == 200


def test_the_access_log_has_a_line_per_request_with_control_characters_escaped(served):
    port, _, log = served
    before = len(log.getvalue().splitlines())
    _exchange(port, _request("/health", method="GET"))
    _exchange(port, _request("/he\x1b[2Jlth", method="GET"))  # a terminal escape in the path
    lines = log.getvalue().splitlines()[before:]
    assert len(lines) == 2, lines
    assert re.fullmatch(r'\S+Z 127\.0\.0\.1 "GET /health HTTP/1\.0" 200 \d+ [\d.]+ms', lines[0]), lines[0]
    assert '"GET /he\\x1b[2Jlth HTTP/1.0" 404' in lines[1] and "\x1b" not in lines[1]


def test_the_cli_load_test_holds_with_no_dropped_connection(world, capsys):
    argv = ["serve", "--selftest", "--checkpoint", str(world[0]), "--adapters", str(world[1])]
    assert main([*argv, "--clients", "50", "--requests", "50", "--workers", "4", "--time-limit", "60"]) == 0
    out = capsys.readouterr().out
    assert "50 answered right, 0 wrong, 0 dropped, 0 not done in time" in out and "p99" in out, out


def test_the_load_test_says_why_no_adapter_serves(world, tmp_path, capsys):
    argv = ["serve", "--selftest", "--checkpoint", str(world[0]), "--adapters", str(tmp_path)]
    assert main(argv) == 2
    assert capsys.readouterr().err.strip().endswith("serves on this base (it holds no user's .safetensors file)")
    (tmp_path / "dan.safetensors").write_bytes(b"not an adapter")
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "serves on this base (the first refused: user 'dan': their adapter does not" in err
    assert "dan.safetensors: not a readable safetensors file" in err  # the service's own detail, not a generic line


def test_serve_options_have_bounds_that_say_why(world, capsys, monkeypatch):
    argv = ["serve", "--checkpoint", str(world[0]), "--adapters", str(world[1]), "--port", "0"]
    for option, value, message in [("--workers", "1000", "8 per CPU"), ("--workers", "0", "at least 1"),
                                   ("--queue", "100000", "at most 4096")]:  # fmt: skip
        with pytest.raises(SystemExit) as e:
            main([*argv, option, value])
        assert e.value.code == 2 and message in capsys.readouterr().err
    monkeypatch.delenv("ALFA_SERVE_TOKEN", raising=False)
    assert main([*argv, "--token", "short"]) == 2
    assert "a token is at least 16 printable ASCII characters" in capsys.readouterr().err
    before = world[0].read_bytes()
    assert main([*argv, "--access-log", str(world[0])]) == 2  # the log would be appended to the checkpoint
    assert "is this command's --checkpoint" in capsys.readouterr().err and world[0].read_bytes() == before

    def stop(self, *args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(GazeServer, "serve_forever", stop)
    assert main([*argv, "--host", "0.0.0.0"]) == 130
    assert "warning: listening on 0.0.0.0 without a token" in capsys.readouterr().err
    monkeypatch.setenv("ALFA_SERVE_TOKEN", TOKEN)
    assert main([*argv, "--host", "0.0.0.0"]) == 130
    captured = capsys.readouterr()
    assert "warning" not in captured.err and "with a token" in captured.out


def test_loopback_is_only_the_loopback():
    assert is_loopback("127.0.0.1") and is_loopback("localhost") and is_loopback("::1")
    assert not is_loopback("0.0.0.0") and not is_loopback("") and not is_loopback("no-such-host.invalid")
