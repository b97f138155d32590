"""Several processes training one model with PyTorch's DistributedDataParallel (``torchrun``).

``torchrun --nproc-per-node N -m alfa pretrain …`` (and ``truncate``'s recovery) starts N processes that
each hold the whole model. :func:`setup` joins them into one process group (NCCL on GPUs, gloo on CPUs);
:func:`alfa.gaze.train.train_source` then wraps the model in DDP and gives each process a shard of every
global batch (:func:`shard`), so N processes see exactly the batches one process with the same
``--batch-size`` sees. Only rank 0 writes files and prints; every process reads a checkpoint to resume.

Outside ``torchrun`` (no ``WORLD_SIZE`` in the environment, or 1) nothing here does anything and training
is the single-process loop, bit for bit.
"""

from __future__ import annotations

import contextlib
import importlib
import os
from collections.abc import Callable, Iterator, Sequence
from typing import Any, TypeVar

import torch
import torch.distributed as dist
from torch import nn

__all__ = [
    "launched",
    "setup",
    "teardown",
    "rank_and_world",
    "is_main",
    "barrier",
    "shard",
    "gather_dicts",
    "data_parallel",
]

T = TypeVar("T")


def launched() -> bool:
    """Whether this process was started by ``torchrun`` with more than one process."""
    return int(os.environ.get("WORLD_SIZE", "1")) > 1


def setup(device_name: str, resolve: Callable[[str], torch.device]) -> torch.device:
    """Join the process group when started by ``torchrun`` and return this process's device.

    ``resolve`` turns ``--device`` into a device (the CLI's validation). Under ``torchrun`` a CUDA device
    is ``cuda:LOCAL_RANK`` (one GPU per process, NCCL); naming a GPU index there is refused, since each
    process must take its own. The CPU uses gloo.
    """
    device = resolve(device_name)
    if not launched() or (dist.is_available() and dist.is_initialized()):
        return device
    if not dist.is_available():
        raise ValueError("this PyTorch build has no torch.distributed; run without torchrun")
    # Imported before the group exists: this module's functions take ``group=group.WORLD`` as a default argument,
    # evaluated at its first import, which DDP's first construction makes (through torch._dynamo). Imported once the
    # group exists, they would hold it to the process's end: teardown could not free it, its gloo threads would run on
    # into the interpreter's exit, and a rank aborted there now and then ("terminate called without an active
    # exception", SIGABRT, after all its work: torchrun then failed a finished run).
    importlib.import_module("torch.distributed.nn")
    if device.type == "cuda":
        if device.index is not None:
            raise ValueError(f"--device {device_name}: under torchrun each process takes cuda:LOCAL_RANK; pass cuda")
        local = int(os.environ.get("LOCAL_RANK", "0"))
        if local >= torch.cuda.device_count():
            raise ValueError(f"torchrun started process {local}, but only {torch.cuda.device_count()} GPU(s) are here")
        device = torch.device("cuda", local)
        torch.cuda.set_device(device)
        dist.init_process_group("nccl", device_id=device)
    else:
        dist.init_process_group("gloo")
    return device


def teardown() -> None:
    """Leave the process group (at the end of a command)."""
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def rank_and_world() -> tuple[int, int]:
    """``(rank, world size)``; ``(0, 1)`` outside a process group."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def is_main() -> bool:
    """Rank 0 (or the only process): the one that writes and prints."""
    return rank_and_world()[0] == 0


def barrier() -> None:
    if rank_and_world()[1] > 1:
        dist.barrier()


def shard(items: Sequence[T], rank: int, world: int) -> list[T]:
    """This rank's share of one global batch: every ``world``-th item from ``rank`` on. The shards of all
    ranks together are the batch, each item once."""
    return list(items[rank::world])


def gather_dicts(part: dict[str, Any]) -> dict[str, Any]:
    """Every rank's dict merged (keys are disjoint: each rank scored other persons); ``part`` itself alone."""
    rank, world = rank_and_world()
    if world == 1:
        return part
    parts: list[dict[str, Any] | None] = [None] * world
    dist.all_gather_object(parts, part)
    merged: dict[str, Any] = {}
    for p in parts:
        merged.update(p or {})
    return merged


@contextlib.contextmanager
def data_parallel(model: nn.Module, device: torch.device) -> Iterator[nn.Module]:
    """The module to train through: the model itself outside a process group; else a DDP wrapper of it,
    on CUDA with BatchNorm replaced by SyncBatchNorm while training (the statistics of the global batch,
    as one process has them; the original modules, which share the parameters and running statistics,
    are put back afterwards). gloo has no SyncBatchNorm, so on CPUs BatchNorm normalizes each process's
    shard on its own."""
    if rank_and_world()[1] == 1:
        yield model
        return
    swaps = _sync_batchnorm(model) if device.type == "cuda" else contextlib.nullcontext()
    with swaps:
        ids = [device.index] if device.type == "cuda" else None
        yield nn.parallel.DistributedDataParallel(model, device_ids=ids)


@contextlib.contextmanager
def _sync_batchnorm(model: nn.Module) -> Iterator[None]:
    swapped = []
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, nn.modules.batchnorm._BatchNorm) and not isinstance(child, nn.SyncBatchNorm):
                # the converted module shares the Parameters and the running-statistics tensors
                setattr(parent, name, nn.SyncBatchNorm.convert_sync_batchnorm(child))
                swapped.append((parent, name, child))
    try:
        yield
    finally:
        for parent, name, child in swapped:
            setattr(parent, name, child)
