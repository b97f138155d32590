"""Scout a world's calibration (docs/synthetic.md § Calibration): train one ResNet-18 on a world, score it on others.

    python scripts/scout_worlds.py NAME TRAIN_SPEC EPOCHS EVAL_SPEC... [--schedule cosine] [--lr 1e-3] [--replace]

One seed, the dense pre-trained model (no truncation or recovery), a 5 % held-out slice of the training persons
for the per-epoch validation error, 5 adaptation images per scored person left out. A scout only says where a
setting lands; the calibration itself is measured by the benchmark's own source models (docs/calibration.md).
Writes ``docs/data/calibration-scout/NAME.json`` (each scored world's mean error, mean signed yaw/pitch error and
per-person errors; an existing one, committed data, is refused without ``--replace``); checkpoints go to
``runs/scout/NAME`` (resumed if there; a finished run is only re-scored). A second scout of the same NAME waits for
the first one's turn (``runs/scout/NAME.lock``) instead of training into the same folder beside it, then re-scores
what the first one finished (with ``--replace``, since the first wrote NAME.json).

Every argument (the name, each dataset spec, the training settings, the record's place) is checked before anything
is rendered or trained; a refusal is one line on stderr and status 2. Run it with the project's Python
(``.venv/bin/python``, made by ``bash scripts/setup.sh``).
"""

from __future__ import annotations

import argparse
import json
import shlex
import statistics
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:  # run as python scripts/scout_worlds.py it is there; loaded by a test, not
    sys.path.insert(0, str(HERE))
from script_cli import Parser, refuse  # noqa: E402

NAME = "scout_worlds"

try:
    import torch

    from alfa.cli.errors import error_line
    from alfa.fileio import check_writable, safe_filename, write_text
    from alfa.gaze.data.registry import check_spec, open_dataset
    from alfa.gaze.evaluate import person_gaze_errors
    from alfa.gaze.train import SCHEDULES, TrainConfig, train_source
    from alfa.locks import locked
    from alfa.models import create_model
except ImportError as e:  # another Python than the project's: one line, not a traceback
    refuse(NAME, f"{sys.executable} cannot import {e.name}; run it with .venv/bin/python")

ROOT = HERE.parent


def _arguments(argv: list[str]) -> argparse.Namespace:
    parser = Parser(name=NAME, prog="python scripts/scout_worlds.py", description=__doc__.splitlines()[0])
    parser.add_argument("name", help="the scout's name: docs/data/calibration-scout/NAME.json, runs/scout/NAME")
    parser.add_argument("train", help="the training data's spec, e.g. synthetic:eth-v2")
    parser.add_argument("epochs", type=_epochs, help="epochs of training (1 or more)")
    parser.add_argument("evaluate", nargs="+", metavar="EVAL_SPEC", help="the spec of each world scored")
    parser.add_argument("--schedule", default="cosine", choices=SCHEDULES)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--replace", action="store_true", help="overwrite an existing NAME.json")
    return parser.parse_intermixed_args(argv)


def _epochs(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"EPOCHS is a whole number of 1 or more, not {text!r}")
    return int(text)


def _record(root: Path, args: argparse.Namespace) -> Path:
    """The record's path, refused (``ValueError``) where it may not be written now."""
    path = root / "docs/data/calibration-scout" / f"{args.name}.json"
    if path.exists() and not args.replace:
        raise ValueError(f"{path} exists (committed data); choose another NAME, or add --replace")
    return check_writable(path, what="the record")


def main(argv: list[str], root: Path = ROOT) -> None:
    """Train (or resume) and score the scout ``argv`` names; its files go under ``root`` (the repository)."""
    args = _arguments(argv)
    config = TrainConfig(
        epochs=args.epochs, batch_size=64, lr=args.lr, symmetry_weight=1.0, val_fraction=0.05, schedule=args.schedule
    )
    try:
        if safe_filename(args.name) != args.name or args.name.startswith("."):
            raise ValueError(f"NAME {args.name!r} is not a plain file name (letters, digits and ._=- only)")
        config.validate()
        for spec in (args.train, *args.evaluate):  # a misspelt world found now, not after the training
            check_spec(spec)
        _record(root, args)
    except (OSError, ValueError) as e:
        refuse(NAME, error_line(e))
    torch.set_num_threads(1)
    folder = root / "runs/scout" / args.name

    def say_waiting(_holder: str) -> None:  # the holder is the other scout
        print(f"waiting for another scout writing {folder}", file=sys.stderr, flush=True)

    try:
        with locked(folder, on_wait=say_waiting):
            path = _record(root, args)  # again: the scout waited for may have written it
            scores = _scout(args, argv, config, folder, path)
    except (OSError, ValueError) as e:  # a checkpoint in the folder of another scout's settings, say
        refuse(NAME, error_line(e))
    print(json.dumps(scores, indent=1))


def _scout(
    args: argparse.Namespace, argv: list[str], config: TrainConfig, folder: Path, path: Path
) -> dict[str, float]:
    source = open_dataset(args.train)
    torch.manual_seed(0)
    model = create_model("resnet18_gaze")
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
        "command": "python scripts/scout_worlds.py " + shlex.join(a for a in argv if a != "--replace"),
        "train": args.train,
        "config": config.to_dict(),
        "val_error_per_epoch": [h["val_error"] for h in result.history],
        "train_seconds": sum(h["seconds"] for h in result.history),  # per-epoch times kept in the checkpoint
        "mean_error_deg": scores,
        "mean_bias_deg": biases,
        "person_error_deg": per_person,
        "torch": torch.__version__,
    }
    write_text(path, json.dumps(out, indent=1) + "\n")
    return scores


if __name__ == "__main__":
    main(sys.argv[1:])
