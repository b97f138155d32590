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
    from alfa.study.example import run_example

    run_example(rank=args.rank, steps=args.steps, image_size=args.image_size, seed=args.seed)


def _speed(args: argparse.Namespace) -> None:
    from alfa.study.bench.speed import main as speed_main

    speed_main(out=args.out, repeats=args.repeats, image_size=args.image_size, transformers=args.transformers)


def _export(args: argparse.Namespace) -> None:
    import torch

    from alfa.adapters import load_adapter
    from alfa.checkpoint import load_model
    from alfa.export import export_onnx, export_program

    model, saved = load_model(args.checkpoint)
    model.eval()
    if args.adapter:
        load_adapter(model, args.adapter)
    size = tuple(args.image_size) if args.image_size else tuple(saved.get("input_size") or ())
    if len(size) != 2:
        raise ValueError(f"{args.checkpoint} does not record its input size: pass --image-size H W")
    check = export_onnx(model, args.out, size, form=args.merge, tolerance=args.tolerance)
    print(check.describe())
    if args.program:
        from alfa.fileio import atomic_path

        with atomic_path(args.program) as tmp:
            torch.export.save(export_program(model, size, form=args.merge), str(tmp))
        print(f"wrote {args.program} (torch.export; dynamic batch)")


def _serving(args: argparse.Namespace) -> None:
    from alfa.study.bench.serving import main as serving_main

    serving_main(out=args.out, rounds=args.rounds, image_size=args.image_size)


def _serve(args: argparse.Namespace) -> None:
    from alfa.gaze.service import GazeService, make_server

    server = make_server(GazeService(args.checkpoint, args.adapters), args.host, args.port)
    host, port = server.server_address[:2]
    print(f"serving on http://{host}:{port}: POST /predict?user=ID with a face crop, GET /health (Ctrl-C stops)")
    try:
        server.serve_forever()
    finally:
        server.server_close()


