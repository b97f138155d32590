"""The ``alfa bench`` and ``alfa report`` commands.

Each handler turns options into a :class:`~alfa.study.bench.config.BenchConfig` (or paths) and calls one
function of the benchmark (:mod:`alfa.study.bench.runner`, :mod:`~alfa.study.bench.report_page`).

    alfa bench --smoke                                   # every row kind once, tiny data (no claims)
    alfa report --results runs/bench-smoke --out runs/bench-smoke/results.md
    alfa bench --quick                                   # does everything run? (no claims)
    bash scripts/queue.sh scripts/queues/LANE.txt        # the second protocol (alfa bench --standard, into
                                                         # runs/bench-v2), in lanes; docs/results-v2.md
    alfa bench --first-standard --seeds 0 &              # what docs/results.md was made from,
    alfa bench --first-standard --seeds 1                # one process per core (then --seeds 2), then:
    alfa report --results runs/bench-standard --out docs/results.md
    alfa bench --full --out runs/bench --seeds 0 &       # longer training, every target person; not run by us
    alfa bench --full --out runs/bench --seeds 1
"""

from __future__ import annotations

import argparse
import dataclasses
import shlex
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from .options import (
    at_least,
    comma_list,
    comma_separated,
    deterministic_kernels,
    device_option,
    page_head,
    precision_option,
    quiet_option,
    thread_count,
    whole_number_between,
)
from .registry import Command

if TYPE_CHECKING:  # the study is imported when a command runs, not when the CLI starts
    from alfa.study.bench.config import BenchConfig

__all__ = ["BENCH", "POWER", "REPORT", "bench_config"]


def _pairs(value: str) -> list[str]:
    # "E-M" and "EM" are accepted for "E→M" (the arrow is awkward to type).
    out = []
    for v in comma_list(value):
        v = v.replace("->", "→").replace("-", "→")
        if "→" not in v and len(v) == 2:
            v = f"{v[0]}→{v[1]}"
        out.append(v.upper())
    return out


# Each preset (a BenchConfig constructor of that name) and its default --out. The two standard presets get
# folders of their own, the ones their committed records were made in (docs/data/bench-standard and bench-flip came from
# runs/bench-standard and runs/bench-flip, bench-v2 from runs/bench-v2), so that a run of one never resumes into
# the other's records.
PRESETS: dict[str, str] = {
    "smoke": "runs/bench-smoke",
    "quick": "runs/bench-quick",
    "standard": "runs/bench-v2",
    "first_standard": "runs/bench-standard",
    "full": "runs/bench-full",
}


def _preset(args: argparse.Namespace) -> str:
    return next((name for name in PRESETS if getattr(args, name, False)), "quick")


def _command_line() -> str:
    return "alfa " + shlex.join(sys.argv[1:])


def bench_config(args: argparse.Namespace) -> BenchConfig:
    """The :class:`~alfa.study.bench.config.BenchConfig` that ``alfa bench`` with ``args`` runs: the preset
    narrowed by the selection options, validated (an unknown method, pair or ablation is a ``ValueError``)."""
    from alfa.study.bench.ablations import REGISTRY
    from alfa.study.bench.config import BenchConfig, selectable_methods
    from alfa.study.bench.methods import expand_calibration_names

    config = getattr(BenchConfig, _preset(args))()
    changes: dict = {}
    for option in ("methods", "pairs"):  # "," or "" would run nothing (or only the ablations) and exit 0
        if getattr(args, option) is not None and not comma_list(getattr(args, option)):
            raise ValueError(f"--{option} {getattr(args, option)!r} names no {option[:-1]}")
    if args.methods is not None:
        changes["methods"] = expand_calibration_names(tuple(comma_list(args.methods)))
        # a subset of methods also narrows their selected-recipe rows, unless those are named on their own
        selectable = selectable_methods()
        changes["selected_methods"] = tuple(m for m in changes["methods"] if m in selectable)
        # ... and the rows of their shipped default recipes, where the preset has those
        changes["default_methods"] = tuple(m for m in changes["methods"] if m in config.default_methods)
    if args.selected_methods is not None:
        names = comma_list(args.selected_methods)
        changes["selected_methods"] = () if names == ["none"] else tuple(names)
    if args.default_methods is not None:
        names = comma_list(args.default_methods)
        changes["default_methods"] = () if names == ["none"] else tuple(names)
    if args.pairs is not None:
        changes["pairs"] = tuple(_pairs(args.pairs))
    if args.seeds is not None:
        changes["seeds"] = args.seeds
    if args.ablations is not None:
        names = comma_list(args.ablations)
        changes["ablations"] = () if names == ["none"] else tuple(REGISTRY) if names == ["all"] else tuple(names)
    if args.threads is not None:
        changes["threads"] = args.threads
    if args.keep_adapters:
        changes["keep_adapters"] = True
    config = dataclasses.replace(config, **changes)
    config.validate()
    return config


