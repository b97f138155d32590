"""Source training under a process group (what ``torchrun -m alfa pretrain`` runs): two gloo processes on the
CPU train the same weights as one process with the same global batch, write the checkpoint once, and resume."""

import json
import socket

import pytest
import torch
import torch.distributed as dist
from torch import nn

from alfa.checkpoint import read_checkpoint
from alfa.gaze import distributed, train, train_state
from alfa.gaze.pipeline import open_data
from alfa.gaze.train import TrainConfig, train_source

DATA = "synthetic:eth?size=32&persons=5&images_per_person=8"
# 4 training persons x 8 images = 32 = 4 global batches of 8: no short last batch, so both runs see the same ones
CONFIG = TrainConfig(epochs=1, batch_size=8, lr=1e-3, val_fraction=0.2, symmetry_weight=1.0)


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


def _model(kind: str = "group") -> nn.Module:
    torch.manual_seed(0)
    return GroupNormNet() if kind == "group" else BatchNormNet()


# The runs one launch of two processes makes, in order: (model kind, epochs, folder). "resumed" continues the
# checkpoint "first" left, as a run interrupted after one epoch and started again would; each run begins with a
# freshly seeded model and optimizer and train_source reseeds, so nothing but the checkpoint carries over.
RUNS = {"first": ("group", 1, "two"), "resumed": ("group", 2, "two"), "batch": ("batch", 1, "bn")}


def _worker(rank: int, world: int, port: int, out: str, log: str) -> None:
    import os

    os.environ.update(
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank)
    )
    torch.set_num_threads(1)
    device = distributed.setup("cpu", torch.device)
    assert dist.is_initialized() and distributed.rank_and_world() == (rank, world)
    writes: list[str] = []
    real_save, real_state = train_state.save_model, train_state.write_tagged
    train_state.save_model = lambda path, *a, **k: (writes.append(str(path)), real_save(path, *a, **k))[1]
    train_state.write_tagged = lambda path, *a, **k: (writes.append(str(path)), real_state(path, *a, **k))[1]
    seen: list[int] = []  # the training images this process loaded
    real_load = train._raw_batch
    train._raw_batch = lambda data, idx: (seen.extend(idx), real_load(data, idx))[1]
    for run, (kind, epochs, folder) in RUNS.items():
        writes.clear()
        seen.clear()
        model = _model(kind).to(device)
        result = train_source(
            model, open_data(DATA), _config(epochs), f"{out}/{folder}", model_name="group_norm_net", progress=False
        )
        with open(f"{log}/{run}.{rank}.json", "w") as f:
            buffers = {n: b.double().sum().item() for n, b in model.named_buffers()}
            json.dump(
                {
                    "writes": writes,
                    "seen": seen,
                    "history": result.history,
                    "resumed": result.resumed_from_epoch,
                    "buffers": buffers,
                },
                f,
            )
    distributed.teardown()


def _config(epochs: int) -> TrainConfig:
    import dataclasses

    return dataclasses.replace(CONFIG, epochs=epochs)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def two_processes(tmp_path_factory):
    """One launch of two gloo processes making every run of ``RUNS`` (a launch costs seconds of imports):
    the folder they trained in and, per run, what each rank reports."""
    if not dist.is_available():
        pytest.skip("this torch has no torch.distributed")
    out, log = tmp_path_factory.mktemp("two-processes"), tmp_path_factory.mktemp("two-processes-log")
    torch.multiprocessing.spawn(_worker, args=(2, _free_port(), str(out), str(log)), nprocs=2, join=True)
    return out, {run: [json.loads((log / f"{run}.{r}.json").read_text()) for r in range(2)] for run in RUNS}


