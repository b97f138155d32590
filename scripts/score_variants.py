"""Score one benchmark source model on variants of a target world (docs/synthetic.md § Calibration).

    python scripts/score_variants.py NAME MODEL TARGET SEED VARIANT... [--replace]

``MODEL``: a model file (e.g. a benchmark cache's ``source-<key>/recovered/model.safetensors``, the base the
source-only row scores). ``TARGET``: a target letter (``M``, ``D``, ``W``, ``C``, ``R``); its world and persons
are the standard preset's for ``SEED``. Each ``VARIANT`` is ``label:field=value;field=value`` (values in Python
syntax) or ``label:`` for the world as it is. A variant keeps the world's name, so it has the same persons and
scenes: differences between variants are the settings', not other persons'. Only a knob's effect on a model
already trained is measured here (the source models do not depend on the targets); the calibration itself is the
benchmark's own record (docs/calibration.md).

Writes ``docs/data/calibration-variants/NAME.json`` (per variant: mean error, mean signed yaw/pitch error, per
person), atomically, once every variant is scored; an existing file is refused without ``--replace``. Every argument
is checked (the name, the target, the seed, each variant's settings against the world's, the model file) before
anything is scored; a refusal is one line on stderr and status 2. Run it with the project's Python
(``.venv/bin/python``, made by ``bash scripts/setup.sh``).
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import json
import shlex
import statistics
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:  # run as python scripts/score_variants.py it is there; loaded by a test, not
    sys.path.insert(0, str(HERE))
from script_cli import Parser, refuse  # noqa: E402

NAME = "score_variants"

try:
    import torch

    from alfa.checkpoint import load_model
    from alfa.cli.errors import error_line
    from alfa.fileio import check_writable, safe_filename, write_text
    from alfa.gaze.data.registry import open_dataset
    from alfa.gaze.data.synthetic import domains
    from alfa.gaze.evaluate import person_gaze_errors
    from alfa.study.bench.config import BenchConfig
    from alfa.study.bench.methods import TARGETS
except ImportError as e:  # another Python than the project's: one line, not a traceback
    refuse(NAME, f"{sys.executable} cannot import {e.name}; run it with .venv/bin/python")

AXES = ("yaw", "pitch")
ROOT = HERE.parent


def parse_variant(text: str) -> tuple[str, dict[str, Any]]:
    """``label:field=value;field=value`` (or ``label:``) as its label and changes; ``ValueError`` says what is wrong."""
    label, colon, settings = text.partition(":")
    if not colon or not label.strip():
        raise ValueError(f"variant {text!r}: expected label:field=value;field=value, or label: for the world as it is")
    changes = {}
    for item in filter(str.strip, settings.split(";")):
        field, equals, value = item.partition("=")
        if not equals or not field.strip():
            raise ValueError(f"variant {text!r}: {item.strip()!r} is not field=value")
        try:
            changes[field.strip()] = ast.literal_eval(value.strip())
        except (ValueError, SyntaxError):
            raise ValueError(
                f"variant {text!r}: {field.strip()}={value.strip()} is not a Python value (a string needs quotes)"
            ) from None
    return label, changes


def _same_kind(old: Any, new: Any) -> bool:
    """Whether ``new`` can stand where a world's setting is ``old``: a number for a number, a pair for a pair, ..."""
    if isinstance(old, bool) or isinstance(new, bool):
        return isinstance(old, bool) and isinstance(new, bool)
    if isinstance(old, (int, float)):
        return isinstance(new, (int, float))
    if isinstance(old, (tuple, list)):
        return isinstance(new, (tuple, list)) and len(new) == len(old)
    return isinstance(new, type(old))


def check_variants(texts: list[str], world: str) -> list[tuple[str, dict[str, Any]]]:
    """Each variant parsed and checked against ``world``'s settings (known, of the setting's kind, accepted by the
    world), before anything is loaded or rendered; labels are distinct (a second would replace the first's row)."""
    original = domains.DOMAINS[world]
    known = {f.name: getattr(original, f.name) for f in dataclasses.fields(original) if f.name != "name"}
    parsed: list[tuple[str, dict[str, Any]]] = []
    for text in texts:
        label, changes = parse_variant(text)
        if label in (p[0] for p in parsed):
            raise ValueError(f"variant {text!r}: label {label!r} is given twice; labels name the rows")
        for field, value in changes.items():
            if field not in known:  # the name too: a variant keeps the world's persons and scenes
                raise ValueError(
                    f"variant {text!r}: {world} has no setting {field!r}; its settings: {', '.join(known)}"
                )
            if not _same_kind(known[field], value):
                raise ValueError(
                    f"variant {text!r}: {field} is {known[field]!r} in {world}; {value!r} is not of its kind"
                )
        try:
            dataclasses.replace(original, **changes)  # the world's own checks
        except (ValueError, TypeError) as e:
            raise ValueError(f"variant {text!r}: {e}") from None
        parsed.append((label, changes))
    return parsed


