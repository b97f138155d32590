"""The versioned schema of the benchmark's results: the results file's format and version, how a record's
``config_hash`` is computed, and every rule that keeps the files and the hashes of earlier runs valid.

The ``config_hash`` is a record's resume key: a rerun skips a record whose stored hash equals the one
computed now (:func:`config_hash`) and redoes one whose inputs changed. It hashes what the record depends on:
its id, its variant (:func:`variant_key`), its source model's cache key, its seed, the data it is scored on
(the rendered target's pixels, or the stand-in's for a recipe selection), the recipe and the kind's own
settings, and :data:`SCORING`. A change to any rule here changes the hashes of finished records, so each rule
that exists only to keep them equal says so. The record's fields are :class:`~alfa.study.bench.record.Record`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Protocol

import torch

from alfa.gaze.recipes import RECIPE_GRID, RULE_SPECS
from alfa.gaze.train import TrainConfig

from .config import SELECTION_FIELDS

if TYPE_CHECKING:  # the results file reads this module, and the report reads the results: none of them runs a plan
    from .config import BenchConfig
    from .plan import RecordPlan
    from .variants import Variant

__all__ = [
    "FORMAT",
    "VERSION",
    "SCORING",
    "Scored",
    "stable_hash",
    "variant_key",
    "device_key",
    "config_hash",
    "comparable_protocol",
]

FORMAT = "alfa-bench-results"
"""The ``format`` of a results file (:mod:`alfa.study.bench.results`)."""
VERSION = 1
"""The ``version`` of the results file's layout; a file of another version is refused on reading."""

SCORING = 3
"""What a record measures. Part of every record's hash: raise it when a record gains a measure (3: the yaw and
pitch parts of the error and what a flip sees of it), so that every record is made again with it."""


class Scored(Protocol):
    """The data a record is scored on, as its hash sees it (a session's rendered target or stand-in)."""

    spec: str
    fingerprint: str


def stable_hash(obj: Any) -> str:
    """16 hex digits of the SHA-256 of ``obj`` as sorted JSON: the records' hashes and the session's cache keys."""
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()[:16]


def variant_key(variant: Variant) -> dict[str, Any]:
    """What determines a variant's numbers: the ``variant`` part of its records' hashes."""
    adapter = None
    if variant.adapter is not None:
        adapter = {"method": variant.adapter.method, **variant.adapter.to_dict()}
        if variant.same_layers_as_truncated:
            adapter["target"] = "the layers the truncated model factorizes"
    out = {"kind": variant.kind, "adapter": adapter, "recipe": variant.recipe, "base": variant.base}
    # Only a selected row says so: every other row hashes as it did before selected rows existed.
    if variant.selected:
        out["selected"] = True
    if variant.pnpga is not None:  # likewise only PnP-GA's rows have its settings
        out["pnpga"] = variant.pnpga.to_dict()
    if variant.calibration is not None:  # and only the user-calibration rows theirs
        out["calibration"] = variant.calibration
    return out


def device_key(device: torch.device, precision: str = "fp32") -> dict[str, str]:
    """The device and precision part of a record's hash: a record made on a GPU, or with its forwards in
    another precision, is another record (its float results differ). An fp32 CPU record has neither, so such
    records keep the hashes they had before records named a device or a precision."""
    key = {} if device.type == "cpu" else {"device": device.type}
    return key if precision == "fp32" else {**key, "precision": precision}


def config_hash(
    config: BenchConfig,
    plan: RecordPlan,
    source_model: str,
    scored: Scored | None,
    device: torch.device,
    selection: str | None = None,
    precision: str = "fp32",
    stand_in: Scored | None = None,
) -> str:
    """The hash of the record of ``plan``. ``source_model``: the cache key of the model it adapts;
    ``scored``: the stand-in of a recipe selection, the rendered target of a row scored on one (``None`` for
    an in-domain row, scored on the source's held-out persons); ``selection``: for a row with a selected
    recipe, the hash of the selection record it reads (its recipe is whatever that record selects)."""
    v = plan.variant
    common = {"id": plan.id, "variant": variant_key(v), "source_model": source_model, "seed": plan.seed}
    if v.kind == "selection":
        if scored is None:
            raise ValueError(f"{plan.id}: a recipe selection is hashed with its stand-in")
        spec = {
            **common,
            "stand_in": {"spec": scored.spec, "fingerprint": scored.fingerprint},
            "recipe": config.recipe(plan.seed, **v.recipe).to_dict(),  # {} but for another objective's selection
            "grid": [dataclasses.asdict(r) for r in RECIPE_GRID],
            # the first protocol's rule hashes as it always did; the second's is another entry
            "rule": RULE_SPECS[config.selection_rule],
            "scoring": SCORING,
            **device_key(device, precision),
        }
        return stable_hash(spec)
    spec = {**common, "n_adapt": config.personalize.n_adapt, "scoring": SCORING, **device_key(device, precision)}
    if v.kind == "in-domain":
        spec["val"] = config.val_spec(plan.source)
    elif scored is None:
        raise ValueError(f"{plan.id}: a record scored on the target is hashed with the target")
    else:
        spec["target"] = {"spec": scored.spec, "images": config.target_images, "fingerprint": scored.fingerprint}
    if v.kind in ("adapter", "tpgaze", "ruda"):
        spec["recipe"] = config.recipe(plan.seed, **v.recipe).to_dict()
    if v.kind == "tpgaze":
        spec["meta"] = {"config": config.meta.to_dict(), "init_std": config.tpgaze_init_std}
    if v.kind == "oracle":
        spec["oracle"] = dataclasses.asdict(config.oracle)
    if v.base.startswith("rank="):
        spec["recovery"] = config.recovery.to_dict()
    if v.kind == "calibration":
        if stand_in is None:
            raise ValueError(f"{plan.id}: a user-calibration row is hashed with the stand-in its recipe is chosen on")
        spec["stand_in"] = {"spec": stand_in.spec, "fingerprint": stand_in.fingerprint}
        spec["oracle_extra_images"] = config.oracle.extra_images  # the pool's images after the adaptation ones
    if v.selected:
        if selection is None:
            raise ValueError(f"{plan.id}: a selected row is hashed with its selection record's hash")
        spec["selection"] = selection
    return stable_hash(spec)


def comparable_protocol(stored: Mapping[str, Any]) -> dict[str, Any]:
    """The protocol part of a configuration as stored in a results file, in the form two are compared in (a
    run may write to a folder only if its own :meth:`~BenchConfig.protocol_dict` compares equal)."""
    # A field that became a selection field (it chooses records, not how they are made) may still be stored.
    out = {k: v for k, v in stored.items() if k not in SELECTION_FIELDS}
    # Fields added later, stored by files made before them, read as what those files did.
    for name, before in (("target_draw", "fixed"), ("worlds", "v1"), ("within_images", None)):
        out.setdefault(name, before)
    # A training option at its default is no part of the stored form (TrainConfig.to_dict leaves it out), so a
    # file stored before the option existed and one that spells the default out compare equal.
    for name in ("pretrain", "recovery"):
        if isinstance(out.get(name), dict):
            with contextlib.suppress(TypeError, ValueError):
                out[name] = TrainConfig(**out[name]).to_dict()
    return out