def _pages(args: argparse.Namespace) -> None:
    from pathlib import Path

    from alfa.study.pages import check_pages, repo_root, write_pages

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
    """The ``alfa`` parser: every subcommand, its handler set as ``func``."""
    from alfa import __version__

    parser = argparse.ArgumentParser(
        prog="alfa",
        description="Alfa (Attentive Low-Rank Filter Adaptation): truncate, personalize and evaluate gaze models, "
        "and the benchmark around them. Each command says more with --help.",
    )
    parser.add_argument("--version", action="version", version=f"alfa {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="command")
    # The order here is the order of `alfa --help`.
    _register_summary(sub)
    _register_example(sub)
    _register_speed(sub)
    _register_export(sub)
    _register_serving(sub)
    _register_serve(sub)
    _register_pages(sub)
    _register_costs(sub)

    from alfa.gaze.commands import register as register_gaze
    from alfa.gaze.tpgaze_commands import register as register_tpgaze
    from alfa.study.bench.commands import register as register_bench
    from alfa.study.crate.commands import register as register_crate

    register_gaze(sub)
    register_tpgaze(sub)
    register_bench(sub)
    register_crate(sub)
    return parser


def _register_summary(subparsers: argparse._SubParsersAction) -> None:
    from alfa.truncate import DEFAULT_RANK

    p = subparsers.add_parser("summary", help="parameter summary of a registered model, dense and truncated")
    p.add_argument("--model", default="resnet18_gaze", help="a registered model (default %(default)s)")
    p.add_argument("--rank", type=int, default=DEFAULT_RANK, help="SVD rank (0: dense only; default %(default)s)")
    p.set_defaults(func=_summary)


def _register_example(subparsers: argparse._SubParsersAction) -> None:
    from alfa.truncate import DEFAULT_RANK

    p = subparsers.add_parser("example", help="library tour: truncate, attach Alfa, train a few steps, save, merge")
    p.add_argument("--rank", type=int, default=DEFAULT_RANK, help="SVD rank d (default %(default)s)")
    p.add_argument("--steps", type=int, default=5, help="flip-loss steps on random images (default %(default)s)")
    p.add_argument("--image-size", type=int, default=224, help="image side, at least 32 (default %(default)s)")
    p.add_argument("--seed", type=int, default=0, help="seed of the weights and images (default %(default)s)")
    p.set_defaults(func=_example)


def _register_speed(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("speed", help="time a personalization step and inference (dense, truncated, merged)")
    p.add_argument("--out", default=None, help="write the markdown report here (e.g. docs/speed.md)")
    p.add_argument("--repeats", type=int, default=20, help="timed repeats, interleaved (default %(default)s)")
    p.add_argument("--image-size", type=int, default=224, help="image side in pixels (default %(default)s)")
    p.add_argument(
        "--transformers",
        action="store_true",
        help="measure only the section on transformer layers (Alfa vs LoRA/DoRA on d×d layers and a small Llama; "
        "needs transformers) and add it to the page",
    )
    p.set_defaults(func=_speed, outputs={"out": False})


def _register_export(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "export",
        help="write a (personalized, merged) model as ONNX, checked against onnxruntime; optionally torch.export",
    )
    p.add_argument("--checkpoint", required=True, help="the truncated base (model.safetensors)")
    p.add_argument("--adapter", help="a user's adapter file, merged in before export (default: the base)")
    p.add_argument(
        "--merge",
        choices=("extend", "densify"),
        help="for LoRA-family adapters: keep an exact factorization of rank d + r (extend) or dense layers",
    )
    p.add_argument("--image-size", type=int, nargs=2, metavar=("H", "W"), help="default: the checkpoint's")
    p.add_argument("--out", required=True, help="the ONNX file to write")
    p.add_argument("--program", help="also write the torch.export program here (.pt2)")
    p.add_argument(
        "--tolerance", type=float, default=1e-5, help="largest relative difference accepted (default %(default)g)"
    )
    p.set_defaults(func=_export, outputs={"out": False, "program": False})


def _register_serving(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("serving", help="measure many users per batch on one shared base against merged models")
    p.add_argument("--out", default=None, help="write the page here (e.g. docs/serving.md) and its data beside it")
    p.add_argument("--rounds", type=int, default=28, help="interleaved timed rounds (default %(default)s)")
    p.add_argument("--image-size", type=int, default=64, help="image side in pixels (default %(default)s)")
    p.set_defaults(func=_serving, outputs={"out": False})


def _register_serve(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "serve", help="an HTTP gaze service: one shared base, each user's adapter loaded on first use"
    )
    p.add_argument("--checkpoint", required=True, help="the truncated base (model.safetensors)")
    p.add_argument("--adapters", required=True, help="folder of <user>.safetensors adapter files")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default %(default)s)")
    p.add_argument("--port", type=int, default=8000, help="port (default %(default)s; 0: any free one)")
    p.set_defaults(func=_serve)


def _register_pages(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
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


def _register_costs(subparsers: argparse._SubParsersAction) -> None:
    from alfa.study.bench import costs

    p = subparsers.add_parser(
        "costs",
        help="cost table of every adapter method: parameters, file sizes, step time, latency",
        description=costs.__doc__.split("\n\n")[0],
    )
    costs.add_arguments(p)
    p.set_defaults(func=costs.run, outputs={"json": False, "update_doc": False})


def _check_outputs(args: argparse.Namespace) -> None:
    """Every output a command was given must be writable before it starts (not after an hour of work): each
    parser lists its outputs as ``outputs={option: is_folder}``."""
    from alfa.fileio import check_writable

    for name, folder in getattr(args, "outputs", {}).items():
        value = getattr(args, name, None)
        if value is not None:
            check_writable(value, folder=folder, what=f"--{name.replace('_', '-')}")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = build_parser().parse_args(argv)
    try:
        _check_outputs(args)
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
