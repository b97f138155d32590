"""The ``alfa`` command: a thin layer over the library (each subcommand calls one library function)."""

from __future__ import annotations

import argparse
import sys


def _summary(args: argparse.Namespace) -> None:
    import alfa

    model = alfa.models.create_model(args.model)
    print(f"{args.model} (dense):\n{alfa.parameter_summary(model)}\n")
    if args.rank:
        print(alfa.truncate(model, rank=args.rank), "\n")
        print(f"{args.model} truncated at rank {args.rank}:\n{alfa.parameter_summary(model)}")


def _example(args: argparse.Namespace) -> None:
    from .example import run_example

    run_example(rank=args.rank, steps=args.steps, image_size=args.image_size, seed=args.seed)


def _speed(args: argparse.Namespace) -> None:
    from .bench.speed import main as speed_main

    speed_main(out=args.out, repeats=args.repeats, image_size=args.image_size)


def _pages(args: argparse.Namespace) -> None:
    from pathlib import Path

    from .pages import check_pages, repo_root, write_pages

    root = Path(args.root) if args.root else repo_root()
    if args.write:
        for rel in write_pages(root):
            print(f"wrote {rel}")
        return
    problems = check_pages(root)
    for p in problems:
        print(p)
    if problems:
        raise RuntimeError(f"{len(problems)} generated file(s) differ from their committed data; see above")
    print("every generated page regenerates byte for byte from its committed data")


def build_parser() -> argparse.ArgumentParser:
    from .truncate import DEFAULT_RANK

    parser = argparse.ArgumentParser(prog="alfa", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True, metavar="command")

    p = sub.add_parser("summary", help="parameter summary of a registered model, dense and truncated")
    p.add_argument("--model", default="resnet18_gaze")
    p.add_argument("--rank", type=int, default=DEFAULT_RANK, help="SVD rank (0: dense only)")
    p.set_defaults(func=_summary)

    p = sub.add_parser("example", help="library tour: truncate, attach Alfa, train a few steps, save, merge")
    p.add_argument("--rank", type=int, default=DEFAULT_RANK)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--image-size", type=int, default=224)
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(func=_example)

    p = sub.add_parser("speed", help="time a personalization step and inference (dense, truncated, merged)")
    p.add_argument("--out", default=None, help="write the markdown report here (e.g. docs/speed.md)")
    p.add_argument("--repeats", type=int, default=20)
    p.add_argument("--image-size", type=int, default=224)
    p.set_defaults(func=_speed)

    p = sub.add_parser(
        "pages",
        help="check (default) or rewrite the generated pages of docs/ from their committed data",
        description="Every generated page of docs/ is made from data committed under docs/data/; this renders "
        "each page and its figures from that data and compares them byte for byte with the committed files "
        "(--check, the default; exit 2 on a difference) or rewrites them (--write).",
    )
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--check", action="store_true", help="compare, write nothing (the default)")
    mode.add_argument("--write", action="store_true", help="rewrite the pages and figures from the data")
    p.add_argument("--root", help="repository root (default: the checkout this alfa is installed from)")
    p.set_defaults(func=_pages)

    p = sub.add_parser("costs", add_help=False, help="cost table of every adapter method (see `alfa costs --help`)")

    from .bench.commands import register as register_bench
    from .crate.commands import register as register_crate
    from .gaze.commands import register as register_gaze
    from .gaze.tpgaze_commands import register as register_tpgaze

    register_gaze(sub)
    register_tpgaze(sub)
    register_bench(sub)
    register_crate(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["costs"]:  # its own parser (python -m alfa.bench.costs); argparse can't forward --help
        from .bench.costs import main as costs_main

        return costs_main(argv[1:])
    args = build_parser().parse_args(argv)
    try:
        args.func(args)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except (ValueError, FileNotFoundError, RuntimeError, FloatingPointError) as e:
        # Bad input (files, shapes, options): one clear line, no traceback.
        print(f"alfa {args.command}: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
