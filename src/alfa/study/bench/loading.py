"""docs/loading.md: is source training loader-bound? The page ``alfa throughput --out`` writes from what
:func:`alfa.gaze.throughput.measure_throughput` measured, round by round.

Each rate is the median over the rounds with its distribution-free 95 % interval
(:func:`alfa.study.timing.median_interval`); *loader-bound* is judged on the loader's rate over the step's, paired
over the rounds (within a round the loader, both and the step of one configuration are timed back to back) with
its t-interval (:func:`alfa.study.timing.paired_ratio`): *yes* only when the whole interval is below 1, *no* only
when it is above, *not shown* when it straddles 1. A record without rounds prints its rates alone and judges
nothing.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import torch

from alfa.fileio import write_text
from alfa.gaze.throughput import loader_bound_of
from alfa.study.timing import Ratio, interval_note, load_average, load_text, median_cell, no_rounds_note, ratio_cell

__all__ = ["loading_page", "loader_bound_verdict", "write_loading_page"]


def loader_bound_verdict(ratio: Ratio | None) -> str:
    """Whether the loader holds the step back, in the page's words: :func:`~alfa.gaze.throughput.loader_bound_of`'s
    verdict, or *not judged* without an interval."""
    if ratio is None:
        return "not judged"
    return {True: "yes", False: "no", None: "not shown"}[loader_bound_of(ratio)]


def _row(run: dict[str, Any]) -> tuple[str, bool]:
    """One configuration's table row, and whether its rounds gave the intervals."""
    rates = [median_cell(run.get(f"{k}_rounds"), run[k]) for k in ("loader", "step", "both")]
    if run["step"] is None:
        ratio_text, verdict, judged = "—", "—", len(run.get("loader_rounds") or []) >= 2
    else:
        ratio_text, ratio = ratio_cell(run.get("loader_rounds"), run.get("step_rounds"), run["loader"] / run["step"])
        verdict, judged = loader_bound_verdict(ratio), ratio is not None
    return f"| {_name(run)} | {run['workers']} | {' | '.join(rates)} | {ratio_text} | {verdict} |", judged


def _name(run: dict[str, Any]) -> str:
    """What a run read, as the page names it: the generated fixture, or the data the command was given."""
    return run.get("fixture") or run["data"]


FIXTURE_WORDS = {
    "mpiifacegaze": "`mpiifacegaze`: a GazeHub folder of JPEG files",
    "eth-xgaze-h5": "`eth-xgaze-h5`: raw ETH-XGaze subject files",
}
"""How the page names each generated fixture ``alfa throughput --fixture`` reads."""


def _data_words(runs: list[dict[str, Any]]) -> str:
    """What the crops were: the fixtures measured, in the real layouts, or the data the command was given (the page
    described the fixtures whatever it read)."""
    fixtures = [f for f in FIXTURE_WORDS if any(r.get("fixture") == f for r in runs)]
    if fixtures:
        return f"in the real layouts ({'; '.join(FIXTURE_WORDS[f] for f in fixtures)})"
    return "of " + ", ".join(dict.fromkeys(f"`{r['data']}`" for r in runs))


