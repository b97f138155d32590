"""``alfa crate …`` commands; :func:`register` adds them to the main CLI's subparsers."""

from __future__ import annotations

import argparse
import shlex
import shutil
import sys
from pathlib import Path

from alfa.fileio import write_text

from .toy import DEFAULT_PANELS, PANELS, ToyConfig, format_aggregate, format_run, plot_toy, run_toy, write_json

__all__ = ["register", "toy_command", "gaze_command", "main"]


def register(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Add ``crate`` (with the subcommands ``toy`` and ``gaze``) to ``subparsers``; each leaf sets
    ``func(args) -> int``."""
    crate = subparsers.add_parser("crate", help="CRATE, the white-box transformer: worked examples")
    crate_sub = crate.add_subparsers(dest="crate_command", metavar="{toy,gaze}")
    crate_sub.required = True

    toy = crate_sub.add_parser(
        "toy",
        help="the plane example (spec crate.md §4): what compression and sparsification steps do to two clusters",
        description="Runs the panels of the plane toy on a range of seeds, prints per-layer thickness per "
        "cluster, R, R_c, ΔR, misassigned tokens and one-axis share (mean ± std over the seeds), and "
        "optionally writes every run as JSON and the four-panel figure.",
    )
    toy.add_argument("--seeds", type=int, default=10, help="number of seeds to run (default 10)")
    toy.add_argument("--first-seed", type=int, default=0, help="seeds are first-seed … first-seed+seeds-1 (default 0)")
    toy.add_argument(
        "--panels",
        default=",".join(DEFAULT_PANELS),
        help=f"comma-separated panels out of {','.join(PANELS)} (default: all; c-len1 is (c) with token length 1)",
    )
    toy.add_argument("--eps", type=float, default=0.5, help="ε of the coding rates and steps (default 0.5)")
    toy.add_argument("--eta", type=float, default=0.1, help="ISTA step size η in panel (d) (default 0.1)")
    toy.add_argument("--lam", type=float, default=0.1, help="ISTA sparsity λ in panel (d) (default 0.1)")
    toy.add_argument("--layers", type=int, default=6, help="number of layers (default 6)")
    toy.add_argument("--show-runs", action="store_true", help="also print the table of every single run")
    toy.add_argument("--json", type=Path, metavar="PATH", help="write every run (per-layer statistics) as JSON")
    toy.add_argument("--figure", type=Path, metavar="PATH", help="write the four-panel figure (PNG)")
    toy.set_defaults(func=toy_command, outputs={"json": False, "figure": False})

    gaze = crate_sub.add_parser(
        "gaze",
        help="a tiny CRATE and a tiny ViT trained for gaze on the synthetic source: errors, probes, Alfa",
        description="Trains a tiny CRATE and a tiny ViT (same width, depth, heads) on the synthetic source for a "
        "few epochs on CPU, measures their in-domain and cross-domain errors and per-layer probe curves, "
        "truncates the CRATE and personalizes it with Alfa per target person. Writes DIR/results.json and "
        "DIR/probes.png and prints a table. The default takes about 6 minutes on one thread.",
    )
    gaze.add_argument("--out", type=Path, required=True, metavar="DIR", help="output folder (results, checkpoints)")
    gaze.add_argument("--quick", action="store_true", help="a tiny preset that runs in seconds (a smoke test)")
    gaze.add_argument("--seed", type=int, default=0, help="initial weights, batch order, personalization (default 0)")
    gaze.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    gaze.add_argument(
        "--markdown",
        type=Path,
        metavar="PATH",
        help="also write a generated markdown page (e.g. docs/crate-gaze.md); the probe figure is copied to "
        "PATH's folder under figures/",
    )
    gaze.add_argument("--quiet", action="store_true", help="no progress output, only the final table")
    gaze.set_defaults(func=gaze_command, outputs={"out": True})
    return crate


def toy_command(args: argparse.Namespace) -> int:
    """Handler of ``alfa crate toy``; bad options raise ``ValueError`` (the CLI prints it as one line)."""
    panels = [p.strip() for p in args.panels.split(",") if p.strip()]
    unknown = [p for p in panels if p not in PANELS]
    if not panels or unknown:
        raise ValueError(f"--panels: unknown panel(s) {', '.join(map(repr, unknown))}; choose from {', '.join(PANELS)}")
    if args.seeds < 1:
        raise ValueError(f"--seeds must be at least 1, got {args.seeds}")
    if args.figure is not None and not any(p in panels for p in ("a", "b", "c", "d")):
        raise ValueError("--figure needs at least one of the panels a, b, c, d")
    config = ToyConfig(eps=args.eps, eta=args.eta, lam=args.lam, layers=args.layers)
    config.validate()
    seeds = list(range(args.first_seed, args.first_seed + args.seeds))
    runs = run_toy(panels, seeds, config)
    if args.show_runs:
        for run in runs:
            print(format_run(run), end="\n\n")
    print(format_aggregate(runs))
    if args.json is not None:
        write_json(runs, args.json)
        print(f"\nwrote {len(runs)} runs to {args.json}")
    if args.figure is not None:
        plot_toy(runs, args.figure)
        print(f"wrote the figure to {args.figure}")
    return 0


def _gaze_command_line(args: argparse.Namespace) -> str:
    """The command as a person would type it (quoted in the results and the markdown page)."""
    parts = ["alfa", "crate", "gaze", "--out", shlex.quote(str(args.out))]
    if args.quick:
        parts.append("--quick")
    parts += ["--seed", str(args.seed)]
    if args.threads != 1:
        parts += ["--threads", str(args.threads)]
    if args.markdown is not None:
        parts += ["--markdown", shlex.quote(str(args.markdown))]
    return " ".join(parts)


def gaze_command(args: argparse.Namespace) -> int:
    """Handler of ``alfa crate gaze``; bad options raise ``ValueError`` before anything runs."""
    from .gaze import CrateGazeConfig, format_markdown, format_summary, quick_config, run_crate_gaze

    overrides = {"seed": args.seed, "threads": args.threads}
    config = quick_config(**overrides) if args.quick else CrateGazeConfig(**overrides)
    config.validate()
    if args.markdown is not None and args.markdown.suffix.lower() != ".md":
        raise ValueError(f"--markdown must name a .md file, got {args.markdown}")
    results = run_crate_gaze(config, args.out, progress=not args.quiet, command=_gaze_command_line(args))
    print()
    print(format_summary(results))
    print(f"\nwrote {args.out / 'results.json'} and {results['figure']}")
    if args.markdown is not None:
        figure = args.markdown.parent / "figures" / f"{args.markdown.stem.replace('-', '_')}_probes.png"
        figure.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(results["figure"], figure)
        text = format_markdown(results, figure=figure.relative_to(args.markdown.parent).as_posix())
        write_text(args.markdown, text)
        print(f"wrote {args.markdown} (figure {figure})")
    return 0


def main(argv: list[str] | None = None) -> int:
    """``python -m alfa.study.crate.commands toy|gaze …``: the same as ``alfa crate toy|gaze …``."""
    parser = argparse.ArgumentParser(prog="alfa")
    register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["crate", *(sys.argv[1:] if argv is None else argv)])
    try:
        return args.func(args)
    except ValueError as e:
        print(f"alfa crate {args.crate_command}: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
