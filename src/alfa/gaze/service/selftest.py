"""The service under load on the loopback address (``alfa serve --selftest``): many concurrent clients send a
fixed number of requests within a time limit, and every answer is compared with the in-process prediction for
the same user and image. It passes when no connection is dropped, every answer is right and all requests are
done in time; it prints the latency's p50 and p99.

Without a checkpoint it serves a small world of its own (:func:`write_demo_service`: ResNet-18 with its first
stage truncated, three users with Alfa and LoRA adapters), made in a temporary folder in about a second.
"""

from __future__ import annotations

import copy
import http.client
import io
import json
import os
import secrets
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .limits import USER_ID, ServiceLimits
from .model import GazeService
from .server import make_server

__all__ = ["LoadReport", "run_load", "selftest", "write_demo_service"]


def write_demo_service(
    folder: str | os.PathLike,
    model: str = "resnet18_gaze",
    size: int = 16,
    users: Sequence[str] = ("ann", "bob", "cat"),
    truncate_target: str | None = r"^layer1\.",
    seed: int = 0,
) -> Path:
    """A base checkpoint (``folder/base.safetensors``, registered ``model`` truncated at rank 8 where
    ``truncate_target`` matches, input ``size``×``size``) and one adapter per user in ``folder/adapters``
    (Alfa and LoRA in turn, random small weights, the person recorded as ``alfa personalize`` does)."""
    import torch

    import alfa
    from alfa.adapters import adapter_parameters
    from alfa.checkpoint import save_model

    folder = Path(folder)
    torch.manual_seed(seed)
    base = alfa.models.create_model(model).eval()
    alfa.truncate(base, 8, target=truncate_target)
    path = save_model(folder / "base.safetensors", base, model, input_size=(size, size))
    configs = (alfa.AlfaConfig(heads=2, rank=2), alfa.LoraConfig(rank=2))
    for i, user in enumerate(users):
        adapted = copy.deepcopy(base)
        torch.manual_seed(seed + i + 1)
        alfa.attach(adapted, configs[i % len(configs)])
        with torch.no_grad():
            for p in adapter_parameters(adapted).values():
                p.normal_(0, 0.05)
        alfa.save_adapter(adapted, folder / "adapters" / f"{user}.safetensors", about={"person": user})
    return path


def png_bytes(pixels: np.ndarray) -> bytes:
    """``pixels`` (H×W×3 uint8) as a PNG file's bytes."""
    from PIL import Image

    out = io.BytesIO()
    Image.fromarray(pixels).save(out, format="PNG")
    return out.getvalue()


@dataclass
class LoadReport:
    """What a load run saw: per request its latency; answers right, wrong (with what was wrong) and dropped
    (no HTTP answer at all: a reset, a refused or timed-out connection)."""

    clients: int
    requests: int
    seconds: float = 0.0
    right: int = 0
    wrong: list[str] = field(default_factory=list)
    dropped: list[str] = field(default_factory=list)
    latencies: list[float] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.right == self.requests and not self.wrong and not self.dropped

    def percentile(self, q: float) -> float:
        return float(np.percentile(self.latencies, q)) if self.latencies else float("nan")

    def summary(self) -> str:
        rate = self.right / self.seconds if self.seconds else float("nan")
        return (
            f"{self.clients} concurrent clients, {self.requests} requests in {self.seconds:.1f} s ({rate:.0f}/s): "
            f"{self.right} answered right, {len(self.wrong)} wrong, {len(self.dropped)} dropped, "
            f"{self.requests - self.right - len(self.wrong) - len(self.dropped)} not done in time; "
            f"latency p50 {self.percentile(50) * 1000:.0f} ms, p99 {self.percentile(99) * 1000:.0f} ms"
        )


Job = tuple[str, bytes, tuple[float, float]]  # user, PNG body, the expected (yaw, pitch)


def _call(port: int, job: Job, token: str | None, timeout: float) -> tuple[int, dict]:
    user, body, _ = job
    headers = {"Content-Type": "image/png"} | ({"Authorization": f"Bearer {token}"} if token else {})
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        connection.request("POST", f"/predict?user={user}", body=body, headers=headers)
        response = connection.getresponse()
        return response.status, json.loads(response.read())
    finally:
        connection.close()


def run_load(port: int, jobs: Sequence[Job], clients: int, token: str | None = None, time_limit: float = 60.0,
             atol: float = 1e-5) -> LoadReport:  # fmt: skip
    """Send ``jobs`` from ``clients`` threads at once to the service on 127.0.0.1:``port``; each answer must be
    200 with the job's expected gaze (within ``atol``). Requests not started within ``time_limit`` are not done."""
    report = LoadReport(clients, len(jobs))
    todo: Iterator[Job] = iter(jobs)
    lock = threading.Lock()
    start = time.monotonic()
    deadline = start + time_limit

    def client() -> None:
        while time.monotonic() < deadline:
            with lock:
                job = next(todo, None)
            if job is None:
                return
            began = time.monotonic()
            try:
                status, reply = _call(port, job, token, timeout=max(deadline - began, 0.1))
            except (OSError, http.client.HTTPException, json.JSONDecodeError) as e:
                with lock:
                    report.dropped.append(f"{job[0]}: {type(e).__name__}: {e}")
                continue
            took = time.monotonic() - began
            good = status == 200 and reply.get("user") == job[0]
            good = good and np.allclose([reply.get("yaw", np.nan), reply.get("pitch", np.nan)], job[2], atol=atol)
            with lock:
                report.latencies.append(took)
                if good:
                    report.right += 1
                else:
                    report.wrong.append(f"{job[0]}: {status} {reply}")

    threads = [threading.Thread(target=client, daemon=True) for _ in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=max(deadline - time.monotonic(), 0) + 5)
    report.seconds = time.monotonic() - start
    return report


