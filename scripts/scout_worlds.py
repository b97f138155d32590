"""Scout a world's calibration (docs/synthetic.md § Calibration): train one ResNet-18 on a world, score it on others.

    python scripts/scout_worlds.py NAME TRAIN_SPEC EPOCHS EVAL_SPEC... [--schedule cosine] [--lr 1e-3]

One seed, the dense pre-trained model (no truncation or recovery), a 5 % held-out slice of the training persons
for the per-epoch validation error, 5 adaptation images per scored person left out. A scout only says where a
setting lands; the calibration itself is measured by the benchmark's own source models (docs/calibration.md).
Writes ``docs/data/calibration-scout/NAME.json`` (each scored world's mean error, mean signed yaw/pitch error and
per-person errors); checkpoints go to ``runs/scout/NAME`` (resumed if there; a finished run is only re-scored).
A second scout of the same NAME waits for the first one's turn (``runs/scout/NAME.lock``) instead of training into
the same folder beside it, then re-scores what the first one finished.
"""

from __future__ import annotations

import argparse
import json
import shlex
import statistics
import sys
from pathlib import Path

import torch

from alfa.fileio import write_text
from alfa.gaze.data.registry import open_dataset
from alfa.gaze.evaluate import person_gaze_errors
from alfa.gaze.train import TrainConfig, train_source
from alfa.locks import locked
from alfa.models import create_model

ROOT = Path(__file__).resolve().parents[1]


def main(argv: list[str], root: Path = ROOT) -> None:
    """Train (or resume) and score the scout ``argv`` names; its files go under ``root`` (the repository)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("name")
    parser.add_argument("train")
    parser.add_argument("epochs", type=int)
    parser.add_argument("evaluate", nargs="+")
    parser.add_argument("--schedule", default="cosine")
    parser.add_argument("--lr", type=float, default=1e-3)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    folder = root / "runs/scout" / args.name

    def say_waiting(_holder: str) -> None:  # the holder is the other scout
        print(f"waiting for another scout writing {folder}", file=sys.stderr, flush=True)

    with locked(folder, on_wait=say_waiting):
        scores = _scout(args, argv, folder, root)
    print(json.dumps(scores, indent=1))


def _scout(args: argparse.Namespace, argv: list[str], folder: Path, root: Path) -> dict[str, float]:
    source = open_dataset(args.train)
    torch.manual_seed(0)
    model = create_model("resnet18_gaze")
    config = TrainConfig(
        epochs=args.epochs, batch_size=64, lr=args.lr, symmetry_weight=1.0, val_fraction=0.05, schedule=args.schedule
    )
    result = train_source(model, source, config, folder, progress=False)
    model.eval()
    scores, biases, per_person = {}, {}, {}
    for spec in args.evaluate:
        errors = person_gaze_errors(model, open_dataset(spec), n_adapt=5)
        scores[spec] = statistics.fmean(e.angular for e in errors.values())
        # The mean signed error (prediction − label, yaw and pitch): the share of the error a constant
        # offset makes, e.g. a label convention the source does not share.
        biases[spec] = [statistics.fmean(getattr(e, f"{c}_bias") for e in errors.values()) for c in ("yaw", "pitch")]
        per_person[spec] = {person: e.angular for person, e in errors.items()}
    out = {
        "name": args.name,
        "command": "python scripts/scout_worlds.py " + shlex.join(argv),
        "train": args.train,
        "config": config.to_dict(),
        "val_error_per_epoch": [h["val_error"] for h in result.history],
        "train_seconds": sum(h["seconds"] for h in result.history),  # per-epoch times kept in the checkpoint
        "mean_error_deg": scores,
        "mean_bias_deg": biases,
        "person_error_deg": per_person,
        "torch": torch.__version__,
    }
    write_text(root / "docs/data/calibration-scout" / f"{args.name}.json", json.dumps(out, indent=1) + "\n")
    return scores


if __name__ == "__main__":
    main(sys.argv[1:])
