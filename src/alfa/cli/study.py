"""The study's commands around the library: ``example`` (the tour), ``speed``, ``serving`` and ``costs`` (the
measured pages) and ``pages`` (every generated page against its committed data)."""

from __future__ import annotations

import argparse
from pathlib import Path

from .options import (
    MODEL_HELP,
    at_least,
    default_of,
    file_path,
    seed_option,
    thread_count,
    threads_option,
    whole_number_between,
)
from .registry import Command

__all__ = ["EXAMPLE", "SPEED", "SERVING", "PAGES", "COSTS"]


# ----------------------------------------------------------------------------- example

EXAMPLE_STEPS = 1000
EXAMPLE_IMAGE_SIZE = 512


def _example_arguments(p: argparse.ArgumentParser) -> None:
    from alfa.study.example import run_example

    p.add_argument(
        "--rank", type=at_least(1), default=default_of(run_example, "rank"), help="SVD rank d (default %(default)s)"
    )
    p.add_argument(
        "--steps",
        type=whole_number_between(1, EXAMPLE_STEPS, " (a tour of the library, not a training)"),
        default=default_of(run_example, "steps"),
        help="flip-loss steps on random images (default %(default)s)",
    )
    p.add_argument(
        "--image-size",
        # ResNet-18 halves the image five times (so 32 at least); a step's memory grows with the image's area
        type=whole_number_between(
            32, EXAMPLE_IMAGE_SIZE, " (the paper's images are 224; a step's memory grows with the area)"
        ),
        default=default_of(run_example, "image_size"),
        help=f"image side, 32 to {EXAMPLE_IMAGE_SIZE} (default %(default)s)",
    )
    seed_option(p, "the weights and images", default_of(run_example, "seed"))
    threads_option(p)


def _example(args: argparse.Namespace) -> None:
    from alfa.study.example import run_example

    run_example(rank=args.rank, steps=args.steps, image_size=args.image_size, seed=args.seed)


# ----------------------------------------------------------------------------- speed, serving


def _speed_arguments(p: argparse.ArgumentParser) -> None:
    from alfa.study.bench.speed import main as speed_main

    p.add_argument("--out", default=None, help="write the markdown report here (e.g. docs/speed.md)")
    p.add_argument(
        "--repeats",
        # one round gave ratios of medians with no interval, and a page advising to re-run the same command
        type=at_least(2, " (each ratio's 95 % interval is taken over the rounds)"),
        help=f"timed repeats of the gaze sections, interleaved (default {default_of(speed_main, 'repeats')})",
    )
    p.add_argument(
        "--image-size",
        type=at_least(1),
        help=f"image side of the gaze sections, in pixels (default {default_of(speed_main, 'image_size')})",
    )
    p.add_argument(
        "--transformers",
        action="store_true",
        help="measure only the section on transformer layers (Alfa vs LoRA/DoRA on d×d layers and a small Llama, in "
        "rounds and sizes of its own; needs the hf extra's transformers package) and add it to the page",
    )
    threads_option(p)


def _speed(args: argparse.Namespace) -> None:
    from alfa.study.bench.speed import main as speed_main
    from alfa.study.bench.speed import transformers_path

    if args.transformers and (args.repeats is not None or args.image_size is not None):  # they did nothing there
        given = "--repeats" if args.repeats is not None else "--image-size"
        raise ValueError(f"{given} sets the gaze sections; --transformers measures its own rounds and sizes")
    if args.out is not None and Path(args.out).suffix == ".json":  # the page's data would replace the page
        raise ValueError(f"--out {args.out}: the page's data goes beside it as .json; name the page .md")
    # The page itself was checked before this ran (a page of its own is regenerated); where there is none yet, the
    # data this run writes beside it (the gaze part's, or the transformer section's) must not replace a file.
    if args.out is not None and not args.replace and not Path(args.out).exists():
        data = transformers_path(args.out) if args.transformers else Path(args.out).with_suffix(".json")
        if data.exists():
            raise ValueError(
                f"--out {args.out}: the page's data goes to {data}, which exists; name another file, or add "
                "--replace to overwrite it"
            )
    sizes = {"repeats": args.repeats, "image_size": args.image_size}
    sizes = {k: default_of(speed_main, k) if v is None else v for k, v in sizes.items()}
    speed_main(out=args.out, **sizes, transformers=args.transformers, threads=args.torch_threads)


