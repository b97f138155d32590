"""The ``alfa tpgaze`` command: ``meta-train`` (meta-learn the prompts on the source) and
``personalize`` (one prompt file per target person, from the meta-trained prompts).

Evaluation is the common one: ``alfa evaluate --checkpoint BASE --data TARGET --adapters FOLDER``.
Each handler only turns options into configs and calls :mod:`alfa.gaze.tpgaze`.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
from typing import Any

from .gaze import open_spec, seed_torch_deterministic
from .guards import before_personalizing, check_val_data, persons_of, prompts_sized_to
from .options import (
    allow_partial_option,
    at_least,
    data_help,
    device_option,
    fraction,
    non_negative_number,
    positive_rate,
    precision_option,
    quiet_option,
    run_precision_of,
    seed_option,
    threads_option,
)
from .registry import Command

__all__ = ["TPGAZE"]


def _load_base(path: str, device_name: str):
    """The base model of ``path`` on ``--device``, in eval mode; its saved config; the device."""
    from alfa.gaze.devices import resolve_device

    from .guards import load_finished

    device = resolve_device(device_name)
    model, saved = load_finished(path)
    _refuse_a_model_without_the_prompted_convs(model, path)
    return model.to(device).eval(), saved, device


def _refuse_a_model_without_the_prompted_convs(model: Any, path: str) -> None:
    """TPGaze's prompts go before a ResNet's first convs; a model without them (a FAZE model, a ViT) failed with
    the adapter's "no layer to adapt" and its regular expression."""
    import re

    from alfa.adapters.prompt import TPGAZE_TARGET

    if not any(re.search(TPGAZE_TARGET, name) for name, _ in model.named_modules()):
        raise ValueError(
            f"{path} is a {type(model).__name__}: TPGaze puts its prompts before a ResNet's first convolutions "
            "(conv1, layer1, layer2), which it does not have; give a ResNet gaze model (alfa pretrain --model "
            "resnet18_gaze)"
        )


def _kib(n: int) -> str:
    return f"{n / 1024:.1f} KiB"


# ----------------------------------------------------------------------------- meta-train


def _meta_train(args: argparse.Namespace) -> None:
    from alfa.adapters.prompt import TPGazeConfig
    from alfa.gaze.precision import forward_precision
    from alfa.gaze.tpgaze import MetaTrainConfig, meta_train_prompts, square_image_size
    from alfa.gaze.train import check_input_size, held_out_persons

    check_val_data(args)
    changes = {
        "epochs": args.epochs,
        "steps_per_epoch": args.steps_per_epoch,
        "batch_size": args.batch_size,
        "outer_lr": args.outer_lr,
        "inner_lr": args.inner_lr,
        "inner_optimizer": args.inner_optimizer,
        "inner_steps": args.inner_steps,
        "query": args.query,
        "val_fraction": args.val_fraction,
        "seed": args.seed,
    }
    config = dataclasses.replace(MetaTrainConfig(), **changes)
    model, saved, device = _load_base(args.checkpoint, args.device)
    data = open_spec(args.data)
    if args.val_data:
        val, val_persons = open_spec(args.val_data), None
    else:
        val_persons = held_out_persons(saved, data, args.checkpoint)
        val = data if val_persons else None
    for checked in {id(d): d for d in (data, val) if d is not None}.values():
        check_input_size(saved, checked, args.checkpoint)
    size = square_image_size(data, data.person_indices(data.persons()[0])[0])
    prompt = TPGazeConfig(image_size=size, init_std=args.init_std)
    seed_torch_deterministic(config.seed)
    with forward_precision(run_precision_of(args, device)):
        result = meta_train_prompts(
            model,
            data,
            config,
            args.out,
            prompt=prompt,
            val_dataset=val,
            val_persons=val_persons,
            progress=not args.quiet,
        )
    last = result.history[-1] if result.history else {}
    nan = float("nan")
    base, init = result.initial_val_error.get("base", nan), result.initial_val_error.get("init", nan)
    print(
        f"TPGaze meta-training on {data.name}: {_counted(len(result.history), 'epochs')} of "
        f"{_counted(config.steps_per_epoch, 'meta-steps')}, {result.trainable_parameters} prompt values. Error on "
        f"{_counted(len(result.val_persons), 'held-out source persons')}: "
        f"source model {base:.2f} deg, initial prompts {init:.2f} deg, "
        f"meta-trained {last.get('val_error', nan):.2f} deg"
    )
    print(f"meta-trained prompts: {result.prompts} ({_kib(result.prompts.stat().st_size)})")


