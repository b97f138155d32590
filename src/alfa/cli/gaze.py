"""The gaze commands of ``alfa``: pretrain, truncate, personalize, evaluate and demo (serve: :mod:`.serve`,
throughput: :mod:`.throughput`).

Each handler only turns options into configs and calls one function of the application
(:mod:`alfa.gaze.train`, :mod:`~alfa.gaze.personalize`, :mod:`~alfa.gaze.evaluate`, :mod:`~alfa.gaze.pipeline`); the
commands are declared at the end of the file.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .guards import (
    adaptation_count,
    adapted_label,
    before_evaluating,
    before_personalizing,
    check_labels,
    check_method_fits,
    check_truncatable,
    check_val_data,
    load_finished,
    note_what_serve_refuses,
    persons_of,
    prompts_sized_to,
    raise_if_incomplete,
    refuse_a_model_that_is_not_a_gaze_model,
    refuse_adapters_none_fits,
    refuse_calibrations_under_tta,
    tta_column,
)
from .options import (
    MODEL_HELP,
    allow_partial_option,
    at_least,
    data_help,
    deterministic_kernels,
    device_option,
    fraction,
    key_values,
    non_negative_number,
    positive_rate,
    precision_option,
    quiet_option,
    run_precision_of,
    seed_option,
    threads_option,
    tta_of,
    tta_option,
    worker_count,
)
from .registry import Command

if TYPE_CHECKING:
    from alfa.gaze.data.base import GazeDataset

__all__ = [
    "PRETRAIN",
    "TRUNCATE",
    "PERSONALIZE",
    "EVALUATE",
    "DEMO",
    "seed_torch_deterministic",
    "open_spec",
]

PRESETS = ("real", "demo")


def seed_torch_deterministic(seed: int) -> None:
    """Seed torch's global generator and ask for deterministic kernels (warning where there is none)."""
    import torch

    torch.manual_seed(seed)
    deterministic_kernels()


def open_spec(spec: str) -> GazeDataset:
    """The dataset a ``--data`` spec names (:func:`alfa.gaze.pipeline.open_data`)."""
    from alfa.gaze import pipeline

    return pipeline.open_data(spec)


def _train_options(p: argparse.ArgumentParser, epochs_help: str) -> None:
    from alfa.gaze.train import TrainConfig

    g = p.add_argument_group("training (where no default is stated: the --preset's)")
    g.add_argument(
        "--preset",
        choices=PRESETS,
        default="real",
        help="real: the paper's settings (docs/real-data.md); demo: the demo's small ones (default %(default)s)",
    )
    g.add_argument("--epochs", type=at_least(1), help=epochs_help)
    g.add_argument(
        "--batch-size",
        type=at_least(2, " (BatchNorm trains on the batch)"),
        help="images per optimizer step (under torchrun: of all processes together)",
    )
    g.add_argument("--lr", type=positive_rate, help="Adam learning rate")
    g.add_argument(
        "--symmetry-weight",
        type=non_negative_number,
        help="weight of the loss term that asks a mirrored face for the mirrored gaze (0: off; docs/gaze.md §1)",
    )
    g.add_argument(
        "--val-fraction", type=fraction, help="share of source persons held out when --val-data is not given"
    )
    g.add_argument("--workers", type=worker_count, help="data-loading worker processes (0: load in this process)")
    threads_option(g)
    precision_option(g)
    seed_option(g, "the initial weights, batch order and person split", TrainConfig().seed)
    quiet_option(g)


def _train_config(args: argparse.Namespace, stage: str, device):
    from alfa.gaze.pipeline import DemoConfig
    from alfa.gaze.train import TrainConfig, TruncateConfig

    if args.preset == "demo":
        demo = DemoConfig()
        base = demo.pretrain if stage == "pretrain" else demo.truncation.recovery
    else:
        base = TrainConfig() if stage == "pretrain" else TruncateConfig().recovery
    changes = {
        "epochs": args.epochs,
        "batch_size": args.batch_size,
        "lr": args.lr,
        "symmetry_weight": args.symmetry_weight,
        "val_fraction": args.val_fraction,
        "num_workers": args.workers,
        "seed": args.seed,
        "precision": run_precision_of(args, device),
    }
    return dataclasses.replace(base, **{k: v for k, v in changes.items() if v is not None})


