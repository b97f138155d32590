"""Source training under a process group (what ``torchrun -m alfa pretrain`` runs): two gloo processes on the
CPU train the same weights as one process with the same global batch, write the checkpoint once, and resume."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from distributed_worker import DATA
from distributed_worker import config as _config
from distributed_worker import model as _model
from torch import nn

from alfa.checkpoint import read_checkpoint
from alfa.gaze import distributed
from alfa.gaze.pipeline import open_data
from alfa.gaze.train import train_source

WORKER = Path(__file__).with_name("distributed_worker.py")
# What the launch's processes run first, as `torchrun -m alfa pretrain ...` does: that test is of the launch and of
# rank 0 alone reporting, which a tiny model shows as well as ResNet-18 (whose training and files take seconds).
PRETRAIN = ["pretrain", "--model", "tiny_gaze_net", "--data", DATA, "--epochs", "1", "--batch-size", "8"]
PRETRAIN += ["--device", "cpu", "--quiet"]


@pytest.fixture(scope="module")
def two_processes(tmp_path_factory):
    """One torchrun launch of two gloo processes (a launch costs seconds of imports in each) running ``alfa
    pretrain``, then every run of ``RUNS`` (tests/distributed_worker.py): the launch, the folder they trained in,
    and the folder of what each rank reported."""
    if not dist.is_available():
        pytest.skip("this torch has no torch.distributed")
    out, log = tmp_path_factory.mktemp("two-processes"), tmp_path_factory.mktemp("two-processes-log")
    launch = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", str(WORKER)]
    done = subprocess.run(
        [*launch, str(out), str(log), "--", *PRETRAIN, "--out", str(out / "pretrain")],
        capture_output=True,
        text=True,
        timeout=300,
    )
    return done, out, log


def _said(done: subprocess.CompletedProcess) -> str:
    """The launch's stderr for a failure message: its beginning, where the ranks' own errors are (a rank that
    aborts says why before torchrun's summary of the failure), and its end (that summary)."""
    return done.stderr if len(done.stderr) <= 6000 else f"{done.stderr[:3000]}\n[...]\n{done.stderr[-3000:]}"


def _reports(two_processes, run: str) -> list[dict]:
    """What each rank reported of ``run``."""
    done, _, log = two_processes
    files = [log / f"{run}.{rank}.json" for rank in range(2)]
    if not all(f.is_file() for f in files):
        pytest.fail(f"the launch reported no run {run!r} (exit {done.returncode}): {_said(done)}")
    return [json.loads(f.read_text()) for f in files]


@pytest.mark.slow
def test_two_processes_train_what_one_process_trains_write_once_and_resume(two_processes, tmp_path):
    single = _model()
    one = train_source(
        single, open_data(DATA), _config(2), tmp_path / "one", model_name="group_norm_net", progress=False
    )

    out = two_processes[1]
    # interrupted after one epoch, as it were, and resumed
    first, resumed = _reports(two_processes, "first"), _reports(two_processes, "resumed")
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
    ranks = _reports(two_processes, "batch")
    assert ranks[0]["buffers"] == ranks[1]["buffers"] and "norm.running_mean" in ranks[0]["buffers"]
    assert ranks[0]["history"] == [{**h, "seconds": ranks[0]["history"][0]["seconds"]} for h in ranks[1]["history"]]


@pytest.mark.slow
def test_torchrun_runs_the_pretrain_command_and_rank_0_alone_reports(two_processes):
    done, out, _ = two_processes
    assert done.returncode == 0, _said(done)
    assert done.stdout.count("pretrained tiny_gaze_net") == 1 and (out / "pretrain" / "model.safetensors").is_file()


@pytest.mark.slow
def test_leaving_the_group_stops_its_threads(two_processes):
    """Teardown frees the process group, whose gloo threads stop then. Once DDP had run, the group outlived
    destroy_process_group (torch.distributed.nn's default arguments, first imported by DDP, held it), its threads ran
    on into the interpreter's exit, and a rank aborted there now and then (SIGABRT, under load) after its work was
    done, failing the launch."""
    for rank in _reports(two_processes, "teardown"):
        if rank["threads"] is None:
            pytest.skip("/proc lists no thread of a process here")
        assert rank["threads"] == []


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
