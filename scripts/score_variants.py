"""Score one benchmark source model on variants of a target world (docs/synthetic.md § Calibration).

    python scripts/score_variants.py NAME MODEL TARGET SEED VARIANT... [--replace]

``MODEL``: a model file (e.g. a benchmark cache's ``source-<key>/recovered/model.safetensors``, the base the
source-only row scores). ``TARGET``: a target letter (``M``, ``D``); its world and persons are the standard
preset's for ``SEED``. Each ``VARIANT`` is ``label:field=value;field=value`` (values in Python syntax) or
``label:`` for the world as it is. A variant keeps the world's name, so it has the same persons and scenes:
differences between variants are the settings', not other persons'. Only a knob's effect on a model already
trained is measured here (the source models do not depend on the targets); the calibration itself is the
benchmark's own record (docs/calibration.md).

Writes ``docs/data/calibration-variants/NAME.json`` (per variant: mean error, mean signed yaw/pitch error, per person).
"""

from __future__ import annotations

import ast
import dataclasses
import json
import shlex
import statistics
import sys
from pathlib import Path

import torch

from alfa.checkpoint import load_model
from alfa.fileio import write_text
from alfa.gaze.data.registry import open_dataset
from alfa.gaze.data.synthetic import domains
from alfa.gaze.evaluate import person_gaze_errors
from alfa.study.bench.config import BenchConfig

AXES = ("yaw", "pitch")


def parse_variant(text: str) -> tuple[str, dict]:
    label, _, settings = text.partition(":")
    changes = {}
    for item in filter(None, settings.split(";")):
        field, _, value = item.partition("=")
        changes[field.strip()] = ast.literal_eval(value.strip())
    return label, changes


def main(argv: list[str]) -> None:
    replace = "--replace" in argv
    argv = [a for a in argv if a != "--replace"]
    name, model_path, target, seed, *variants = argv
    root = Path(__file__).resolve().parents[1]
    path = root / "docs/data/calibration-variants" / f"{name}.json"
    if path.exists() and not replace:
        sys.exit(f"score_variants: {path} exists (committed data); choose another NAME, or add --replace")
    torch.set_num_threads(1)
    config = BenchConfig.standard()
    spec = config.target_spec(target, int(seed))
    world = config.world(target)
    original = domains.DOMAINS[world]
    model, _ = load_model(model_path)
    model.eval()
    out: dict = {"name": name, "command": "python scripts/score_variants.py " + shlex.join(argv), "spec": spec}
    results = {}
    for text in variants:
        label, changes = parse_variant(text)
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