def _join(name: str):
    """``--device`` for the commands that train a source: under ``torchrun``, this process's device in the
    process group it joins (:func:`alfa.gaze.distributed.setup`)."""
    from alfa.gaze import distributed
    from alfa.gaze.devices import resolve_device

    return distributed.setup(name, resolve_device)


# ----------------------------------------------------------------------------- pretrain


def _pretrain(args: argparse.Namespace) -> None:
    from alfa.gaze import distributed
    from alfa.gaze.train import refuse_mixed_sizes, train_source
    from alfa.models import create_model

    check_val_data(args)
    device = _join(args.device)
    config = _train_config(args, "pretrain", device)
    seed_torch_deterministic(config.seed)
    model = create_model(args.model).to(device)  # an unknown --model is refused before any data is made
    data = open_spec(args.data)
    val = open_spec(args.val_data) if args.val_data else None
    refuse_mixed_sizes(data, *([val] if val is not None else []))  # a held-out person of another size: no error
    try:
        refuse_a_model_that_is_not_a_gaze_model(model, args.model, data)
        result = train_source(
            model, data, config, args.out, model_name=args.model, val_dataset=val, progress=not args.quiet
        )
        main = distributed.is_main()
    finally:
        distributed.teardown()
    if not main:  # rank 0 reports for all
        return
    if len(result.history) > config.epochs:  # a resume found more done than asked: that run is kept, not cut short
        raise ValueError(
            f"--out {args.out}: holds a run of {len(result.history)} epochs, more than the {config.epochs} asked (kept "
            f"as it is): use another --out, or --epochs {len(result.history)}"
        )
    epochs = len(result.history)
    print(f"pretrained {args.model} on {data.name}: {epochs} epoch{'s' * (epochs != 1)}, {_validation_words(result)}")
    print(f"checkpoint: {result.checkpoint}")


def _validation_words(result: Any) -> str:
    """The last epoch's validation error, or why there is none (a share of one person holds none out: it printed
    "nan deg on 0 held-out persons")."""
    error = (result.history[-1] if result.history else {}).get("val_error")
    if not result.val_persons or error is None or error != error:
        return "no validation (no person held out: give --val-data, or more persons)"
    n = len(result.val_persons)
    return f"validation error {error:.2f} deg on {n} held-out person{'' if n == 1 else 's'}"


# ----------------------------------------------------------------------------- truncate


def _truncate(args: argparse.Namespace) -> None:
    from alfa.gaze import distributed
    from alfa.gaze.train import TruncateConfig, check_input_size, held_out_persons, truncate_and_recover

    check_val_data(args)
    device = _join(args.device)
    config = TruncateConfig(rank=args.rank, recovery=_train_config(args, "recover", device))
    model, saved = load_finished(args.checkpoint)
    model.to(device)
    if saved.get("factorized"):
        raise ValueError(f"{args.checkpoint} is already truncated; pass the dense pre-trained checkpoint")
    check_truncatable(model, args.rank)  # a --rank that saves nothing anywhere: refused before any data is made
    data = open_spec(args.data)
    check_input_size(saved, data, args.checkpoint)  # recovery on another size would record that size as trained
    recorded = (saved.get("extra") or {}).get("data")
    trained_on = recorded.get("name") if isinstance(recorded, dict) else None
    # recovery on other data works (a choice): said, not refused; once, by the first process under torchrun
    if trained_on and trained_on != data.name and distributed.is_main():
        print(
            f"alfa truncate: note: {args.checkpoint} was trained on {trained_on}, not --data's {data.name}: recovery "
            "fine-tunes it on --data (the source data it was trained on is the usual choice)",
            file=sys.stderr,
        )
    if args.val_data:
        val, val_persons = open_spec(args.val_data), None
        check_input_size(saved, val, args.checkpoint)
    else:
        val_persons = held_out_persons(saved, data, args.checkpoint)
        val = data if val_persons else None
    seed_torch_deterministic(config.recovery.seed)
    try:
        result = truncate_and_recover(
            model,
            data,
            config,
            args.out,
            val_dataset=val,
            val_persons=val_persons,
            model_name=saved["model"],
            model_kwargs=saved.get("model_kwargs"),
            progress=not args.quiet,
        )
        main = distributed.is_main()
    finally:
        distributed.teardown()
    if not main:  # rank 0 reports for all
        return
    print(result.format())
    print(f"checkpoint: {result.checkpoint}")


