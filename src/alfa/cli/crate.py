"""The ``alfa crate`` commands: ``toy`` (the plane example) and ``gaze`` (a tiny CRATE and ViT for gaze)."""

from __future__ import annotations

import argparse
import shlex
from pathlib import Path

from .options import (
    at_least,
    comma_list,
    file_path,
    folder_path,
    non_negative_number,
    number_between,
    positive_number,
    quiet_option,
    refuse_listed_twice,
    seed_option,
    thread_count,
    whole_number_between,
)
from .registry import Command

__all__ = ["CRATE"]

MAX_SEEDS = 10_000
"""The most seeds alfa crate toy runs (the committed record has 20; 400 took 21 s here)."""


def _toy_arguments(toy: argparse.ArgumentParser) -> None:
    from alfa.study.crate.toy import DEFAULT_PANELS, EPS_RANGE, EPS_WHY, MAX_LAYERS, PANELS, ToyConfig

    constants = ToyConfig()
    toy.add_argument(
        "--seeds",
        # each seed is a run of every panel, kept in memory for the tables: a mistyped count ran for hours
        type=whole_number_between(1, MAX_SEEDS, " (each is a run of every panel, held for the tables)"),
        default=10,
        help=f"number of seeds to run, 1 to {MAX_SEEDS} (default %(default)s)",
    )
    toy.add_argument(
        "--first-seed",
        type=at_least(0),
        default=0,
        help="seeds are first-seed … first-seed+seeds-1 (default %(default)s)",
    )
    toy.add_argument(
        "--panels",
        default=",".join(DEFAULT_PANELS),
        help=f"comma-separated panels out of {','.join(PANELS)} (default %(default)s; c-len1 is (c) with tokens of "
        "length 1)",
    )
    toy.add_argument(
        "--eps",
        type=number_between(*EPS_RANGE, f" ({EPS_WHY})"),
        default=constants.eps,
        help=f"ε of the coding rates R, R_c and of the steps, {EPS_RANGE[0]:g} to {EPS_RANGE[1]:g} (default "
        "%(default)s)",
    )
    toy.add_argument(
        "--eta",
        type=positive_number,
        default=constants.eta,
        help="ISTA step size η in panel (d), above 0 (default %(default)s; with D = I the step subtracts ηλ: a "
        "threshold above the token length zeroes every token)",
    )
    toy.add_argument(
        "--lam",
        type=non_negative_number,
        default=constants.lam,
        help="ISTA sparsity λ in panel (d) (default %(default)s)",
    )
    toy.add_argument(
        "--layers",
        type=whole_number_between(1, MAX_LAYERS, " (the tokens stop moving after a few; the spec runs 6)"),
        default=constants.layers,
        help=f"number of layers, 1 to {MAX_LAYERS} (default %(default)s)",
    )
    toy.add_argument("--show-runs", action="store_true", help="also print the table of every single run")
    toy.add_argument("--json", type=file_path, metavar="PATH", help="write every run (per-layer statistics) as JSON")
    toy.add_argument(
        "--data-to",
        type=file_path,
        metavar="PATH",
        help="write the record docs/crate.md's toy sections are rendered from (alfa pages --write): this command, "
        "the constants, every run and the tokens the figure draws, e.g. docs/data/crate-toy/toy.json",
    )
    toy.add_argument(
        "--figure", type=file_path, metavar="PATH", help="write the four-panel figure (PNG, its plotted data beside it)"
    )
    quiet_option(toy)


