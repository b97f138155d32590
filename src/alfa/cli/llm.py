"""The ``alfa llm`` commands: ``pretrain`` (the small diffusion language model), ``bench`` (Alfa against LoRA,
DoRA and full fine-tuning on it: docs/llm.md) and ``time`` (a finished bench's training steps timed again)."""

from __future__ import annotations

import argparse
import json
import shlex
from pathlib import Path

from .options import file_path, folder_path, quiet_option
from .registry import Command

__all__ = ["LLM"]

DEFAULT_CACHE = "runs/llm/pretrain"


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--smoke", action="store_true", help="a tiny model and schedule: an end-to-end check in about a minute"
    )
    p.add_argument(
        "--cache",
        type=folder_path,
        default=Path(DEFAULT_CACHE),
        metavar="DIR",
        help="where pretrained weights are kept, one folder per config digest (default %(default)s)",
    )
    quiet_option(p)


def _bench_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--out", type=folder_path, required=True, metavar="DIR", help="the run's records (resumed if present)"
    )
    _common(p)
    p.add_argument(
        "--data-to",
        type=file_path,
        metavar="FILE",
        help="also copy the results to this file (e.g. docs/data/llm/bench.json)",
    )
    p.add_argument(
        "--markdown", type=file_path, metavar="FILE", help="also write the page to this file (e.g. docs/llm.md)"
    )
    p.add_argument(  # said here: --data-to is checked by the command itself (the copy of this run's records is kept)
        "--replace",
        action="store_true",
        help="overwrite the file --markdown or --data-to names if it exists (by default that is refused before "
        "anything runs, except the copy of this run's own records, or a page this command generated: rewritten)",
    )


def _config(args: argparse.Namespace):  # noqa: ANN202 (a study type; imported here only)
    from alfa.study.llm.bench import smoke_config, standard_config

    return smoke_config() if args.smoke else standard_config()


def _pretrain(args: argparse.Namespace) -> None:
    import torch

    from alfa.study.llm.pretrain import pretrained_model

    torch.set_num_threads(1)
    config = _config(args).pretrain
    _, state = pretrained_model(config, args.cache, progress=not args.quiet)
    print(f"base model {config.digest()} in {args.cache / config.digest()}: {state['step']} steps, "
          f"{state['seconds'] / 60:.1f} min")  # fmt: skip
    for form, scores in state["probe"].items():
        print(f"  {form:8s} " + "  ".join(f"{task} {100 * v:.1f} %" for task, v in scores.items()))


def _bench_command(args: argparse.Namespace) -> str:
    parts = ["alfa", "llm", "bench", "--out", shlex.quote(str(args.out))]
    if args.smoke:
        parts.append("--smoke")
    if Path(args.cache) != Path(DEFAULT_CACHE):  # the base it adapted lies there: part of how to make the page again
        parts += ["--cache", shlex.quote(str(args.cache))]
    for option in ("data_to", "markdown"):
        if getattr(args, option) is not None:
            parts += [f"--{option.replace('_', '-')}", shlex.quote(str(getattr(args, option)))]
    return " ".join(parts)


def _refuse_another_record(path: Path, out: Path) -> None:
    """``--data-to`` may rewrite the copy of this run's records (the bench resumed, its --out the same), never a
    file of anything else: another run's records, a hand-written file (``--replace`` to overwrite it)."""
    if not path.exists():
        return
    try:
        command = json.loads(path.read_text(encoding="utf-8")).get("command")
        words = shlex.split(command) if isinstance(command, str) else []
        ours = words[:3] == ["alfa", "llm", "bench"] and words[words.index("--out") + 1] == str(out)
    except (OSError, ValueError, AttributeError, TypeError, IndexError):
        ours = False
    if not ours:
        raise ValueError(
            f"--data-to {path}: exists and is not the record of a bench run with --out {out}; name another file, "
            "or add --replace to overwrite it"
        )


def _bench(args: argparse.Namespace) -> None:
    from alfa.fileio import write_json, write_text
    from alfa.study.llm.bench import run_bench
    from alfa.study.llm.report import llm_page

    for option, suffix in (("data_to", ".json"), ("markdown", ".md")):
        value = getattr(args, option)
        if value is not None and value.suffix != suffix:
            raise ValueError(f"--{option.replace('_', '-')} must name a {suffix} file, got {value}")
    if args.data_to is not None and not args.replace:
        _refuse_another_record(args.data_to, args.out)
    result = run_bench(_config(args), args.out, args.cache, progress=not args.quiet, command=_bench_command(args))
    print(f"wrote {args.out / 'bench.json'} ({len(result['runs'])} runs; rates {result['selected_rates']})")
    if args.data_to is not None:
        write_json(args.data_to, result)
        print(f"wrote {args.data_to}")
    if args.markdown is not None:
        write_text(args.markdown, llm_page(result, str(args.data_to or args.out / "bench.json")))
        print(f"wrote {args.markdown}")


def _time_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--record",
        type=file_path,
        required=True,
        metavar="FILE",
        help="a finished bench's record (docs/data/llm/bench.json, or OUT/bench.json): its step timing is replaced",
    )
    p.add_argument(
        "--replace",
        action="store_true",
        help="replace the step timing the record holds, and an existing --markdown file (without it, "
        "either is refused)",
    )
    p.add_argument(
        "--markdown", type=file_path, metavar="FILE", help="also write the page to this file (e.g. docs/llm.md)"
    )
    quiet_option(p)


