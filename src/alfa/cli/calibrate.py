"""The user-calibration commands: ``alfa calibrate`` (one file per person from ``k`` labelled images) and ``alfa
faze`` (``train``: DT-ED with its gaze MLP; ``meta-train``: the MLP by MAML). Scoring is the common command:
``alfa evaluate --checkpoint B --data SPEC --adapters DIR`` (it scores each person's images after the
calibration pool, never the ``k``). Each handler turns options into configs and calls :mod:`alfa.gaze.calibrate`
or :mod:`alfa.gaze.faze_train`.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .gaze import open_spec, seed_torch_deterministic
from .guards import note_what_serve_refuses, persons_of
from .options import (
    allow_partial_option,
    at_least,
    data_help,
    device_option,
    key_values,
    non_negative_number,
    positive_rate,
    quiet_option,
    seed_option,
    threads_option,
)
from .registry import Command

if TYPE_CHECKING:
    from torch import nn

__all__ = ["CALIBRATE", "FAZE"]


def _load(path: str, device_name: str):
    from alfa.gaze.devices import resolve_device

    from .guards import load_finished

    device = resolve_device(device_name)
    model, saved = load_finished(path)
    return model.to(device).eval(), saved


# ----------------------------------------------------------------------------- calibrate


def _calibrate_config(args: argparse.Namespace):
    from alfa.gaze.calibrate import CalibrateConfig

    options = key_values(args.option)
    every_image = args.k == "all"
    if every_image and (args.pool is not None or args.draw is not None):
        flag = "--pool" if args.pool is not None else "--draw"
        raise ValueError(f"{flag} chooses the k among a person's images; --k all labels every one of them")
    changes = {
        "method": args.method,
        "k": None if every_image else args.k,
        "every_image": every_image,
        "draw": args.draw,
        "pool": args.pool,
        "seed": args.seed,
        "affine_ridge": args.affine_ridge,
        "feature_ridge": args.feature_ridge,
        "offset_prior": args.offset_prior,
        "steps": args.steps,
        "lr": args.lr,
        "adapter_method": args.adapter_method,
        "adapter_options": options,
        "flip_weight": args.flip_weight,
        "faze_lr": args.faze_lr,
        "faze_steps": args.faze_steps,
    }
    config = CalibrateConfig(**{k: v for k, v in changes.items() if v is not None})
    config.validate()
    for dest, methods in RECIPE_OPTIONS.items():  # an option the method never reads is a mistake, not a no-op
        if getattr(args, dest) is not None and config.method not in methods:
            flag = "--" + dest.replace("_", "-")
            raise ValueError(f"{flag} sets the {' and '.join(methods)} method's recipe, not {config.method}'s")
    return config


RECIPE_OPTIONS = {
    "affine_ridge": ("affine",),
    "feature_ridge": ("ridge",),
    "steps": ("last-layer", "adapter"),
    "lr": ("last-layer", "adapter"),
    "adapter_method": ("adapter",),
    "option": ("adapter",),
    "flip_weight": ("last-layer", "adapter"),
    "faze_lr": ("faze",),
    "faze_steps": ("faze",),
}
"""Each recipe option of ``alfa calibrate`` and the methods that read it (docs/user-calibration.md)."""


def _refuse_faze_on_another_model(model: nn.Module, method: str, checkpoint: str) -> None:
    """--method faze adapts a FAZE model's gaze MLP: on any other model every person failed in turn, the first
    with the advice to give --faze-lr and --faze-steps."""
    from alfa.gaze.faze import FazeGaze

    if method == "faze" and not isinstance(model, FazeGaze):
        raise ValueError(
            f"--method faze adapts a FAZE model (alfa faze train, then alfa faze meta-train); {checkpoint} is a "
            f"{type(model).__name__}: choose another --method"
        )


def _meta_training_recipe(saved: dict, checkpoint: str) -> tuple[float, int] | None:
    """PS-GEN's default rate and steps: those meta-training used, as the checkpoint records them (``None`` where it
    records none); a record of another kind is damage, named before anything is removed."""
    maml = saved.get("extra", {}).get("maml")
    if maml is None:
        return None
    from alfa.adapters.groups import is_number

    config = maml.get("config") if isinstance(maml, dict) else None
    lr, steps = (config.get("inner_lr"), config.get("inner_steps")) if isinstance(config, dict) else (None, None)
    if not (is_number(lr) and lr > 0 and is_number(steps) and isinstance(steps, int) and steps >= 1):
        raise ValueError(
            f"{checkpoint}: damaged checkpoint header (its meta-training record 'maml' has no config with a "
            "positive inner_lr and a whole number of inner_steps)"
        )
    return float(lr), steps


def _adapter_fitted_to(config: Any, model: nn.Module, data: Any) -> Any:
    """``--method adapter``'s checks before any person, as ``alfa personalize`` makes them (each person failed in
    turn): the method's sizes fit the model's layers, and TPGaze's prompts are sized to the data's images (its
    default, 224, failed every person of other data) unless ``--option image_size=N`` chose them."""
    import dataclasses

    from alfa.adapters import config_from_dict

    from .guards import check_method_fits, prompts_sized_to

    method = config_from_dict(config.adapter_method, dict(config.adapter_options))
    sized_by = "--option image_size" if "image_size" in config.adapter_options else None
    sized = prompts_sized_to(data, method, sized_by)
    if sized is not method:  # the size goes into the recipe the files record, as if given
        config = dataclasses.replace(config, adapter_options={**config.adapter_options, "image_size": sized.image_size})
    check_method_fits(model, sized)
    return config


def _calibrate(args: argparse.Namespace) -> None:
    from alfa.gaze.calibrate import calibrate_dataset, make_room, refuse_a_pool_no_one_has
    from alfa.gaze.train import check_input_size

    config = _calibrate_config(args)
    model, saved = _load(args.checkpoint, args.device)
    _refuse_faze_on_another_model(model, config.method, args.checkpoint)
    data = open_spec(args.data)
    check_input_size(saved, data, args.checkpoint)
    out = Path(args.out)
    persons = persons_of(args.persons, data)
    refuse_a_pool_no_one_has(data, persons, config)
    defaults = _meta_training_recipe(saved, args.checkpoint)
    if config.method == "faze" and defaults is None and (config.faze_lr is None or config.faze_steps is None):
        # every person would fail alike: one line before any work
        raise ValueError(
            f"--method faze: {args.checkpoint} records no meta-training (alfa faze meta-train), so PS-GEN has no "
            "rate and steps of its own: give --faze-lr and --faze-steps"
        )
    if config.method == "adapter":
        config = _adapter_fitted_to(config, model, data)
    make_room(out, data, config, args.replace, model)  # last of the refusals: with --replace it removes files
    if config.method == "adapter":  # the corrections adapt nothing dense
        besides = "; offset, affine, ridge and last-layer are corrections any base serves"
        note_what_serve_refuses(model, "calibrate", config.adapter_method, args.checkpoint, besides)
    seed_torch_deterministic(config.seed)
    record = calibrate_dataset(
        model, data, config, out, persons=persons, faze_defaults=defaults, progress=not args.quiet
    )
    done = [e for e in record["persons"].values() if e["status"] in ("ok", "skipped")]
    found = sum(e["status"] == "skipped" for e in done)
    failed = {p: e["error"] for p, e in record["persons"].items() if e["status"] == "failed"}
    for person, error in failed.items():
        print(f"calibration of {person!r} failed: {error}")
    pace = f", {sum(e['seconds'] for e in done) / len(done):.3f} s and " if done else ""
    size = f"{sum(e['bytes'] for e in done) / len(done) / 1024:.1f} KiB per person" if done else ""
    labelled = (
        "on every image of each person (none is left to score)"
        if config.every_image
        else f"at k = {config.k} ({config.draw} draws from the first {config.pool} images)"
    )
    print(
        f"{config.method} user calibration of {data.name} {labelled}: {len(done) - found} done, {found} already "
        f"there, {len(failed)} failed{pace}{size}; files in {out}"
    )
    if failed and (not done or not args.allow_partial):
        raise RuntimeError(f"{len(failed)} of {len(record['persons'])} persons failed (listed above)")


def _labelled_count(text: str) -> int | str:
    """An argparse type for ``--k``: a whole number of at least 1, or ``all``."""
    return "all" if text == "all" else at_least(1)(text)


def _calibrate_arguments(p: argparse.ArgumentParser) -> None:
    from alfa.gaze.calibrate import DEFAULT_REASON, DRAWS, USER_CALIBRATIONS, CalibrateConfig

    d = CalibrateConfig()
    methods = "; ".join(
        f"{c.name}{f' (k >= {c.min_k})' if c.min_k > 1 else ''}: {c.description}" for c in USER_CALIBRATIONS.values()
    )
    p.description = (
        "User calibration: for each person, a file fitted to k labelled images drawn from the person's first --pool "
        f"images; alfa evaluate --adapters scores it on the images after the pool (--k all fits every image, as for a "
        f"user's own session, and leaves none to score). The methods: {methods}. "
        f"{DEFAULT_REASON[0].upper()}{DEFAULT_REASON[1:]}. The recipes: docs/user-calibration.md."
    )
    p.add_argument("--checkpoint", required=True, help="the gaze model (any; a FAZE one for --method faze)")
    p.add_argument("--data", required=True, help=data_help("the target persons, with their gaze labels"))
    p.add_argument("--out", required=True, help="output folder: <person>.safetensors and personalization.json")
    p.add_argument(
        "--k",
        type=_labelled_count,
        default=d.k,
        help="labelled images per person, or 'all': every image of each person, as for a user's own 9-point session "
        "(nothing is left for alfa evaluate to score; default %(default)s)",
    )
    p.add_argument(
        "--method", choices=tuple(USER_CALIBRATIONS), default=d.method, help="calibration method (default %(default)s)"
    )
    p.add_argument(
        "--draw",
        choices=DRAWS,
        help=f"how the k are drawn from the pool: at random, or spread over the person's gaze range (default {d.draw})",
    )
    p.add_argument("--pool", type=at_least(1), help=f"first images per person the k come from (default {d.pool})")
    p.add_argument("--persons", help="comma-separated person ids (default: all)")
    p.add_argument(
        "--replace",
        action="store_true",
        help="replace an earlier run's files in --out (without it, a run of the same recipe there is resumed)",
    )
    g = p.add_argument_group("each method's recipe (the defaults are the declared ones: docs/user-calibration.md)")
    g.add_argument(
        "--affine-ridge",
        type=non_negative_number,
        help=f"affine: weight of ‖A − I‖², which pulls the map toward the identity (default {d.affine_ridge:g})",
    )
    g.add_argument(
        "--feature-ridge",
        type=non_negative_number,
        help="ridge: weight of the head's change ‖W′ − W‖², relative to the features' mean squared norm "
        f"(default {d.feature_ridge:g})",
    )
    g.add_argument(
        "--offset-prior",
        type=non_negative_number,
        metavar="N",
        help="offset/affine: shrink the offset toward zero by k/(k + N), as if N more images had no error (0: no "
        f"shrinkage; default {d.offset_prior:g}; docs/user-calibration.md §5.1)",
    )
    g.add_argument("--steps", type=at_least(1), help=f"last-layer/adapter: AdamW steps (default {d.steps})")
    g.add_argument("--lr", type=positive_rate, help=f"last-layer/adapter: AdamW learning rate (default {d.lr:g})")
    g.add_argument(
        "--adapter-method", help=f"adapter: the adapter method, one of alfa personalize's (default {d.adapter_method})"
    )
    g.add_argument(
        "--option",
        action="append",
        metavar="KEY=VALUE",
        help="adapter: an option of the adapter method's config (repeatable)",
    )
    g.add_argument(
        "--flip-weight",
        type=non_negative_number,
        help="last-layer/adapter: weight of the flip loss on the pool's unlabelled images (0: labels only; default "
        f"{d.flip_weight:g})",
    )
    g.add_argument(
        "--faze-lr",
        type=positive_rate,
        help="faze: learning rate of PS-GEN, the per-person adaptation (default: the one meta-training used)",
    )
    g.add_argument("--faze-steps", type=at_least(1), help="faze: PS-GEN steps (default: the number meta-training used)")
    seed_option(p, "the draws and any adapter's initial weights", d.seed)
    allow_partial_option(p)
    quiet_option(p)
    device_option(p)
    threads_option(p)


# ----------------------------------------------------------------------------- faze


def _checkpoint_every_option(p: argparse.ArgumentParser, default: int) -> None:
    p.add_argument(
        "--checkpoint-every",
        type=at_least(1),
        default=default,
        help="steps between two saved states; a rerun of the same command resumes from the last (default %(default)s)",
    )


def _faze_train(args: argparse.Namespace) -> None:
    from alfa.gaze.faze_train import FazeTrainConfig, train_faze

    weights = (args.lambda_recon, args.lambda_ec, args.lambda_gaze)
    config = FazeTrainConfig(
        steps=args.steps,
        batch_size=args.batch_size,
        lr=args.lr,
        weights=weights,
        seed=args.seed,
        checkpoint_every=args.checkpoint_every,
    )
    kwargs = {"appearance": args.appearance, "gaze_features": args.gaze_features, "head_features": args.head_features}
    data = open_spec(args.data)
    seed_torch_deterministic(config.seed)
    _, record = train_faze(data, config, args.out, model_kwargs=kwargs, progress=not args.quiet)
    losses = ", ".join(f"{k} {v:.4f}" for k, v in record["final_losses"].items())
    print(
        f"FAZE (DT-ED + gaze MLP) trained on {data.name} in {record['seconds']:.0f} s (last step: {losses}); "
        f"{Path(args.out) / 'model.safetensors'}"
    )


def _faze_train_arguments(p: argparse.ArgumentParser) -> None:
    from alfa.gaze.faze import faze_gaze
    from alfa.gaze.faze_train import FazeTrainConfig

    from .options import default_of

    d = FazeTrainConfig()
    p.add_argument("--data", required=True, help=data_help("the source data, with head poses", "synthetic:eth"))
    p.add_argument("--out", required=True, help="output folder (model.safetensors; faze_state.safetensors to resume)")
    p.add_argument("--steps", type=at_least(1), default=d.steps, help="Adam steps (default %(default)s)")
    p.add_argument(
        "--batch-size",
        type=at_least(2),
        default=d.batch_size,
        help="image pairs per step, two images of one person each (default %(default)s)",
    )
    p.add_argument("--lr", type=positive_rate, default=d.lr, help="Adam learning rate (default %(default)s)")
    losses = ("the reconstruction loss", "the embedding-consistency loss", "the gaze loss")
    for name, what, value in zip(("recon", "ec", "gaze"), losses, d.weights):
        p.add_argument(
            f"--lambda-{name}", type=non_negative_number, default=value, help=f"weight of {what} (default %(default)s)"
        )
    codes = ("size of the appearance code", "3-D vectors in the gaze code", "3-D vectors in the head code")
    for name, what in zip(("appearance", "gaze_features", "head_features"), codes):
        flag = "--" + name.replace("_", "-")
        default = default_of(faze_gaze, name)
        p.add_argument(flag, type=at_least(1), default=default, help=f"{what} (default %(default)s)")
    _checkpoint_every_option(p, d.checkpoint_every)
    seed_option(p, "the initial weights and the pairs", d.seed)
    quiet_option(p)
    threads_option(p)


def _faze_meta_train(args: argparse.Namespace) -> None:
    from alfa.gaze.faze_train import MetaTrainConfig, meta_train_faze

    config = MetaTrainConfig(
        steps=args.steps,
        k=args.k,
        l=args.l,
        tasks=args.tasks,
        inner_lr=args.inner_lr,
        inner_steps=args.inner_steps,
        outer_lr=args.outer_lr,
        outer_optimizer=args.outer_optimizer,
        first_order=args.first_order,
        seed=args.seed,
        checkpoint_every=args.checkpoint_every,
    )
    config.validate()
    from alfa.gaze.train import check_input_size

    model, saved = _load(args.checkpoint, "cpu")
    data = open_spec(args.data)
    check_input_size(saved, data, args.checkpoint)
    seed_torch_deterministic(config.seed)
    record = meta_train_faze(model, saved, data, config, args.out, progress=not args.quiet)
    print(
        f"AdaGEN meta-trained on {record['persons']} persons of {data.name} in {record['seconds']:.0f} s (last "
        f"post-adaptation loss {record['final_loss_deg']:.2f}°); {Path(args.out) / 'model.safetensors'}"
    )


def _faze_meta_train_arguments(p: argparse.ArgumentParser) -> None:
    from alfa.gaze.faze_train import MetaTrainConfig

    d = MetaTrainConfig()
    p.add_argument("--checkpoint", required=True, help="a FAZE model (from alfa faze train)")
    p.add_argument("--data", required=True, help=data_help("the source persons, one task each", "synthetic:eth"))
    p.add_argument(
        "--out", required=True, help="output folder (model.safetensors, the meta-learned MLP; its state to resume)"
    )
    p.add_argument("--steps", type=at_least(1), default=d.steps, help="outer (meta) steps (default %(default)s)")
    p.add_argument(
        "--k", type=at_least(1), default=d.k, help="images per task the inner steps adapt on (default %(default)s)"
    )
    p.add_argument(
        "--l", type=at_least(1), default=d.l, help="images per task the adapted MLP is scored on (default %(default)s)"
    )
    p.add_argument("--tasks", type=at_least(1), default=d.tasks, help="persons per outer step (default %(default)s)")
    p.add_argument(
        "--inner-lr",
        type=positive_rate,
        default=d.inner_lr,
        help="learning rate α of the inner steps (default %(default)s)",
    )
    p.add_argument(
        "--inner-steps", type=at_least(1), default=d.inner_steps, help="inner steps per task (default %(default)s)"
    )
    p.add_argument(
        "--outer-lr",
        type=positive_rate,
        default=d.outer_lr,
        help="learning rate η of the outer step (default %(default)s)",
    )
    p.add_argument(
        "--outer-optimizer",
        choices=("sgd", "adam"),
        default=d.outer_optimizer,
        help="optimizer of the outer step (default %(default)s)",
    )
    p.add_argument("--first-order", action="store_true", help="first-order MAML (drop the second-order term)")
    _checkpoint_every_option(p, d.checkpoint_every)
    seed_option(p, "the tasks", d.seed)
    quiet_option(p)
    threads_option(p)


CALIBRATE = Command(
    "calibrate",
    help="user calibration: one file per person from k labelled images (offset, affine, ridge, adapters, FAZE)",
    add_arguments=_calibrate_arguments,
    run=_calibrate,
    outputs={"out": True},
    folder_kinds={"out": "users"},
    extra="gaze",
)
FAZE = Command(
    "faze",
    help="FAZE: train DT-ED and its gaze MLP, meta-train the MLP (then alfa calibrate --method faze)",
    description="FAZE, few-shot gaze estimation: an encoder-decoder (DT-ED) whose gaze code turns with the eyes, "
    "and a small gaze MLP on that code, meta-learned so that a few labelled images adapt it to a person. Train "
    "with train, then meta-train; alfa calibrate --method faze adapts it per person (docs/user-calibration.md §2).",
    extra="gaze",
    subcommands=(
        Command(
            "train",
            help="DT-ED and the gaze MLP on a source with head poses",
            description="Train FAZE's encoder-decoder (DT-ED) and its gaze MLP together on pairs of images of one "
            "person, which needs the source's head poses; resumable (docs/user-calibration.md §2).",
            add_arguments=_faze_train_arguments,
            run=_faze_train,
            outputs={"out": True},
            folder_kinds={"out": "own"},
        ),
        Command(
            "meta-train",
            help="the gaze MLP meta-learned by MAML over the source persons (AdaGEN)",
            description="Meta-learn the gaze MLP of a trained FAZE model with MAML, one task per source person: "
            "inner steps adapt it on --k images, the outer step improves its start for the --l others; resumable "
            "(docs/user-calibration.md §2).",
            add_arguments=_faze_meta_train_arguments,
            run=_faze_meta_train,
            outputs={"out": True},
            folder_kinds={"out": "own"},
        ),
    ),
)
