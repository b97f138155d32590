"""The HTTP gaze service, started on localhost by the test and called by real clients (urllib, raw sockets):
right answers per user, a JSON error with no server path for every hostile request, sizes refused before
decoding, timeouts that free the worker, a full queue answered 503, the token, the access log, the load test."""

from __future__ import annotations

import contextlib
import functools
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
    "no id": (_request("/predict", PNG), 400, "no user: add ?user=ID to the request's path"),
    "a broken adapter": (_request("/predict?user=broken", PNG), 500, "their adapter file is damaged"),
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
    "a length of 23 digits": (
        _request("/predict?user=ann", headers={"Content-Length": "9" * 23}),
        413,
        "the body is 99999999999999999999999 bytes; the limit is",
    ),
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
    """Three clients at once, each sending a byte per 0.1 s (every read within the socket timeout): a whole
    request, and two header blocks that never end. Each is cut at the request timeout and answered 408."""
    limits = ServiceLimits(workers=3, queue=3, socket_timeout=0.2, request_timeout=0.5)  # QUICK's, a worker each
    streams = {
        "a whole request": [bytes([byte]) for byte in _request("/predict?user=ann", PNG)],
        "POST headers": [b"POST /predict?user=ann HTTP/1.1\r\nHost: x\r\n"] + [b"X"] * 40,
        "a GET line": [b"GET /health"] + [b"X"] * 40,
    }
    with serving(GazeService(*world, limits), limits=limits) as port, contextlib.ExitStack() as stack:
        clients = [stack.enter_context(socket.create_connection(("127.0.0.1", port), timeout=5)) for _ in streams]
        began, answers = time.monotonic(), {}
        waiting = dict(zip(clients, map(iter, streams.values())))
        while waiting and time.monotonic() - began < 4:
            for client, chunks in waiting.items():
                with contextlib.suppress(OSError):
                    client.sendall(next(chunks, b""))
            for client in select.select(list(waiting), [], [], 0.1)[0]:
                answers[client] = client.recv(65536), time.monotonic() - began
                del waiting[client]
    for case, client in zip(streams, clients):
        answer, seconds = answers.get(client, (b"", None))
        assert seconds is not None and seconds < 2, f"{case}: the connection outlived the request timeout"
        # what the cut left of the headers is no request: 408, not an answer to the part that came (411, 400, 200)
        assert answer.split(b" ")[1:2] == [b"408"], (case, answer)


def test_a_body_over_the_limit_is_answered_413_and_the_client_reads_it(served):
    """The client sends the whole body before it reads: the server reads and drops it after its 413, so that
    closing does not reset the connection and throw the answer away."""
    import http.client

    port, _, _ = served
    for _ in range(3):
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        connection.request("POST", "/predict?user=ann", body=bytes(9 << 20))
        reply = connection.getresponse()
        assert reply.status == 413 and json.loads(reply.read())["status"] == 413
        connection.close()


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
        # without the token, nothing is learnt of the endpoints or their methods; with it, the usual answers
        for path, method, status_with_token in [("/admin", "GET", 404), ("/predict?user=ann", "GET", 405)]:
            assert _exchange(port, _request(path, method=method))[0] == 401
            with_token = _request(path, method=method, headers={"Authorization": f"Bearer {TOKEN}"})
            assert _exchange(port, with_token)[0] == status_with_token


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
    assert err.count("\n") == 1 and "(the first refused: user 'dan': their adapter file is damaged" in err
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


def test_a_photo_over_the_pixel_limit_is_refused_from_its_header_as_a_crop_is(served):
    """/predict/photo applies /predict's pixel limit before the camera path decodes anything: the same 413 and the
    same sentence (these bodies hold a header and a few bytes: decoding them would fail, or take gigabytes)."""
    port, _, _ = served
    for width, height, message in [(4200, 4200, "the image is 4200×4200 = 17640000 pixels; the limit is 16777216"),
                                   (30000, 30000, "the image has more than 16777216 pixels")]:  # fmt: skip
        body = _png_header(width, height)
        crop = _exchange(port, _request("/predict?user=ann", body))
        photo = _exchange(port, _request("/predict/photo?user=ann", body))
        assert (photo[0], photo[2]) == (crop[0], crop[2]) == (413, {"error": message, "status": 413}), photo
    status, _, reply = _exchange(port, _request("/predict/photo?user=ann", b"junk"))
    assert status == 400 and reply["error"] == "the body is not a readable image"