# ----------------------------------------------------------------------------- personalize


def _method_config(args: argparse.Namespace):
    from alfa.adapters import METHODS, config_from_dict

    if args.method not in METHODS:
        raise ValueError(f"unknown adapter method {args.method!r}; known: {', '.join(sorted(METHODS))}")
    options: dict[str, Any] = {}
    fields = {f.name for f in dataclasses.fields(METHODS[args.method])}
    for flag, field, value in (("--heads", "heads", args.heads), ("--adapter-rank", "rank", args.adapter_rank)):
        if value is None:
            continue  # the method's own default
        if field not in fields:
            raise ValueError(f"{flag}: --method {args.method} has no {field!r} option")
        options[field] = value
    options.update(key_values(args.option))
    return config_from_dict(args.method, options)


def _personalize_config(args: argparse.Namespace, method: Any = None):
    from alfa.adapters import TPGazeConfig
    from alfa.gaze.objectives import OBJECTIVES
    from alfa.gaze.personalize import PersonalizeConfig
    from alfa.gaze.pipeline import DemoConfig
    from alfa.gaze.recipes import named_recipe
    from alfa.gaze.tpgaze import tpgaze_recipe

    base = DemoConfig().personalize if args.preset == "demo" else PersonalizeConfig()
    # Each adapter method's default recipe was selected without target labels (alfa.gaze.recipes.METHOD_RECIPES);
    # TPGaze keeps its own (Adam, lr 0.01, no layer scaling). Flags still win.
    if isinstance(method, TPGazeConfig):
        base = tpgaze_recipe(base)
    elif method.method == "full" and args.loss == "ruda":  # RUDA itself (docs/gaze.md): its recipe, not full's
        from alfa.gaze.ruda import ruda_recipe

        base = ruda_recipe(base)
    else:
        base = named_recipe(args.recipe, method.method).apply(base)
    changes = {
        "steps": args.steps,
        "lr": args.lr,
        "n_adapt": args.n_adapt,
        "loss": args.loss,
        "seed": args.seed,
        "detach_flipped": False if args.train_both_branches else True if args.detach_flipped else None,
        "pitch_anchor": args.pitch_anchor,
    }
    config = dataclasses.replace(base, **{k: v for k, v in changes.items() if v is not None})
    if (args.train_both_branches or args.detach_flipped) and not OBJECTIVES[config.loss].flip_branches:
        flag = "--train-both-branches" if args.train_both_branches else "--detach-flipped"
        raise ValueError(
            f"{flag} reaches the flip loss's mirrored branch (--loss flip, flip+roll); --loss {config.loss} has none"
        )
    return config


def _recipe_words(config: Any) -> str:
    from alfa.gaze.objectives import OBJECTIVES

    scale = ", ".join(f"×{v:g} on {k}" for k, v in config.lr_scale.items()) or "no layer scaling"
    branches = "flipped branch detached" if config.detach_flipped else "both branches trained"
    if not OBJECTIVES[config.loss].flip_branches:  # no mirrored branch to detach or train
        branches = f"loss {config.loss}"
    anchor = f", pitch anchor {config.pitch_anchor:g}" if config.pitch_anchor else ""
    return f"{config.steps} steps, lr {config.lr:g} ({scale}), {branches}{anchor}"