PAGE_TITLES = {"report": "# Benchmark results", "user calibration": "# Results: what a few labels are worth"}
"""How each kind of page ``alfa report`` writes begins: one kind is never rewritten as the other."""


def _refuse_another_report(page: Path, results: Path | str, flag: str = "--report", kind: str = "report") -> None:
    """A page is rewritten only as the page of the same results and kind it is (the checks before any command let
    any `alfa report` page be rewritten: a smoke run's report replaced docs/results.md, the default --out, and a
    user-calibration page a main one); ``--replace`` overwrites it anyway."""
    if not page.exists():
        return
    head = page_head(page)
    if f"`alfa report --results {results} " not in head or not head.startswith(PAGE_TITLES[kind]):
        raise ValueError(
            f"{flag} {page}: exists and is not the {kind} page of --results {results}; name another file, or add "
            "--replace to overwrite it"
        )


def _refuse_unasked_figures(page: str, figures: str | None, elsewhere: str) -> None:
    """A page's figures never replace files it does not show (another page's, a person's) unless --replace."""
    from alfa.study.bench.report_figures import unasked_figures

    found = unasked_figures(page, figures)
    if found:
        more = f" (and {len(found) - 1} more)" if len(found) > 1 else ""
        raise ValueError(
            f"{found[0]} exists and is not a figure of {page}, whose figures would replace it{more}; {elsewhere}, "
            "or add --replace to overwrite"
        )


def _bench(args: argparse.Namespace) -> None:
    from alfa.gaze.devices import resolve_device
    from alfa.study.bench.runner import run_bench

    if args.cache_dir is not None and Path(args.cache_dir).exists() and not Path(args.cache_dir).is_dir():
        # said before anything: found by the first source model, the run had begun its results.json (the cache may
        # be --out itself, so it is not one of the checked outputs, which must differ)
        raise ValueError(f"--cache-dir {args.cache_dir} is a file, not a folder")
    config = bench_config(args)
    preset = _preset(args)
    deterministic_kernels()
    out = Path(args.out or PRESETS[preset])
    if args.report and not args.replace:
        _refuse_another_report(Path(args.report), out)  # the page bench --report writes names --results OUT
        _refuse_unasked_figures(args.report, None, "name another --report")
    device = resolve_device(args.device)
    summary = run_bench(
        config,
        out,
        cache_dir=args.cache_dir,
        progress=not args.quiet,
        command=_command_line(),
        dry_run=args.dry_run,
        device=device,
        precision=args.precision or "fp32",
        rebuild_elsewhere=args.rebuild_elsewhere,
        new_models_elsewhere=args.new_models_elsewhere,
    )
    if args.dry_run:
        print(f"{len(summary.pending)} records to run, {len(summary.skipped)} already done in {summary.results}:")
        for rid in summary.pending:
            print(f"  {rid}")
        return
    print(
        f"{len(summary.ran)} records run, {len(summary.skipped)} already done; {summary.results} "
        f"({summary.wall_s / 60:.1f} min wall, {summary.cpu_s / 60:.1f} min CPU)"
    )
    for rid, why in summary.errors.items():
        print(f"FAILED {rid}: {why}", file=sys.stderr)
    if args.report:
        from alfa.study.bench.report_page import build_report

        path = build_report(summary.results, args.report, command=f"alfa report --results {out} --out {args.report}")
        print(f"report: {path}")
    if summary.errors:
        raise RuntimeError(f"{len(summary.errors)} record(s) failed (listed above); rerun to retry them")


