"""``alfa serve``: the HTTP gaze service (:mod:`alfa.gaze.service`), and ``alfa serve --selftest``, the same
service under load on the loopback address."""

from __future__ import annotations

import argparse
import contextlib
import errno
import os
import socket
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TextIO

from .guards import check_finished, refuse_a_model_folder_as_users, refuse_calibrations_under_tta
from .interrupts import Terminated
from .options import at_least, default_of, tta_of, tta_option, whole_number_between
from .registry import Command

__all__ = ["SERVE"]


def _port(text: str) -> int:
    """``--port``: a TCP port number, refused by the parser when it is not one."""
    try:
        port = int(text)
    except ValueError:
        port = -1
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"expected a port number from 0 to 65535, got {text!r}")
    return port


def _workers(text: str) -> int:
    """``--workers``: 1 up to 8 per CPU this process may use (:func:`alfa.gaze.service.max_workers` says why)."""
    from alfa.gaze.service import max_workers

    value = at_least(1)(text)
    if value > max_workers():
        raise argparse.ArgumentTypeError(
            f"at most {max_workers()} (8 per CPU this process may use: the model answers one request at a time, and "
            f"every worker may hold a request's body and image), got {value}"
        )
    return value


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got {text!r}") from None
    if not 0 < value < 3600:
        raise argparse.ArgumentTypeError(f"expected seconds above 0 and below 3600, got {text}")
    return value


def _token(args: argparse.Namespace) -> str | None:
    from alfa.gaze.service.limits import TOKEN_ENV, valid_token

    if args.token is not None:
        return valid_token(args.token, "--token")
    if os.environ.get(TOKEN_ENV):
        return valid_token(os.environ[TOKEN_ENV], TOKEN_ENV)
    return None


def _bind(service: Any, args: argparse.Namespace, token: str | None, log: TextIO | None) -> Any:
    """The server on ``--host``/``--port``, or one line saying why it cannot listen there."""
    from alfa.gaze.service import make_server

    where = f"{args.host}:{args.port}"
    try:
        return make_server(service, args.host, args.port, service.limits, token=token, access_log=log)
    except socket.gaierror:
        raise ValueError(f"--host {args.host}: not a name or address of this machine") from None
    except OSError as e:
        # these two say what to do themselves: an OSError would get error_line's advice for its errno as well
        if e.errno == errno.EADDRINUSE:
            raise ValueError(f"port {args.port} on {args.host} is taken (Address already in use): stop the other "
                             "server or choose another --port (0: any free one)") from None  # fmt: skip
        if e.errno == errno.EACCES:
            raise ValueError(f"may not listen on {where}: ports below 1024 need administrator rights (or choose "
                             "another --port; 0: any free one)") from None  # fmt: skip
        if e.errno == errno.EADDRNOTAVAIL:
            raise ValueError(f"--host {args.host}: not an address of this machine") from None
        raise OSError(e.errno, f"cannot listen on {where}: {e.strerror}") from None


def _limits(args: argparse.Namespace) -> Any:
    from alfa.gaze.service import ServiceLimits

    return ServiceLimits(workers=args.workers, queue=args.queue, request_timeout=args.request_timeout)


# Options of one mode that the other would ignore, with why: refused rather than silently dropped. Their
# parser default is None (False for --quiet), so that "given" is told from "not given"; _resolve fills them.
_SERVING_ONLY = {
    "host": ("--host", "the selftest listens on 127.0.0.1 only"),
    "port": ("--port", "the selftest listens on a free port of its own"),
    "token": ("--token", "the selftest makes a random token of its own"),
    "access_log": ("--access-log", "the selftest writes no access log to a file (it prints a summary)"),
    "quiet": ("--quiet", "the selftest has no access log to silence (it prints only its summary)"),
    "camera": ("--camera", "the selftest sends face crops, which no camera's intrinsics are read for"),
    "screen": ("--screen", "the selftest sends face crops, whose answers have no screen point"),
}
_SELFTEST_ONLY = {
    "clients": ("--clients", "the load test's number of clients (a served service answers whoever connects)"),
    "requests": ("--requests", "the number of requests the load test sends (a served service answers what comes)"),
    "time_limit": ("--time-limit", "the load test's time (a served service runs until it is stopped)"),
}


def _defaults() -> dict[str, Any]:
    """What each option of :data:`_SERVING_ONLY` and :data:`_SELFTEST_ONLY` is when not given."""
    from alfa.gaze.service import make_server
    from alfa.gaze.service.selftest import selftest

    return {
        "host": default_of(make_server, "host"),
        "port": default_of(make_server, "port"),
        "clients": default_of(selftest, "clients"),
        "requests": default_of(selftest, "requests"),
        "time_limit": default_of(selftest, "time_limit"),
    }