def _jobs(service: GazeService, users: Sequence[str], requests: int, seed: int) -> list[Job]:
    """``requests`` jobs over ``users`` and a few images each, with the in-process prediction as the answer."""
    rng = np.random.default_rng(seed)
    h, w = service.input_size
    pool = []
    for user in users:
        for _ in range(4):
            body = png_bytes(rng.integers(0, 256, (h, w, 3), dtype=np.uint8))
            answer = service.predict(user, body)
            pool.append((user, body, (answer["yaw"], answer["pitch"])))
    return [pool[i] for i in rng.integers(0, len(pool), requests)]


def servable_users(service: GazeService, limit: int = 8) -> tuple[list[str], list[str]]:
    """Up to ``limit`` users whose adapters serve (tried in name order, none after the ``limit``-th that serves), and
    why each user tried before was left out, in order: the service's own note of the refusal (its server-side
    detail, ``alfa serve: …``, taken here instead of said), else the answer's words."""
    users, refused, said = [], [], []
    note, service.note = service.note, said.append
    try:
        for path in sorted(service.adapters.glob("*.safetensors")):
            if len(users) == limit:
                break
            if not USER_ID.fullmatch(path.stem) or len(path.stem) > service.limits.max_user_chars:
                continue
            said.clear()
            try:
                service.predict(path.stem, png_bytes(np.zeros((*service.input_size, 3), dtype=np.uint8)))
            except Exception as e:  # noqa: BLE001 — a user whose adapter does not serve is left out of the load
                refused.append(said[0] if said else f"{path.stem}: {e}")
                continue
            users.append(path.stem)
    finally:
        service.note = note
    return users, refused


def selftest(checkpoint: str | os.PathLike | None = None, adapters: str | os.PathLike | None = None,
             clients: int = 200, requests: int = 1000, time_limit: float = 120.0, limits: ServiceLimits | None = None,
             seed: int = 0, say: Callable[[str], None] = print, tta: str | None = None) -> LoadReport:  # fmt: skip
    """Serve ``checkpoint`` and ``adapters`` (both or neither; neither: :func:`write_demo_service`'s world) on
    127.0.0.1 with a random token, every answer made with test-time augmentation ``tta`` where given, and put it
    under ``clients`` concurrent clients for ``requests`` requests (:func:`run_load`)."""
    if (checkpoint is None) != (adapters is None):
        # adapters belong to the base they were made on: one without the other cannot be served, and the small
        # world of its own would leave the given one untested
        given, missing = ("checkpoint", "adapters") if adapters is None else ("adapters", "checkpoint")
        raise ValueError(f"selftest: a {given} was given without its {missing}: give both, or neither to serve "
                         "a small world of its own")  # fmt: skip
    limits = limits or ServiceLimits()
    with tempfile.TemporaryDirectory(prefix="alfa-selftest-") as tmp:
        if checkpoint is None:
            checkpoint, adapters = write_demo_service(tmp), Path(tmp) / "adapters"
            say("selftest: serving a small world of its own (ResNet-18, first stage truncated, 16×16 px, 3 users)")
        # the service's server-side detail of a refusal under load is kept quiet: the report counts the answers
        service = GazeService(checkpoint, adapters, limits, note=lambda line: None, tta=tta)
        users, refused = servable_users(service)
        if not users:
            detail = refused[0].removeprefix("alfa serve: ") if refused else None
            why = f" (the first refused: {detail})" if refused else " (it holds no user's .safetensors file)"
            raise ValueError(f"selftest: no adapter in {adapters} serves on this base{why}")
        jobs = _jobs(service, users, requests, seed)
        token = secrets.token_urlsafe()
        server = make_server(service, "127.0.0.1", 0, limits, token=token)
        thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        thread.start()
        augmented = f", {service.tta.name} test-time augmentation" if service.tta else ""
        say(f"selftest: {len(users)} users, {limits.workers} workers, queue {limits.queue}, backlog {limits.backlog}"
            f"{augmented}")  # fmt: skip
        try:
            report = run_load(server.server_address[1], jobs, clients, token, time_limit)
        finally:
            server.shutdown()
            server.server_close()
    say(f"selftest: {report.summary()}")
    for line in (report.wrong + report.dropped)[:5]:
        say(f"selftest:   {line}")
    return report
