"""Fuzzing the parsers a user's files and strings reach: GazeHub label files and dataset specs. Whatever the
bytes, only the project's own clear errors may come out (a ``ValueError`` naming the spec or the file and line,
or ``FileNotFoundError``), never a ``TypeError``, ``IndexError``, ``UnicodeDecodeError`` or a traceback from
deep inside a library."""

from __future__ import annotations

import functools
import os
import shutil
from pathlib import Path

import pytest

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from alfa.gaze.data.fixtures import write_gazehub_fixture  # noqa: E402
from alfa.gaze.data.gazehub import GazeHubDataset  # noqa: E402
from alfa.gaze.data.registry import open_dataset  # noqa: E402

# The suite runs each fuzz test on the same 60 examples every time (its time budget, and a failure that a rerun
# shows again); ALFA_FUZZ_EXAMPLES=400 runs the long version, on examples drawn afresh each run (hypothesis then
# prints the failing example and how to reproduce it). No example database is written into the checkout.
LONG = "ALFA_FUZZ_EXAMPLES" in os.environ
EXAMPLES = int(os.environ.get("ALFA_FUZZ_EXAMPLES", "60"))
FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize=not LONG,
    database=None,
    print_blob=LONG,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)

_CLEAR = (ValueError, FileNotFoundError)


