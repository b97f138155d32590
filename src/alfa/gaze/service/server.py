"""The HTTP side of the gaze service: a fixed pool of worker threads fed by a bounded queue of accepted
connections, a route table, a token check, socket and request timeouts, and an access log.

    GET  /health            -> 200 {"status": "ok", "users_loaded", "input_size"}   (no token needed)
    POST /predict?user=ID   body: a face crop (PNG or JPEG) of the base's input size
                            -> 200 {"user", "yaw", "pitch", "unit": "radians"}
    POST /predict/photo?user=ID   body: a photo of one face, any size within the pixel limit (the camera extra)
                            -> 200 {"user", "image", "camera", "convention", "faces"}

Every answer is JSON; an error is ``{"error": "...", "status": N}`` and never names a path of the server. A
connection that finds the queue full is answered 503 at once by the accepting thread (never dropped unanswered);
one whose body does not arrive within the timeouts gets 408 and frees its worker. Routes are a table
(:data:`ROUTES`): a new endpoint is one :class:`Route`, and it gets the same limits, token check and log.
"""

from __future__ import annotations

import contextlib
import json
import queue
import socket
import socketserver
import sys
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from typing import Any, TextIO
from urllib.parse import parse_qs, urlsplit

from .limits import ServiceError, ServiceLimits, check_token, content_length
from .model import GazeService

__all__ = ["GazeServer", "ROUTES", "Request", "Route", "is_loopback", "make_server"]


@dataclass
class Request:
    """What a route sees of a request: its query (each name's values) and its body (empty for a GET)."""

    query: dict[str, list[str]]
    body: bytes = b""

    def one(self, name: str) -> str | None:
        """The single value of query parameter ``name`` (``None`` if absent; given twice is refused)."""
        values = self.query.get(name, [])
        if len(values) > 1:
            raise ServiceError(400, f"{name!r} given {len(values)} times")
        return values[0] if values else None


@dataclass(frozen=True)
class Route:
    """One endpoint: ``answer(service, request)`` returns the JSON payload of a 200 or raises ServiceError.
    ``body``: it reads a body (its Content-Length checked against the limits first); ``public``: it is answered
    without the token (the health check a load balancer polls)."""

    answer: Callable[[GazeService, Request], dict[str, Any]]
    body: bool = False
    public: bool = False


ROUTES: dict[str, dict[str, Route]] = {
    "/health": {"GET": Route(lambda service, request: service.health(), public=True)},
    "/predict": {"POST": Route(lambda service, request: service.predict(request.one("user"), request.body), body=True)},
    "/predict/photo": {
        "POST": Route(lambda service, request: service.predict_photo(request.one("user"), request.body), body=True)
    },
}
"""Path -> method -> route."""


def is_loopback(host: str) -> bool:
    """Whether every address ``host`` names is this machine's loopback (only local programs can connect)."""
    import ipaddress

    try:
        infos = socket.getaddrinfo(host or None, None, proto=socket.IPPROTO_TCP, flags=socket.AI_PASSIVE)
    except (socket.gaierror, UnicodeError):
        return False
    return bool(infos) and all(ipaddress.ip_address(info[4][0].split("%")[0]).is_loopback for info in infos)


def _printable(text: str, limit: int = 200) -> str:
    """``text`` for one log line: control characters escaped (no forged lines), at most ``limit`` characters."""
    escaped = text.encode("unicode_escape", "backslashreplace").decode("ascii")
    return escaped if len(escaped) <= limit else escaped[:limit] + "…"


@dataclass
class _Log:
    """The access log: one line per answered request, whole lines from many threads (``stream=None``: off)."""

    stream: TextIO | None
    lock: threading.Lock = field(default_factory=threading.Lock)
    failed: bool = False  # said once: a full disk does not stop the service, nor fill stderr

    def line(self, client: str, request: str, status: int, size: int, seconds: float) -> None:
        if self.stream is None:
            return
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime())
        text = f'{stamp}Z {client} "{_printable(request)}" {status} {size} {seconds * 1000:.1f}ms\n'
        with self.lock:
            try:
                self.stream.write(text)
                self.stream.flush()
            except (OSError, ValueError) as e:
                if not self.failed and self.stream is not sys.stderr:
                    name = getattr(self.stream, "name", "the access log")
                    print(f"alfa serve: warning: cannot write the access log {name} ({e}): requests are still "
                          "answered, their log lines are lost", file=sys.stderr, flush=True)  # fmt: skip
                self.failed = True