def test_a_photo_of_several_faces_is_refused_in_the_services_own_words(served):
    pytest.importorskip("cv2")
    pytest.importorskip("skimage")
    from PIL import Image

    from alfa.gaze.camera import read_photo

    def png(pixels: np.ndarray) -> bytes:  # zlib's fastest level: a photo this size, the same pixels sooner
        buffer = io.BytesIO()
        Image.fromarray(pixels).save(buffer, format="PNG", compress_level=1)
        return buffer.getvalue()

    port, _, _ = served
    astronaut = read_photo("skimage:astronaut")[0]
    body = png(np.concatenate([astronaut, astronaut], 1))
    status, _, reply = _exchange(port, _request("/predict/photo?user=ann", body), timeout=60)
    assert status == 400 and reply["error"].startswith("2 faces found (boxes [")
    assert reply["error"].endswith("): the photo must show exactly one face") and "--" not in reply["error"]
    status, _, reply = _exchange(port, _request("/predict/photo?user=ann", png(astronaut)), timeout=60)
    assert status == 200 and len(reply["faces"]) == 1 and reply["user"] == "ann"


def test_a_16_bit_crop_is_scaled_as_a_photo_is_and_a_photo_of_an_unknown_user_is_a_404_first(served):
    """A 16-bit crop was clipped at 255 (white) and answered 200; an unknown user's photo was searched for a face
    first, and a face-less one answered 400 where the user is the request's first mistake."""
    from PIL import Image

    def png(img: Image.Image) -> bytes:
        buffer = io.BytesIO()
        img.save(buffer, format="PNG")
        return buffer.getvalue()

    port, _, _ = served
    gray = _face(2)[..., 0]
    eight = _exchange(port, _request("/predict?user=ann", png(Image.fromarray(gray, "L"))))
    sixteen = _exchange(port, _request("/predict?user=ann", png(Image.fromarray(gray.astype(np.uint16) * 257))))
    assert eight[0] == sixteen[0] == 200 and sixteen[2] == eight[2]
    status, _, reply = _exchange(port, _request("/predict/photo?user=zoe", png_bytes(_face(3, 64))))
    assert (status, reply["error"]) == (404, "unknown user 'zoe'")


def _one_error_line(capsys, argv: list[str]) -> str:
    assert main(argv) == 2, argv
    err = capsys.readouterr().err
    assert err.startswith("alfa serve: error: ") and err.count("\n") == 1 and "Traceback" not in err, err
    return err.strip().removeprefix("alfa serve: error: ")


def test_the_selftest_takes_a_checkpoint_and_its_adapters_together(world, capsys):
    from alfa.gaze.service.selftest import selftest

    checkpoint, adapters = map(str, world)
    load = ["--requests", "10", "--clients", "2"]
    err = _one_error_line(capsys, ["serve", "--selftest", "--checkpoint", checkpoint, *load])
    assert err == "--checkpoint needs --adapters (the folder of <user>.safetensors files to serve on it)"
    err = _one_error_line(capsys, ["serve", "--selftest", "--adapters", adapters, *load])
    assert err.startswith("--adapters needs --checkpoint") and "a small world of its own" in err
    for given in ({"checkpoint": checkpoint}, {"adapters": adapters}):  # the library refuses it too
        with pytest.raises(ValueError, match="was given without its"):
            selftest(**given, requests=1, clients=1, say=lambda line: None)


def test_the_selftest_runs_with_test_time_augmentation(world, capsys):
    argv = ["serve", "--selftest", "--checkpoint", str(world[0]), "--adapters", str(world[1]), "--tta", "flip"]
    assert main([*argv, "--requests", "10", "--clients", "2", "--workers", "2"]) == 0
    out = capsys.readouterr().out
    assert "flip test-time augmentation" in out and "10 answered right, 0 wrong" in out, out


def test_adapters_given_as_a_file_are_said_to_be_one(world, capsys):
    adapter = world[1] / "ann.safetensors"
    err = _one_error_line(capsys, ["serve", "--checkpoint", str(world[0]), "--adapters", str(adapter), "--port", "0"])
    assert err == f"{adapter} is a file, not a folder: the adapters are a folder of <user>.safetensors files"


def test_a_models_folder_given_as_adapters_is_refused_before_serving(world, tmp_path, capsys):
    """alfa serve --adapters runs/model started, and answered 404 to a user named "model"."""
    shutil.copy(world[0], tmp_path / "model.safetensors")
    for extra in (["--port", "0"], ["--selftest"]):
        err = _one_error_line(capsys, ["serve", "--checkpoint", str(world[0]), "--adapters", str(tmp_path), *extra])
        assert err.startswith(f"--adapters {tmp_path} holds a model (model.safetensors), not users' files")
    argv = ["evaluate", "--checkpoint", str(world[0]), "--data", "synthetic:mpii", "--adapters", str(tmp_path)]
    assert main(argv) == 2 and "holds a model (model.safetensors)" in capsys.readouterr().err