def _counted(count: int, plural: str) -> str:
    """``"2 epochs"``, ``"1 epoch"``: ``plural`` ends in its plural noun's ``s``."""
    return f"{count} {plural if count != 1 else plural.removesuffix('s')}"


# ----------------------------------------------------------------------------- personalize


def _personalize(args: argparse.Namespace) -> None:
    from alfa.gaze.personalize import PersonalizeConfig, personalize_dataset
    from alfa.gaze.pipeline import DemoConfig
    from alfa.gaze.precision import forward_precision
    from alfa.gaze.tpgaze import tpgaze_method, tpgaze_recipe
    from alfa.gaze.train import check_input_size

    if (args.meta is None) != args.no_meta:  # neither, or both (one would be ignored)
        raise ValueError(
            "pass --meta PROMPTS (from `alfa tpgaze meta-train`) or --no-meta to start from Gaussian prompts, "
            "not " + ("both" if args.no_meta else "neither")
        )
    base = DemoConfig().personalize if args.preset == "demo" else PersonalizeConfig()
    changes = {"steps": args.steps, "lr": args.lr, "n_adapt": args.n_adapt, "seed": args.seed}
    config = tpgaze_recipe(base, **{k: v for k, v in changes.items() if v is not None})
    model, saved, device = _load_base(args.checkpoint, args.device)
    data = open_spec(args.data)
    check_input_size(saved, data, args.checkpoint)  # once, not a failure per person
    persons = persons_of(args.persons, data)
    method = prompts_sized_to(data, tpgaze_method(model, data, args.meta), args.meta and f"--meta {args.meta}")
    # the checks alfa personalize --method tpgaze makes; the folder's adapters of another method, recipe or base
    # are not this run's to replace unasked
    before_personalizing(model, data, persons, method, config, args.out, args.replace)
    seed_torch_deterministic(config.seed)
    with forward_precision(run_precision_of(args, device)):
        run = personalize_dataset(model, data, method, config, args.out, persons=persons, progress=not args.quiet)
    counts = run.counts()
    files = [o.adapter for o in run.persons.values() if o.adapter]
    size = f", {_kib(os.path.getsize(files[0]))} per person" if files else ""
    print(
        f"tpgaze personalization of {data.name} (Adam lr {config.lr}, {config.steps} steps, {config.n_adapt} images): "
        f"{counts['ok']} done, {counts['skipped']} already there, {counts['failed']} failed; "
        f"prompt files in {args.out}{size}"
    )
    run.raise_if_failed(args.allow_partial)


# ----------------------------------------------------------------------------- the options
# Each default is read from the config it sets (MetaTrainConfig, TPGazeConfig, the TPGaze recipe).