def _gaze_arguments(gaze: argparse.ArgumentParser) -> None:
    from alfa.study.crate.gaze_config import CrateGazeConfig

    config = CrateGazeConfig()
    gaze.add_argument(
        "--out", type=folder_path, required=True, metavar="DIR", help="output folder (results, checkpoints)"
    )
    gaze.add_argument("--quick", action="store_true", help="a tiny preset that runs in seconds (a smoke test)")
    seed_option(gaze, "the initial weights, batch order and personalization", config.seed)
    gaze.add_argument(
        "--threads", type=thread_count, default=config.threads, help="torch threads (default %(default)s)"
    )
    gaze.add_argument(
        "--markdown",
        type=file_path,
        metavar="PATH",
        help="also write a generated markdown page (e.g. docs/crate-gaze.md); the probe figure is copied to "
        "PATH's folder under figures/",
    )
    gaze.add_argument(
        "--replace",
        action="store_true",
        help="start over: remove the folders crate/, vit/, crate-truncated/ and adapters/ (whatever they hold) and "
        "the results and figure in --out (by default a run with the same settings resumes there and another run's "
        "files are refused), and overwrite --markdown's page",
    )
    quiet_option(gaze)


def _toy(args: argparse.Namespace) -> None:
    """``alfa crate toy``; bad options raise ``ValueError`` before anything runs."""
    from alfa.study.crate.toy import PANELS, ToyConfig, format_aggregate, format_run, plot_toy, run_toy, write_json
    from alfa.study.crate.toy_report import toy_record, write_record

    panels = comma_list(args.panels)
    if not panels:
        raise ValueError(f"--panels {args.panels!r} names no panel; choose from {', '.join(PANELS)}")
    refuse_listed_twice("--panels", panels)  # a panel's runs twice would count as more seeds, narrowing its intervals
    unknown = [p for p in panels if p not in PANELS]
    if unknown:
        raise ValueError(f"--panels: unknown panel(s) {', '.join(map(repr, unknown))}; choose from {', '.join(PANELS)}")
    if args.seeds < 1:
        raise ValueError(f"--seeds must be at least 1, got {args.seeds}")
    if args.figure is not None and not any(p in panels for p in ("a", "b", "c", "d")):
        raise ValueError("--figure needs at least one of the panels a, b, c, d")
    if args.figure is not None and args.figure.suffix.lower() != ".png":  # found out only after the runs otherwise
        raise ValueError(f"--figure must name a .png file, got {args.figure}")
    config = ToyConfig(eps=args.eps, eta=args.eta, lam=args.lam, layers=args.layers)
    config.validate()
    seeds = list(range(args.first_seed, args.first_seed + args.seeds))
    runs = run_toy(panels, seeds, config, progress=not args.quiet)
    if args.show_runs:
        for run in runs:
            print(format_run(run), end="\n\n")
    print(format_aggregate(runs))
    if args.json is not None:
        write_json(runs, args.json)
        print(f"\nwrote {len(runs)} runs to {args.json}")
    if args.data_to is not None:
        write_record(args.data_to, toy_record(runs, config, _toy_command_line(args)))
        print(f"wrote the record of {len(runs)} runs to {args.data_to} (alfa pages --write renders docs/crate.md)")
    if args.figure is not None:
        plot_toy(runs, args.figure)
        print(f"wrote the figure to {args.figure}")


def _toy_command_line(args: argparse.Namespace) -> str:
    """``alfa crate toy`` as a person would type it, with the options that differ from their defaults (kept in
    the record and quoted on the page)."""
    from alfa.study.crate.toy import DEFAULT_PANELS, ToyConfig

    defaults = ToyConfig()
    parts = ["alfa", "crate", "toy", "--seeds", str(args.seeds)]
    if args.first_seed != 0:
        parts += ["--first-seed", str(args.first_seed)]
    if args.panels != ",".join(DEFAULT_PANELS):
        parts += ["--panels", shlex.quote(args.panels)]
    for option in ("eps", "eta", "lam", "layers"):
        if getattr(args, option) != getattr(defaults, option):
            value = getattr(args, option)
            short = f"{value:g}"  # 1 rather than 1.0, but never a value rounded away
            parts += [f"--{option}", short if float(short) == value else repr(value)]
    for option in ("json", "data_to", "figure"):
        if getattr(args, option) is not None:
            parts += [f"--{option.replace('_', '-')}", shlex.quote(str(getattr(args, option)))]
    if args.replace:
        parts.append("--replace")
    return " ".join(parts)


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