class GazeServer(socketserver.TCPServer):
    """A TCP server whose accepted connections wait in a bounded queue for ``limits.workers`` threads.

    The listen backlog is ``limits.backlog``; a connection accepted while ``limits.queue`` others wait is
    answered 503 by the accepting thread itself. A watchdog cuts the connection of a request not received
    within ``limits.request_timeout`` (a client that trickles its headers a byte at a time)."""

    allow_reuse_address = True

    def __init__(
        self,
        address: tuple[str, int],
        service: GazeService,
        limits: ServiceLimits,
        token: str | None = None,
        access_log: TextIO | None = None,
    ) -> None:
        self.service, self.limits, self.token, self.log = service, limits, token, _Log(access_log)
        self.request_queue_size = limits.backlog
        self.address_family = socket.AF_INET6 if ":" in address[0] else socket.AF_INET
        self._pending: queue.Queue = queue.Queue(limits.queue)
        self._receiving: dict[socket.socket, float] = {}  # connection -> deadline to have received the request
        # connections the watchdog cut (what they sent is no whole request) -> the status that says why
        self._cut: dict[socket.socket, int] = {}
        self._receiving_lock = threading.Lock()
        self._open = 0  # connections queued or being served
        self._stopping = threading.Event()  # no new connections; those accepted are still answered
        self._closing = threading.Event()
        self._threads: list[threading.Thread] = []  # none yet: a failed bind closes the server inside __init__
        super().__init__(address, _Handler)
        self._threads += [threading.Thread(target=self._work, daemon=True, name=f"alfa-serve-{i}")
                         for i in range(limits.workers)]  # fmt: skip
        self._threads.append(threading.Thread(target=self._watch, daemon=True, name="alfa-serve-watchdog"))
        for thread in self._threads:
            thread.start()

    # -- the pool
    def process_request(self, request: Any, client_address: Any) -> None:
        with self._receiving_lock:
            self._open += 1  # before a worker can take it, and be done with it
        try:
            self._pending.put_nowait((request, client_address))
        except queue.Full:
            with self._receiving_lock:
                self._open -= 1
            self._turn_away(request, client_address, "the service is busy: try again shortly", "queue full")

    def _work(self) -> None:
        while True:
            item = self._pending.get()
            if item is None:
                return
            request, client_address = item
            try:
                self.finish_request(request, client_address)
            except Exception:  # noqa: BLE001 — one connection's failure must not end a worker
                self.handle_error(request, client_address)
            finally:
                self.shutdown_request(request)
                with self._receiving_lock:
                    self._open -= 1

    def _turn_away(self, connection: socket.socket, client_address: Any, words: str, why: str) -> None:
        """Answer 503 with ``words`` without reading the request (the queue is full, or the service stops): the
        client should retry shortly. ``why`` goes to the access log."""
        data = json.dumps({"error": words, "status": 503}).encode()
        head = (f"HTTP/1.0 503 Service Unavailable\r\nContent-Type: application/json\r\nRetry-After: 1\r\n"
                f"Connection: close\r\nContent-Length: {len(data)}\r\n\r\n").encode()  # fmt: skip
        with contextlib.suppress(OSError):
            connection.settimeout(1.0)
            connection.sendall(head + data)
            connection.shutdown(socket.SHUT_WR)
            # Read what already came (the request), so that closing does not reset the connection before the
            # client has read the answer; never wait for more.
            connection.setblocking(False)
            for _ in range(16):
                if not connection.recv(65536):
                    break
        self.log.line(str(client_address[0]), f"(not read: {why})", 503, len(data), 0.0)
        self.shutdown_request(connection)

    # -- the request deadline
    def receiving(self, connection: socket.socket, active: bool) -> None:
        with self._receiving_lock:
            if active:
                wait = self.limits.request_timeout
                if self._stopping.is_set():
                    wait = min(wait, STOP_GRACE)
                self._receiving[connection] = time.monotonic() + wait
            else:
                self._receiving.pop(connection, None)

    def cut_answer(self, connection: socket.socket) -> tuple[int, str] | None:
        """If the watchdog cut ``connection`` before its request had arrived, the status and words to answer with
        (408, or 503 when the server was stopping), whatever part of a request line or headers the cut left to read."""
        with self._receiving_lock:
            status = self._cut.get(connection)
        return None if status is None else (status, STOPPING if status == 503 else LATE)

    def forget(self, connection: socket.socket) -> None:
        with self._receiving_lock:
            self._receiving.pop(connection, None)
            self._cut.pop(connection, None)

    def _watch(self) -> None:
        while not self._closing.wait(0.1 if self._stopping.is_set() else 0.25):
            now = time.monotonic()
            with self._receiving_lock:
                late = [c for c, deadline in self._receiving.items() if deadline < now]
                for connection in late:
                    del self._receiving[connection]
                    self._cut[connection] = 503 if self._stopping.is_set() else 408
            for connection in late:  # a blocked read returns at once; the handler answers 408 (503) if it still can
                with contextlib.suppress(OSError):
                    connection.shutdown(socket.SHUT_RD)

    def handle_error(self, request: Any, client_address: Any) -> None:
        print(f"alfa serve: error in a connection from {client_address[0]}:\n{traceback.format_exc()}",
              file=sys.stderr)  # fmt: skip

    def server_close(self) -> None:
        """Stop: connections waiting to be accepted get a 503, no new one is taken, and those accepted are answered
        (a request still arriving gets ``STOP_GRACE`` seconds more, then 503); it returns when they are, or when
        the workers have made no progress for as long as one connection may take."""
        self._answer_the_backlog()
        super().server_close()
        now = time.monotonic()
        with self._receiving_lock:
            self._stopping.set()
            for connection, deadline in self._receiving.items():
                self._receiving[connection] = min(deadline, now + STOP_GRACE)
        for _ in self._threads[:-1]:  # one stop per worker, after the connections already queued
            self._pending.put(None)
        # However long the queue, each connection's time is bounded: wait while they are being answered, and give up
        # on a worker only when no connection has been done with for longer than one may take.
        patience = STOP_GRACE + self.limits.socket_timeout + _LINGER_SECONDS + 1
        last_progress, left = time.monotonic(), self.in_flight()
        workers = self._threads[:-1]
        while any(t.is_alive() for t in workers) and time.monotonic() - last_progress < patience:
            for thread in workers:
                thread.join(timeout=0.1)
            if self.in_flight() < left:
                last_progress, left = time.monotonic(), self.in_flight()
        self._closing.set()
        for watchdog in self._threads[-1:]:  # none when the bind failed
            watchdog.join(timeout=1.0)

    def _answer_the_backlog(self) -> None:
        """Accept what waits in the listen backlog and answer each 503 (closing the socket would reset them)."""
        with contextlib.suppress(OSError):
            self.socket.setblocking(False)
            for _ in range(self.limits.backlog):
                try:
                    connection, address = self.socket.accept()
                except (BlockingIOError, InterruptedError):
                    return
                self._turn_away(connection, address, STOPPING, "stopping")

    def in_flight(self) -> int:
        """Connections accepted and not yet done with (queued or being served)."""
        with self._receiving_lock:
            return self._open