def _report(args: argparse.Namespace) -> None:
    from alfa.study.bench.plan import declared_run_progress
    from alfa.study.bench.report_page import build_report
    from alfa.study.bench.results import export_results, load_results, results_file

    results, command = args.results, _command_line()
    results_file(results)  # results that are not there are said first, not as the figures they would replace
    if not args.replace:
        named = args.data_to or args.results  # the results the pages will name
        _refuse_another_report(Path(args.out), named, "--out")
        if args.user_calibration:
            _refuse_another_report(Path(args.user_calibration), named, "--user-calibration", "user calibration")
        _refuse_unasked_figures(args.out, args.figures, "name another --figures folder")
    if args.data_to:  # keep the data with the page, then make the page from the kept copy
        results = export_results(args.results, args.data_to, keep_kept=True)
        command = f"alfa report --results {args.data_to} --out {args.out}"
        print(f"data: {results}")
    loaded = load_results(results)  # read once for both pages (the committed file is 48 MB)
    if not isinstance(loaded.get("config"), dict):  # the page's protocol is written from it ("None×None faces")
        raise ValueError(f"{results_file(results)}: no 'config', the benchmark's settings its page is written from")
    # what of a declared run the results hold (nothing for worlds without one), as alfa pages --write says it
    path = build_report(
        results, args.out, args.figures, command=command, progress_of=declared_run_progress, loaded=loaded
    )
    print(f"report: {path}")
    if args.user_calibration:
        from alfa.study.bench.user_calibration_report import write_user_calibration_page

        page = write_user_calibration_page(results, args.user_calibration, command, loaded)
        print(f"user calibration: {page}")


