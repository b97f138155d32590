"""What a user-calibration row of the benchmark runs (:func:`calibration_settings`): its pool, draws, the stand-in
rule's grid and the library's defaults, part of its records' hashes (docs/user-calibration.md §5). Apart from
:mod:`alfa.study.bench.user_calibration`, which runs the rows, because the rows' variants
(:mod:`alfa.study.bench.variants`) need these settings and nothing that runs them."""

from __future__ import annotations

import copy
import dataclasses
import functools
from typing import Any

from alfa.gaze.calibrate import CalibrateConfig
from alfa.gaze.faze_train import FazeTrainConfig
from alfa.gaze.faze_train import MetaTrainConfig as FazeMetaConfig

from .methods import (
    ADAPTER_CALIBRATIONS,
    ADAPTER_DRAWS,
    FAZE_CALIBRATIONS,
    SEMI_FLIP_WEIGHT,
    SEMI_SUPERVISED,
    SHRUNK_AFFINE,
)

__all__ = [
    "POOL",
    "STAND_IN_POOL",
    "DRAWS",
    "SELECTION_K",
    "TIE_DEG",
    "GRIDS",
    "FAZE_TRAINING",
    "FAZE_META_TRAINING",
    "calibration_settings",
]

POOL = 32
"""The labelled images per target person the ``k`` are drawn from (``alfa calibrate``'s pool)."""
STAND_IN_POOL = 16
"""The labelled images per stand-in person the selection draws from (a stand-in person has no extra images:
their first 16 of 40, the other 24 scored)."""
DRAWS = 10
"""Draws of the ``k`` images per person (seeds 0–9); a person's error is the mean over them."""
SELECTION_K = 9
"""The ``k`` the stand-in rule compares recipes at (docs/user-calibration.md §3)."""
TIE_DEG = 0.05
FAZE_TRAINING = FazeTrainConfig()
FAZE_META_TRAINING = FazeMetaConfig()
"""FAZE's training and meta-training in the benchmark: the library's defaults (docs/user-calibration.md §2 and
§5.3), each run with the source's seed."""
_PS_GEN_STEPS = FAZE_META_TRAINING.inner_steps
_NOT_HASHED = ("seed", "checkpoint_every")  # the seed is the source's; no number depends on the checkpoints
GRIDS: dict[str, tuple[dict[str, Any], ...]] = {
    # each grid from the strongest regularization to the weakest: the order ties are settled in
    "affine": tuple({"affine_ridge": x} for x in (1.0, 0.1, 0.01)),
    SHRUNK_AFFINE: tuple({"affine_ridge": x} for x in (1.0, 0.1, 0.01)),  # the offset prior is estimated, not chosen
    "offset": ({},),  # nothing to choose
    "ridge": tuple({"feature_ridge": x} for x in (10.0, 1.0, 0.1)),
    "last-layer": tuple({"steps": s, "lr": lr} for s in (20, 50) for lr in (1e-4, 1e-3, 1e-2)),
    **{m: ({},) for m in ADAPTER_CALIBRATIONS},  # the declared recipe (§5.2): the rule is not run for them
    # PS-GEN's rate α (§3), the lowest first; its steps are the meta-training's inner steps
    **{m: tuple({"faze_lr": a, "faze_steps": _PS_GEN_STEPS} for a in (0.01, 0.05, 0.2)) for m in FAZE_CALIBRATIONS},
}
"""Per method, the recipes the stand-in rule chooses among (docs/user-calibration.md §3), strongest first:
larger λ, then fewer steps, then a lower rate."""
# CalibrateConfig fields added after the first rows, at their neutral value
_LATER_FIELDS = {"offset_prior": 0.0, "every_image": False}
_SET_PER_ROW = ("method", "k", "draw", "pool", "seed")  # CalibrateConfig fields a row sets, not its recipe


@functools.cache
def _library_defaults() -> dict[str, Any]:
    """:class:`~alfa.gaze.calibrate.CalibrateConfig`'s defaults that a row does not set. Made once: every plan and
    results layout makes the thousand or so calibration rows' settings, several times over."""
    defaults = {f: v for f, v in dataclasses.asdict(CalibrateConfig()).items() if f not in _SET_PER_ROW}
    for field, before in _LATER_FIELDS.items():  # a field added at its neutral value keeps earlier rows' hashes
        if defaults.get(field) == before:
            del defaults[field]
    return defaults


def calibration_settings(
    config: Any, method: str, k: int, draw: str, adapter_options: dict[str, Any] | None = None
) -> dict[str, Any]:
    """What a row of ``method`` at ``k`` with ``draw`` runs (part of its records' hashes): the pool sizes (capped
    by what the configuration renders: ``n_adapt`` + the oracle's extra images per target person, half of a
    stand-in person's images), the draws, the stand-in rule's grid and ``k``, and the library's defaults; for an
    ``adapter-<method>`` row, the adapter's options (``adapter_options``: the benchmark's settings of it)."""
    pool = min(POOL, config.personalize.n_adapt + config.oracle.extra_images)
    stand_in_pool = min(STAND_IN_POOL, config.target_images // 2)
    defaults = copy.deepcopy(_library_defaults())  # the row's own copy: the cached one is every row's
    settings = {
        "method": method,
        "k": k,
        "draw": draw,
        "pool": pool,
        "draws": DRAWS,
        "stand_in_pool": stand_in_pool,
        "selection_k": min(SELECTION_K, stand_in_pool),
        "grid": [dict(g) for g in GRIDS[method]],
        "tie_deg": TIE_DEG,
        "defaults": defaults,
    }
    if method == SHRUNK_AFFINE:
        settings["library_method"] = "affine"
        # the words name the fit: the offset at the k images' mean prediction shrunk by k / (k + κ) (§5.1)
        settings["offset_prior"] = (
            "estimated on the stand-in's persons (alfa.gaze.calibrate.estimate_offset_prior); the offset at the "
            "mean prediction shrunk by k/(k+κ)"
        )
    if method in FAZE_CALIBRATIONS:  # the FAZE models are trained per source and seed (the seed is theirs)
        settings["library_method"] = "faze"
        train = {f: v for f, v in dataclasses.asdict(FAZE_TRAINING).items() if f not in _NOT_HASHED}
        meta = {f: v for f, v in dataclasses.asdict(FAZE_META_TRAINING).items() if f not in _NOT_HASHED}
        settings["faze"] = {"model": FAZE_CALIBRATIONS[method], "train": train, "meta": meta}
    if method in ADAPTER_CALIBRATIONS:
        settings["library_method"] = "adapter"
        settings["draws"] = ADAPTER_DRAWS
        settings["adapter"] = {"method": ADAPTER_CALIBRATIONS[method], "options": dict(adapter_options or {})}
        if method in SEMI_SUPERVISED:  # only these rows name it: the supervised ones hash as before
            settings["flip_weight"] = SEMI_FLIP_WEIGHT
    return settings
