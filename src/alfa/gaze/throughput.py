"""Is source training loader-bound? Images per second of the data loader alone, of the training step alone, and
of both together, through the same code paths as :func:`alfa.gaze.train.train_source` (``alfa throughput``).

* **loader**: the training loop's batches (the same index batches, the same worker processes and pinned
  memory) read and decoded, nothing else;
* **step**: the training step (forward, the symmetry target, backward, Adam) on one batch held on the
  device, so no loading at all;
* **both**: the loop as training runs it.

When the loader's rate is below the step's, a GPU waits on the CPUs: training is loader-bound, and more
``--workers`` (or faster storage) is what helps. Timings are wall clock after one warm-up batch; on CUDA the
device is synchronised before every reading. One call measures one round; :func:`of_rounds` makes several rounds
of one configuration its medians and keeps every round, from which the page (:mod:`alfa.study.bench.loading`)
reads its intervals.
"""

from __future__ import annotations

import statistics
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch
from torch import nn
from tqdm.auto import tqdm

from alfa.models import create_model

from .data.base import GazeDataset, unit_images
from .tdist import Ratio, paired_ratio
from .train import TrainConfig, _epoch_batches, _iterate, _train_step

__all__ = [
    "ThroughputResult",
    "measure_throughput",
    "measure_worker_counts",
    "loader_bound_of",
    "of_rounds",
    "fixture_dataset",
    "FIXTURE_FORMATS",
]

FIXTURE_FORMATS = ("mpiifacegaze", "eth-xgaze-h5")
"""Layouts ``--fixture`` writes: a GazeHub folder (JPEG files) or raw ETH-XGaze subject files (h5)."""


@dataclass
class ThroughputResult:
    """Images per second of the loader, the step and both, with what was measured: one round's rates, or the
    medians over rounds (:func:`of_rounds`) with every round's rate kept in ``*_rounds``."""

    loader: float
    step: float | None  # None: the loader alone was measured
    both: float | None
    batch_size: int
    batches: int
    workers: int
    device: str
    precision: str
    image_size: tuple[int, int]
    data: str
    loader_rounds: list[float] = field(default_factory=list)
    step_rounds: list[float] | None = None
    both_rounds: list[float] | None = None

    @property
    def loader_to_step(self) -> Ratio | None:
        """The loader's rate over the step's, paired over the rounds, with its 95 % t-interval; ``None`` without a
        step or under two rounds."""
        return None if self.step is None else paired_ratio(self.loader_rounds, self.step_rounds or [])

    @property
    def loader_bound(self) -> bool | None:
        """Whether the loader holds the step back, judged on :attr:`loader_to_step`'s interval: ``True`` only when
        all of it is below 1, ``False`` only when all of it is above; ``None`` when it straddles 1 or is missing."""
        return loader_bound_of(self.loader_to_step)

    def format(self) -> str:
        h, w = self.image_size
        rounds = f", median of {len(self.loader_rounds)} rounds" if len(self.loader_rounds) > 1 else ""
        head = (
            f"{self.data}: {h}×{w} images, batches of {self.batch_size}, {self.batches} timed batches, "
            f"{self.workers} loader workers{rounds}"
        )
        if self.step is None:
            return f"{head}\n  loader alone   {self.loader:10,.1f} images/s"
        ratio, rates = self.loader_to_step, f"{self.loader:,.0f} images/s against the step's {self.step:,.0f}"
        if ratio is None:
            verdict = f"not judged: one round gives no interval (the loader gives {rates}; --rounds 2 or more)"
        else:
            of = f"(loader / step {ratio.text()} over {ratio.rounds} rounds)"
            verdict = {
                True: f"loader-bound: the loader gives {rates} {of}; more --workers (or faster storage) would help",
                False: f"not loader-bound: the loader gives {rates} {of}",
                None: f"not shown: the loader gives {rates} {of}, an interval that straddles 1",
            }[self.loader_bound]
        return "\n".join(
            [
                f"{head}, {self.device}, {self.precision}",
                f"  loader alone   {self.loader:10,.1f} images/s",
                f"  step alone     {self.step:10,.1f} images/s",
                f"  both           {self.both:10,.1f} images/s",
                verdict,
            ]
        )

    def to_dict(self) -> dict[str, Any]:
        d = dict(self.__dict__)
        d["image_size"] = list(self.image_size)
        d["loader_bound"] = self.loader_bound
        return d


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def measure_throughput(
    model: nn.Module,
    dataset: GazeDataset,
    config: TrainConfig,
    batches: int = 10,
    step: bool = True,
) -> ThroughputResult:
    """Time ``batches`` batches of ``config.batch_size`` (after one warm-up) for the loader, the step and both
    (the loader alone without ``step``); ``model`` (on its device) is trained by the step and both parts, so pass
    a copy you can spare."""
    if batches < 1:
        raise ValueError(f"batches must be at least 1, got {batches}")
    device = next(model.parameters()).device
    indices = list(range(len(dataset)))
    plan: list[list[int]] = []
    epoch = 0
    while len(plan) < batches + 1:  # as many epochs' batches as it takes
        plan += _epoch_batches(indices, config.batch_size, config.seed, epoch)
        epoch += 1
        if epoch > 1000:
            raise ValueError(f"{dataset.name}: {len(dataset)} images give no batch of {config.batch_size}")
    plan = plan[: batches + 1]
    pin = device.type == "cuda"
    layout = torch.channels_last if pin else torch.preserve_format  # as train_source lays out model and batches
    model.to(memory_format=layout)
    optimizer = torch.optim.Adam(model.parameters(), lr=config.lr)
    scaler = torch.amp.GradScaler(device.type, enabled=config.precision == "fp16")  # one, as in training

    def train_step(images: torch.Tensor, gaze: torch.Tensor) -> None:
        images = unit_images(images).to(memory_format=layout)  # as the training loop converts, on the device
        _train_step(
            model, optimizer, images, gaze, config.symmetry_weight, config.symmetry_bn, config.precision, scaler=scaler
        )

    def timed(run_batch) -> float:
        t, n = None, 0
        for k, (images, gaze) in enumerate(_iterate(dataset, plan, config.num_workers, pin_memory=pin)):
            run_batch(images, gaze)
            if k == 0:  # the warm-up: worker start-up, first allocations
                _sync(device)
                t = time.perf_counter()
            else:
                n += len(images)
        _sync(device)
        return n / (time.perf_counter() - t)

    loader = timed(lambda images, gaze: None)
    images, gaze = next(iter(_iterate(dataset, plan[:1], 0)))
    step_rate = both = None
    if step:
        both = timed(lambda x, y: train_step(x.to(device, non_blocking=True), y.to(device, non_blocking=True)))
        images, gaze = images.to(device), gaze.to(device)
        train_step(images, gaze)  # warm-up
        _sync(device)
        t = time.perf_counter()
        for _ in range(batches):
            train_step(images, gaze)
        _sync(device)
        step_rate = batches * len(images) / (time.perf_counter() - t)
    return ThroughputResult(
        loader=loader,
        step=step_rate,
        both=both,
        batch_size=config.batch_size,
        batches=batches,
        workers=config.num_workers,
        device=str(device),
        precision=config.precision,
        image_size=(int(images.shape[-2]), int(images.shape[-1])),
        data=dataset.name,
        loader_rounds=[loader],
        step_rounds=None if step_rate is None else [step_rate],
        both_rounds=None if both is None else [both],
    )