def _personalize(args: argparse.Namespace) -> None:
    from alfa.gaze.devices import resolve_device
    from alfa.gaze.personalize import personalize_dataset
    from alfa.gaze.precision import forward_precision
    from alfa.gaze.train import check_input_size

    method = _method_config(args)
    if args.init and not type(method).trains_prompts:  # before the checkpoint and the data are read
        raise ValueError(
            f"--init (meta-trained prompts) only applies to a method that trains prompts, not {method.method}"
        )
    config = _personalize_config(args, method)
    device = resolve_device(args.device)
    precision = run_precision_of(args, device)
    model, saved = load_finished(args.checkpoint)
    model.to(device).eval()
    # --adapter-rank 100000 is refused now, before the data is read, not after minutes of allocating (and again
    # by before_personalizing, on the method as --init and the data leave it)
    check_method_fits(model, method)
    if args.init:
        from alfa.gaze.tpgaze import start_from

        method = start_from(model, args.init)
    data = open_spec(args.data)
    check_input_size(saved, data, args.checkpoint)
    persons = persons_of(args.persons, data)
    given = f"--option image_size={method.image_size}" if "image_size" in key_values(args.option) else None
    method = prompts_sized_to(data, method, f"--init {args.init}" if args.init else given)
    before_personalizing(model, data, persons, method, config, args.out, args.replace)
    note_what_serve_refuses(model, "personalize", method.method, args.checkpoint)
    if type(method).trains_prompts and not args.init:  # alfa tpgaze personalize asks for --no-meta to mean it
        print(
            f"alfa personalize: note: --method {method.method} without --init starts every person from random "
            "prompts, not meta-trained ones (alfa tpgaze meta-train, then --init; docs/tpgaze.md)",
            file=sys.stderr,
        )
    seed_torch_deterministic(config.seed)
    if not args.quiet:
        print(f"recipe: {_recipe_words(config)}")
    with forward_precision(precision):
        run = personalize_dataset(model, data, method, config, args.out, persons=persons, progress=not args.quiet)
    counts = run.counts()
    done = [o.seconds for o in run.persons.values() if o.status == "ok"]
    pace = f", {sum(done) / len(done):.2f} s per person on {device}" if done else ""
    print(
        f"{method.method} personalization of {data.name}: {counts['ok']} done, {counts['skipped']} already "
        f"there, {counts['failed']} failed{pace}; adapters in {args.out}"
    )
    run.raise_if_failed(args.allow_partial)


# ----------------------------------------------------------------------------- evaluate


def _evaluation_tta(args: argparse.Namespace) -> Any:
    """The test-time augmentation ``evaluate`` scores besides (``--tta``; ``--flip-tta`` is ``--tta flip``)."""
    if args.flip_tta and args.tta not in (None, "flip"):
        raise ValueError(f"--flip-tta is --tta flip: it cannot go with --tta {args.tta}")
    return tta_of("flip" if args.flip_tta else args.tta)


def _evaluate(args: argparse.Namespace) -> None:
    from alfa.gaze.devices import resolve_device
    from alfa.gaze.evaluate import evaluate
    from alfa.gaze.precision import forward_precision
    from alfa.gaze.train import check_input_size

    n_adapt = adaptation_count(args)  # before any loading: no --adapters folder, a conflicting --n-adapt
    if args.label is None:  # an empty one given is refused by check_labels
        args.label = adapted_label(args.adapters)
    tta = _evaluation_tta(args)
    check_labels(args.label, tta and tta.name)
    if tta is not None and args.adapters is not None:
        refuse_calibrations_under_tta(tta, Path(args.adapters))
    device = resolve_device(args.device)
    precision = run_precision_of(args, device)
    model, saved = load_finished(args.checkpoint)
    model.to(device).eval()
    data = open_spec(args.data)
    check_input_size(saved, data, args.checkpoint)
    before_evaluating(data, args, n_adapt)  # what would fail every person: one line, not a table of failures
    if args.adapters is not None:
        refuse_adapters_none_fits(model, data, args.adapters, args.checkpoint)
    if tta is not None and saved.get("input_size"):
        tta.check_size(tuple(saved["input_size"]))
    options = {"adapters": args.adapters, "n_adapt": n_adapt, "batch_size": args.batch_size}
    with forward_precision(precision):
        report = evaluate(model, data, **options, progress=not args.quiet, after=args.label)
        if tta is not None:  # the same persons and images through the test-time augmentation
            column = tta_column(tta.name)
            augmented = evaluate(
                model,
                data,
                **options,
                progress=False,
                before=column,
                after=f"{args.label} + {column}",
                predictor=tta.wrap,
            )
            report.columns.update(augmented.columns)
            report.without_tta.update({column: next(iter(report.columns)), f"{args.label} + {column}": args.label})
    meta = {"checkpoint": str(args.checkpoint), "adapters": args.adapters, "data": args.data, "precision": precision}
    if tta is not None:
        meta["tta"] = {"kind": tta.name, "forward_passes": tta.passes}
    report.meta.update(meta)
    print(report.format_table(failures=False))  # the table on stdout; raise_if_incomplete says who failed
    if args.json:
        print(f"written {report.save_json(args.json)}")
    raise_if_incomplete(report, args.allow_partial)


# ----------------------------------------------------------------------------- demo