def _gaze(args: argparse.Namespace) -> None:
    """``alfa crate gaze``; bad options raise ``ValueError`` before anything runs."""
    from alfa.checkpoint import CheckpointError
    from alfa.fileio import write_bytes, write_text
    from alfa.study.crate.gaze import CrateGazeConfig, format_markdown, format_summary, quick_config, run_crate_gaze

    overrides = {"seed": args.seed, "threads": args.threads}
    config = quick_config(**overrides) if args.quick else CrateGazeConfig(**overrides)
    config.validate()
    if args.markdown is not None and args.markdown.suffix.lower() != ".md":
        raise ValueError(f"--markdown must name a .md file, got {args.markdown}")
    figure = None if args.markdown is None else _probe_figure(args.markdown)
    if figure is not None and figure.exists() and not args.markdown.exists() and not args.replace:
        raise ValueError(
            f"--markdown {args.markdown}: its figure goes to {figure}, which exists; name another page, or add "
            "--replace to overwrite it"
        )
    try:
        results = run_crate_gaze(
            config, args.out, progress=not args.quiet, command=_gaze_command_line(args), replace=args.replace
        )
    except CheckpointError as e:  # a stage's own refusal says to delete its file; this command has an option for it
        if args.replace:
            raise
        raise CheckpointError(f"{e} (or add --replace: this command's folders in --out start over)") from None
    print()
    print(format_summary(results))
    print(f"\nwrote {args.out / 'results.json'} and {results['figure']}")
    if figure is not None:
        figure.parent.mkdir(parents=True, exist_ok=True)
        write_bytes(figure, Path(results["figure"]).read_bytes())  # atomic: a kill leaves no half figure
        text = format_markdown(results, figure=figure.relative_to(args.markdown.parent).as_posix())
        write_text(args.markdown, text)
        print(f"wrote {args.markdown} (figure {figure})")


def _probe_figure(page: Path) -> Path:
    """Where ``--markdown PAGE`` puts its probe figure: ``figures/`` beside the page, named after it."""
    return page.parent / "figures" / f"{page.stem.replace('-', '_')}_probes.png"


CRATE = Command(
    "crate",
    help="CRATE, the white-box transformer: worked examples",
    description="CRATE, the transformer whose layers compress and sparsify their tokens: the plane toy "
    "(docs/crate.md) and a tiny CRATE against a tiny ViT for gaze (docs/crate-gaze.md).",
    extra="study",
    subcommands=(
        Command(
            "toy",
            help="the plane toy: what compression and sparsification steps do to two clusters of tokens",
            description="Run the panels of the plane toy on a range of seeds and print, per layer, each cluster's "
            "thickness, the coding rates R, R_c and ΔR, the misassigned tokens and the share of tokens on one axis "
            "(the mean over the seeds and its 95 % interval); optionally write every run as JSON, the record "
            "docs/crate.md's toy sections are rendered from (--data-to) and the four-panel figure. The panels and "
            "measures: docs/crate.md, The plane toy.",
            add_arguments=_toy_arguments,
            run=_toy,
            outputs={"json": False, "data_to": False, "figure": False},
            plotted_beside=frozenset({"figure"}),
        ),
        Command(
            "gaze",
            help="a tiny CRATE and a tiny ViT trained for gaze on the synthetic source: errors, probes, Alfa",
            description="Train a tiny CRATE and a tiny ViT (same width, depth, heads) on the synthetic source for a "
            "few epochs on CPU, measure their in-domain and cross-domain errors and per-layer probe curves, then "
            "truncate the CRATE and personalize it with Alfa per target person. Writes DIR/results.json and "
            "DIR/probes.png and prints a table (docs/crate-gaze.md, which records the committed run's wall time "
            "and machine; --quick is a check of the chain in seconds).",
            add_arguments=_gaze_arguments,
            run=_gaze,
            outputs={"out": True, "markdown": False},
            pages=frozenset({"markdown"}),
        ),
    ),
)
