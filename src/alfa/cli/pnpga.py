"""The ``alfa pnpga`` command: ``members`` (one source training that keeps the snapshots of its last epochs, the
ensemble PnP-GA adapts) and ``adapt`` (one adapted model per target person, scored on the person's other images).

Each handler only turns options into configs and calls :mod:`alfa.gaze.pnpga` or :mod:`alfa.gaze.pnpga_folder`.
"""

from __future__ import annotations

import argparse
import sys

from .gaze import _train_config, _train_options, open_spec, seed_torch_deterministic
from .guards import (
    check_val_data,
    persons_of,
    raise_if_incomplete,
    refuse_a_model_that_is_not_a_gaze_model,
    refuse_n_adapt_no_one_has,
)
from .options import (
    MODEL_HELP,
    allow_partial_option,
    at_least,
    data_help,
    device_option,
    positive_rate,
    quiet_option,
    seed_option,
    threads_option,
)
from .registry import Command

__all__ = ["PNPGA"]


def _members(args: argparse.Namespace) -> None:
    from alfa.gaze.devices import resolve_device
    from alfa.gaze.pipeline import data_fingerprint
    from alfa.gaze.pnpga import snapshot_paths, train_snapshot_members
    from alfa.gaze.pnpga_folder import check_members_run
    from alfa.gaze.train import refuse_mixed_sizes
    from alfa.models import create_model

    check_val_data(args)
    device = resolve_device(args.device)
    config = _train_config(args, "pretrain", device)
    model = create_model(args.model)  # an unknown --model is refused before any data is made
    data = open_spec(args.data)
    val = open_spec(args.val_data) if args.val_data else None
    refuse_mixed_sizes(data, *([val] if val is not None else []))
    refuse_a_model_that_is_not_a_gaze_model(model.to(device), args.model, data)
    identity = {
        "model": args.model,
        "data": args.data,
        "val_data": args.val_data,
        "data_fingerprint": data_fingerprint(data),
    }
    check_members_run(args.out, {**identity, "train_config": config.to_dict(), "members": args.member_count})
    train_snapshot_members(
        args.model, config.seed, data, val, config, args.out, args.member_count, progress=not args.quiet, device=device
    )
    if args.member_count > config.epochs:  # after the training, which a refused run never reaches: one line then
        print(
            f"alfa pnpga members: note: --members {args.member_count} asks for more than the {config.epochs} epochs "
            f"this training runs: {config.epochs} members, a snapshot of every epoch",
            file=sys.stderr,
        )
    kept = snapshot_paths(args.out, args.member_count, config.epochs)
    first, last = (int(p.stem.removeprefix("epoch-")) for p in (kept[0], kept[-1]))
    print(f"{len(kept)} members of {args.model} on {data.name}: the snapshots of epochs {first}–{last} in {args.out}")
    print(f"the last is the source model itself: {args.out}/pretrain/model.safetensors (alfa truncate takes it)")


def _adapt(args: argparse.Namespace) -> None:
    from alfa.gaze.devices import resolve_device
    from alfa.gaze.pnpga import PnPGAConfig
    from alfa.gaze.pnpga_folder import RECORD, adapt_persons, read_members
    from alfa.gaze.train import check_input_size

    device = resolve_device(args.device)
    members = read_members(args.members)
    for model in members.models:
        model.to(device)
    k = len(members.models)
    config = PnPGAConfig(
        members=k,
        images=args.n_adapt,
        source_images=args.source_images,
        lr=args.lr,
        epochs=args.epochs,
        predict_with=k - 1,
    )
    config.validate()
    data, source = open_spec(args.data), open_spec(args.source_data)
    for what in (data, source):
        check_input_size(members.header, what, members.files[-1])
    if len(source) < config.source_images:
        raise ValueError(
            f"--source-data {args.source_data}: {len(source)} images; --source-images asks for {config.source_images}"
        )
    persons = persons_of(args.persons, data)
    refuse_n_adapt_no_one_has(data, persons, config.images, "adapt and score")
    seed_torch_deterministic(args.seed)
    options = {"persons": persons, "seed": args.seed, "replace": args.replace, "progress": not args.quiet}
    report = adapt_persons(members, data, source, args.source_data, config, args.out, **options)
    print(report.format_table(failures=False))
    print(f"{k} members, the last predicting; one model per person in {args.out} (its record: {RECORD})")
    if k < 5:  # docs/pnpga.md: the largest z-score among K values is (K − 1)/√K, under 1.645 for K ≤ 4
        print(
            f"alfa pnpga adapt: note: with {k} members the outlier term flagged no member at the start (PnP-GA's "
            "authors use 10): only its source and consistency terms acted until the students spread",
            file=sys.stderr,
        )
    if args.json:
        print(f"written {report.save_json(args.json)}")
    raise_if_incomplete(report, args.allow_partial)


