"""The ``alfa llm`` commands: ``pretrain`` (the small diffusion language model) and ``bench`` (Alfa against LoRA,
DoRA and full fine-tuning on it: docs/llm.md)."""

from __future__ import annotations

import argparse
import shlex
from pathlib import Path

from .options import quiet_option
from .registry import Command

__all__ = ["LLM"]

DEFAULT_CACHE = "runs/llm/pretrain"


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--smoke", action="store_true", help="a tiny model and schedule: an end-to-end check in about a minute"
    )
    p.add_argument(
        "--cache",
        type=Path,
        default=Path(DEFAULT_CACHE),
        metavar="DIR",
        help="where pretrained weights are kept, one folder per config digest (default %(default)s)",
    )
    quiet_option(p)


def _bench_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", type=Path, required=True, metavar="DIR", help="the run's records (resumed if present)")
    _common(p)
    p.add_argument(
        "--data-to", type=Path, metavar="FILE", help="also copy the results there (docs/data/llm/bench.json)"
    )
    p.add_argument("--markdown", type=Path, metavar="FILE", help="also write the page there (docs/llm.md)")


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
    for option in ("data_to", "markdown"):
        if getattr(args, option) is not None:
            parts += [f"--{option.replace('_', '-')}", shlex.quote(str(getattr(args, option)))]
    return " ".join(parts)


def _bench(args: argparse.Namespace) -> None:
    from alfa.fileio import write_json, write_text
    from alfa.study.llm.bench import run_bench
    from alfa.study.llm.report import llm_page

    for option, suffix in (("data_to", ".json"), ("markdown", ".md")):
        value = getattr(args, option)
        if value is not None and value.suffix != suffix:
            raise ValueError(f"--{option.replace('_', '-')} must name a {suffix} file, got {value}")
    result = run_bench(_config(args), args.out, args.cache, progress=not args.quiet, command=_bench_command(args))
    print(f"wrote {args.out / 'bench.json'} ({len(result['runs'])} runs; rates {result['selected_rates']})")
    if args.data_to is not None:
        write_json(args.data_to, result)
        print(f"wrote {args.data_to}")
    if args.markdown is not None:
        write_text(args.markdown, llm_page(result, str(args.data_to or args.out / "bench.json")))
        print(f"wrote {args.markdown}")


LLM = Command(
    "llm",
    help="the paper's §4.8 in miniature: Alfa, LoRA, DoRA on a small diffusion language model (docs/llm.md)",
    extra="study",
    subcommands=(
        Command(
            "pretrain",
            help="pretrain the small masked-diffusion model on generated tasks (cached; resumes)",
            description="Trains the base model of the bench (or the --smoke one) on the pretraining formats of "
            "arithmetic, Countdown and 4x4 Sudoku, keeping its weights under --cache/<config digest>; a finished "
            "model is reused, an interrupted one resumed. About 15 minutes on one core.",
            add_arguments=_common,
            run=_pretrain,
            outputs={"cache": True},
        ),
        Command(
            "bench",
            help="adapt the pretrained model with 1,000 held-out-format problems by each method; score and page",
            description="Pretrains the base if needed, then adapts it with Alfa, LoRA, DoRA and full fine-tuning "
            "(rates chosen on a validation split by the declared rule, three seeds) and scores every method and "
            "the unadapted model by exact match on held-out-format test problems. Records go to --out (resumed); "
            "--data-to and --markdown write docs/data/llm/bench.json and docs/llm.md. About 25 minutes on one "
            "core after pretraining; --smoke about a minute.",
            add_arguments=_bench_arguments,
            run=_bench,
            outputs={"out": True, "cache": True, "data_to": False, "markdown": False},
        ),
    ),
)