LATE = "the request did not arrive within the time limit"
"""The 408's words, whichever way the time ran out (the socket's, the watchdog's cut)."""

STOP_GRACE = 2.0
"""Seconds a request still arriving when the server stops gets to arrive (then 503 with ``STOPPING``): one whose
client trickles its bytes does not hold the stop up (a large photo on a slow link is cut too, and may retry)."""

STOPPING = "the service is stopping: try again shortly"

_LINGER_SECONDS, _LINGER_STEP, _LINGER_BYTES = 2.0, 0.25, 64 << 20
"""How long (in all, and at most between two reads) and how much a refused request's unread body is read and
dropped before its connection closes: enough for a body a few times the limit on any network that sends it at
all, bounded so that a client cannot hold a worker with it."""


class _Handler(BaseHTTPRequestHandler):
    server: GazeServer
    server_version = "alfa-serve"
    sys_version = ""
    # HTTP/1.1 so that a client's "Expect: 100-continue" gets its interim answer (curl would otherwise wait a
    # second before sending a body), yet one request per connection: every answer says "Connection: close", so a
    # worker is never held by an idle keep-alive.
    protocol_version = "HTTP/1.1"

    def setup(self) -> None:
        self.timeout = self.server.limits.socket_timeout
        super().setup()
        self._started = time.monotonic()
        self._status, self._size, self._timed_out = 0, 0, False
        self.command, self.request_version, self.requestline = None, "HTTP/1.0", ""
        self.server.receiving(self.connection, True)

    def handle(self) -> None:
        super().handle()
        if self._status:
            return
        # http.server closes without a word on a stalled request line or headers, and on a blank request line:
        # say what happened, if the socket still lets us (a client the deadline cut gets its 408 even when it had
        # sent nothing).
        with contextlib.suppress(OSError):
            cut = self.server.cut_answer(self.connection)
            if cut is not None:
                self._reply_cut(*cut)
            elif self._timed_out:
                self._reply(408, {"error": LATE, "status": 408})
            elif getattr(self, "raw_requestline", b""):
                self._reply(400, {"error": "not an HTTP request", "status": 400})

    def finish(self) -> None:
        self.server.forget(self.connection)
        if self._status:  # logged when answered: before the client sees the end of the answer, and its time
            request = getattr(self, "requestline", "") or "-"  # without the drain below
            seconds = time.monotonic() - self._started
            self.server.log.line(self.client_address[0], request, self._status, self._size, seconds)
        if self._status >= 400:  # a refused body may still sit unread: take what came, so that closing does not
            self._drain()  # reset the connection before the client has read the answer
        with contextlib.suppress(OSError):
            super().finish()

    def _drain(self) -> None:
        """After a refusal, end the answer (FIN) and read, for a short while, what the client still sends: a
        client sends its whole body before it reads, and a connection closed on unread data is reset, which
        would throw away the answer it has not read yet."""
        with contextlib.suppress(OSError, ValueError):
            self.wfile.flush()
            self.connection.shutdown(socket.SHUT_WR)
            self.connection.settimeout(_LINGER_STEP)
            deadline, left = time.monotonic() + _LINGER_SECONDS, _LINGER_BYTES
            while left > 0 and time.monotonic() < deadline:
                chunk = self.connection.recv(65536)
                if not chunk:
                    break
                left -= len(chunk)

    # -- answers
    def _reply(self, status: int, payload: dict[str, Any], headers: dict[str, str] | None = None) -> None:
        try:
            data = json.dumps(payload, allow_nan=False).encode()
        except ValueError:  # a NaN or infinity (a broken adapter's answer): bare NaN is not JSON, and not an answer
            status, headers = 500, None
            payload = {"error": "the model's answer is not a finite number (the user's adapter?)", "status": 500}
            data = json.dumps(payload).encode()
        self.request_version = "HTTP/1.0"  # http.server would answer an HTTP/0.9 request line without a status line
        self.send_response(status)
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.send_header("Connection", "close")
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)
        self._status, self._size = status, len(data)

    def _reply_cut(self, status: int, words: str) -> None:
        self._reply(status, {"error": words, "status": status}, {"Retry-After": "1"} if status == 503 else None)

    def send_error(self, code: int, message: str | None = None, explain: str | None = None) -> None:
        """http.server's own refusals (a malformed request line, too many headers, an unknown method) as JSON."""
        self.close_connection = True
        text = message or self.responses.get(code, ("error",))[0]
        cut = self.server.cut_answer(self.connection)
        if cut is not None:  # what was malformed is what the cut left: the time ran out, or the server stops
            code, text = cut
        with contextlib.suppress(OSError):
            self._reply(code, {"error": text, "status": code})

    def log_request(self, code: Any = "-", size: Any = "-") -> None:
        pass  # the access log is written once per request in finish(), with the time it took

    def log_error(self, format: str, *args: Any) -> None:
        self._timed_out = self._timed_out or format.startswith("Request timed out")

    def log_message(self, format: str, *args: Any) -> None:
        pass  # http.server's own lines: the access log says what was answered

    # -- routing
    def _dispatch(self) -> None:
        cut = self.server.cut_answer(self.connection)
        if cut is not None:  # the request line and headers as far as they came: not a request
            self._reply_cut(*cut)
            return
        try:
            self._reply(200, self._answer())
        except ServiceError as e:
            self._reply(e.status, {"error": str(e), "status": e.status}, e.headers)
        except Exception:  # noqa: BLE001 — a bug must still answer, and say nothing of the server's insides
            self.server.handle_error(self.connection, self.client_address)
            self._reply(500, {"error": "internal error (the server's log has the details)", "status": 500})

    def _answer(self) -> dict[str, Any]:
        url = urlsplit(self.path)
        methods = ROUTES.get(url.path)
        route = None if methods is None else methods.get(self.command)
        if self.server.token is not None and not (route is not None and route.public):
            # before the endpoints are listed or a method named: a caller without the token learns nothing
            check_token(self.headers.get("Authorization"), self.server.token)
        if methods is None:
            endpoints = ", ".join(f"{method} {path}" for path, methods in ROUTES.items() for method in methods)
            raise ServiceError(404, f"no such endpoint; there are: {endpoints}")
        if route is None:
            raise ServiceError(405, f"{url.path} takes {', '.join(methods)}", {"Allow": ", ".join(methods)})
        try:
            query = parse_qs(url.query, keep_blank_values=True, max_num_fields=16)
        except ValueError:
            raise ServiceError(400, "too many query parameters") from None
        body = self._read_body() if route.body else b""
        self.server.receiving(self.connection, False)  # received: the deadline was for the request, not the model
        return route.answer(self.server.service, Request(query, body))

    def _read_body(self) -> bytes:
        """The body, its declared length checked first, read within the socket and request timeouts."""
        if self.headers.get("Transfer-Encoding"):
            raise ServiceError(411, "chunked bodies are not taken: send the body with its Content-Length")
        length = content_length(self.headers.get_all("Content-Length") or [], self.server.limits)
        deadline = self._started + self.server.limits.request_timeout
        chunks, got = [], 0
        try:
            while got < length:
                chunk = self.rfile.read1(min(length - got, 65536))
                if not chunk or time.monotonic() > deadline:
                    break
                chunks.append(chunk)
                got += len(chunk)
        except (TimeoutError, OSError):
            pass
        if got < length:
            cut = self.server.cut_answer(self.connection)
            if cut is not None and cut[0] == 503:
                raise ServiceError(
                    503, f"{cut[1]} (the body had sent {got} of its {length} bytes)", {"Retry-After": "1"}
                )
            raise ServiceError(408, f"the body ended or stalled after {got} of its {length} bytes")
        return b"".join(chunks)

    do_GET = do_POST = do_PUT = do_DELETE = do_PATCH = do_HEAD = do_OPTIONS = _dispatch  # noqa: N815


def make_server(
    service: GazeService,
    host: str = "127.0.0.1",
    port: int = 8000,
    limits: ServiceLimits | None = None,
    token: str | None = None,
    access_log: TextIO | None = None,
) -> GazeServer:
    """An HTTP server for ``service`` (``port=0``: any free port; ``server.server_address`` says which). Requests
    need ``Authorization: Bearer <token>`` when ``token`` is given; ``access_log`` gets a line per request."""
    return GazeServer((host, port), service, limits or service.limits, token, access_log)