def _meta_train_arguments(p: argparse.ArgumentParser) -> None:
    from alfa.adapters.prompt import TPGazeConfig
    from alfa.gaze.tpgaze import INNER_OPTIMIZERS, QUERIES, MetaTrainConfig

    meta = MetaTrainConfig()
    p.add_argument(
        "--checkpoint", required=True, help="the source model, from alfa pretrain or alfa truncate (model.safetensors)"
    )
    p.add_argument("--data", required=True, help=data_help("the source data the model was trained on", "synthetic:eth"))
    p.add_argument(
        "--val-data",
        help="held-out source persons, as a dataset spec (default: those the checkpoint's training held out)",
    )
    p.add_argument("--out", default="runs/tpgaze-meta", help="output folder (default %(default)s; resumes a run there)")
    g = p.add_argument_group("meta-training (defaults: TPGaze's published code's; docs/tpgaze.md)")
    g.add_argument("--epochs", type=at_least(1), default=meta.epochs, help="epochs (default %(default)s)")
    g.add_argument(
        "--steps-per-epoch",
        type=at_least(1),
        default=meta.steps_per_epoch,
        help="meta-steps per epoch (default %(default)s)",
    )
    g.add_argument(
        "--batch-size",
        type=at_least(1),
        default=meta.batch_size,
        help="images per support batch, which the inner step adapts on, and per query batch, which the outer step "
        "scores (default %(default)s)",
    )
    g.add_argument(
        "--outer-lr", type=positive_rate, default=meta.outer_lr, help="Adam lr of the outer step (default %(default)g)"
    )
    g.add_argument(
        "--inner-lr", type=positive_rate, default=meta.inner_lr, help="lr of the inner step (default %(default)g)"
    )
    g.add_argument(
        "--inner-optimizer",
        choices=INNER_OPTIMIZERS,
        default=meta.inner_optimizer,
        help="optimizer of the inner step (default %(default)s)",
    )
    g.add_argument(
        "--inner-steps",
        type=at_least(1),
        default=meta.inner_steps,
        help="inner steps per meta-step (default %(default)s)",
    )
    g.add_argument(
        "--query",
        choices=QUERIES,
        default=meta.query,
        help="the query batch: the next batch, or the support batch again (default %(default)s)",
    )
    g.add_argument(
        "--init-std",
        type=non_negative_number,
        default=TPGazeConfig().init_std,
        help="standard deviation of the prompts' Gaussian initial values (default %(default)s)",
    )
    g.add_argument(
        "--val-fraction",
        type=fraction,
        default=meta.val_fraction,
        help="share of source persons held out when neither --val-data nor the checkpoint names them (default "
        "%(default)s)",
    )
    seed_option(g, "the prompt init and task sampling", meta.seed)
    quiet_option(g)
    device_option(p)
    threads_option(p)
    # fp16 is not offered: the meta-gradients are taken outside any optimizer a gradient scaler could unscale
    precision_option(p, choices=("fp32", "bf16"))


def _personalize_arguments(p: argparse.ArgumentParser) -> None:
    from alfa.gaze.tpgaze import tpgaze_recipe

    recipe = tpgaze_recipe()
    p.add_argument("--checkpoint", required=True, help="the model the prompts were meta-trained on")
    p.add_argument("--data", required=True, help=data_help("the target persons"))
    p.add_argument("--meta", help="the meta-trained prompts (prompts.safetensors from alfa tpgaze meta-train)")
    p.add_argument(
        "--no-meta",
        action="store_true",
        help="instead of --meta: start from random Gaussian prompts (no meta-training)",
    )
    p.add_argument(
        "--out",
        default="runs/tpgaze-adapters",
        help="prompt-file folder (default %(default)s; persons already done with the same recipe are skipped)",
    )
    p.add_argument(
        "--preset",
        choices=("real", "demo"),
        default="real",
        help="the augmentation: real: the paper's; demo: the demo's smaller blur (default %(default)s)",
    )
    p.add_argument("--steps", type=at_least(1), help=f"Adam steps per person (default {recipe.steps})")
    p.add_argument("--lr", type=positive_rate, help=f"Adam learning rate (default {recipe.lr:g})")
    p.add_argument("--n-adapt", type=at_least(1), help=f"adaptation images per person (default {recipe.n_adapt})")
    p.add_argument("--persons", help="comma-separated person ids (default: all)")
    seed_option(p, "the prompt init and augmentation draws per person", recipe.seed)
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


TPGAZE = Command(
    "tpgaze",
    help="the TPGaze baseline: meta-trained padding prompts",
    description="TPGaze, the test-time personalization baseline: prompts (learned values in place of the zero "
    "padding of the first convolutions) meta-trained on the source, then trained per target person without "
    "labels; alfa evaluate scores the prompt files as it scores adapters (docs/tpgaze.md).",
    extra="gaze",
    subcommands=(
        Command(
            "meta-train",
            help="meta-train the prompts on the source (resumable)",
            description="Meta-train TPGaze's prompts on the source persons, with the model frozen, so that a few "
            "label-free steps on a new person lower its error; writes prompts.safetensors to --out (docs/tpgaze.md).",
            add_arguments=_meta_train_arguments,
            run=_meta_train,
            outputs={"out": True},
            folder_kinds={"out": "own"},
        ),
        Command(
            "personalize",
            help="one prompt file per target person, from the meta-trained prompts",
            description="For each target person, train the prompts from --meta (or random ones with --no-meta) on "
            "the person's first --n-adapt images, without labels, and save them in --out (docs/tpgaze.md).",
            add_arguments=_personalize_arguments,
            run=_personalize,
            outputs={"out": True},
            folder_kinds={"out": "users"},
        ),
    ),
)