def _members_arguments(p: argparse.ArgumentParser) -> None:
    from alfa.gaze.pipeline import DemoConfig
    from alfa.gaze.pnpga import PnPGAConfig

    p.add_argument("--data", required=True, help=data_help("the source data", "synthetic:eth"))
    p.add_argument("--val-data", help="held-out source persons, as a dataset spec (default: a share of --data's)")
    p.add_argument("--model", default=DemoConfig().model, help=MODEL_HELP)
    p.add_argument(
        "--members",
        dest="member_count",
        metavar="K",
        type=at_least(2, " (PnP-GA tests each member against the others' spread)"),
        default=PnPGAConfig().members,
        help="K: keep the snapshots of the last K epochs (all of them if there are fewer; default %(default)s, the "
        "paper's)",
    )
    p.add_argument(
        "--out", default="runs/pnpga-members", help="output folder (default %(default)s; resumes a run there)"
    )
    _train_options(p, "epochs of the source training (default: the --preset's; the members are its last ones)")
    device_option(p)


def _adapt_arguments(p: argparse.ArgumentParser) -> None:
    from alfa.gaze.pnpga import PnPGAConfig

    config = PnPGAConfig()
    p.add_argument(
        "--members",
        required=True,
        nargs="+",
        metavar="PATH",
        help="the ensemble: the folder alfa pnpga members wrote, or model files of one architecture, oldest first; "
        "the last predicts (from a members folder: its last epoch, the source model itself)",
    )
    p.add_argument("--source-data", required=True, help=data_help("the labelled source data", "synthetic:eth"))
    p.add_argument("--data", required=True, help=data_help("the target persons"))
    p.add_argument(
        "--out", default="runs/pnpga", help="one model per person (default %(default)s; resumes a run there)"
    )
    p.add_argument("--persons", help="comma-separated person ids (default: all)")
    g = p.add_argument_group("PnP-GA (defaults: its authors' scripts', except --n-adapt; docs/pnpga.md)")
    g.add_argument(
        "--n-adapt",
        type=at_least(1),
        default=5,
        help="unlabelled images per person it adapts on, the person's first; the rest are scored (default "
        "%(default)s, as alfa personalize and the benchmark, so the errors compare image for image; the paper's: 10)",
    )
    g.add_argument(
        "--source-images",
        type=at_least(1),
        default=config.source_images,
        help="labelled source images of its L1 term, the first of --source-data (default %(default)s)",
    )
    g.add_argument(
        "--epochs",
        type=at_least(1),
        default=config.epochs,
        help="epochs over the person's images (default %(default)s)",
    )
    g.add_argument("--lr", type=positive_rate, default=config.lr, help="Adam learning rate (default %(default)g)")
    seed_option(g, "the batch order per person", 0)
    p.add_argument("--json", help="also write the report here (JSON)")
    p.add_argument(
        "--replace",
        action="store_true",
        help="if --out holds a PnP-GA run of other members, data or settings, remove its models and adapt again",
    )
    allow_partial_option(p)
    quiet_option(p)
    device_option(p)
    threads_option(p)


PNPGA = Command(
    "pnpga",
    help="the PnP-GA baseline on your own data: an ensemble of source snapshots, adapted per target person",
    description="PnP-GA, the unsupervised domain-adaptation baseline (docs/pnpga.md): `members` trains a source "
    "model and keeps the snapshots of its last epochs, the ensemble; `adapt` adapts that ensemble to each target "
    "person from their first unlabelled images, with a few labelled source images, and writes one whole model per "
    "person, scored on the person's other images.",
    extra="gaze",
    subcommands=(
        Command(
            "members",
            help="train a source model, keeping the snapshots of its last K epochs (resumable)",
            description="Train --model on the source data as alfa pretrain does, keeping the weights after each of "
            "its last --members epochs as epoch-NNN.safetensors in --out: the ensemble alfa pnpga adapt reads. The "
            "last snapshot is the finished source model (--out/pretrain/model.safetensors).",
            add_arguments=_members_arguments,
            run=_members,
            outputs={"out": True},
            folder_kinds={"out": "own"},
        ),
        Command(
            "adapt",
            help="one adapted model per target person, scored on the person's other images",
            description="For each target person: adapt the ensemble (--members) from the person's first --n-adapt "
            "images, without their labels, with the first --source-images labelled source images, as PnP-GA does; "
            "save the predicting student (a whole model) as <person>.safetensors in --out; print each person's "
            "error before and after on their other images. The models load with alfa.checkpoint.load_model "
            "(alfa predict --checkpoint takes one).",
            add_arguments=_adapt_arguments,
            run=_adapt,
            outputs={"out": True, "json": False},
            folder_kinds={"out": "own"},
        ),
    ),
)