@pytest.mark.slow
def test_two_processes_train_what_one_process_trains_write_once_and_resume(two_processes, tmp_path):
    single = _model()
    one = train_source(
        single, open_data(DATA), _config(2), tmp_path / "one", model_name="group_norm_net", progress=False
    )

    out, runs = two_processes
    first, resumed = runs["first"], runs["resumed"]  # interrupted after one epoch, as it were, and resumed
    written = [str(out / "two" / name) for name in ("state.safetensors", "model.safetensors")]
    assert [r["writes"] for r in first] == [written, []]  # rank 0 only, the state first
    assert [r["writes"] for r in resumed] == [written, []]
    assert [r["resumed"] for r in first] == [0, 0] and [r["resumed"] for r in resumed] == [1, 1]
    # each process loaded its half of the epoch, the two halves together every training image once
    ours, theirs = (set(r["seen"]) for r in resumed)
    assert len(resumed[0]["seen"]) == len(resumed[1]["seen"]) == 16 and not ours & theirs
    data = open_data(DATA)
    assert ours | theirs == {i for p in one.train_persons for i in data.person_indices(p)}

    tensors, _ = read_checkpoint(out / "two" / "model.safetensors")
    for name, value in single.state_dict().items():
        torch.testing.assert_close(tensors[name], value, rtol=1e-4, atol=1e-6, msg=name)
    for rank in resumed:  # every process reports the global batch's loss and the error of all persons
        for got, want in zip(rank["history"], one.history):
            for key in ("train_loss", "train_l1", "train_symmetry", "val_error"):
                assert got[key] == pytest.approx(want[key], rel=1e-4), key


@pytest.mark.slow
def test_with_batchnorm_every_process_ends_with_rank_0s_statistics(two_processes):
    """Each process updates BatchNorm's running statistics from its own shard; after every epoch they are
    rank 0's everywhere, so every process scores (and rank 0 saves) the same model."""
    ranks = two_processes[1]["batch"]
    assert ranks[0]["buffers"] == ranks[1]["buffers"] and "norm.running_mean" in ranks[0]["buffers"]
    assert ranks[0]["history"] == [{**h, "seconds": ranks[0]["history"][0]["seconds"]} for h in ranks[1]["history"]]


def test_a_global_batch_is_sharded_into_every_item_once():
    batch = list(range(11))
    shards = [distributed.shard(batch, r, 3) for r in range(3)]
    assert sorted(sum(shards, [])) == batch and [len(s) for s in shards] == [4, 4, 3]


def test_outside_torchrun_nothing_is_distributed(monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    assert not distributed.launched() and distributed.rank_and_world() == (0, 1)
    assert distributed.setup("cpu", torch.device) == torch.device("cpu") and not dist.is_initialized()
    model = nn.Linear(2, 2)
    with distributed.data_parallel(model, torch.device("cpu")) as net:
        assert net is model


def test_syncbatchnorm_is_swapped_in_and_the_original_modules_put_back():
    """On CUDA under DDP the BatchNorms become SyncBatchNorms sharing their parameters and statistics, and
    the model gets its own modules back afterwards (the swap itself needs no GPU)."""
    model = nn.Sequential(nn.Conv2d(3, 4, 1), nn.BatchNorm2d(4), nn.Sequential(nn.BatchNorm2d(4)))
    bn, inner = model[1], model[2][0]
    with distributed._sync_batchnorm(model):
        assert isinstance(model[1], nn.SyncBatchNorm) and isinstance(model[2][0], nn.SyncBatchNorm)
        assert model[1].weight is bn.weight and model[1].running_mean is bn.running_mean
    assert model[1] is bn and model[2][0] is inner


def test_a_global_batch_too_small_for_the_processes_is_refused(monkeypatch, tmp_path):
    monkeypatch.setattr(distributed, "rank_and_world", lambda: (0, 5))  # 8 images: 2 for each of 5 too many
    with pytest.raises(ValueError, match="global batch of 5 processes, at least 2 images each: at least 10$"):
        train_source(_model(), open_data(DATA), _config(1), tmp_path / "out", progress=False)
    assert not (tmp_path / "out").exists()  # refused before the folder was made


@pytest.mark.slow
@pytest.mark.skipif(not dist.is_available(), reason="this torch has no torch.distributed")
def test_torchrun_runs_the_pretrain_command_and_rank_0_alone_reports(tmp_path):
    import subprocess
    import sys

    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", "-m", "alfa"]
    options = ["--data", DATA, "--epochs", "1", "--batch-size", "8", "--device", "cpu", "--quiet"]
    done = subprocess.run(
        [*command, "pretrain", *options, "--out", str(tmp_path / "run")], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.count("pretrained resnet18_gaze") == 1 and (tmp_path / "run" / "model.safetensors").is_file()