def _bench_arguments(p: argparse.ArgumentParser) -> None:
    from alfa.study.bench.config import BenchConfig

    preset = p.add_mutually_exclusive_group()
    preset.add_argument(
        "--smoke",
        action="store_true",
        help="every row kind, method and ablation once on tiny data (the rows no other preset runs unless named "
        "too), the shortest preset, still many minutes on two cores (its page gives its wall time); no claims",
    )
    preset.add_argument(
        "--quick", action="store_true", help="every pair and the main rows at a larger size, no claims (default)"
    )
    preset.add_argument(
        "--standard",
        action="store_true",
        help="the second protocol's preset (docs/flip-premise.md §7), behind docs/results-v2.md and "
        "docs/results-user-calibration.md: six pairs and S→R on the v2 worlds; hours per seed: run it in pieces, "
        "as scripts/queues/*.txt do",
    )
    preset.add_argument(
        "--first-standard",
        action="store_true",
        help="the preset the first records were made with, behind docs/results.md and docs/results-flip.md "
        "(the v1 worlds, the same 5 persons per target in every seed; its commands are in those pages' § Runs, "
        "where it was still called --standard)",
    )
    preset.add_argument(
        "--full", action="store_true", help="longer training, every target person (many hours; run it in pieces)"
    )
    p.add_argument(
        "--out",
        help="results folder (default, per preset: "
        + ", ".join(f"{folder} for --{name.replace('_', '-')}" for name, folder in PRESETS.items())
        + ")",
    )
    p.add_argument("--cache-dir", help="where source models are cached (default OUT/cache)")
    p.add_argument(
        "--methods",
        help=_methods_help(),
    )
    p.add_argument(
        "--pairs",
        help="comma-separated source→target pairs out of E→M,E→D,G→M,G→D (negative controls), S→W,S→C (positive "
        "controls) and, on the v2 worlds, S→R (the constructed control: source-only, flip-TTA and the oracle only); "
        "E-M also works (default: the preset's; the worlds: docs/flip-premise.md §2)",
    )
    p.add_argument(
        "--selected-methods",
        help="comma-separated methods that also get a row with their recipe chosen without target labels "
        "(docs/flip-premise.md §4), or 'none' (default: the preset's; with --methods, those of them that have one)",
    )
    p.add_argument(
        "--default-methods",
        help="comma-separated methods that also get a row with the recipe alfa personalize ships for them, or "
        "'none' (default: the preset's; with --methods, those of them the preset has)",
    )
    p.add_argument("--seeds", type=_seed_list, help="comma-separated seeds (default: the preset's)")
    p.add_argument("--ablations", help=_ablations_help())
    p.add_argument("--threads", type=thread_count, help=f"torch threads (default {BenchConfig().threads})")
    p.add_argument("--keep-adapters", action="store_true", help="keep every per-person adapter file")
    p.add_argument(
        "--dry-run",
        action="store_true",
        help="list the records that would run, run nothing (their data is rendered to hash them: minutes for the "
        "large presets)",
    )
    p.add_argument(
        "--rebuild-elsewhere",
        action="store_true",
        help="train again a model the results say another CPU trained (by default refused before it trains: "
        "another CPU's vector instructions train other bits, which its record then refuses)",
    )
    p.add_argument(
        "--new-models-elsewhere",
        action="store_true",
        help="train a model new to a seed whose models another CPU trained (by default refused before it trains: "
        "the seed would hold models of two kinds of machine); its entry in the results keeps this CPU",
    )
    p.add_argument("--report", metavar="MD", help="also write the report to this markdown file afterwards")
    quiet_option(p)
    device_option(p)
    precision_option(
        p,
        choices=("fp32", "bf16"),  # TPGaze's meta-training takes no gradient scaler, so fp16 would fail its rows
        note="the source models train in fp32, their recipe's precision",
        default="fp32 on every device (the benchmark's records are compared with each other)",
    )


def _ablations_help() -> str:
    from alfa.study.bench.ablations import REGISTRY

    return f"comma-separated ablations out of {', '.join(REGISTRY)}; 'all' or 'none' (default: the preset's)"


def _methods_help() -> str:
    """``--methods``' help: every method name ``BenchConfig.validate`` accepts, read from the study's lists."""
    from alfa.study.bench.methods import EXTRA_METHODS, OPT_IN_METHODS, SANITY_METHODS, TTA_ROWS, table_methods

    names = (*table_methods(), *SANITY_METHODS, *TTA_ROWS, *EXTRA_METHODS, *OPT_IN_METHODS)
    return (
        f"comma-separated methods to run instead of the preset's, out of: {', '.join(names)} (docs/adapters.md, "
        "docs/pnpga.md); and the user-calibration rows calibrate-<method>[k=K], or calibrate-<method> for all of its "
        f"k and draws (docs/user-calibration.md §5). No preset but --smoke (no claims) runs "
        f"{' or '.join(OPT_IN_METHODS)}"
    )


def _report_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--results", required=True, help="results.json or the benchmark folder holding it")
    p.add_argument("--out", default="docs/results.md", help="markdown file to write (default %(default)s)")
    p.add_argument("--figures", help="figure folder (default: figures/results next to --out)")
    p.add_argument(
        "--data-to",
        metavar="DIR",
        help="first copy results.json and the figure data (never adapters or models) to DIR, e.g. "
        "docs/data/bench-standard, the data committed with the page, and make the page from that copy (refused "
        "where DIR holds records the results lack: remove them there first if that is meant)",
    )
    p.add_argument(
        "--user-calibration",
        metavar="PAGE",
        help="also write the page of the results' user-calibration rows (alfa calibrate's methods against k, what "
        "a label-free row is worth in labelled images; its figure in figures/<PAGE's name> beside it), as "
        "docs/results-user-calibration.md is the declared run's",
    )


