"""``python -m alfa.gaze.data.synthetic``: regenerate the figure and tables of docs/synthetic.md."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any, NoReturn

import torch

from alfa.fileio import check_writable

from .preview import (
    changes_table_markdown,
    domain_table_markdown,
    label_table_markdown,
    measure_render_rate,
    preview_samples,
    render_preview_grid,
    save_preview_samples,
)


class _Parser(argparse.ArgumentParser):
    """argparse's parser, except that an error is one line, as every error of ``alfa``'s commands is (argparse
    printed its whole usage block first): its own, and where the options are listed; and that an option is
    written whole, as ``alfa``'s are (no ``--sam`` for ``--samples-to``)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def print_usage(self, file: IO[str] | None = None) -> None:
        """Nothing: only :meth:`error` prints the usage, and its line says where to find it."""

    def error(self, message: str) -> NoReturn:
        super().error(f"{message} (see {self.prog} --help)")


def _whole_number(low: int) -> Callable[[str], int]:
    """An option's type: a whole number of at least ``low``, refused in argparse's one line otherwise (a size the
    renderer cannot draw, or no threads, was a traceback from deep inside)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"invalid int value: {text!r}") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"must be at least {low}, got {value}")
        return value

    return parse


def main(argv: list[str] | None = None) -> None:
    parser = _Parser(prog="python -m alfa.gaze.data.synthetic", description=__doc__)
    parser.add_argument("--preview", metavar="PNG", help="write the sample grid (one row per domain) to PNG")
    parser.add_argument(
        "--samples-to",
        metavar="FILE",
        help="write the sample grid's images and labels (safetensors) that alfa pages draws docs/synthetic.md's "
        "figure from, e.g. docs/data/synthetic/samples.safetensors",
    )
    parser.add_argument("--tables", action="store_true", help="print the domain settings and label tables")
    parser.add_argument(
        "--version", default="v1", choices=("v1", "v2"), help="which worlds' tables (v2: what each changes from v1)"
    )
    parser.add_argument("--throughput", action="store_true", help="measure rendering speed (images per second)")
    parser.add_argument("--size", type=_whole_number(16), default=64, help="image size, at least 16 (default 64)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=_whole_number(1), default=None, help="torch threads (default: torch's)")
    parser.add_argument("--replace", action="store_true", help="overwrite an existing --preview or --samples-to file")
    args = parser.parse_args(argv)
    if not (args.preview or args.samples_to or args.tables or args.throughput):
        parser.error("nothing to do: give --preview PNG, --samples-to FILE, --tables and/or --throughput")
    for flag, path in (("--preview", args.preview), ("--samples-to", args.samples_to)):
        if path and Path(path).exists() and not args.replace:
            parser.error(f"{flag} {path}: exists; name another file, or add --replace to overwrite it")
        if path:
            try:
                check_writable(path, what=flag)  # before the rendering, not after it
            except ValueError as e:
                parser.error(str(e))
    if args.threads:
        torch.set_num_threads(args.threads)
    try:
        _run(args)
    except OSError as e:  # a file that cannot be written: the system's words, in one line
        parser.error(str(e))


def _run(args: argparse.Namespace) -> None:
    if args.preview:
        print(f"wrote {render_preview_grid(args.preview, seed=args.seed, size=args.size)}")
    if args.samples_to:
        print(f"wrote {save_preview_samples(preview_samples(args.seed, args.size), args.samples_to)}")
    if args.tables:
        print(domain_table_markdown() if args.version == "v1" else changes_table_markdown(args.version), end="\n\n")
        print(label_table_markdown(seed=args.seed, version=args.version), end="\n\n")
    if args.throughput:
        rates = measure_render_rate(size=args.size)
        threads = torch.get_num_threads()
        print(f"| domain | images/s at {args.size}×{args.size} ({threads} threads) |\n|---|---|")
        for name, rate in rates.items():
            print(f"| {name} | {rate:.0f} |")


if __name__ == "__main__":
    main()
