"""The ``alfa tpgaze`` command: ``meta-train`` (meta-learn the prompts on the source) and
``personalize`` (one prompt file per target person, from the meta-trained prompts).

Evaluation is the common one: ``alfa evaluate --checkpoint BASE --data TARGET --adapters FOLDER``.
Each handler only turns options into configs and calls :mod:`alfa.gaze.tpgaze`.
"""

from __future__ import annotations

import argparse
import dataclasses
import os

__all__ = ["register"]


def _seed(seed: int) -> None:
    import torch

    torch.manual_seed(seed)
    torch.use_deterministic_algorithms(True, warn_only=True)


def _open(spec: str):
    from .pipeline import open_data

    return open_data(spec)


def _load_base(path: str, device_name: str):
    from alfa.checkpoint import load_model

    from .commands import resolve_device

    device = resolve_device(device_name)
    model, saved = load_model(path)
    return model.to(device).eval(), saved


def _kib(n: int) -> str:
    return f"{n / 1024:.1f} KiB"


# ----------------------------------------------------------------------------- meta-train


def _meta_train(args: argparse.Namespace) -> None:
    from alfa.adapters.prompt import TPGazeConfig

    from .tpgaze import MetaTrainConfig, meta_train_prompts

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
    config = dataclasses.replace(MetaTrainConfig(), **{k: v for k, v in changes.items() if v is not None})
    model, saved = _load_base(args.checkpoint, args.device)
    data = _open(args.data)
    extra = saved.get("extra", {})
    if args.val_data:
        val, val_persons = _open(args.val_data), None
    elif extra.get("val_data") == data.name and extra.get("val_persons"):
        val, val_persons = data, extra["val_persons"]  # the source model's held-out persons stay unseen
    else:
        val, val_persons = None, None
    size = data[data.person_indices(data.persons()[0])[0]]["image"].shape[-1]
    prompt = TPGazeConfig(image_size=int(size), init_std=args.init_std)
    _seed(config.seed)
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
        f"TPGaze meta-training on {data.name}: {len(result.history)} epochs of {config.steps_per_epoch} meta-steps, "
        f"{result.trainable_parameters} prompt values. Error on {len(result.val_persons)} held-out source persons: "
        f"source model {base:.2f} deg, initial prompts {init:.2f} deg, "
        f"meta-trained {last.get('val_error', nan):.2f} deg"
    )
    print(f"meta-trained prompts: {result.prompts} ({_kib(result.prompts.stat().st_size)})")


# ----------------------------------------------------------------------------- personalize


def _personalize(args: argparse.Namespace) -> None:
    from .personalize import PersonalizeConfig
    from .pipeline import DemoConfig
    from .tpgaze import personalize_tpgaze_dataset, tpgaze_recipe

    if args.meta is None and not args.no_meta:
        raise ValueError(
            "pass --meta PROMPTS (from `alfa tpgaze meta-train`), or --no-meta to start from Gaussian prompts"
        )
    base = DemoConfig().personalize if args.preset == "demo" else PersonalizeConfig()
    changes = {"steps": args.steps, "lr": args.lr, "n_adapt": args.n_adapt, "seed": args.seed}
    config = tpgaze_recipe(base, **{k: v for k, v in changes.items() if v is not None})
    model, _ = _load_base(args.checkpoint, args.device)
    data = _open(args.data)
    persons = [p for p in args.persons.split(",") if p] if args.persons else None
    _seed(config.seed)
    run = personalize_tpgaze_dataset(model, data, args.meta, args.out, config, persons=persons, progress=not args.quiet)
    counts = run.counts()
    files = [o.adapter for o in run.persons.values() if o.adapter]
    size = f", {_kib(os.path.getsize(files[0]))} per person" if files else ""
    print(
        f"tpgaze personalization of {data.name} (Adam lr {config.lr}, {config.steps} steps, {config.n_adapt} images): "
        f"{counts['ok']} done, {counts['skipped']} already there, {counts['failed']} failed; "
        f"prompt files in {args.out}{size}"
    )
    run.raise_if_failed(args.allow_partial)


# ----------------------------------------------------------------------------- registration


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add ``tpgaze meta-train`` and ``tpgaze personalize`` to ``subparsers``."""
    from .commands import allow_partial_option, device_option

    top = subparsers.add_parser("tpgaze", help="the TPGaze baseline: meta-trained padding prompts")
    sub = top.add_subparsers(dest="tpgaze_command", required=True)

    p = sub.add_parser("meta-train", help="meta-train the prompts on the source (resumable)")
    p.add_argument("--checkpoint", required=True, help="the source model: dense pre-trained or truncated+recovered")
    p.add_argument("--data", required=True, help="the source dataset spec the model was trained on")
    p.add_argument("--val-data", help="held-out source persons (default: the checkpoint's)")
    p.add_argument("--out", default="runs/tpgaze-meta", help="output folder (an unfinished run there resumes)")
    g = p.add_argument_group("meta-training (defaults: the reference code's)")
    g.add_argument("--epochs", type=int, help="epochs (default 10)")
    g.add_argument("--steps-per-epoch", type=int, help="meta-steps per epoch (default 100)")
    g.add_argument("--batch-size", type=int, help="images per support and per query batch (default 20)")
    g.add_argument("--outer-lr", type=float, help="Adam lr of the outer step (default 1e-4)")
    g.add_argument("--inner-lr", type=float, help="lr of the inner step (default 1e-4)")
    g.add_argument("--inner-optimizer", choices=("adam", "sgd"), help="inner step rule (default adam)")
    g.add_argument("--inner-steps", type=int, help="inner steps per meta-step (default 1)")
    g.add_argument("--query", choices=("next", "same"), help="query batch: the next batch (default) or the support")
    g.add_argument("--init-std", type=float, default=1.0, help="σ of the Gaussian prompt init (default 1.0)")
    g.add_argument("--val-fraction", type=float, help="share of source persons held out (without a split)")
    g.add_argument("--seed", type=int, help="prompt init and task sampling (default: the meta config's, 0)")
    g.add_argument("--quiet", action="store_true", help="no progress bars")
    device_option(p)
    p.set_defaults(func=_meta_train, outputs={"out": True})

    p = sub.add_parser("personalize", help="one prompt file per target person (Adam lr 0.01, 10 steps)")
    p.add_argument("--checkpoint", required=True, help="the base model the prompts were meta-trained on")
    p.add_argument("--data", required=True, help="target dataset spec, e.g. synthetic:mpii")
    p.add_argument("--meta", help="meta-trained prompts (prompts.safetensors from `alfa tpgaze meta-train`)")
    p.add_argument("--no-meta", action="store_true", help="start from Gaussian prompts (TPGaze without meta)")
    p.add_argument(
        "--out", default="runs/tpgaze-adapters", help="prompt-file folder (persons already done are skipped)"
    )
    p.add_argument("--preset", choices=("real", "demo"), default="real", help="demo: blur kernel for 64×64 images")
    p.add_argument("--steps", type=int, help="Adam steps per person (default 10)")
    p.add_argument("--lr", type=float, help="Adam learning rate (default 0.01)")
    p.add_argument("--n-adapt", type=int, help="adaptation images per person (default 5)")
    p.add_argument("--persons", help="comma-separated person ids (default: all)")
    p.add_argument("--seed", type=int, help="prompt init and augmentation draws per person (default 0)")
    allow_partial_option(p)
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    device_option(p)
    p.set_defaults(func=_personalize, outputs={"out": True})