def _demo(args: argparse.Namespace) -> None:
    from alfa.fileio import safe_filename
    from alfa.gaze.data.registry import split_spec
    from alfa.gaze.devices import resolve_device
    from alfa.gaze.pipeline import check_demo_specs, demo_configs, run_demo, seeded, summary_table
    from alfa.gaze.precision import forward_precision

    device = resolve_device(args.device)
    precision = run_precision_of(args, device)
    configs = [seeded(c, args.seed) for c in demo_configs(cache_dir=args.cache_dir)]
    if args.targets:  # only the first part (the E source), on these targets
        configs = [dataclasses.replace(configs[0], targets=tuple(args.targets))]
    for config in configs:  # every part's specs before the first part renders its source
        check_demo_specs(config)
    seed_torch_deterministic(args.seed)
    results, total = [], 0.0
    for config in configs:
        name = Path(split_spec(config.source)[1]).name
        config = dataclasses.replace(config, out_dir=str(Path(args.out) / safe_filename(name)))
        if not args.quiet:
            print(f"\n== source {config.source}", flush=True)
        with forward_precision(precision):
            result = run_demo(config, rebuild=args.rebuild, progress=not args.quiet, device=device)
        if args.quiet:  # the tables a run with progress printed as each target finished
            print("\n\n".join(r.format_table() for r in result.reports.values()))
        print(f"\n{result.source_line()}")
        origin = "cached source model" if result.from_cache else "source model built"
        print(f"{origin} ({Path(config.cache_dir)}); wall time {result.seconds['total']:.0f} s")
        print(f"results: {result.json_path}" + (f"; figure: {result.figure_path}" if result.figure_path else ""))
        print("\n".join(result.verdict), flush=True)  # each part's, as it ends: said even if a later part fails
        results.append(result)
        total += result.seconds["total"]
    print()
    print(summary_table({k: v for r in results for k, v in r.reports.items()}))
    print(f"\ntotal wall time {total:.0f} s")


# ----------------------------------------------------------------------------- the options
# Each default is read from the config (or function) it sets, so it is written in one place only.


def _pretrain_arguments(p: argparse.ArgumentParser) -> None:
    from alfa.gaze.pipeline import DemoConfig
    from alfa.gaze.train import TrainConfig

    p.add_argument("--data", required=True, help=data_help("the source data", "synthetic:eth"))
    p.add_argument("--val-data", help="held-out source persons, as a dataset spec (default: a share of --data's)")
    p.add_argument("--model", default=DemoConfig().model, help=MODEL_HELP)
    p.add_argument(
        "--out", default="runs/pretrain", help="checkpoint folder (default %(default)s; resumes a run there)"
    )
    _train_options(p, f"training epochs (real: {TrainConfig().epochs})")
    device_option(p)


def _truncate_arguments(p: argparse.ArgumentParser) -> None:
    from alfa.gaze.train import TruncateConfig

    truncation = TruncateConfig()
    p.add_argument("--checkpoint", required=True, help="the dense model alfa pretrain wrote (model.safetensors)")
    p.add_argument("--data", required=True, help=data_help("the source data the model was trained on", "synthetic:eth"))
    p.add_argument(
        "--val-data",
        help="the held-out source persons, as a dataset spec (default: those pre-training held out, where the "
        "checkpoint records them)",
    )
    p.add_argument(
        "--rank", type=at_least(1), default=truncation.rank, help="SVD rank d of each layer (default %(default)s)"
    )
    p.add_argument("--out", default="runs/recovered", help="checkpoint folder (default %(default)s)")
    _train_options(p, f"recovery epochs (real: {truncation.recovery.epochs})")
    device_option(p)


