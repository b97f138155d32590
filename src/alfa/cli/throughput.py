"""``alfa throughput``: images per second of the data loader, of the training step and of both, on one's data or
on generated data in a real dataset's layout; its page is docs/loading.md."""

from __future__ import annotations

import argparse

from .gaze import open_spec
from .guards import refuse_a_model_that_is_not_a_gaze_model
from .options import (
    MODEL_HELP,
    at_least,
    comma_list,
    comma_separated,
    data_help,
    default_of,
    device_option,
    precision_option,
    refuse_listed_twice,
    run_precision_of,
    worker_count,
)
from .registry import Command

__all__ = ["THROUGHPUT"]


def _throughput(args: argparse.Namespace) -> None:
    import tempfile

    from alfa.gaze.devices import resolve_device
    from alfa.gaze.throughput import FIXTURE_FORMATS, fixture_dataset, measure_worker_counts
    from alfa.models import create_model

    if (args.data is None) == (args.fixture is None):
        raise ValueError("pass --data SPEC (your data) or --fixture KIND (data in a real layout, written here)")
    if args.data is not None and args.image_size is not None:
        raise ValueError("--image-size sizes --fixture's images; --data is read at its own size")
    size = default_of(fixture_dataset, "size") if args.image_size is None else args.image_size
    device = resolve_device(args.device)
    precision = run_precision_of(args, device)
    if args.batches < 1 or args.batch_size < 2:
        raise ValueError(f"need --batches >= 1 and --batch-size >= 2, got {args.batches} and {args.batch_size}")
    # an empty --fixture is refused as one, not read as no option (it named a dataset spec 'None')
    sources = [(f, None) for f in comma_list(args.fixture)] if args.fixture is not None else [(None, args.data)]
    unknown = [f for f, _ in sources if f is not None and f not in FIXTURE_FORMATS]
    if unknown or not sources:
        raise ValueError(f"--fixture {args.fixture!r}: expected one or more of {', '.join(FIXTURE_FORMATS)}")
    refuse_listed_twice("--fixture", [f for f, _ in sources])  # the same rows twice on the page
    refuse_listed_twice("--workers", args.workers)
    results = []
    for fixture, spec in sources:
        with tempfile.TemporaryDirectory(prefix="alfa-throughput-") as tmp:
            data = fixture_dataset(fixture, tmp, size=size) if fixture else open_spec(spec)
            if not args.loader_only:  # before the rounds: a classifier failed in the loss, once they had begun
                refuse_a_model_that_is_not_a_gaze_model(
                    create_model(args.model).to(device), args.model, data, "alfa throughput times the step of"
                )
            measured = measure_worker_counts(
                args.model, data, args.workers, args.batch_size, args.batches, args.rounds,
                loader_only=args.loader_only, device=device, precision=precision,
            )  # fmt: skip
            for result in measured:
                print(result.format())
                results.append({**result.to_dict(), "fixture": fixture, "model": args.model})
    if args.out:
        from alfa.study.bench.loading import write_loading_page

        what = f"--fixture {args.fixture} --image-size {size}" if args.fixture else f"--data {args.data}"
        workers = ",".join(map(str, args.workers))
        command = (
            f"alfa throughput {what} --model {args.model} --batch-size {args.batch_size} --workers {workers} "
            f"--batches {args.batches} --rounds {args.rounds}{' --loader-only' if args.loader_only else ''} "
            f"--device {args.device} --out {args.out}"
        )
        write_loading_page(args.out, command, results)


def _throughput_arguments(p: argparse.ArgumentParser) -> None:
    from alfa.gaze.pipeline import DemoConfig
    from alfa.gaze.throughput import fixture_dataset, measure_throughput
    from alfa.gaze.train import TrainConfig

    training = TrainConfig()
    p.add_argument("--data", help=data_help("the data to read (or --fixture)", "synthetic:eth"))
    p.add_argument(
        "--fixture",
        help="instead of --data: generated images in a real dataset's file layout, written to a temporary folder: "
        "mpiifacegaze (JPEG files), eth-xgaze-h5 (raw h5), or both, comma-separated",
    )
    p.add_argument(
        "--image-size",
        type=at_least(8),
        help=f"--fixture: image side (default {default_of(fixture_dataset, 'size')})",
    )
    p.add_argument("--model", default=DemoConfig().model, help=MODEL_HELP)
    p.add_argument(
        "--batch-size",
        type=int,
        default=training.batch_size,
        help="images per step (default %(default)s, the paper's)",
    )
    p.add_argument(
        "--workers",
        type=comma_separated(worker_count),
        default=[training.num_workers],
        help="loader worker processes (0: load in this process); a comma-separated list measures each (default "
        f"{training.num_workers})",
    )
    p.add_argument(
        "--batches",
        type=int,
        default=default_of(measure_throughput, "batches"),
        help="timed batches after one warm-up (default %(default)s)",
    )
    p.add_argument(
        "--rounds",
        type=at_least(1),
        default=7,
        help="rounds per configuration, interleaved over the worker counts: each rate is the median over them with "
        "its 95 %% interval, which needs six rounds or more (default %(default)s)",
    )
    precision_option(p)
    p.add_argument("--loader-only", action="store_true", help="time the loader alone (no model step)")
    p.add_argument("--out", help="write the page here (e.g. docs/loading.md) and its data beside it")
    device_option(p)


THROUGHPUT = Command(
    "throughput",
    help="images/s of the data loader, of the training step and of both: is training loader-bound?",
    description="Measure how many images per second the data loader delivers, the training step takes, and both "
    "together, on your data (--data) or generated data in a real dataset's layout (--fixture).",
    add_arguments=_throughput_arguments,
    run=_throughput,
    outputs={"out": False},
    pages=frozenset({"out"}),
    data_beside=frozenset({"out"}),
    extra="gaze",
)