def _arguments(argv: list[str]) -> argparse.Namespace:
    parser = Parser(
        name=NAME,
        prog="python scripts/score_variants.py",
        description=__doc__.split("\n\n")[0],
        epilog="e.g. python scripts/score_variants.py E-s0-on-D runs/bench-v2/cache/source-<key>/recovered/"
        "model.safetensors D 0 v2: 'origin-50cm:label_origin_pitch_deg=4.9'",
    )
    parser.add_argument("name", help="the record's name: docs/data/calibration-variants/NAME.json")
    parser.add_argument("model", help="the model file to score")
    parser.add_argument("target", help=f"a target letter ({', '.join(TARGETS)})")
    parser.add_argument("seed", type=_seed, help="the standard preset's seed whose target persons are scored")
    parser.add_argument("variants", nargs="+", metavar="VARIANT", help="label:field=value;field=value, or label:")
    parser.add_argument("--replace", action="store_true", help="overwrite an existing NAME.json")
    return parser.parse_intermixed_args(argv)


def _seed(text: str) -> int:
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"a seed is a whole number (0 or more), not {text!r}")
    return int(text)


def main(argv: list[str], root: Path = ROOT) -> None:
    """Check every argument, then score each variant and write the record under ``root`` (the repository)."""
    args = _arguments(argv)
    path = root / "docs/data/calibration-variants" / f"{args.name}.json"
    try:
        if safe_filename(args.name) != args.name or args.name.startswith("."):
            raise ValueError(f"NAME {args.name!r} is not a plain file name (letters, digits and ._=- only)")
        if path.exists() and not args.replace:
            raise ValueError(f"{path} exists (committed data); choose another NAME, or add --replace")
        check_writable(path, what="the record")
        if args.target not in TARGETS:
            raise ValueError(f"unknown target {args.target!r}; the targets are {', '.join(TARGETS)}")
        config = BenchConfig.standard()
        world = config.world(args.target)
        variants = check_variants(args.variants, world)
        if not Path(args.model).is_file():
            raise ValueError(f"MODEL {args.model}: no such file")
        model, _ = load_model(args.model)
    except (OSError, ValueError) as e:
        print(f"score_variants: {error_line(e)}", file=sys.stderr)
        sys.exit(2)
    torch.set_num_threads(1)
    spec = config.target_spec(args.target, args.seed)
    original = domains.DOMAINS[world]
    model.eval()
    recorded = [a for a in argv if a != "--replace"]
    out: dict = {"name": args.name, "command": "python scripts/score_variants.py " + shlex.join(recorded), "spec": spec}
    results = {}
    for label, changes in variants:
        domains.DOMAINS[world] = dataclasses.replace(original, **changes)
        try:
            full = open_dataset(spec)
            keep = [i for p in full.persons() for i in full.person_indices(p)[: config.target_images]]
            errors = person_gaze_errors(model, full.subset(keep), n_adapt=config.personalize.n_adapt)
        finally:
            domains.DOMAINS[world] = original
        results[label] = {
            "changes": changes,
            "mean_error_deg": statistics.fmean(e.angular for e in errors.values()),
            "mean_bias_deg": [statistics.fmean(getattr(e, f"{c}_bias") for e in errors.values()) for c in AXES],
            "person_error_deg": {p: e.angular for p, e in errors.items()},
        }
        print(f"{label:24s} {results[label]['mean_error_deg']:.2f}  bias {results[label]['mean_bias_deg']}", flush=True)
    out["variants"] = results
    write_text(path, json.dumps(out, indent=1) + "\n")  # atomic: alfa pages reads every file there


if __name__ == "__main__":
    main(sys.argv[1:])
