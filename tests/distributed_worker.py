"""What every process of tests/test_distributed.py's one ``torchrun`` launch runs (a launch costs seconds of
imports in each process, so one serves all its tests): the command line after ``--`` exactly as ``python -m alfa``
runs it, then the source-training runs of ``RUNS``, each rank writing what it saw to a JSON file.

    torchrun --standalone --nproc-per-node 2 tests/distributed_worker.py OUT LOG -- pretrain ...
"""

import contextlib
import json
import os
import runpy
import sys
from pathlib import Path

import torch
from torch import nn

DATA = "synthetic:eth?size=32&persons=5&images_per_person=8"


def config(epochs: int):
    from alfa.gaze.train import TrainConfig

    # 4 training persons x 8 images = 32 = 4 global batches of 8: no short last batch, so both runs see the same ones
    return TrainConfig(epochs=epochs, batch_size=8, lr=1e-3, val_fraction=0.2, symmetry_weight=1.0)


class GroupNormNet(nn.Module):
    """Per-sample normalization only (GroupNorm), so that sharding a batch cannot change a single number;
    BatchNorm on CPUs normalizes each process's shard (gloo has no SyncBatchNorm)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, stride=2, padding=1)
        self.norm = nn.GroupNorm(2, 8)
        self.conv2 = nn.Conv2d(8, 16, 3, stride=2, padding=1)
        self.fc = nn.Linear(16, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.relu(self.norm(self.conv1(x)))
        return self.fc(torch.relu(self.conv2(x)).mean((2, 3)))


class BatchNormNet(GroupNormNet):
    """The same with BatchNorm, whose running statistics each process updates from its own shard."""

    def __init__(self) -> None:
        super().__init__()
        self.norm = nn.BatchNorm2d(8)


def _register() -> None:
    """Their constructors under the names their checkpoints give, as save_model needs (load_model rebuilds them)."""
    from alfa.models import list_models, register_model

    if "group_norm_net" not in list_models():  # imported by the test process too

        @register_model
        def group_norm_net() -> nn.Module:
            """The distributed tests' :class:`GroupNormNet`."""
            return GroupNormNet()

        @register_model
        def batch_norm_net() -> nn.Module:
            """The distributed tests' :class:`BatchNormNet`."""
            return BatchNormNet()


_register()


def model(kind: str = "group") -> nn.Module:
    torch.manual_seed(0)
    return GroupNormNet() if kind == "group" else BatchNormNet()


# The runs, in order: (model kind, epochs, folder). "resumed" continues the checkpoint "first" left, as a run
# interrupted after one epoch and started again would; each run begins with a freshly seeded model and optimizer
# and train_source reseeds, so nothing but the checkpoint carries over.
RUNS = {"first": ("group", 1, "two"), "resumed": ("group", 2, "two"), "batch": ("batch", 1, "bn")}


def train_runs(out: str, log: str) -> None:
    """This process's part of every run of ``RUNS``, each reported in ``log/<run>.<rank>.json``: the files the
    process wrote, the training images it loaded, its history, the epoch it resumed from and its buffers' sums; then
    the gloo threads still running once it has left the group (``log/teardown.<rank>.json``)."""
    import torch.distributed as dist

    from alfa.gaze import distributed, train, train_state
    from alfa.gaze.pipeline import open_data
    from alfa.gaze.train import train_source

    torch.set_num_threads(1)
    device = distributed.setup("cpu", torch.device)  # the group the command joined
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    assert dist.is_initialized() and distributed.rank_and_world() == (rank, world)
    writes: list[str] = []
    seen: list[int] = []  # the training images this process loaded
    real = train_state.save_model, train_state.write_tagged, train._raw_batch
    train_state.save_model = lambda path, *a, **k: (writes.append(str(path)), real[0](path, *a, **k))[1]
    train_state.write_tagged = lambda path, *a, **k: (writes.append(str(path)), real[1](path, *a, **k))[1]
    train._raw_batch = lambda data, idx: (seen.extend(idx), real[2](data, idx))[1]
    try:
        for run, (kind, epochs, folder) in RUNS.items():
            writes.clear()
            seen.clear()
            net = model(kind).to(device)
            result = train_source(
                net, open_data(DATA), config(epochs), f"{out}/{folder}", model_name=f"{kind}_norm_net", progress=False
            )
            report = {
                "writes": writes,
                "seen": seen,
                "history": result.history,
                "resumed": result.resumed_from_epoch,
                "buffers": {n: b.double().sum().item() for n, b in net.named_buffers()},
            }
            with open(f"{log}/{run}.{rank}.json", "w") as f:
                json.dump(report, f)
    finally:
        train_state.save_model, train_state.write_tagged, train._raw_batch = real
        distributed.teardown()
    with open(f"{log}/teardown.{rank}.json", "w") as f:
        json.dump({"threads": _gloo_threads()}, f)


def _gloo_threads() -> list[str] | None:
    """The names of this process's gloo threads (Linux's names for them, ``gloo_tcp_loop`` and ``pt_gloo_runloop``),
    or None where ``/proc`` does not list a process's threads."""
    tasks = Path("/proc/self/task")
    if not tasks.is_dir():
        return None
    names = []
    for task in tasks.iterdir():
        with contextlib.suppress(OSError):  # a thread that ended meanwhile
            names.append((task / "comm").read_text().strip())
    return sorted(n for n in names if "gloo" in n)


if __name__ == "__main__":
    import tiny_models  # noqa: F401 — registers tiny_gaze_net (this file's folder is on the path)

    from alfa.gaze import distributed

    split = sys.argv.index("--")
    out, log = sys.argv[1:split]
    # The command joins the process group as it would alone; the runs after it use that group (one initialized
    # anew in this process would meet the first one's keys in torchrun's store, and may hang), leaving it at the end.
    real_teardown, distributed.teardown = distributed.teardown, lambda: None
    sys.argv = [sys.argv[0], *sys.argv[split + 1 :]]
    try:  # as `python -m alfa ARGS` runs: alfa/__main__.py as __main__, ARGS its sys.argv[1:]
        runpy.run_module("alfa", run_name="__main__", alter_sys=True)
    except SystemExit as e:
        if e.code:
            raise
    distributed.teardown = real_teardown
    train_runs(out, log)