BENCH = Command(
    "bench",
    help="the cross-domain benchmark: every method on synthetic source→target pairs, seeds, ablations, costs",
    description="Run (or resume) the benchmark: source models, then every method on each source→target pair and "
    "seed, and the ablations; the records go to OUT/results.json, which alfa report turns into a page (the second "
    "protocol's pages are made by bash scripts/keep_records.sh). "
    "--dry-run lists what would run.",
    add_arguments=_bench_arguments,
    run=_bench,
    outputs={"out": True, "report": False},
    pages=frozenset({"report"}),
    rewrites=("report",),  # the page --report writes is `alfa report`'s, rewritten as the run it reports resumes
    # not held: pieces of one benchmark fill one folder at once, merged into results.json under its file lock
    shared=frozenset({"out"}),
    extra="study",
)
REPORT = Command(
    "report",
    help="generate a results page (default docs/results.md) and its figures from a benchmark's results.json",
    description="Render the benchmark report (tables, verdicts, figures) from results.json; the page is generated, "
    "so it is never edited by hand.",
    add_arguments=_report_arguments,
    run=_report,
    outputs={"out": False, "figures": True, "data_to": True, "user_calibration": False},
    pages=frozenset({"out", "user_calibration"}),
    extra="study",
)


BENCH_SEED_LIMIT = 2**31 - 1
"""The largest seed a benchmark takes: its worlds and records derive generators' seeds from it by sums, and
99999999999999999999 was listed by --dry-run, then failed in a run with "Overflow when unpacking long long"."""


def _seed_list(text: str) -> tuple[int, ...]:
    """``--seeds``: comma-separated whole numbers from 0 to :data:`BENCH_SEED_LIMIT`."""
    return tuple(comma_separated(whole_number_between(0, BENCH_SEED_LIMIT))(text))


_counts = comma_separated(at_least(1))
"""A comma-separated list of whole numbers of at least 1."""


def _power_arguments(p: argparse.ArgumentParser) -> None:
    from alfa.study.bench.power import plan_table

    from .options import default_of

    def default(name: str) -> object:
        return default_of(plan_table, name)

    def option(flag: str, what: str) -> None:
        value = list(default(flag))
        p.add_argument(f"--{flag}", type=_counts, default=value, help=f"{what} (default {','.join(map(str, value))})")

    option("seeds", "numbers of seeds, the table's rows")
    option("families", "family sizes, the numbers of comparisons Holm's correction divides α among")
    option("pairs", "numbers of source→target pairs pooled in a comparison")
    p.add_argument(
        "--persons",
        type=at_least(1),
        default=default("persons"),
        help="persons per pair and seed (default %(default)s)",
    )


MOST_SEEDS = 1000
"""The most seeds ``alfa power`` plans for: 10,000 took seconds and 1,000,000 ran for minutes without a line."""


def _power(args: argparse.Namespace) -> None:
    from alfa.study.bench.power import plan_table

    for flag in ("seeds", "families", "pairs"):
        values = getattr(args, flag)
        if len(set(values)) < len(values):  # a row or column printed twice
            raise ValueError(f"--{flag} {','.join(map(str, values))}: name each number once")
    if min(args.seeds) < 2 or max(args.seeds) > MOST_SEEDS:
        raise ValueError(
            f"--seeds: each number of seeds must be from 2 (one seed has no spread over seeds to judge a difference "
            f"by) to {MOST_SEEDS}, got {','.join(map(str, args.seeds))}"
        )
    print(plan_table(args.seeds, args.families, args.pairs, persons=args.persons))


POWER = Command(
    "power",
    help="plan a benchmark's power: the smallest difference its design detects, before it runs",
    description="Print the smallest difference (degrees) a comparison detects with 80 % power at α = 0.05 / family, "
    "per number of seeds, family size and pooled pairs, in the nested design, from the random effects the first "
    "records measured (docs/flip-premise.md §7.1).",
    add_arguments=_power_arguments,
    run=_power,
    extra="study",
)