def _timed_record(path: Path, replace: bool) -> dict:
    """The bench record at ``path``, refused (one line) when it is not a finished bench's, or when it holds a step
    timing and ``replace`` is not given: another timing's data goes only when asked."""
    if not path.is_file():
        raise ValueError(f"--record {path}: {'a folder, not a file' if path.is_dir() else 'no such file'}")
    try:
        result = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise ValueError(f"--record {path}: not a bench record alfa llm bench wrote ({e})") from None
    if not isinstance(result, dict) or "config" not in result or "runs" not in result:
        raise ValueError(f"--record {path}: not a bench record alfa llm bench wrote (no config and runs)")
    if not result.get("complete", False):
        raise ValueError(f"--record {path}: an unfinished bench; finishing it (alfa llm bench) times the steps")
    if not replace and ("step_seconds" in result or "step_round_seconds" in result):
        made_by = result.get("step_timing", {}).get("command") or result.get("command") or "an earlier run"
        raise ValueError(f"--record {path}: holds the step timing of `{made_by}`; --replace times the steps again")
    return result


def _time_command(args: argparse.Namespace) -> str:
    parts = ["alfa", "llm", "time", "--record", shlex.quote(str(args.record))]
    if args.replace:
        parts.append("--replace")
    if args.markdown is not None:
        parts += ["--markdown", shlex.quote(str(args.markdown))]
    return " ".join(parts)


def _time(args: argparse.Namespace) -> None:
    from alfa.fileio import write_json, write_text
    from alfa.study.llm.bench import retime
    from alfa.study.llm.report import llm_page

    if args.markdown is not None and args.markdown.suffix != ".md":
        raise ValueError(f"--markdown must name a .md file, got {args.markdown}")
    result = _timed_record(args.record, args.replace)
    if not args.quiet:
        print(f"timing the training steps of {', '.join(result['config']['grids'])} in turn", flush=True)
    result.update(retime(result, _time_command(args), progress=not args.quiet))
    write_json(args.record, result)
    print(f"wrote {args.record}: " + ", ".join(f"{m} {1000 * s:.0f} ms" for m, s in result["step_seconds"].items()))
    if args.markdown is not None:
        write_text(args.markdown, llm_page(result, str(args.record)))
        print(f"wrote {args.markdown}")


LLM = Command(
    "llm",
    help="the paper's §4.8 in miniature: Alfa, LoRA, DoRA on a small diffusion language model (docs/llm.md)",
    description="Alfa against LoRA, DoRA and full fine-tuning on a small masked-diffusion language model, trained "
    "here on generated arithmetic, Countdown and Sudoku problems: pretrain the model, bench the methods, time "
    "their training steps (docs/llm.md).",
    extra="study",
    subcommands=(
        Command(
            "pretrain",
            help="pretrain the small masked-diffusion model on generated tasks (cached; resumes)",
            description="Train the base model of the bench (or the --smoke one) on the pretraining formats of "
            "arithmetic, Countdown and 4x4 Sudoku, keeping its weights under --cache/<config digest>; a finished "
            "model is reused, an interrupted one resumed. About 15 minutes on one core.",
            add_arguments=_common,
            run=_pretrain,
            outputs={"cache": True},
            shared=frozenset({"cache"}),  # not held: each base is made under its own lock (llm.pretrain.pretrain)
        ),
        Command(
            "bench",
            help="adapt the pretrained model to a held-out problem format with each method; score it, write the page",
            description="Pretrain the base if needed, then adapt it with Alfa, LoRA, DoRA and full fine-tuning "
            "(rates chosen on a validation split by the declared rule, three seeds) and score every method and "
            "the unadapted model by exact match on held-out-format test problems. Records go to --out (resumed); "
            "--data-to and --markdown write docs/data/llm/bench.json and docs/llm.md. About 25 minutes on one "
            "core after pretraining; --smoke about a minute.",
            add_arguments=_bench_arguments,
            run=_bench,
            outputs={"out": True, "cache": True, "data_to": False, "markdown": False},
            folder_kinds={"out": "own"},
            # --out is this run's alone; the cache is every run's (the default one too), each base made under its
            # own lock (llm.pretrain.pretrain): two benches into other --out folders run at once
            shared=frozenset({"cache"}),
            keeps=frozenset({"data_to"}),  # the copy of the records of the run it resumes (_refuse_another_record)
        ),
        Command(
            "time",
            help="time a finished bench's training steps again, every round kept, without the pretraining",
            description="Time one training step (forward, backward, AdamW) of each of the bench's methods in turn, "
            "round after round, on the architecture, batch and rounds of the bench's config, built with random "
            "weights (a step's time depends on the shapes, not on the weights' values, so neither the pretraining "
            "nor its cache is needed), on one thread. Every round's time goes into --record (written atomically; "
            "a record that already holds a timing is refused without --replace), from which docs/llm.md prints "
            "each method's step time over LoRA's with its 95 % interval. About a minute on one core.",
            add_arguments=_time_arguments,
            run=_time,
            outputs={"record": False, "markdown": False},
            keeps=frozenset({"record"}),  # its timing is replaced only under --replace (_timed_record)
        ),
    ),
)