def _resolve(args: argparse.Namespace) -> None:
    """Refuse an option the mode (serving, or --selftest) would ignore, then fill in the defaults."""
    if args.selftest:
        for dest, (option, why) in _SERVING_ONLY.items():
            if getattr(args, dest) is not None and getattr(args, dest) is not False:  # --port 0 is given too
                raise ValueError(f"{option} does not apply to --selftest: {why}")
        if args.checkpoint is not None and args.adapters is None:
            raise ValueError("--checkpoint needs --adapters (the folder of <user>.safetensors files to serve on it)")
        if args.adapters is not None and args.checkpoint is None:
            raise ValueError("--adapters needs --checkpoint (the base they were made on); without both, --selftest "
                             "serves a small world of its own")  # fmt: skip
    else:
        for dest, (option, why) in _SELFTEST_ONLY.items():
            if getattr(args, dest) is not None:
                raise ValueError(f"{option} applies to --selftest only: it sets {why}")
    for dest, value in _defaults().items():
        if getattr(args, dest) is None:
            setattr(args, dest, value)


def _serve(args: argparse.Namespace) -> None:
    from alfa.gaze.service import GazeService, is_loopback
    from alfa.gaze.service.server import STOP_GRACE

    _resolve(args)
    if args.checkpoint is not None:
        check_finished(args.checkpoint)
    if args.adapters is not None:
        refuse_a_model_folder_as_users(args.adapters)
    if args.selftest:
        _selftest(args)
        return
    if args.checkpoint is None or args.adapters is None:
        raise ValueError("--checkpoint and --adapters are needed (only --selftest runs without them)")
    token = _token(args)
    tta = tta_of(args.tta)  # a bad name is one line before anything loads
    if tta is not None and Path(args.adapters).is_dir():  # refused now, not by a 409 to each of them once serving
        refuse_calibrations_under_tta(tta, Path(args.adapters))
    photos = _photo_options(args)  # a bad camera or screen file: one line before the model loads
    service = GazeService(args.checkpoint, args.adapters, _limits(args), tta=tta and tta.name, photo_options=photos)
    _refuse_adapters_none_serves(service, args)
    log = None if args.quiet else sys.stderr
    with _access_log(args.access_log) as log_file:
        server = _bind(service, args, token, log_file or log)
        host, port = server.server_address[:2]
        if not is_loopback(args.host) and token is None:
            print(f"alfa serve: warning: listening on {args.host} without a token: anyone who can reach port {port} "
                  "gets any user's predictions; set ALFA_SERVE_TOKEN (or --token), and put TLS in front "
                  "(docs/deploy.md)", file=sys.stderr)  # fmt: skip
        auth = "a token (Authorization: Bearer …)" if token else "no token"
        if tta is not None:
            auth += f", {tta.name} test-time augmentation ({tta.passes} forward passes a prediction)"
        print(f"serving on http://{host}:{port} with {auth}: POST /predict?user=ID with a face crop, "
              "POST /predict/photo?user=ID with a photo, GET /health (Ctrl-C stops)", flush=True)  # fmt: skip
        stop: KeyboardInterrupt | None = None
        try:
            server.serve_forever()
        except KeyboardInterrupt as signalled:  # Ctrl-C, or SIGTERM/SIGHUP (Terminated: alfa.cli.interrupts)
            stop = signalled
            if hasattr(args, "interrupts"):  # handled here: an error while closing is said as itself
                args.interrupts.handled()
            print(f"alfa serve: stopping: answering the {server.in_flight()} connection(s) accepted (a request "
                  f"still arriving gets {STOP_GRACE:g} s more)", file=sys.stderr, flush=True)  # fmt: skip
        finally:
            server.server_close()
        if isinstance(stop, Terminated):  # a service manager stopping it (or its terminal closed): no failure
            print(f"alfa serve: stopped ({stop.signal.name})", file=sys.stderr)
        elif stop is not None:
            raise stop  # Ctrl-C: "interrupted", exit 130, as every command


OTHER_BASE_SIGNS = (
    "made for a different base model",
    "was made on a base",
    "does not fit this model",
    "layer mismatch",
)
"""What alfa.load_adapter says of a file made on another base: the reasons that blame the --checkpoint."""


def _refuse_adapters_none_serves(service: Any, args: argparse.Namespace) -> None:
    """One line before serving where the folder holds users' adapter files, none of them serves, and one was made
    on another base (a wrong --checkpoint: every request got a 404, the reason in the server's log alone). An
    empty folder is served (users' files may come later), and so is one where a file serves, or where the files
    fail for reasons of their own (damaged, another person's): each is its user's answer, its reason said in the
    log now, as the service says it (its refusals are kept, and not said again at a request)."""
    from alfa.gaze.service.selftest import servable_users

    users, refused = servable_users(service, limit=1)
    if not users and any(sign in line for line in refused for sign in OTHER_BASE_SIGNS):
        raise ValueError(
            f"--adapters {args.adapters}: none of its users' adapters serves on --checkpoint {args.checkpoint} (the "
            f"first refused: {refused[0].removeprefix('alfa serve: ')}): serve the checkpoint they were made on"
        )
    for line in refused:
        service.note(line)