def _personalize_arguments(p: argparse.ArgumentParser) -> None:
    from alfa.adapters import METHODS, AlfaConfig
    from alfa.gaze.objectives import OBJECTIVES
    from alfa.gaze.personalize import PersonalizeConfig
    from alfa.gaze.recipes import DEFAULT_RECIPE, PAPER_RECIPE, RECIPE_NAMES

    alfa, recipe = AlfaConfig(), PersonalizeConfig()
    p.add_argument("--checkpoint", required=True, help="the truncated base alfa truncate wrote (model.safetensors)")
    p.add_argument("--data", required=True, help=data_help("the target persons"))
    p.add_argument(
        "--out", default="runs/adapters", help="adapter folder (default %(default)s; persons already done are skipped)"
    )
    p.add_argument(
        "--method",
        default="alfa",
        help=f"the adapter method (docs/adapters.md): {', '.join(sorted(METHODS))} (default %(default)s)",
    )
    p.add_argument(
        "--heads", type=at_least(1), help=f"attention heads H of a method that has them (Alfa's default {alfa.heads})"
    )
    p.add_argument(
        "--adapter-rank",
        type=at_least(1),
        help=f"low rank r of a method that has one (Alfa's and LoRA's default {alfa.rank})",
    )
    p.add_argument(
        "--option", action="append", metavar="KEY=VALUE", help="another option of the method's config (repeatable)"
    )
    p.add_argument("--init", help="tpgaze: start every person from these meta-trained prompts (alfa tpgaze meta-train)")
    p.add_argument(
        "--preset",
        choices=PRESETS,
        default="real",
        help="the augmentation: real: the paper's; demo: the demo's smaller blur (default %(default)s)",
    )
    p.add_argument(
        "--recipe",
        choices=RECIPE_NAMES,
        default="default",
        help="default (the default): each method's own recipe, chosen without target labels (for alfa: "
        f"{DEFAULT_RECIPE.label}; docs/flip-premise.md §4); paper: the paper's ({PAPER_RECIPE.label}); tpgaze "
        "always keeps its own, and --method full --loss ruda is RUDA with its own (one learning rate, 1e-4, on "
        "every parameter; docs/gaze.md). --steps, --lr, --pitch-anchor and the branch options override it",
    )
    p.add_argument("--steps", type=at_least(1), help="optimizer steps per person (default: the recipe's)")
    p.add_argument("--lr", type=positive_rate, help="AdamW base learning rate (default: the recipe's)")
    p.add_argument("--n-adapt", type=at_least(1), help=f"adaptation images per person (default {recipe.n_adapt})")
    p.add_argument(
        "--loss",
        choices=tuple(OBJECTIVES),
        help="the personalization objective: "
        + "; ".join(f"{name}, {o.description}" for name, o in OBJECTIVES.items())
        + f" (default {recipe.loss})",
    )
    branches = p.add_mutually_exclusive_group()
    branches.add_argument(
        "--train-both-branches",
        action="store_true",
        help="flip loss: train through the mirrored image's prediction too (default: the recipe's choice)",
    )
    branches.add_argument(
        "--detach-flipped",
        action="store_true",
        help="flip loss: the mirrored image's prediction is a fixed target, as in the paper (default: the recipe's "
        "choice)",
    )
    p.add_argument(
        "--pitch-anchor",
        type=non_negative_number,
        metavar="W",
        help="not in the paper: keep the batch's mean predicted pitch where it was before personalization, with "
        "weight W (0: off; default: the recipe's)",
    )
    p.add_argument("--persons", help="comma-separated person ids (default: all)")
    seed_option(p, "the adapter init and augmentation draws per person", recipe.seed)
    p.add_argument(
        "--replace",
        action="store_true",
        help="if --out holds adapters of another dataset, method, recipe or base, remove them and redo (by default "
        "that is refused)",
    )
    allow_partial_option(p)
    quiet_option(p)
    device_option(p)
    threads_option(p)
    precision_option(p)


def _evaluate_arguments(p: argparse.ArgumentParser) -> None:
    from alfa.gaze.evaluate import EVAL_BATCH_SIZE
    from alfa.gaze.personalize import PersonalizeConfig

    recipe = PersonalizeConfig()
    p.add_argument("--checkpoint", required=True, help="the model the adapters were trained on (model.safetensors)")
    p.add_argument("--data", required=True, help=data_help("the target persons"))
    p.add_argument(
        "--adapters",
        help="folder of per-person files from alfa personalize or alfa calibrate (without it: the model alone)",
    )
    p.add_argument(
        "--label",
        help="column name of the results with adapters (default: calibrated for alfa calibrate's folder, else "
        "personalized)",
    )
    tta_option(p, "also score the base and every adapter")
    p.add_argument("--flip-tta", action="store_true", help="the same as --tta flip (kept for existing scripts)")
    p.add_argument(
        "--n-adapt",
        type=at_least(0),
        help="the first N images of each person, used for adaptation, are not scored (default: the count the "
        f"adapters record, else {recipe.n_adapt})",
    )
    p.add_argument(
        "--batch-size", type=at_least(1), default=EVAL_BATCH_SIZE, help="images per forward (default %(default)s)"
    )
    p.add_argument("--json", help="also write the report here (JSON)")
    allow_partial_option(p)
    quiet_option(p)
    device_option(p)
    threads_option(p)
    precision_option(p, trains=False)


