import os

# On a loaded machine OpenMP's busy-waiting makes small ops ~100× slower; tests never need it.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import pytest
import torch
from torch import nn

if os.environ.get("PYTEST_XDIST_WORKER_COUNT"):
    # The workers of -n N share the machine's cores: each takes its share of torch's threads (on 2 cores and -n 2,
    # one), rather than N × all of them handing small ops to each other (on the AVX2 machine, 2026-12-07: 181 s so,
    # 168 s with this).
    # A test that needs a thread count sets it, and _seed gives this one back after it.
    torch.set_num_threads(max(1, torch.get_num_threads() // int(os.environ["PYTEST_XDIST_WORKER_COUNT"])))


@pytest.fixture(autouse=True, scope="session")
def _no_disk_flush():
    """``os.fsync`` does nothing in the suite's processes: what it buys, a file whole after a power cut, no test can
    see, and the suite's five thousand or so took seconds of waiting on the disk. The order of flushes and renames
    is still tested, through a wrapper of its own (tests/test_safety.py)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(os, "fsync", lambda fd: os.fstat(fd) and None)  # a bad descriptor still fails
        yield


@pytest.fixture(autouse=True)
def _seed():
    """Every test starts from the same global RNG state and leaves torch's thread count as it found it: a test that
    sets one thread (for speed, or for the same bits as a run it compares with) set it for every later test of its
    process, so that a test ran with another thread count alone than in the suite."""
    torch.manual_seed(0)
    threads = torch.get_num_threads()
    yield
    if torch.get_num_threads() != threads:
        torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def one_thread():
    """One torch thread for a module's tests (restored after): on a busy 2-core machine, LAPACK's thread
    hand-offs on small matrices (truncation SVDs, log dets) cost 10-50× the arithmetic."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


class SmallNet(nn.Module):
    """Convs with every geometry option plus a Linear head: a quick stand-in for a real model."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 24, 3, stride=2, padding=1, bias=True)
        self.bn1 = nn.BatchNorm2d(24)
        self.conv2 = nn.Conv2d(24, 40, (3, 2), stride=(1, 2), padding=(2, 1), dilation=(2, 1), bias=False)
        self.conv3 = nn.Conv2d(40, 48, 3, padding=1, bias=True)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc1 = nn.Linear(48, 36)
        self.fc2 = nn.Linear(36, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.relu(self.bn1(self.conv1(x)))
        x = torch.relu(self.conv2(x))
        x = torch.relu(self.conv3(x))
        x = self.pool(x).flatten(1)
        return self.fc2(torch.relu(self.fc1(x)))


@pytest.fixture
def small_net() -> SmallNet:
    net = SmallNet()
    # Non-trivial BN statistics, so eval-mode outputs depend on them.
    with torch.no_grad():
        net.bn1.running_mean.normal_(0, 0.1)
        net.bn1.running_var.uniform_(0.5, 1.5)
    return net.eval()


@pytest.fixture(scope="session")
def service_world(tmp_path_factory):
    """A folder with a small served world (``base.safetensors``; ``adapters/`` of users ann, bob and cat, Alfa and
    LoRA), shared by the service's tests and its fuzz tests: the tests' tiny conv net at 16×16 px."""
    import tiny_models  # noqa: F401 — registers tiny_gaze_net, which the checkpoint names

    from alfa.gaze.service.selftest import write_demo_service

    folder = tmp_path_factory.mktemp("service-world")
    write_demo_service(folder, model="tiny_gaze_net", size=16, truncate_target=None)
    return folder


@pytest.fixture
def stdout_pipe(monkeypatch):
    """A real pipe to stand for stdout: ``use()`` (in the test's body, where pytest's capture no longer replaces
    it) makes ``sys.stdout`` its writing end, line-buffered so that a command's print writes at once;
    ``close_reader()`` closes its reading end, as ``| head`` does once it has read enough."""
    import contextlib
    import sys
    import types

    read, write = os.pipe()
    stream = open(write, "w", buffering=1)
    reader = [read]

    def close_reader() -> None:
        os.close(reader.pop())

    yield types.SimpleNamespace(use=lambda: monkeypatch.setattr(sys, "stdout", stream), close_reader=close_reader)
    monkeypatch.undo()
    with contextlib.suppress(OSError):
        stream.close()
    for fd in reader:
        os.close(fd)