def loading_page(page: dict[str, Any]) -> str:
    """docs/loading.md from what ``alfa throughput --out`` measured (``page``: the command, the machine, the
    rounds and the runs, each a :meth:`~alfa.gaze.throughput.ThroughputResult.to_dict` with its ``fixture`` and
    ``model``)."""
    runs = page["runs"]
    made = [_row(r) for r in runs]
    first = runs[0]
    h, w = first["image_size"]
    rounds = len(first.get("loader_rounds") or [])
    # one command times the step for every configuration or (--loader-only) for none
    stepped = first["step"] is not None
    if not stepped:
        what = "The loader alone (`--loader-only`: the training step was not timed)."
    else:
        what = (
            f"Model `{first['model']}` on `{first['device']}` in {first['precision']}. *Loader*: the training loop's "
            "batches read and decoded to uint8, nothing else; *step*: forward, symmetry target, backward and Adam "
            "on one batch already on the device; *both*: the training loop."
        )
    if rounds >= 2 and all(judged for _, judged in made):
        ratio = (
            " *Loader / step* is the loader's rate over the step's. "
            + interval_note()
            + " *Loader-bound*: *yes* only where the whole interval is below 1, *no* only where it is above 1, "
            "*not shown* where it straddles 1."
            if stepped
            else ""
        )
        how = [
            f"Each configuration was timed in {rounds} rounds, interleaved: a round times every worker count in "
            f"turn{' (and, within one, the loader, both and the step back to back)' if stepped else ''}. A rate "
            "is the median over the "
            "rounds and, in square brackets, its distribution-free 95 % interval (the k-th smallest and k-th largest "
            f"round; none under six rounds).{ratio} Rates of different worker counts are not compared here.",
            "",
        ]
    elif stepped:
        how = [no_rounds_note(page["command"]), ""]
    else:
        how = [
            f"This record keeps one round per configuration, so its rates carry no 95 % interval: re-run "
            f"`{page['command']}` with six rounds or more (`--rounds 6`) for them.",
            "",
        ]
    return "\n".join(
        [
            "# Data loading: is training loader-bound?",
            "",
            f"<!-- Generated by `{page['command']}`. Do not edit by hand: re-run the command. -->",
            "",
            f"Generated by `{page['command']}` on {page['date']} ({page['cpus']} CPUs, torch {page['torch']}; load "
            f"average {load_text(page['load_average_end'])} at the end). {h}×{w} face crops {_data_words(runs)}, read "
            f"by the project's own loaders in the training loop's worker processes; batches of {first['batch_size']}, "
            f"{first['batches']} timed batches after one warm-up batch, each handed over as the loader stores it "
            "(uint8 for these 8-bit images) with its labels: the conversion to float runs once per batch where the "
            f"step runs, so it counts in the step. {what}",
            "",
            *how,
            "| data | loader workers | loader (images/s) | step (images/s) | both (images/s) | loader / step "
            "| loader-bound |",
            "| --- | ---: | ---: | ---: | ---: | ---: | :---: |",
            *(row for row, _ in made),
            "",
            *([] if stepped else [*_unstepped_answer(runs, page["command"]), *_one_worker_note(runs)]),
            "The fixtures' faces are flat colours, which decode faster than photographs, so these rates are upper "
            "bounds for real data of the same size. ETH-XGaze's training set is ~756k images: at a rate R, one "
            "epoch's loading takes 756,000 / R seconds of these CPUs. On a GPU the step is far faster than on a "
            "CPU; `alfa throughput --data … --device cuda --workers 4,8` there says how many workers keep it fed.",
            "",
        ]
    )


def _unstepped_answer(runs: list[dict[str, Any]], command: str) -> list[str]:
    """Where no step was timed (``--loader-only``): the title's question answered in the only form the loader's
    rates allow, the step rate above which training waits for the loader, per data (at most the highest median of its
    worker counts, which the page does not tell apart)."""
    fastest = []
    for name in dict.fromkeys(_name(r) for r in runs):
        mine = [r for r in runs if _name(r) == name]
        best = max(mine, key=lambda r: r["loader"])
        rate = median_cell(best.get("loader_rounds"), best["loader"])  # its interval where the rounds give one
        workers = f"{best['workers']} worker{'' if best['workers'] == 1 else 's'}"
        of = f", the highest median of its {len(mine)} worker counts" if len(mine) > 1 else ""
        fastest.append(f"at most {rate} images/s for `{name}` ({workers}{of})")
    flag = " --loader-only"
    again = f"`{command.replace(flag, '')}`" if flag in command else "the command without `--loader-only`"
    return [
        "The step was not timed, so this record answers the title's question in one form only: training from this "
        f"data on these CPUs waits for the loader where its step takes in more images per second than the loader "
        f"gives, {'; '.join(fastest)} (at most: a step on these CPUs takes some of them from the loader, and the "
        f"page does not tell its worker counts apart). {again} times the step beside the loader (its `--device` "
        "set to the one that trains).",
        "",
    ]


def _one_worker_note(runs: list[dict[str, Any]]) -> list[str]:
    """Why one loader worker need not read faster than none, where both were timed (on the loader alone)."""
    if not {0, 1} <= {r["workers"] for r in runs}:
        return []
    return [
        "Timed alone, the loader with one worker does the reading the main process does with none, and hands each "
        "batch over between processes besides: it need not read faster. In training, that one worker reads while "
        "the step runs.",
        "",
    ]


def write_loading_page(out: str | Path, command: str, runs: list[dict[str, Any]]) -> None:
    """``out`` (the page) and its data beside it (``out`` with ``.json``): the runs ``alfa throughput`` measured,
    with the command that measured them and the machine they ran on."""
    page = {
        "command": command,
        "runs": runs,
        "cpus": os.cpu_count(),
        "torch": torch.__version__,
        "date": time.strftime("%Y-%m-%d"),
        "load_average_end": load_average(),
    }
    write_text(Path(out).with_suffix(".json"), json.dumps(page, indent=2))
    write_text(Path(out), loading_page(page))