def _serving_arguments(p: argparse.ArgumentParser) -> None:
    from alfa.study.bench.serving import main as serving_main

    p.add_argument("--out", default=None, help="write the page here (e.g. docs/serving.md) and its data beside it")
    p.add_argument(
        "--rounds",
        # every ratio's interval is Student's t over the rounds (and a rate's spread their quartiles): one has none
        type=at_least(2, " (each ratio's 95 % interval is taken over the rounds)"),
        default=default_of(serving_main, "rounds"),
        help="interleaved timed rounds (default %(default)s)",
    )
    p.add_argument(
        "--image-size",
        type=at_least(1),
        default=default_of(serving_main, "image_size"),
        help="image side in pixels (default %(default)s)",
    )
    p.add_argument(
        "--threads",
        type=thread_count,
        default=default_of(serving_main, "threads"),
        help="torch threads the measurement runs on (default %(default)s)",
    )


def _serving(args: argparse.Namespace) -> None:
    from alfa.study.bench.serving import main as serving_main

    serving_main(out=args.out, rounds=args.rounds, image_size=args.image_size, threads=args.threads)


# ----------------------------------------------------------------------------- pages


def _pages_arguments(p: argparse.ArgumentParser) -> None:
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--check", action="store_true", help="compare, write nothing (the default)")
    mode.add_argument("--write", action="store_true", help="rewrite the pages and figures from the data")
    p.add_argument("--root", help="repository root (default: the checkout this alfa is installed from)")


REPOSITORY_MARKS = ("docs", "src/alfa")
"""The folders an alfa repository root holds: the pages' ``docs/`` and the package ``src/alfa/`` whose code some
pages are drawn from."""


def refuse_non_repository(root: Path) -> None:
    """One line where ``root`` is a folder but not an alfa repository root (none of :data:`REPOSITORY_MARKS`, or
    only some), rather than every page's data reported missing."""
    lacking = [mark for mark in REPOSITORY_MARKS if not (root / mark).is_dir()]
    if lacking:
        looked = " and ".join(f"{m}/" for m in REPOSITORY_MARKS)
        raise ValueError(
            f"--root {root}: not an alfa repository root (looked for {looked}; it has no "
            f"{' nor '.join(f'{m}/' for m in lacking)}): name the checkout whose docs/ the pages are in"
        )


def _pages(args: argparse.Namespace) -> None:
    from pathlib import Path

    from alfa.study.pages import check_pages, repo_root, write_pages

    root = Path(args.root) if args.root else repo_root()
    if not root.is_dir():
        raise ValueError(f"--root {root}: not a folder (the repository root whose docs/ the pages are in)")
    refuse_non_repository(root)
    if args.write:
        for rel in write_pages(root):
            print(f"wrote {rel}")
        return
    problems = check_pages(root)
    for p in problems:
        print(p)
    if problems:
        raise RuntimeError(f"{len(problems)} generated file(s) differ from their committed data; see above")
    print(
        "every generated page regenerates from its committed data (pages byte for byte, figures by what they plot, "
        "each a whole PNG file)"
    )


# ----------------------------------------------------------------------------- costs


def _costs_arguments(parser: argparse.ArgumentParser) -> None:

    from alfa.study.bench import costs

    def default(name: str):
        return default_of(costs.cost_table, name)

    parser.add_argument("--model", default=default("model_name"), help=MODEL_HELP)
    parser.add_argument("--rank", type=int, default=default("rank"), help="SVD truncation rank d (default %(default)s)")
    parser.add_argument(
        "--batch",
        type=int,
        default=default("batch"),
        help="images per step, each also flipped (default %(default)s)",
    )
    parser.add_argument(
        "--image-size",
        type=int,
        default=default("image_size"),
        help="image side in pixels (default %(default)s)",
    )
    parser.add_argument(
        "--warmup", type=int, default=default("warmup"), help="untimed rounds first (default %(default)s)"
    )
    parser.add_argument(
        "--repeats",
        type=int,
        default=default("repeats"),
        help="timed rounds, interleaved (default %(default)s)",
    )
    parser.add_argument(
        "--threads", type=thread_count, default=default("threads"), help="torch threads (default %(default)s)"
    )
    seed_option(parser, "the weights and images", default("seed"))
    parser.add_argument("--no-dense", action="store_true", help="skip the untruncated rows")
    parser.add_argument("--json", type=file_path, help="also write the rows to this JSON file")
    parser.add_argument(
        "--update-doc",
        type=file_path,
        metavar="MD",
        help="also write the table into this page, between its <!-- costs:begin --> and <!-- costs:end --> lines",
    )