@contextlib.contextmanager
def _access_log(path: str | None) -> Iterator[TextIO | None]:
    """The access log file (``None``: none). Lines it could not take were said once as they failed (a full disk);
    closing it then fails alike and is not the command's error: every request was answered."""
    if path is None:
        yield None
        return
    log_file = open(path, "a", encoding="utf-8")
    try:
        yield log_file
    finally:
        with contextlib.suppress(OSError):
            log_file.close()


def _selftest(args: argparse.Namespace) -> None:
    from alfa.gaze.service.selftest import selftest

    tta = tta_of(args.tta)
    report = selftest(args.checkpoint, args.adapters, clients=args.clients, requests=args.requests,
                      time_limit=args.time_limit, limits=_limits(args), tta=tta and tta.name)  # fmt: skip
    if not report.ok:
        raise RuntimeError(f"selftest failed: {report.summary()}")


def _photo_options(args: argparse.Namespace) -> Any:
    """How ``/predict/photo`` reads a photo: ``--camera``'s intrinsics and ``--screen``'s geometry where given
    (``None``: the defaults, no screen point)."""
    if args.camera is None and args.screen is None:
        return None
    from alfa.gaze.camera import PhotoOptions, load_camera, load_screen

    camera = None if args.camera is None else load_camera(args.camera)
    return PhotoOptions(camera=camera, screen=None if args.screen is None else load_screen(args.screen), faces="one")


def _serve_arguments(p: argparse.ArgumentParser) -> None:
    from alfa.gaze.service import TOKEN_ENV, ServiceLimits

    limits = ServiceLimits()
    p.add_argument(
        "--checkpoint",
        help="the base model (model.safetensors): a truncated one, or a dense one for alfa calibrate's corrections "
        "only; required unless --selftest",
    )
    p.add_argument(
        "--adapters",
        help="folder of <user>.safetensors files (alfa personalize's or alfa calibrate's); required unless --selftest",
    )
    defaults = _defaults()
    p.add_argument("--host", help=f"address to listen on (default {defaults['host']}; anything but loopback without "
                   "a token gets a warning; not with --selftest)")  # fmt: skip
    p.add_argument("--port", type=_port, help=f"port (default {defaults['port']}; 0: any free one; not with "
                   "--selftest)")  # fmt: skip
    p.add_argument("--token", help="require 'Authorization: Bearer TOKEN' on every request but /health (default: the "
                   f"{TOKEN_ENV} environment variable, which other users of the machine cannot see; --selftest makes "
                   "its own)")  # fmt: skip
    p.add_argument("--workers", type=_workers, default=limits.workers, help="request threads (default %(default)s)")
    queue = whole_number_between(1, 4096, " (each waiting connection holds a socket)")
    p.add_argument("--queue", type=queue, default=limits.queue,
                   help="connections waiting for a worker; beyond it: 503 at once (default %(default)s)")  # fmt: skip
    p.add_argument("--request-timeout", type=_seconds, default=limits.request_timeout,
                   help="seconds to receive a whole request (default %(default)s)")  # fmt: skip
    tta_option(p, "answer every prediction")
    p.add_argument("--camera", metavar="K.json", help="/predict/photo: the camera's intrinsics, as alfa predict "
                   "--camera takes them (default: assumed from each photo's size; not with --selftest)")  # fmt: skip
    p.add_argument("--screen", metavar="S.json", help="/predict/photo: the screen's geometry in that camera's frame "
                   "(docs/camera.md), so that each face's answer has the screen point looked at, as alfa predict "
                   "--screen gives it: one camera and screen for every user, as at a kiosk; not with "
                   "--selftest")  # fmt: skip
    p.add_argument("--access-log", help="append the access log (a line per request) to this file (default: stderr; "
                   "--selftest keeps none)")  # fmt: skip
    p.add_argument("--quiet", action="store_true", help="no access log (--selftest keeps none)")
    test = p.add_argument_group("load test (--selftest: on 127.0.0.1 only, then exit; non-zero if anything failed)")
    test.add_argument("--selftest", action="store_true", help="put the service under load and check every answer")
    test.add_argument("--clients", type=whole_number_between(1, 1000, " (each is a thread and a socket)"),
                      help=f"concurrent clients (default {defaults['clients']})")  # fmt: skip
    test.add_argument("--requests", type=whole_number_between(1, 100_000, " (a load test, not a soak)"),
                      help=f"requests in all (default {defaults['requests']})")  # fmt: skip
    test.add_argument("--time-limit", type=_seconds, help=f"seconds for all (default {defaults['time_limit']:g})")


SERVE = Command(
    "serve",
    help="an HTTP gaze service: one shared base, each user's adapter loaded on first use",
    description="Serve gaze predictions over HTTP for many users on one shared base model: POST /predict?user=ID "
    "with a face crop, POST /predict/photo?user=ID with a photo, GET /health; each user's adapter file is read "
    "from --adapters on first use. --selftest puts the service under load instead (docs/deploy.md).",
    add_arguments=_serve_arguments,
    run=_serve,
    outputs={"access_log": False},
    keeps=frozenset({"access_log"}),  # appended to
    extra="gaze",
)