@pytest.fixture(scope="module")
def gazehub_root(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("gazehub")
    write_gazehub_fixture(root, "mpiifacegaze", persons=["p00", "p01"], images_per_person=3)
    return root


def _open_with_label(root: Path, tmp: Path, label: bytes) -> None:
    if not tmp.exists():  # one copy for all examples: the loader only reads, and each example writes its label
        shutil.copytree(root, tmp)
    (tmp / "Label" / "p01.label").write_bytes(label)
    GazeHubDataset(tmp, "mpiifacegaze", check_files=False)


def _names_the_culprit(error: Exception) -> bool:
    text = str(error)
    return "p01.label" in text or "Label" in text or "label" in text.lower()


@pytest.mark.skipif(LONG, reason="the long version draws its examples afresh")
def test_the_suite_draws_the_same_examples_every_run():
    """A fuzz failure in the suite shows again on a rerun: FUZZ draws the same examples each time."""

    def drawn() -> list[bytes]:
        seen: list[bytes] = []

        @FUZZ
        @given(body=st.binary(max_size=64))
        def collect(body: bytes) -> None:
            seen.append(body)

        collect()
        return seen

    first = drawn()
    assert len(set(first)) > 10 and drawn() == first


huge_or_odd = st.sampled_from(["nan", "inf", "-inf", "1e309", "-1e400", "0x1f", "1,2,3", "", " ", "é", "\x00"])


@pytest.mark.slow
@FUZZ
@given(data=st.data())
def test_a_mangled_label_file_gives_a_clear_error_or_loads(gazehub_root, tmp_path, data):
    good = (gazehub_root / "Label" / "p01.label").read_bytes()
    lines = good.split(b"\n")
    how = data.draw(st.sampled_from(["bytes", "cut", "line", "cell", "encoding"]))
    if how == "bytes":
        label = data.draw(st.binary(max_size=400))
    elif how == "cut":
        label = good[: data.draw(st.integers(0, len(good)))]
    elif how == "line":
        i = data.draw(st.integers(0, len(lines) - 1))
        lines[i] = data.draw(st.text(max_size=120)).encode("utf-8", "surrogatepass")
        label = b"\n".join(lines)
    elif how == "cell":
        i = data.draw(st.integers(1, len(lines) - 2))
        cells = lines[i].split(b" ")
        j = data.draw(st.integers(0, len(cells) - 1))
        cells[j] = data.draw(huge_or_odd).encode()
        lines[i] = b" ".join(cells)
        label = b"\n".join(lines)
    else:
        label = good.decode().encode(data.draw(st.sampled_from(["utf-16", "utf-32", "latin-1", "cp1252"])))
    try:
        _open_with_label(gazehub_root, tmp_path / "copy", label)
    except _CLEAR as e:
        assert _names_the_culprit(e), f"{how}: {e}"


spec_text = st.text(alphabet=st.characters(codec="utf-8"), max_size=60)


@FUZZ
@given(kind=st.sampled_from(["synthetic", "gazehub", "xgaze", "toy", ""]), rest=spec_text, query=spec_text)
def test_any_dataset_spec_gives_a_clear_error(kind, rest, query):
    spec = f"{kind}:{rest}?{query}" if query else f"{kind}:{rest}"
    try:
        open_dataset(spec)
    except _CLEAR as e:
        assert spec in str(e) or "dataset" in str(e) or "domain" in str(e) or "synthetic world" in str(e), str(e)


# ----------------------------------------------------------------------------- the gaze service
# Whatever a client sends, the service answers: an HTTP status line, a JSON body, a status from the expected set
# (never 500, never a dropped connection), and no path of the server in what it says.

USERS = {"ann", "bob", "cat"}


@pytest.fixture(scope="module")
def fuzzed_service(service_world):
    import threading

    import torch

    from alfa.gaze.service import GazeService, ServiceLimits, make_server

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    limits = ServiceLimits(workers=2, socket_timeout=2.0, request_timeout=4.0)
    service = GazeService(service_world / "base.safetensors", service_world / "adapters", limits, note=lambda _: None)
    server = make_server(service, port=0)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    yield service, server.server_address[1]
    server.shutdown()
    server.server_close()
    torch.set_num_threads(threads)


@functools.lru_cache(maxsize=16)
def _png(seed: int = 0, size: int = 16) -> bytes:
    import numpy as np

    from alfa.gaze.service.selftest import png_bytes

    return png_bytes(np.random.default_rng(seed).integers(0, 256, (size, size, 3), dtype=np.uint8))


def _says_nothing_of_the_server(text: str, root: Path) -> bool:
    return str(root) not in text and "Traceback" not in text and "/tmp" not in text


known_headers = ["Content-Length", "Transfer-Encoding", "Authorization", "Content-Type", "Expect", "Connection", "Host"]
header_name = st.sampled_from(known_headers) | st.text("abcdefghijklmnopqrstuvwxyz-XYZ0", min_size=1, max_size=12)
header_value = (
    st.integers(-(10**3), 10**12).map(str)
    | st.sampled_from(["", " 12", "1e3", "0x10", "12, 13", "chunked", "Bearer", "100-continue", "٣"])
    | st.text(st.characters(min_codepoint=32, max_codepoint=255, exclude_characters="\x7f"), max_size=40)
)


@FUZZ
@given(method=st.sampled_from(["GET", "POST", "PUT", "HEAD", "OPTIONS"]),
       path=st.sampled_from(["/predict?user=ann", "/predict", "/health", "/", "/predict?user=ann&x=1"]),
       headers=st.lists(st.tuples(header_name, header_value), max_size=6), with_body=st.booleans(),
       garbage=st.none() | st.none() | st.binary(max_size=300))  # fmt: skip
def test_any_headers_get_a_json_answer(fuzzed_service, service_world, method, path, headers, with_body, garbage):
    import json
    import socket

    _, port = fuzzed_service
    body = _png() if with_body else b""
    lines = [f"{method} {path} HTTP/1.0", *(f"{name}: {value}" for name, value in headers)]
    if with_body and not any(name.lower() == "content-length" for name, _ in headers):
        lines.append(f"Content-Length: {len(body)}")
    data = ("\r\n".join(lines) + "\r\n\r\n").encode("utf-8") + body
    if garbage is not None:  # not HTTP at all: bytes, then the end of a head
        data, method = garbage + b"\r\n\r\n", ""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(data)
        s.shutdown(socket.SHUT_WR)  # a body shorter than its length ends here, rather than after the timeout
        raw = b""
        while chunk := s.recv(65536):
            raw += chunk
    head, _, reply = raw.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 "), raw[:200]
    status = int(head.split()[1])
    assert status in {200, 400, 404, 405, 408, 411, 413, 414, 431, 501, 505}, raw[:300]
    if method != "HEAD":
        payload = json.loads(reply)
        assert status == 200 or (payload["status"] == status and payload["error"]), payload
        assert _says_nothing_of_the_server(reply.decode(), service_world)


@FUZZ
@given(user=st.text(max_size=200) | st.sampled_from(["ann", "ANN", "ann.", ".ann", "a" * 129, "..", "ann\x00", "ann/"]))
def test_any_user_id_gets_a_clear_answer(fuzzed_service, service_world, user):
    from urllib.parse import parse_qs, quote

    from alfa.gaze.service import ROUTES, Request, ServiceError

    service, _ = fuzzed_service
    request = Request(parse_qs(f"user={quote(user, safe='')}", keep_blank_values=True), _png())
    try:
        reply = ROUTES["/predict"]["POST"].answer(service, request)
    except ServiceError as e:
        assert e.status in (400, 404) and _says_nothing_of_the_server(str(e), service_world), str(e)
        assert user not in USERS
    else:
        assert user in USERS and reply["user"] == user


def _png_claiming(width: int, height: int, depth: int, color: int, pixels: bytes) -> bytes:
    import struct
    import zlib

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    ihdr = struct.pack(">IIBBBBB", width, height, depth, color, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(pixels)) + chunk(b"IEND", b"")


@st.composite
def image_bodies(draw) -> bytes:
    good = _png(draw(st.integers(0, 3)), size=draw(st.sampled_from([16, 16, 8])))
    how = draw(st.sampled_from(["bytes", "cut", "flip", "claim"]))
    if how == "bytes":
        return draw(st.binary(max_size=600))
    if how == "cut":
        return good[: draw(st.integers(0, len(good)))]
    if how == "flip":
        body = bytearray(good)
        for _ in range(draw(st.integers(1, 8))):
            body[draw(st.integers(0, len(body) - 1))] = draw(st.integers(0, 255))
        return bytes(body)
    return _png_claiming(draw(st.integers(0, 2**31 - 1)) if draw(st.booleans()) else 16,
                         draw(st.integers(0, 2**31 - 1)) if draw(st.booleans()) else 16,
                         draw(st.sampled_from([1, 2, 4, 8, 16, 3])), draw(st.sampled_from([0, 2, 3, 4, 6, 5])),
                         draw(st.binary(max_size=400)))  # fmt: skip


@FUZZ
@given(body=image_bodies())
def test_any_body_gets_a_clear_answer(fuzzed_service, service_world, body):
    from alfa.gaze.service import ServiceError

    service, _ = fuzzed_service
    try:
        reply = service.predict("ann", body)
    except ServiceError as e:
        assert e.status in (400, 413) and _says_nothing_of_the_server(str(e), service_world), str(e)
    else:
        assert set(reply) == {"user", "yaw", "pitch", "unit"}