def _demo_arguments(p: argparse.ArgumentParser) -> None:
    from alfa.gaze.pipeline import DemoConfig

    demo = DemoConfig()
    p.add_argument(
        "--out",
        default=demo.out_dir,
        help="results, figures and adapters, one folder per source (default %(default)s)",
    )
    p.add_argument("--cache-dir", default=demo.cache_dir, help="source model cache (default %(default)s)")
    p.add_argument("--rebuild", action="store_true", help="train the source models again instead of reusing the cache")
    p.add_argument(
        "--targets",
        nargs="+",
        metavar="SPEC",
        help="run only the first source (synthetic eth) on these target dataset specs (default: synthetic mpii, "
        f"then the studio source on synthetic mpii-window); the last {demo.calibrate.pool} images of each person "
        "are the labelled (user-calibration) column's pool and never scored",
    )
    seed_option(
        p, "every draw: the source model's weights and batches, its recovery, personalization, calibration", demo.seed
    )
    quiet_option(p)
    device_option(p)
    threads_option(p)
    precision_option(p, note="the source models train in fp32, their recipe's precision")


# ----------------------------------------------------------------------------- the commands, in `alfa --help` order

PRETRAIN = Command(
    "pretrain",
    help="train a dense gaze model on the source data (resumable)",
    description="Train a gaze model (yaw and pitch from a face crop) on the source data, validating on held-out "
    "source persons, and write its checkpoint to --out; an interrupted run resumes. The first step of the "
    "pipeline: pretrain, truncate, personalize, evaluate (docs/gaze.md §1).",
    add_arguments=_pretrain_arguments,
    run=_pretrain,
    outputs={"out": True},
    folder_kinds={"out": "own"},
    extra="gaze",
    distributed=True,
)
TRUNCATE = Command(
    "truncate",
    help="SVD-truncate a pre-trained model and recover it on the source",
    description="Replace each layer's weights by their rank-d SVD factors, then fine-tune the truncated model on "
    "the source data to recover its accuracy; the result is the base every adapter is trained on "
    "(docs/gaze.md §2).",
    add_arguments=_truncate_arguments,
    run=_truncate,
    outputs={"out": True},
    folder_kinds={"out": "own"},
    extra="gaze",
    distributed=True,
)
PERSONALIZE = Command(
    "personalize",
    help="train one adapter per target person from its first few images, without labels",
    description="For each target person, train a small adapter on the truncated base from the person's first "
    "--n-adapt images, without their gaze labels (by default the flip loss: a mirrored face gets the mirrored "
    "gaze), and save it as <person>.safetensors in --out; alfa evaluate scores them (docs/gaze.md §3).",
    add_arguments=_personalize_arguments,
    run=_personalize,
    outputs={"out": True},
    folder_kinds={"out": "users"},
    extra="gaze",
)
EVALUATE = Command(
    "evaluate",
    help="per-person angular error, before and after personalization",
    description="Score a model on each target person: the angular error (degrees) on the images after the first "
    "--n-adapt, of the model alone and, with --adapters, with each person's adapter or calibration file; prints "
    "a table (docs/gaze.md §4).",
    add_arguments=_evaluate_arguments,
    run=_evaluate,
    outputs={"json": False},
    extra="gaze",
)
DEMO = Command(
    "demo",
    help="the whole chain on the synthetic benchmark: table, JSON, figure",
    description="Run the whole chain twice on small synthetic worlds, a symmetric pair and an asymmetric one: "
    "train and truncate the source model (cached), then score each target person with the model alone, flip-TTA "
    "(averaged with its prediction on the mirrored image), Alfa under its default and the paper's recipe, and a "
    "user calibration from a few labelled images. Writes a results JSON and a figure per source and prints the "
    "table (docs/gaze.md §5).",
    add_arguments=_demo_arguments,
    run=_demo,
    outputs={"out": True, "cache_dir": True},
    # not held: a cache every demo shares (each source model in its own keyed folder), by default runs/cache
    shared=frozenset({"cache_dir"}),
    extra="gaze",
)
