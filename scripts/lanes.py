"""Which lane lines still have benchmark records to make, and whether this machine may make them.

    python scripts/lanes.py [--results FILE] [LANE ...]

A seed of the benchmark is made on one kind of machine (docs/flip-premise.md §7.2, docs/gaze.md § Determinism): the
CPU its source models' entries in the results name. For each line of each lane (default: every file of
scripts/queues) with records the results do not hold yet, it prints the lane, the line, how many of the line's
records are left, its seeds, the CPU that made them, whether this machine may run it: ``yes`` (this CPU made
its seeds, or no machine has started them), ``declared`` (another CPU made them, and the line gives
``--new-models-elsewhere`` or ``--rebuild-elsewhere``, as an amendment declared) or ``no``, and the source models
its records left need (the pairs' sources, the targets' for the within-target yardstick) that this machine's cache
(runs/bench-v2/cache) does not hold finished where the results recorded it, each with the hours its training
took where it was made, as the results recorded them: what a session must train before the line's first record (two
lanes that need one source model share its training). Then, per lane, the
line to start ``scripts/queue.sh`` from here (or, for a lane a ``queue.sh`` of this machine runs now, that it runs
and from which line), and the records of the declared run
(``alfa.study.bench.plan.declared_run_parts``) that neither the results nor any lane holds.

A record counts as made when the results hold its id (the runner also compares its configuration hash, which
needs the data rendered: this reads files only, and trains and renders nothing). ``--results``: default
runs/bench-v2/results.json, else the kept docs/data/bench-v2/results.json. A refusal is one line on stderr and
status 2. Run it with the project's Python (``.venv/bin/python``).
"""

from __future__ import annotations

import contextlib
import io
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:  # run as python scripts/lanes.py it is there; loaded by a test, not
    sys.path.insert(0, str(HERE))
from script_cli import Parser, refuse  # noqa: E402

NAME = "lanes"
ROOT = HERE.parent
QUEUES = ROOT / "scripts" / "queues"
RESULTS = (ROOT / "runs" / "bench-v2" / "results.json", ROOT / "docs" / "data" / "bench-v2" / "results.json")
ELSEWHERE_FLAGS = ("--new-models-elsewhere", "--rebuild-elsewhere")

try:
    from alfa.cli import build_parser
    from alfa.cli.bench import bench_config
    from alfa.gaze.pipeline import source_model_finished
    from alfa.study.bench.config import BenchConfig
    from alfa.study.bench.plan import RecordPlan, declared_run_parts, plan_records
    from alfa.study.bench.results import load_results
    from alfa.study.bench.runner import seed_machine
    from alfa.study.bench.session import Session
    from alfa.study.timing import cpu_name
except ImportError as e:  # another Python than the project's: one line, not a traceback
    refuse(NAME, f"{sys.executable} cannot import {e.name}; run it with .venv/bin/python")


@dataclass
class LaneLine:
    """One line of a lane with records left: where it is, what it makes, and who may make it."""

    lane: str
    number: int
    left: int
    total: int
    seeds: tuple[int, ...]
    made_on: tuple[str, ...]  # the CPU of each of its seeds that one has made, in the seeds' order
    here: str  # yes, declared (its flags), or no
    to_train: str  # the source models it needs that this machine has not finished, or "none"