def _check_costs(args: argparse.Namespace) -> None:
    from alfa.models import list_models

    for name in ("rank", "batch", "image_size", "repeats", "threads"):
        if getattr(args, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be at least 1, got {getattr(args, name)}")
    if args.warmup < 0:
        raise ValueError(f"--warmup must be at least 0, got {args.warmup}")
    if args.model not in list_models():
        raise ValueError(f"unknown model {args.model!r}; known: {', '.join(list_models())}")
    import torch

    from alfa.models import create_model

    from .guards import refuse_a_model_that_is_not_a_gaze_model

    # the table times the flip loss on (yaw, pitch): an image classifier failed inside the loss, after truncating
    image = torch.zeros(1, 3, args.image_size, args.image_size)
    refuse_a_model_that_is_not_a_gaze_model(create_model(args.model), args.model, None, "alfa costs times", image)


def _costs(args: argparse.Namespace) -> None:
    from alfa.study.bench.costs import report_costs

    _check_costs(args)
    report_costs(
        model_name=args.model,
        rank=args.rank,
        batch=args.batch,
        image_size=args.image_size,
        warmup=args.warmup,
        repeats=args.repeats,
        threads=args.threads,
        seed=args.seed,
        dense_alfa=not args.no_dense,
        json_path=args.json,
        update_doc_path=args.update_doc,
    )


EXAMPLE = Command(
    "example",
    help="library tour: truncate, attach Alfa, train a few steps, save, merge",
    description="Walk through the library on random images, printing each step: truncate ResNet-18 by SVD, "
    "attach an Alfa adapter, train it a few steps with the flip loss, save it, merge it. It shows the mechanics "
    "and their costs, not accuracy (alfa demo does that).",
    add_arguments=_example_arguments,
    run=_example,
    extra="study",
)
SPEED = Command(
    "speed",
    help="time a personalization step and inference (dense, truncated, merged)",
    description="Time one personalization step (Alfa, the head alone, full fine-tuning) and inference (dense, "
    "truncated, merged) on this machine, and measure each one's peak memory; prints the page, --out writes it.",
    add_arguments=_speed_arguments,
    run=_speed,
    outputs={"out": False},
    pages=frozenset({"out"}),
    extra="study",
)
SERVING = Command(
    "serving",
    help="throughput of many users per batch on one shared base, against merged models",
    description="Measure the throughput of batches that mix 1, 8 or 64 users' adapters on one shared base, "
    "against one merged model and against switching merged models per request, and the memory each added user "
    "costs (docs/deploy.md).",
    add_arguments=_serving_arguments,
    run=_serving,
    outputs={"out": False},
    pages=frozenset({"out"}),
    data_beside=frozenset({"out"}),
    extra="study",
)
PAGES = Command(
    "pages",
    help="check (default) or rewrite the generated pages of docs/ from their committed data",
    description="Every generated page of docs/ is made from data committed under docs/data/. --check (the "
    "default) renders each page and its figures from that data and compares them with the committed files (pages "
    "byte for byte, figures by the data they plot, saved beside each PNG, which must be a whole PNG file), exiting 2 "
    "on a difference; --write rewrites them.",
    add_arguments=_pages_arguments,
    run=_pages,
    extra="study",
)
COSTS = Command(
    "costs",
    help="cost table of every adapter method: parameters, file sizes, step time, latency",
    description="For each adapter method at its default settings on one truncated model (random weights: the "
    "costs do not depend on them): trainable parameters, parameters after merging, the adapter file's size, the "
    "time of one personalization step and of one inference forward.",
    add_arguments=_costs_arguments,
    run=_costs,
    outputs={"json": False, "update_doc": False},
    keeps=frozenset({"update_doc"}),  # a page it updates in place
    extra="study",
)