def test_serve_refuses_a_checkpoint_none_of_the_adapters_fits_and_serves_an_empty_folder(
    world, tmp_path, capsys, monkeypatch
):
    """alfa serve started on a base none of the folder's adapters was made on, and answered every user a 404 whose
    reason only its log had; evaluate and --selftest refused the same pair in one line."""
    from alfa.gaze.service.selftest import write_demo_service

    other = write_demo_service(tmp_path / "other", model="tiny_gaze_net", size=16, truncate_target=None, seed=5)

    def stop(self, *args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(GazeServer, "serve_forever", stop)
    err = _one_error_line(capsys, ["serve", "--checkpoint", str(other), "--adapters", str(world[1]), "--port", "0"])
    assert err.startswith(f"--adapters {world[1]}: none of its users' adapters serves on --checkpoint {other} (the")
    assert "ann.safetensors" in err and err.endswith("): serve the checkpoint they were made on"), err
    (tmp_path / "empty").mkdir()  # users' files may come later: served, as is a folder where one file serves
    (tmp_path / "damaged").mkdir()  # or one whose file fails for a reason of its own: its user's answer, in the log
    (tmp_path / "damaged" / "aaa.safetensors").write_bytes(b"half a copy")
    errs = {}
    for adapters, base in ((tmp_path / "empty", other), (tmp_path / "damaged", other), (world[1], world[0])):
        assert main(["serve", "--checkpoint", str(base), "--adapters", str(adapters), "--port", "0", "--quiet"]) == 130
        captured = capsys.readouterr()
        assert "serving on http://" in captured.out and "error" not in captured.err
        errs[adapters.name] = captured.err
    # the file's reason, which the service keeps (a request does not say it again), is in the log from the start
    assert "alfa serve: user 'aaa': their adapter file is damaged" in errs["damaged"], errs


def test_a_taken_port_is_one_line_with_one_hint(world, capsys):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        argv = ["serve", "--checkpoint", str(world[0]), "--adapters", str(world[1]), "--port", str(port)]
        err = _one_error_line(capsys, argv)
    assert err == (f"port {port} on 127.0.0.1 is taken (Address already in use): stop the other server or choose "
                   "another --port (0: any free one)")  # fmt: skip


IGNORED_OPTIONS = {
    "--clients without --selftest": (["--clients", "5"], "--clients applies to --selftest only"),
    "--requests without --selftest": (["--requests", "5"], "--requests applies to --selftest only"),
    "--time-limit without --selftest": (["--time-limit", "5"], "--time-limit applies to --selftest only"),
    "--host with --selftest": (["--selftest", "--host", "0.0.0.0"], "--host does not apply to --selftest"),
    "--port with --selftest": (["--selftest", "--port", "18765"], "--port does not apply to --selftest"),
    "--port 8000 with --selftest": (["--selftest", "--port", "8000"], "--port does not apply to --selftest"),
    "--port 0 with --selftest": (["--selftest", "--port", "0"], "--port does not apply to --selftest"),
    "--access-log with --selftest": (["--selftest", "--access-log", "x.log"], "--access-log does not apply"),
    "--quiet with --selftest": (["--selftest", "--quiet"], "--quiet does not apply to --selftest"),
    "--token with --selftest": (["--selftest", "--token", TOKEN], "--token does not apply to --selftest"),
}


@pytest.mark.parametrize("case", list(IGNORED_OPTIONS))
def test_an_option_the_mode_would_ignore_is_refused(world, tmp_path, capsys, monkeypatch, case):
    extra, message = IGNORED_OPTIONS[case]
    monkeypatch.chdir(tmp_path)

    from alfa.gaze.service import selftest

    @functools.wraps(selftest.selftest)  # its signature stays: the command reads its defaults from it
    def stop(*args, **kwargs):  # had the option been let through: end at once (exit 130), never serve or load
        raise KeyboardInterrupt

    monkeypatch.setattr(GazeServer, "serve_forever", stop)
    monkeypatch.setattr(selftest, "selftest", stop)
    err = _one_error_line(capsys, ["serve", "--checkpoint", str(world[0]), "--adapters", str(world[1]), *extra])
    assert err.startswith(message) and ": " in err.removeprefix(message), err  # the option, then why
    assert not (tmp_path / "x.log").exists()


def test_each_refused_option_gives_its_own_reason():
    from alfa.cli.serve import _SELFTEST_ONLY, _SERVING_ONLY

    reasons = [why for _, why in (*_SERVING_ONLY.values(), *_SELFTEST_ONLY.values())]
    assert len(set(reasons)) == len(reasons)  # --access-log and --quiet once shared one
    assert _SERVING_ONLY["quiet"][1].startswith("the selftest has no access log to silence")


def test_options_not_given_take_their_stated_defaults():
    from alfa.cli import build_parser
    from alfa.cli.serve import _resolve

    served = build_parser().parse_args(["serve", "--checkpoint", "c", "--adapters", "a"])
    _resolve(served)
    assert (served.host, served.port, served.clients, served.requests, served.time_limit) == (
        "127.0.0.1", 8000, 200, 1000, 120.0)  # fmt: skip
    loaded = build_parser().parse_args(["serve", "--selftest", "--clients", "7"])
    _resolve(loaded)
    assert (loaded.clients, loaded.requests, loaded.time_limit) == (7, 1000, 120.0)


def test_a_damaged_fingerprint_is_a_500_and_a_non_finite_answer_is_no_bare_nan(world, tmp_path):
    """An adapter header whose fingerprint is valid JSON of the wrong shape does not load (500: a damaged file,
    as every other), and a user whose adapter makes the model's answer infinite gets a JSON error, never ``NaN``
    in the body (which is not JSON)."""
    from safetensors import safe_open
    from safetensors.torch import load_file, save_file

    folder = tmp_path / "adapters"
    shutil.copytree(world[1], folder)
    source = folder / "ann.safetensors"
    with safe_open(str(source), "pt") as f:
        meta = dict(f.metadata())
    fingerprint = json.loads(meta["fingerprint"])
    meta["fingerprint"] = json.dumps({name: "x" for name in fingerprint})
    meta["about"] = json.dumps({"person": "eve"})
    save_file(load_file(str(source)), str(folder / "eve.safetensors"), metadata=meta)
    with pytest.raises(alfa.AdapterFileError, match="its fingerprint of .* is not a signature"):
        alfa.read_adapter_metadata(folder / "eve.safetensors")
    base, _ = load_model(world[0])
    alfa.load_adapter(base, source)
    with torch.no_grad():
        for p in alfa.adapter_parameters(base).values():
            p.fill_(1e30)
    alfa.save_adapter(base, folder / "zed.safetensors", about={"person": "zed"})
    service = GazeService(world[0], folder, ServiceLimits(workers=1))
    with serving(service) as port:
        status, _, reply = _exchange(port, _request("/predict?user=eve", PNG))
        assert status == 500 and "their adapter file is damaged" in reply["error"]
        with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
            s.sendall(_request("/predict?user=zed", PNG))
            raw = b"".join(iter(lambda: s.recv(65536), b""))
        assert b"NaN" not in raw and b"Infinity" not in raw
        status, _, reply = _exchange(port, _request("/predict?user=zed", PNG))
        assert status == 500 and "not a finite number" in reply["error"]
        assert _exchange(port, _request("/predict?user=ann", PNG))[0] == 200  # the others are still served


def test_stopping_answers_what_was_accepted_and_a_trickling_client_does_not_hold_it_up(world, monkeypatch):
    import alfa.gaze.service.server as server_module
    from alfa.gaze.service.server import STOPPING

    # a shorter grace, still told from the socket timeout (10 s) that a trickling client would otherwise hold
    monkeypatch.setattr(server_module, "STOP_GRACE", STOP_GRACE := 1.5)
    server = make_server(GazeService(*world, ServiceLimits(workers=2)), port=0)  # socket timeout 10 s, request 30 s
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    port, request = server.server_address[1], _request("/predict?user=ann", PNG)
    with (
        socket.create_connection(("127.0.0.1", port), timeout=10) as slow,
        socket.create_connection(("127.0.0.1", port), timeout=10) as arriving,
    ):
        slow.sendall(b"POST /predict?user=ann HTTP/1.0\r\n")  # headers that never end
        arriving.sendall(request[:-10])
        _until(lambda: len(server._receiving) == 2)  # both taken by the workers
        assert server.in_flight() == 2
        server.shutdown()
        began = time.monotonic()
        closing = threading.Thread(target=server.server_close)
        closing.start()
        _until(server._stopping.is_set)  # the grace has begun
        time.sleep(0.3)
        arriving.sendall(request[-10:])  # the rest comes within the grace, not at once: answered
        assert _answer(arriving)[0] == 200
        status, headers, reply = _answer(slow)
        closing.join(timeout=15)
        assert status == 503 and reply["error"] == STOPPING and headers["Retry-After"] == "1"
        assert time.monotonic() - began < STOP_GRACE + 1.5, "a trickling client held the stop up"
    assert server.in_flight() == 0


def test_sigterm_drains_and_exits_0_with_a_line_not_a_traceback(world, tmp_path):
    import os
    import signal
    import subprocess
    import sys
    from pathlib import Path

    tests = Path(__file__).parent
    # a short grace for the request that never ends (its length is the in-process stopping tests' matter)
    code = (
        "import sys, tiny_models; import alfa.gaze.service.server as s; s.STOP_GRACE = 0.3; "
        "from alfa.cli import main; sys.exit(main(sys.argv[1:]))"
    )
    command = [sys.executable, "-c", code, "serve", "--checkpoint", str(world[0]), "--adapters", str(world[1])]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tests), os.environ.get("PYTHONPATH", "")])}
    server = subprocess.Popen(
        [*command, "--port", "0", "--quiet"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
    )
    try:
        port = int(re.search(r"http://127\.0\.0\.1:(\d+)", server.stdout.readline()).group(1))
        with socket.create_connection(("127.0.0.1", port), timeout=10) as slow:
            slow.sendall(b"GET /health HTTP/1.0\r\n")  # headers that never end
            time.sleep(0.3)
            server.send_signal(signal.SIGTERM)
            status, _, reply = _answer(slow)
        _, errors = server.communicate(timeout=15)
    finally:
        server.kill()
    assert status == 503 and "stopping" in reply["error"]
    assert server.returncode == 0 and "Traceback" not in errors, errors
    assert "stopping: answering the 1 connection(s) accepted" in errors and "stopped (SIGTERM)" in errors, errors


def test_stopping_answers_a_long_queue_and_the_backlog(world, monkeypatch):
    """However long the queue, what was accepted is answered while the workers make progress; a connection still
    in the listen backlog gets a 503 rather than a reset."""
    import alfa.gaze.service.server as server_module
    from alfa.gaze.service.server import STOPPING

    monkeypatch.setattr(server_module, "STOP_GRACE", 0.1)
    monkeypatch.setattr(server_module, "_LINGER_SECONDS", 0.1)  # one connection may take 1.4 s: the queue, 1.8 s
    service = GazeService(*world, ServiceLimits(workers=1, queue=16, socket_timeout=0.2))
    predict = service.predict
    monkeypatch.setattr(service, "predict", lambda *a: time.sleep(0.3) or predict(*a))
    server, accepted = make_server(service, port=0), []
    process = server.process_request
    monkeypatch.setattr(server, "process_request", lambda *a: accepted.append(a) or process(*a))
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    port, request = server.server_address[1], _request("/predict?user=ann", PNG)
    clients = [socket.create_connection(("127.0.0.1", port), timeout=10) for _ in range(6)]
    for client in clients:
        client.sendall(request)
    _until(lambda: len(accepted) == 6)
    server.shutdown()
    late = socket.create_connection(("127.0.0.1", port), timeout=10)  # in the backlog: no one accepts it now
    late.sendall(request)
    server.server_close()
    assert server.in_flight() == 0  # it returned once all were answered, not after a fixed wait
    assert [_answer(client)[0] for client in clients] == [200] * 6
    status, headers, reply = _answer(late)
    assert status == 503 and reply["error"] == STOPPING and headers["Retry-After"] == "1"
    for client in (*clients, late):
        client.close()


def test_an_access_log_that_cannot_be_written_is_said_once_and_the_service_goes_on(capsys, tmp_path):
    """A full disk: every line was dropped in silence, and closing the file at the stop was the command's error."""
    import errno

    from alfa.cli.serve import _access_log
    from alfa.gaze.service.server import _Log

    class FullDisk(io.StringIO):
        name = "/var/log/gaze.log"

        def flush(self):
            raise OSError(errno.ENOSPC, "No space left on device")

    log = _Log(FullDisk())
    for _ in range(3):
        log.line("127.0.0.1", "GET /health HTTP/1.1", 200, 80, 0.001)
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "cannot write the access log /var/log/gaze.log (" in err and log.failed
    with _access_log(str(tmp_path / "access.log")) as f:
        f.write("a line\n")
        f.flush = FullDisk().flush  # its last flush, at close, fails as the disk is full
    assert (tmp_path / "access.log").read_text() == ""