def pieces(path: Path) -> list[tuple[int, str]]:
    """The lines of a lane file that are pieces (numbered from 1, as scripts/queue.sh counts them): not blank, not
    a comment; a Windows line end dropped, as the queue drops it."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        refuse(NAME, f"{path}: cannot be read as a lane file ({e.__class__.__name__})")
    numbered = enumerate((line.rstrip("\r") for line in text.splitlines()), start=1)
    return [(n, line) for n, line in numbered if line.strip() and not line.lstrip().startswith("#")]


def line_config(lane: str, number: int, line: str) -> BenchConfig:
    """The benchmark selection a lane line runs (``alfa bench --standard ... LINE``), or one line saying why not."""
    said = io.StringIO()
    try:
        with contextlib.redirect_stderr(said):
            args = build_parser().parse_args(["bench", "--standard", "--out", "runs/bench-v2", *line.split()])
        return bench_config(args)
    except SystemExit:
        why = said.getvalue().strip().splitlines() or ["not an alfa bench selection"]
        refuse(NAME, f"{lane} line {number}: {why[-1]}")
    except ValueError as e:
        refuse(NAME, f"{lane} line {number}: {e}")


def verdict(made_on: tuple[str, ...], here: str, line: str) -> str:
    """``yes``, ``declared (FLAGS)`` or ``no``: whether this CPU may make a line whose seeds ``made_on`` made."""
    if all(cpu == here for cpu in made_on):
        return "yes"
    given = [flag for flag in ELSEWHERE_FLAGS if flag in line.split()]
    return f"declared ({', '.join(given)})" if given else "no"


def to_train(plans: list[RecordPlan], sources: dict, root: Path = ROOT) -> str:
    """The models (``E seed 1``) the records ``plans`` still need that the cache under ``root`` does not hold
    finished where the results recorded it: the pair's source, or the target's for the within-target yardstick (as
    the runner picks them: ``Session.model_key``), each with the hours its training took where it was made
    (``recorded_train_seconds``), if recorded; ``none`` if there are none."""
    needed = []
    for key, seed in dict.fromkeys((Session.model_key(plan), plan.seed) for plan in plans):
        entry = sources.get(f"{key}|seed{seed}") or {}
        if entry.get("cache") and source_model_finished(root / entry["cache"]):
            continue
        seconds = entry.get("recorded_train_seconds")
        needed.append(f"{key} seed {seed}" + (f" ({seconds / 3600:.1f} h where made)" if seconds else ""))
    return "; ".join(needed) or "none"


def lane_lines(lanes: list[Path], results: dict, here: str) -> tuple[list[LaneLine], set[str]]:
    """The lines of ``lanes`` with records ``results`` does not hold, and every record id the lanes make."""
    made = {record["id"] for record in results["records"]}
    left, every = [], set()
    for path in lanes:
        for number, line in pieces(path):
            config = line_config(path.name, number, line)
            plans = plan_records(config)
            ids = [plan.id for plan in plans]
            every.update(ids)
            missing = [i for i in ids if i not in made]
            if not missing:
                continue
            machines = tuple(m for m in (seed_machine(results["sources"], s) for s in config.seeds) if m)
            verdict_here = verdict(machines, here, line)
            train = to_train([plan for plan in plans if plan.id not in made], results["sources"])
            left.append(
                LaneLine(path.name, number, len(missing), len(ids), config.seeds, machines, verdict_here, train)
            )
    return left, every


def unlaned(results: dict, laned: set[str]) -> Counter[str]:
    """The declared run's records neither made nor in a lane, counted by method (a label's name before its ``[``)."""
    made = {record["id"] for record in results["records"]}
    plans = [p for part in declared_run_parts("v2").values() for p in part]
    return Counter(p.variant.label.split("[")[0] for p in plans if p.id not in made and p.id not in laned)


def running_lanes(proc: Path = Path("/proc")) -> dict[str, tuple[int, str]]:
    """The lanes a ``scripts/queue.sh`` process of this machine runs now: lane file name -> (its process id, the line
    it was started from, as given). Read from the processes' command lines (``proc``; none where there is no such
    folder): a lane started twice runs each piece twice over, the second waiting on the first's locks."""
    running: dict[str, tuple[int, str]] = {}
    for cmdline in sorted(proc.glob("[0-9]*/cmdline")):
        with contextlib.suppress(OSError):
            args = cmdline.read_bytes().decode(errors="replace").split("\0")
            at = next((i for i, arg in enumerate(args) if Path(arg).name == "queue.sh"), None)
            if at is not None and at + 1 < len(args) and args[at + 1].endswith(".txt"):
                start = args[at + 2] if at + 2 < len(args) and args[at + 2] else "1"
                running.setdefault(Path(args[at + 1]).name, (int(cmdline.parent.name), start))
    return running


def report(
    left: list[LaneLine],
    missing: Counter[str],
    here: str,
    source: Path,
    records: int,
    running: dict[str, tuple[int, str]] | None = None,
) -> list[str]:
    """The lines printed; ``running``: :func:`running_lanes`."""
    running = running or {}
    out = [f"this machine: {here}", f"results: {source} ({records} records)", ""]
    out.append("| lane | line | records left | seeds | made on | here | source models to train here first |")
    out.append("|---|---|---|---|---|---|---|")
    for x in left:
        seeds = ",".join(map(str, x.seeds))
        made_on = "; ".join(sorted(set(x.made_on))) or "no machine yet"
        out.append(f"| {x.lane} | {x.number} | {x.left} of {x.total} | {seeds} | {made_on} | {x.here} | {x.to_train} |")
    out.append("")
    starts = {}
    for x in left:
        if x.here != "no":
            starts.setdefault(x.lane, x.number)
    if starts:
        out.append("to start here:")
        for lane, n in starts.items():
            if lane in running:
                pid, start = running[lane]
                out.append(f"  {lane}: running now (queue.sh, process {pid}, started from line {start})")
            else:
                out.append(f"  bash scripts/queue.sh scripts/queues/{lane} {n}")
    else:
        out.append("no line with records left may run on this machine")
    if missing:
        counted = ", ".join(f"{method} {n}" for method, n in sorted(missing.items()))
        out.append(f"declared records in no lane and not made: {sum(missing.values())} ({counted})")
    return out


def main(argv: list[str] | None = None) -> None:
    parser = Parser(prog="python scripts/lanes.py", name=NAME, description=__doc__.split("\n\n")[0])
    parser.add_argument("--results", type=Path, help="the results file (default: runs/bench-v2's, else the kept one)")
    parser.add_argument("lanes", nargs="*", type=Path, metavar="LANE", help="lane files (default: scripts/queues/*)")
    args = parser.parse_args(argv)
    source = args.results or next((path for path in RESULTS if path.is_file()), RESULTS[0])
    lanes = args.lanes or sorted(QUEUES.glob("*.txt"))
    for path in lanes:
        if not path.is_file():
            refuse(NAME, f"{path}: no such lane file")
    try:
        results = load_results(source)
    except (OSError, ValueError) as e:
        refuse(NAME, f"--results: {e}")
    made_by = (results.get("preset"), results.get("config", {}).get("worlds"))
    if made_by != ("standard", "v2"):  # the lanes make the declared run: a smoke run's records are not its
        refuse(NAME, f"--results {source}: preset {made_by[0]} on the worlds {made_by[1]}, not the declared run's "
               "(preset standard on the worlds v2)")  # fmt: skip
    here = cpu_name()
    left, laned = lane_lines(lanes, results, here)
    missing = unlaned(results, laned) if not args.lanes else Counter()  # a few lanes: the rest are not "no lane"
    print("\n".join(report(left, missing, here, source, len(results["records"]), running_lanes())))


if __name__ == "__main__":
    main()