def measure_worker_counts(
    model_name: str,
    data: GazeDataset,
    workers: Sequence[int],
    batch_size: int,
    batches: int,
    rounds: int,
    *,
    loader_only: bool = False,
    device: torch.device | str = "cpu",
    precision: str = "fp32",
) -> list[ThroughputResult]:
    """:func:`measure_throughput` of ``data`` for each DataLoader worker count (a fresh ``model_name`` model, seed
    0, for each), over ``rounds`` rounds made :func:`of_rounds`' medians. The rounds are interleaved over the worker
    counts, so that a slow spell of the machine hits each alike."""
    configs = [TrainConfig(batch_size=batch_size, num_workers=w, precision=precision) for w in workers]
    models = []
    for config in configs:
        config.validate()
        torch.manual_seed(0)
        models.append(create_model(model_name).to(device))
    kept: list[list[ThroughputResult]] = [[] for _ in configs]
    for _ in tqdm(range(rounds), desc=f"{data.name}: rounds"):
        for measured, model, config in zip(kept, models, configs):
            measured.append(measure_throughput(model, data, config, batches, step=not loader_only))
    return [of_rounds(measured) for measured in kept]


def loader_bound_of(ratio: Ratio | None) -> bool | None:
    """The loader-to-step ratio's verdict, on its interval: ``True`` (loader-bound) only when all of it is below 1,
    ``False`` only when all of it is above; ``None`` when it straddles 1 or there is no interval. The terminal and
    the page (:mod:`alfa.study.bench.loading`) both judge by it."""
    return None if ratio is None or ratio.low <= 1 <= ratio.high else ratio.high < 1


def of_rounds(rounds: Sequence[ThroughputResult]) -> ThroughputResult:
    """One configuration measured in several rounds: each rate the median over the rounds, every round's rate kept
    (the page's intervals are read from them)."""
    if not rounds:
        raise ValueError("of_rounds needs at least one round")
    first = rounds[0]
    keys = ("batch_size", "batches", "workers", "device", "precision", "image_size", "data")
    if any(getattr(r, k) != getattr(first, k) for r in rounds for k in keys):
        raise ValueError("of_rounds: every round must measure the same configuration")

    def kept(name: str) -> list[float] | None:
        # a result made by hand may keep no rounds: its one rate is then its only round
        values = [v for r in rounds for v in (getattr(r, f"{name}_rounds") or [getattr(r, name)]) if v is not None]
        return values or None

    loader, step, both = kept("loader"), kept("step"), kept("both")
    return replace(
        first,
        loader=statistics.median(loader),
        step=None if step is None else statistics.median(step),
        both=None if both is None else statistics.median(both),
        loader_rounds=loader,
        step_rounds=step,
        both_rounds=both,
    )


def fixture_dataset(kind: str, folder: str | Path | None = None, size: int = 224, images: int = 240) -> GazeDataset:
    """A dataset in a real layout (``kind`` of :data:`FIXTURE_FORMATS`), written to ``folder`` (default: a new
    temporary folder) and opened with the real loader: ``images`` face crops of ``size``×``size`` over three
    persons. The fixture's faces are flat colours, which decode faster than photographs: a bound from above."""
    from .data.fixtures import write_gazehub_fixture, write_xgaze_h5_dir
    from .pipeline import open_data

    if kind not in FIXTURE_FORMATS:
        raise ValueError(f"--fixture {kind!r}: expected one of {', '.join(FIXTURE_FORMATS)}")
    root = Path(tempfile.mkdtemp(prefix="alfa-throughput-") if folder is None else folder)
    per_person = max(2, images // 3)
    if kind == "mpiifacegaze":
        write_gazehub_fixture(root, "mpiifacegaze", images_per_person=per_person, size=size, write_eyes=False)
        return open_data(f"gazehub:mpiifacegaze:{root}")
    write_xgaze_h5_dir(root, images=per_person, size=size)
    return open_data(f"xgaze-h5:{root}")
