"""The cross-domain benchmark (``alfa bench``): every method on four synthetic pairs, seeds, ablations, costs.

The paper's evidence is four tables and two figures on real data; this reproduces their *form* on the
synthetic worlds (spec gaze-data §3). Two sources named like the real ones (``E``: the ETH-XGaze-like
``eth``, ``G``: the Gaze360-like ``gaze360``) and two targets (``M``: ``mpii``, ``D``: ``eyediap``) give
the pairs E→M, E→D, G→M and G→D.

Per (source, seed) one source model is pre-trained, truncated at rank ``d`` and recovered
(:func:`alfa.gaze.pipeline.build_source_model`, cached by a hash of everything it depends on); every
method of that (pair, seed) starts from that same truncated + recovered base. Per (method, pair, seed)
each target person is personalized with the shared recipe (:mod:`alfa.gaze.personalize`), scored on the
images not used for adaptation (spec §7), and the costs are measured; the result is one *record*.

Records go to ``<out>/results.json``, keyed by a stable id (``"alfa|E→M|seed0"``) and a hash of
everything that determines them (method, recipe, source model, target pixels), so a rerun skips what is
finished and redoes what changed. The file is rewritten atomically (temporary file, then rename) under
a file lock after every record: an interrupted run loses at most the record in progress (whose
per-person adapters resume too), and several pieces of one benchmark (``--seeds 0`` here, ``--seeds 1``
there) may write to the same folder at once.

Nothing is chosen on target labels: every setting is in :class:`BenchConfig`, the target labels are read
only by the evaluation (and by the oracle, which is the headroom, not a competitor).
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import datetime
import hashlib
import itertools
import json
import os
import platform
import re
import shutil
import statistics
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn
from tqdm.auto import tqdm

from alfa.adapters import FullFinetuneConfig, MergeError, attach, detach, load_adapter, param_groups
from alfa.adapters.prompt import TPGazeConfig
from alfa.checkpoint import read_checkpoint
from alfa.fileio import safe_filename
from alfa.gaze.data.base import GazeDataset, InMemoryGazeDataset
from alfa.gaze.evaluate import (
    GazeError,
    adapter_filename,
    eval_indices,
    load_examples,
    load_images,
    person_errors,
    person_gaze_errors,
    predict_images,
)
from alfa.gaze.flip import FlipParts, FlipTTA, person_flip_parts
from alfa.gaze.geometry import angular_error
from alfa.gaze.losses import finite_or_raise, supervised_l1_loss
from alfa.gaze.personalize import PersonalizeConfig, person_seed, personalize_dataset
from alfa.gaze.pipeline import DemoConfig, build_source_model, data_fingerprint, open_data, source_cache_key
from alfa.gaze.recipes import (
    PAPER_RECIPE,
    RECIPE_GRID,
    TIE_DEGREES,
    Recipe,
    reference_protocol_error,
    select_recipe,
    training_runs,
)
from alfa.gaze.tpgaze import MetaTrainConfig, meta_train_prompts, personalize_tpgaze_dataset, tpgaze_recipe
from alfa.gaze.train import TruncateConfig, truncate_and_recover
from alfa.layers import is_factorized

from .ablations import ablation_variants
from .config import ABLATIONS, SELECTION_FIELDS, BenchConfig, OracleConfig, split_pair
from .measure import (
    _latency_ms,
    _param_count,
    _proc_status_mib,
    _reset_peak_memory,
    adapter_costs,
    constant_prediction_error,
)
from .methods import MAIN_METHODS, PAIRS, SANITY_METHODS, SOURCES, TARGETS
from .results import FIGURE_DIR, RANK_SLICES_FILE, RESULTS_FILE, UPDATES_FILE, ResultsStore, load_results
from .variants import SELECTED, Variant, main_variants, selection_variants

__all__ = [
    "PAIRS",
    "SOURCES",
    "TARGETS",
    "MAIN_METHODS",
    "SANITY_METHODS",
    "ABLATIONS",
    "RESULTS_FILE",
    "OracleConfig",
    "BenchConfig",
    "Variant",
    "RecordPlan",
    "BenchSummary",
    "main_variants",
    "ablation_variants",
    "plan_records",
    "load_results",
    "run_bench",
]

KINDS = ("source-only", "flip-tta", "in-domain", "target-trained", "oracle", "adapter", "tpgaze")
UNADAPTED = ("source-only", "flip-tta", "in-domain", "target-trained")

# What a record measures; part of every record's hash, so a change re-runs the records (v2: the yaw/pitch
# parts of the error, ``per_person_parts``; v3: what a flip sees of it, ``per_person_flip``).
SCORING = 3


@dataclass
class RecordPlan:
    """One record to produce: a variant on a pair with a seed."""

    variant: Variant
    pair: str
    seed: int

    @property
    def id(self) -> str:
        return record_id(self.variant.label, self.pair, self.seed)

    @property
    def source(self) -> str:
        return split_pair(self.pair)[0]

    @property
    def target(self) -> str:
        return split_pair(self.pair)[1]


def record_id(label: str, pair: str, seed: int) -> str:
    return f"{label}|{pair}|seed{seed}"


STAND_IN = "stand-in"
"""The target name of a recipe-selection record's pair (``"E→stand-in"``): it is scored on the source's
stand-in (:data:`~alfa.study.bench.methods.STAND_INS`), never on a target."""


def plan_records(config: BenchConfig) -> list[RecordPlan]:
    """Every record the selection asks for, in run order (seed, then source, then pair), deduplicated. A
    method's recipe-selection record on the stand-in comes before its selected rows (which read it)."""
    main = main_variants(config)
    selection = {m: selection_variants(config, m) for m in config.selected_methods}
    plans: dict[str, RecordPlan] = {}
    for seed in config.seeds:
        for source in SOURCES:
            pairs = [p for p in PAIRS if p in config.pairs and split_pair(p)[0] == source]
            if pairs:
                for grid, _ in selection.values():
                    plan = RecordPlan(grid, f"{source}→{STAND_IN}", seed)
                    plans[plan.id] = plan
            for pair in pairs:
                variants = [main[m] for m in config.methods] + [row for _, row in selection.values()]
                if pair in config.ablation_pairs:
                    for name in config.ablations:
                        variants += ablation_variants(name, config)
                for v in variants:
                    plan = RecordPlan(v, pair, seed)
                    if plan.id not in plans:
                        plans[plan.id] = plan
    return list(plans.values())


def _hash(obj: Any) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()[:16]


# ----------------------------------------------------------------------------- contexts


@dataclass
class _Target:
    key: str
    spec: str
    data: InMemoryGazeDataset  # target_images per person: what every method sees and is scored on
    extra: InMemoryGazeDataset | None  # the oracle's extra labelled images
    fingerprint: str


@dataclass
class _Source:
    key: str
    seed: int
    demo: DemoConfig
    data: GazeDataset
    val: GazeDataset
    cache_key: str
    models: Any = None  # SourceModels once built
    other_ranks: dict[int, nn.Module] = field(default_factory=dict)
    prompts: Path | None = None
    info: dict[str, Any] = field(default_factory=dict)


class _Session:
    """Data, source models and paths of one :func:`run_bench` call; :meth:`run` makes one record (with the
    record functions below: unadapted rows, personalization, oracle)."""

    def __init__(
        self, config: BenchConfig, out: Path, cache: Path, progress: bool, device: torch.device | None = None
    ) -> None:
        self.config, self.out, self.cache, self.progress = config, out, cache, progress
        self.device = torch.device("cpu") if device is None else device
        self.figures = _FigureData(config, out)
        self.targets: dict[str, _Target] = {}
        self.sources: dict[tuple[str, int], _Source] = {}
        self.source_data: dict[str, tuple[GazeDataset, GazeDataset]] = {}

    # ---------------------------------------------------------------- data

    def target(self, key: str) -> _Target:
        if key not in self.targets:
            c = self.config
            spec = c.target_spec(key)
            full = open_data(spec)
            keep, extra = [], []
            for p in full.persons():
                idx = full.person_indices(p)
                keep += idx[: c.target_images]
                extra += idx[c.target_images :]
            data = full.subset(keep)
            self.targets[key] = _Target(key, spec, data, full.subset(extra) if extra else None, data_fingerprint(data))
        return self.targets[key]

    def source(self, key: str, seed: int) -> _Source:
        if (key, seed) not in self.sources:
            c = self.config
            if key not in self.source_data:
                self.source_data[key] = (open_data(c.source_spec(key)), open_data(c.val_spec(key)))
            data, val = self.source_data[key]
            demo = c.demo_config(key, seed, self.cache)
            fingerprints = {"source": data_fingerprint(data), "val": data_fingerprint(val)}
            self.sources[(key, seed)] = _Source(key, seed, demo, data, val, source_cache_key(demo, fingerprints))
        return self.sources[(key, seed)]

    def release(self, key: str, seed: int) -> None:
        src = self.sources.get((key, seed))
        if src is not None:
            src.models, src.other_ranks = None, {}

    # ---------------------------------------------------------------- hashes

    def stand_in(self, source: str) -> _Target:
        """The labelled stand-in of ``source``'s recipe selection (another world's held-out persons)."""
        key = f"{source}→{STAND_IN}"
        if key not in self.targets:
            spec = self.config.stand_in_spec(source)
            data = open_data(spec)
            self.targets[key] = _Target(key, spec, data, None, data_fingerprint(data))
        return self.targets[key]

    def grid_plan(self, plan: RecordPlan) -> RecordPlan:
        """The recipe-selection record a selected row reads."""
        method = plan.variant.label.removesuffix(SELECTED)
        return RecordPlan(selection_variants(self.config, method)[0], f"{plan.source}→{STAND_IN}", plan.seed)

    def _device_key(self) -> dict[str, str]:
        # a record made on a GPU is another record (float results differ); CPU records hash as they always did
        return {} if self.device.type == "cpu" else {"device": self.device.type}

    def record_hash(self, plan: RecordPlan) -> str:
        c, v = self.config, plan.variant
        src = self.source(self.model_key(plan), plan.seed)
        if v.kind == "selection":  # scored on the stand-in: no target is opened, let alone its labels
            standin = self.stand_in(plan.source)
            return _hash(
                {
                    "id": plan.id,
                    "variant": v.describe(),
                    "source_model": src.cache_key,
                    "seed": plan.seed,
                    "stand_in": {"spec": standin.spec, "fingerprint": standin.fingerprint},
                    "recipe": c.recipe(plan.seed).to_dict(),
                    "grid": [dataclasses.asdict(r) for r in RECIPE_GRID],
                    "rule": {"tie": TIE_DEGREES, "order": "steps, lr, anchor on, no x10, detached"},
                    "scoring": SCORING,
                    **self._device_key(),
                }
            )
        tgt = self.target(plan.target)
        spec: dict[str, Any] = {
            "id": plan.id,
            "variant": v.describe(),
            "source_model": src.cache_key,
            "seed": plan.seed,
            "n_adapt": c.personalize.n_adapt,
            "scoring": SCORING,
            **self._device_key(),
        }
        if v.kind == "in-domain":
            spec["val"] = c.val_spec(plan.source)
        else:
            spec["target"] = {"spec": tgt.spec, "images": c.target_images, "fingerprint": tgt.fingerprint}
        if v.kind in ("adapter", "tpgaze"):
            spec["recipe"] = c.recipe(plan.seed, **v.recipe).to_dict()
        if v.kind == "tpgaze":
            spec["meta"] = {"config": c.meta.to_dict(), "init_std": c.tpgaze_init_std}
        if v.kind == "oracle":
            spec["oracle"] = dataclasses.asdict(c.oracle)
        if v.base.startswith("rank="):
            spec["recovery"] = c.recovery.to_dict()
        if v.selected:  # the recipe is whatever the selection record selects: its hash stands for it
            spec["selection"] = self.record_hash(self.grid_plan(plan))
        return _hash(spec)

    # ---------------------------------------------------------------- models

    def build(self, key: str, seed: int) -> _Source:
        src = self.source(key, seed)
        if src.models is None:
            torch.manual_seed(seed)
            src.models = build_source_model(src.demo, src.data, src.val, progress=self.progress, device=self.device)
            if src.models.cache.name != f"source-{src.cache_key}":
                raise RuntimeError(f"source cache {src.models.cache} does not match the expected key {src.cache_key}")
            src.info = {
                "cache": str(src.models.cache),
                "from_cache": src.models.from_cache,
                "seconds": src.models.seconds,
                "truncation": {
                    k: src.models.truncation.get(k) for k in ("rank", "errors", "params", "factorized_layers")
                },
                "pretrain_final_val_error": (src.models.pretrain_history or [{}])[-1].get("val_error"),
            }
            src.info.update(self.recorded_training(src))
        return src

    def base(self, src: _Source, which: str) -> nn.Module:
        if which == "truncated":
            return src.models.recovered
        if which == "dense":
            return src.models.dense
        d = int(which.removeprefix("rank="))
        if d == self.config.rank:
            return src.models.recovered
        if d not in src.other_ranks:
            model = copy.deepcopy(src.models.dense)
            result = truncate_and_recover(
                model,
                src.data,
                TruncateConfig(rank=d, recovery=dataclasses.replace(self.config.recovery, seed=src.seed)),
                src.models.cache / f"rank-{d}",
                val_dataset=src.val,
                val_persons=src.val.persons(),
                model_name=self.config.model,
                progress=self.progress,
            )
            src.info.setdefault("other_ranks", {})[str(d)] = {"errors": result.errors, "params": result.params}
            src.info.update(self.recorded_training(src))  # now with this rank's recovery
            src.other_ranks[d] = model.eval()
        return src.other_ranks[d]

    def recorded_training(self, src: _Source) -> dict[str, Any]:
        """What training the models of ``src`` took when they were built, read from their checkpoints'
        per-epoch timings (so a model loaded from the cache still counts what it once cost): pre-training,
        recovery, the recoveries at other SVD ranks and TPGaze's meta-training, as far as they exist."""
        parts: dict[str, float] = {}

        def epochs(history: list[dict[str, Any]] | None) -> float:
            return sum(float(e.get("seconds", 0.0)) for e in history or [])

        def header(path: Path) -> dict[str, Any]:
            return read_checkpoint(path, header_only=True)[1].get("extra", {}) if path.is_file() else {}

        cache = src.models.cache
        parts["pretrain"] = epochs(header(cache / "pretrain" / "model.safetensors").get("history"))
        parts["recovery"] = epochs(
            header(cache / "recovered" / "model.safetensors").get("result", {}).get("recovery_history")
        )
        for folder in sorted(cache.glob("rank-*")):
            history = header(folder / "model.safetensors").get("result", {}).get("recovery_history")
            if history:
                parts[f"recovery at {folder.name}"] = epochs(history)
        meta_log = self.tpgaze_setup(src)[2] / "meta_train.json"
        if meta_log.is_file():
            parts["tpgaze meta-training"] = epochs(json.loads(meta_log.read_text()).get("history"))
        return {"recorded_train_seconds": sum(parts.values()), "recorded_train_parts": parts}

    def tpgaze_setup(self, src: _Source) -> tuple[MetaTrainConfig, TPGazeConfig, Path]:
        """TPGaze's meta-training settings for ``src`` and the cache folder they hash to."""
        c = self.config
        meta = dataclasses.replace(c.meta, seed=src.seed)
        prompt = TPGazeConfig(image_size=c.image_size, init_std=c.tpgaze_init_std)
        key = _hash({"source": src.cache_key, "meta": meta.to_dict(), "prompt": prompt.to_dict()})
        return meta, prompt, self.cache / f"tpgaze-{key}"

    def tpgaze_prompts(self, src: _Source) -> Path:
        """Meta-train TPGaze's prompts once per (source, seed) base (resumable, cached by a hash)."""
        if src.prompts is None:
            meta, prompt, folder = self.tpgaze_setup(src)
            base = src.models.recovered
            t0 = time.time()
            result = meta_train_prompts(
                base, src.data, meta, folder, prompt=prompt, val_dataset=src.val, progress=self.progress
            )
            detach(base)
            src.prompts = result.prompts
            src.info.update(self.recorded_training(src))
            src.info["tpgaze_meta"] = {
                "folder": str(folder),
                "initial_val_error": result.initial_val_error,
                "final_val_error": (result.history or [{}])[-1].get("val_error"),
                "trainable_params": result.trainable_parameters,
                "seconds": time.time() - t0,
            }
        return src.prompts

    # ---------------------------------------------------------------- records

    def adapter_dir(self, plan: RecordPlan) -> Path:
        pair = safe_filename(plan.pair.replace("→", "-"))
        return self.out / "adapters" / pair / f"seed{plan.seed}" / safe_filename(plan.variant.label)

    def shows_updates(self, plan: RecordPlan) -> bool:
        """Whether the update-map figure is drawn from this record's adapters (Alfa and LoRA on the figure's
        pair and seed)."""
        c = self.config
        return plan.pair == c.figure_pair and plan.seed == c.figure_seed and plan.variant.label in ("alfa", "lora")

    def keeps_adapters(self, plan: RecordPlan) -> bool:
        return self.config.keep_adapters or self.shows_updates(plan)

    @staticmethod
    def model_key(plan: RecordPlan) -> str:
        """Whose model a record uses: the pair's source, or for the within-target yardstick the target's."""
        return plan.target if plan.variant.kind == "target-trained" else plan.source

    def selected_recipe(self, plan: RecordPlan) -> Recipe:
        """The recipe the selection record of ``plan``'s method, source and seed chose (it must have run)."""
        grid = self.grid_plan(plan)
        stored = next((r for r in load_results(self.out)["records"] if r["id"] == grid.id), None)
        if stored is None or stored.get("config_hash") != self.record_hash(grid):
            raise RuntimeError(f"{plan.id} needs the recipe-selection record {grid.id}, which has not run")
        return Recipe(**stored["selected"])

    def latency_images(self, tgt: _Target) -> torch.Tensor:
        persons = tgt.data.persons()
        idx = [i for p in persons for i in tgt.data.person_indices(p)[self.config.personalize.n_adapt :]]
        return load_images(tgt.data, idx[: self.config.latency_batch])

    def run(self, plan: RecordPlan) -> dict[str, Any]:
        """Produce the record of ``plan``: build (or reuse) its base, adapt and score it, measure the costs."""
        v = plan.variant
        src = self.build(self.model_key(plan), plan.seed)
        base = self.base(src, v.base)
        t0, cpu0 = time.time(), time.process_time()
        record = _new_record(plan, self.record_hash(plan), base)
        if v.kind == "selection":
            _run_selection(self, base, plan, record)
            record["wall_s"], record["cpu_s"] = time.time() - t0, time.process_time() - cpu0
            record["finished"] = datetime.datetime.now().isoformat(timespec="seconds")
            return record
        if v.selected:  # the recipe chosen on the stand-in, read from its selection record
            chosen = self.selected_recipe(plan)
            record["selected_recipe"] = {"label": chosen.label, **dataclasses.asdict(chosen)}
            plan = dataclasses.replace(plan, variant=dataclasses.replace(v, recipe=_recipe_changes(chosen)))
        tgt = self.target(plan.target)
        flips: dict[str, FlipParts] = {}
        if v.kind in UNADAPTED:
            errors = _score_unadapted(self, base, src, tgt, record, flips)
        elif v.kind == "oracle":
            errors = _run_oracle(self, base, tgt, plan, record, flips)
        else:
            errors = _run_personalization(self, base, src, tgt, plan, record, flips)
        _add_errors(record, errors, flips)
        record["wall_s"] = time.time() - t0
        record["cpu_s"] = time.process_time() - cpu0
        record["finished"] = datetime.datetime.now().isoformat(timespec="seconds")
        return record


# ----------------------------------------------------------------------------- one record


def _new_record(plan: RecordPlan, config_hash: str, base: nn.Module) -> dict[str, Any]:
    """The fields every record has, at their values for no adaptation (the runners below fill in theirs)."""
    v = plan.variant
    return {
        "id": plan.id,
        "config_hash": config_hash,
        "method": v.label,
        "group": v.group,
        "ablation": None if v.group in ("main", "sanity") else {"name": v.group, "value": v.value},
        "kind": v.kind,
        "pair": plan.pair,
        "source": plan.source,
        "target": plan.target,
        "seed": plan.seed,
        "base": v.base if not v.base.startswith("rank=") else f"truncated d={v.base[5:]}",
        "steps": None,
        "failed": {},
        "trainable_params": 0,
        "inference_params": _param_count(base),
        "compact_merge_params": _param_count(base),
        "merge": "none",
        "adapter_bytes": None,
        "compact_bytes": None,
        "seconds_per_user": 0.0,
        "cpu_seconds_per_user": 0.0,
        "peak_rss_mib": None,
        "peak_rss_increase_mib": None,
        "latency_ms": None,
        "base_latency_ms": None,
    }


def _score(model: nn.Module, data: GazeDataset, persons: list[str], n_adapt: int, flips: dict[str, FlipParts]):
    """Per-person errors of ``model`` on the scored images, and (into ``flips``) what a flip sees of them."""
    flips.update(person_flip_parts(model, data, persons, n_adapt))
    return person_gaze_errors(model, data, persons, n_adapt)


def _add_errors(record: dict[str, Any], errors: dict[str, GazeError], flips: dict[str, FlipParts]) -> None:
    """The scored part of a record: per-person errors (their yaw/pitch parts, what a flip sees of them:
    :mod:`alfa.gaze.flip`) and their means; ``flip_tta_error_deg`` is flip-TTA on top of the record's model."""
    record["per_person_flip"] = {p: flips[p].to_dict() for p in errors if p in flips}
    if record["per_person_flip"]:
        parts = list(record["per_person_flip"].values())
        record["flip"] = {k: statistics.fmean(x[k] for x in parts) for k in parts[0]}
        record["flip_tta_error_deg"] = record["flip"]["tta_error"]
    angular = {p: e.angular for p, e in errors.items()}
    record["per_person"] = angular
    record["per_person_parts"] = {p: e.parts() for p, e in errors.items()}
    record["persons"] = len(angular)
    record["error_deg"] = sum(angular.values()) / len(angular) if angular else float("nan")
    record["std_over_persons"] = statistics.pstdev(angular.values()) if len(angular) > 1 else 0.0


def _score_unadapted(
    session: _Session,
    base: nn.Module,
    src: _Source,
    tgt: _Target,
    record: dict[str, Any],
    flips: dict[str, FlipParts],
) -> dict[str, GazeError]:
    """The rows without adaptation: in-domain (on held-out source persons), target-trained, source-only and
    flip-TTA (the base's predictions averaged with its mirrored predictions on the flipped images; on the
    target), each with the error of a constant prediction on its set; source-only's and flip-TTA's latency."""
    n_adapt = session.config.personalize.n_adapt
    data = src.val if record["kind"] == "in-domain" else tgt.data
    model = FlipTTA(base) if record["kind"] == "flip-tta" else base
    errors = _score(model, data, data.persons(), n_adapt, flips)
    record["constant_prediction_deg"] = constant_prediction_error(data, data.persons(), n_adapt)
    if record["kind"] in ("source-only", "flip-tta"):
        images = session.latency_images(tgt)
        record["latency_ms"], record["base_latency_ms"] = _latency_ms(
            [model, base], images, session.config.latency_repeats
        )
    return errors


def _run_personalization(
    session: _Session,
    base: nn.Module,
    src: _Source,
    tgt: _Target,
    plan: RecordPlan,
    record: dict[str, Any],
    flips: dict[str, FlipParts],
) -> dict[str, GazeError]:
    """An adapter method (or TPGaze) with the shared recipe on every target person: personalize, score each
    person's saved adapter, measure the costs of one of them."""
    c, v = session.config, plan.variant
    folder = session.adapter_dir(plan)
    run, recipe, cpu = _personalize_persons(session, base, src, tgt, plan, folder, record)
    ok = [p for p, o in run.persons.items() if o.status in ("ok", "skipped")]
    fresh = [p for p, o in run.persons.items() if o.status == "ok"]
    _add_run_summary(record, run, recipe, cpu, ok, fresh)
    errors: dict[str, GazeError] = {}
    for person in ok:
        load_adapter(base, folder / adapter_filename(person))
        try:
            errors.update(_score(base, tgt.data, [person], c.personalize.n_adapt, flips))
        finally:
            detach(base)
    if ok:
        images = session.latency_images(tgt)
        record.update(adapter_costs(base, folder / adapter_filename(ok[0]), images, c.latency_repeats))
    if v.kind == "tpgaze":
        record["meta_only"] = _meta_only_errors(session, base, src, tgt)
    if session.shows_updates(plan):
        session.figures.save_updates(base, src, tgt, plan, folder, record["config_hash"])
    if not session.keeps_adapters(plan):
        shutil.rmtree(folder, ignore_errors=True)
    return errors


def _step_errors(data: GazeDataset, indices: dict[str, list[int]], at: set[int] | None = None):
    """``track`` for :func:`personalize_dataset`: per person, a function giving the model's mean angular error
    on that person's images ``indices[person]`` (with their labels), measured at the calls numbered in ``at``
    (0: before the first step; every call when ``at`` is None) and NaN at the others."""

    def for_person(person: str):
        images, labels = load_examples(data, indices[person])
        calls = itertools.count()

        def measure(model: nn.Module) -> float:
            if at is not None and next(calls) not in at:
                return float("nan")
            return float(angular_error(predict_images(model, images), labels).mean())

        return measure

    return for_person


def _personalize_persons(
    session: _Session,
    base: nn.Module,
    src: _Source,
    tgt: _Target,
    plan: RecordPlan,
    folder: Path,
    record: dict[str, Any],
) -> tuple[Any, Any, float]:
    """Personalize every target person into ``folder``; the peak memory goes to ``record``. Returns the
    run's summary, the recipe it used and the CPU seconds it took."""
    v = plan.variant
    recipe = session.config.recipe(plan.seed, **v.recipe)
    persons = tgt.data.persons()
    # The reference protocol, replayed: every step scored with labels on all of a person's images (the
    # adaptation images too), as the reference code does; reported as test-label selection, never a result.
    replay = _step_errors(tgt.data, {p: tgt.data.person_indices(p) for p in persons})
    before_mib = _reset_peak_memory()
    cpu0 = time.process_time()
    if v.kind == "tpgaze":
        prompts = session.tpgaze_prompts(src)
        before_mib = _reset_peak_memory()  # meta-training is a per-source cost, not a per-user one
        cpu0 = time.process_time()
        recipe = tpgaze_recipe(recipe)
        run = personalize_tpgaze_dataset(
            base, tgt.data, prompts, folder, recipe, persons=persons, progress=session.progress, track=replay
        )
    else:
        adapter = v.adapter
        assert adapter is not None
        if v.same_layers_as_truncated:
            names = [n for n, m in src.models.recovered.named_modules() if is_factorized(m)]
            adapter = dataclasses.replace(adapter, target="^(" + "|".join(re.escape(n) for n in names) + ")$")
        run = personalize_dataset(
            base, tgt.data, adapter, recipe, folder, persons=persons, progress=session.progress, track=replay
        )
    cpu = time.process_time() - cpu0
    peak = _proc_status_mib("VmHWM")
    if before_mib is not None and peak is not None:
        record["peak_rss_mib"] = peak
        record["peak_rss_increase_mib"] = max(0.0, peak - before_mib)
    return run, recipe, cpu


def _add_run_summary(
    record: dict[str, Any], run: Any, recipe: Any, cpu: float, ok: list[str], fresh: list[str]
) -> None:
    """What the personalization run reports: failures, steps, configs, time per user, first/final loss."""
    record["failed"] = run.failed
    record["steps"] = recipe.steps
    record["method_config"] = run.method_config
    record["recipe"] = {k: v for k, v in run.config.items() if k != "augment"}
    record["seconds_per_user"] = statistics.mean(run.persons[p].seconds for p in ok) if ok else None
    record["cpu_seconds_per_user"] = cpu / len(fresh) if fresh else None
    steps = {p: run.persons[p].tracked for p in ok if run.persons[p].tracked}
    if steps:
        record["per_person_steps"] = steps
        record["reference_protocol_deg"] = reference_protocol_error(steps)
    losses = [run.persons[p] for p in ok if run.persons[p].losses]
    if losses:
        record["loss"] = {
            "first": statistics.mean(o.losses[0] for o in losses),
            "final": statistics.mean(o.final_loss for o in losses),
        }


def _recipe_changes(recipe: Recipe) -> dict[str, Any]:
    """A grid recipe as changes to the benchmark's :class:`PersonalizeConfig` (what a :class:`Variant` holds)."""
    applied = recipe.apply(PersonalizeConfig())
    return {k: getattr(applied, k) for k in ("detach_flipped", "lr", "lr_scale", "steps", "pitch_anchor")}


def _run_selection(session: _Session, base: nn.Module, plan: RecordPlan, record: dict[str, Any]) -> None:
    """The declared recipe grid (docs/flip-premise.md §4) for one method on its source's stand-in: every run
    of :func:`~alfa.gaze.recipes.training_runs`, each person scored after the step counts the grid asks
    for; the rule picks the recipe. Reads the stand-in's labels and nothing of any target."""
    c, v = session.config, plan.variant
    assert v.adapter is not None
    standin = session.stand_in(plan.source)
    n_adapt = c.personalize.n_adapt
    persons = standin.data.persons()
    scored = {p: eval_indices(standin.data, p, n_adapt) for p in persons}
    folder = session.adapter_dir(plan)
    errors: dict[Recipe, dict[str, float]] = {}
    failed: dict[str, str] = {}
    source_only: dict[str, float] = {}
    for run_recipe, evals in training_runs(RECIPE_GRID).items():
        recipe = run_recipe.apply(c.recipe(plan.seed))
        track = _step_errors(standin.data, scored, at={0, *evals})
        run = personalize_dataset(
            base,
            standin.data,
            v.adapter,
            recipe,
            folder / safe_filename(run_recipe.label),
            persons=persons,
            resume=False,
            progress=False,
            track=track,
        )
        ok = {p: o for p, o in run.persons.items() if o.status == "ok"}
        failed.update({f"{run_recipe.label} {p}": o.error or "" for p, o in run.persons.items() if p not in ok})
        for k in evals:
            # a recipe that fails on a person is out of the running (its mean is not finite)
            per_person = {p: o.tracked[k] for p, o in ok.items()}
            if len(ok) < len(persons):
                per_person = {p: per_person.get(p, float("inf")) for p in persons}
            errors[dataclasses.replace(run_recipe, steps=k)] = per_person
        source_only = source_only or {p: o.tracked[0] for p, o in ok.items()}
    shutil.rmtree(folder, ignore_errors=True)
    means = {r: statistics.fmean(e.values()) for r, e in errors.items()}
    chosen = select_recipe(means)
    record.update(
        {
            "stand_in": standin.spec,
            "persons": len(persons),
            "per_person": errors[chosen],
            "error_deg": means[chosen],
            "source_only_deg": statistics.fmean(source_only.values()) if source_only else None,
            "selected": dataclasses.asdict(chosen),
            "selected_label": chosen.label,
            "paper_recipe_deg": means.get(PAPER_RECIPE),
            "grid": [
                {"recipe": dataclasses.asdict(r), "label": r.label, "error_deg": means[r], "per_person": e}
                for r, e in errors.items()
            ],
            "failed": failed,
        }
    )


def _meta_only_errors(session: _Session, base: nn.Module, src: _Source, tgt: _Target) -> dict[str, Any]:
    """TPGaze's meta-trained prompts before any personalization step, on the same scored images."""
    persons = tgt.data.persons()
    load_adapter(base, session.tpgaze_prompts(src))
    try:
        meta_only = person_errors(base, tgt.data, persons, session.config.personalize.n_adapt)
    finally:
        detach(base)
    return {"error_deg": sum(meta_only.values()) / len(meta_only), "per_person": meta_only}


def _run_oracle(
    session: _Session,
    base: nn.Module,
    tgt: _Target,
    plan: RecordPlan,
    record: dict[str, Any],
    flips: dict[str, FlipParts],
) -> dict[str, GazeError]:
    """Per person: supervised fine-tuning of every parameter on labelled images that are never scored."""
    c, oc = session.config, session.config.oracle
    n_adapt = c.personalize.n_adapt
    errors: dict[str, GazeError] = {}
    seconds = []
    before_mib = _reset_peak_memory()
    cpu0 = time.process_time()
    persons = tgt.data.persons()
    for person in tqdm(persons, desc=f"oracle {tgt.data.name}", disable=not session.progress, leave=False):
        t0 = time.time()
        images, gaze = _oracle_examples(tgt, person, n_adapt, oc)
        attach(base, FullFinetuneConfig())
        try:
            _fine_tune(base, images, gaze, oc, torch.Generator().manual_seed(person_seed(plan.seed, person, "oracle")))
            seconds.append(time.time() - t0)
            errors.update(_score(base, tgt.data, [person], n_adapt, flips))
        finally:
            detach(base)
    peak = _proc_status_mib("VmHWM")
    record["trainable_params"] = _param_count(base)
    record["merge"] = "in place"
    record["steps"] = oc.steps
    record["seconds_per_user"] = statistics.mean(seconds) if seconds else None
    record["cpu_seconds_per_user"] = (time.process_time() - cpu0) / max(1, len(persons))
    if before_mib is not None and peak is not None:
        record["peak_rss_mib"], record["peak_rss_increase_mib"] = peak, max(0.0, peak - before_mib)
    record["labelled_images_per_person"] = n_adapt + (oc.extra_images if tgt.extra is not None else 0)
    return errors


def _oracle_examples(tgt: _Target, person: str, n_adapt: int, oc: OracleConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """The oracle's labelled images of ``person``: the adaptation images and the extra ones."""
    images, gaze = load_examples(tgt.data, tgt.data.person_indices(person)[:n_adapt])
    if tgt.extra is not None and oc.extra_images > 0:
        more = load_examples(tgt.extra, tgt.extra.person_indices(person))
        images, gaze = torch.cat([images, more[0]]), torch.cat([gaze, more[1]])
    return images, gaze


def _fine_tune(
    model: nn.Module, images: torch.Tensor, gaze: torch.Tensor, oc: OracleConfig, generator: torch.Generator
) -> None:
    """The oracle's supervised fine-tuning of ``model`` (its full fine-tune adapter attached)."""
    model.eval()
    device = next(model.parameters()).device
    images, gaze = images.to(device), gaze.to(device)
    groups = param_groups(model, oc.lr, lr_scale=oc.lr_scale, weight_decay=oc.weight_decay)
    optimizer = torch.optim.AdamW(groups, lr=oc.lr, weight_decay=oc.weight_decay)
    for _ in range(oc.steps):
        idx = torch.randperm(images.shape[0], generator=generator)[: oc.batch_size]
        loss = finite_or_raise(supervised_l1_loss(model(images[idx]), gaze[idx]), "oracle")
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()


# ----------------------------------------------------------------------------- figure data


class _FigureData:
    """The data behind the report's two model figures, stored in the results folder's ``figure_data``."""

    def __init__(self, config: BenchConfig, out: Path) -> None:
        self.config, self.folder = config, out / FIGURE_DIR

    def has_rank_slices(self) -> bool:
        return _figure_stamp(self.folder / RANK_SLICES_FILE) is not None

    def save_rank_slices(self, src: _Source, tgt: _Target) -> None:
        """Rank-slice maps of the figure layer on two target persons (once per source model and target)."""
        from .figures import rank_slice_data, save_figure_data

        path = self.folder / RANK_SLICES_FILE
        stamp = _hash({"source": src.cache_key, "target": tgt.fingerprint, "layer": self.config.slice_layer})
        if _figure_stamp(path) == stamp:
            return
        persons = tgt.data.persons()[:2]
        images = load_images(tgt.data, [tgt.data.person_indices(p)[0] for p in persons])
        tensors, meta = rank_slice_data(
            src.models.recovered, self.config.slice_layer, images, self.config.figure_slices
        )
        meta.update({"persons": persons, "target": tgt.data.name, "pair": self.config.figure_pair, "stamp": stamp})
        save_figure_data(path, tensors, meta)

    def save_updates(
        self, base: nn.Module, src: _Source, tgt: _Target, plan: RecordPlan, folder: Path, record_hash: str
    ) -> None:
        """The update ΔW of the figure layer for three persons of this record, next to the other methods'
        (kept while they come from the same source model)."""
        from .figures import save_figure_data, update_data

        path = self.folder / UPDATES_FILE
        persons = [p for p in tgt.data.persons() if (folder / adapter_filename(p)).is_file()][:3]
        tensors, meta = update_data(base, {p: folder / adapter_filename(p) for p in persons}, self.config.update_layer)
        existing_tensors, existing_meta = _read_figure(path)
        methods = dict(existing_meta.get("methods", {})) if existing_meta.get("source") == src.cache_key else {}
        keep = {
            k: t
            for k, t in existing_tensors.items()
            if k.split("/")[0] in methods and k.split("/")[0] != plan.variant.label
        }
        methods[plan.variant.label] = {"record_hash": record_hash, "persons": persons}
        keep.update({f"{plan.variant.label}/{k}": t for k, t in tensors.items()})
        meta.update({"methods": methods, "source": src.cache_key, "pair": plan.pair, "seed": plan.seed})
        save_figure_data(path, keep, meta)


def _read_figure(path: Path) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    from .figures import load_figure_data

    if not path.is_file():
        return {}, {}
    try:
        return load_figure_data(path)
    except ValueError:
        return {}, {}


def _figure_stamp(path: Path) -> str | None:
    return _read_figure(path)[1].get("stamp")


# ----------------------------------------------------------------------------- the run


@dataclass
class BenchSummary:
    """What one :func:`run_bench` call did."""

    results: Path
    ran: list[str]
    skipped: list[str]
    pending: list[str]
    wall_s: float
    cpu_s: float
    errors: dict[str, str] = field(default_factory=dict)  # record id -> why it failed (not written)


def _log_line(record: dict[str, Any], index: int, total: int) -> str:
    spu = record.get("seconds_per_user")
    extra = f", {spu:.1f} s/user" if spu else ""
    failed = f", {len(record['failed'])} FAILED" if record.get("failed") else ""
    return (
        f"[{index}/{total}] {record['id']}: {record['error_deg']:.2f} deg over {record['persons']} persons"
        f"{extra}{failed} ({record['wall_s']:.0f} s)"
    )


def run_bench(
    config: BenchConfig,
    out_dir: str | os.PathLike,
    *,
    cache_dir: str | os.PathLike | None = None,
    progress: bool = True,
    command: str | None = None,
    dry_run: bool = False,
    device: torch.device | str = "cpu",
) -> BenchSummary:
    """Run (or resume) the benchmark described by ``config`` into ``out_dir``.

    Records already in ``out_dir/results.json`` with the same id and config hash are skipped; the others
    run, each written as soon as it is finished. Source models are cached under ``cache_dir`` (default
    ``out_dir/cache``), TPGaze's meta-trained prompts and the other-rank bases next to them. With
    ``dry_run`` nothing is trained: the pending records are listed (the data are rendered to hash them).
    ``device`` holds the models (training and inference); the numbers are compared bit for bit only on the
    CPU, so the run log records the device.
    """
    config.validate()
    out = Path(out_dir)
    if not dry_run:
        out.mkdir(parents=True, exist_ok=True)
    cache = Path(cache_dir) if cache_dir is not None else out / "cache"
    store = ResultsStore(out, config, create=not dry_run)
    threads = torch.get_num_threads()
    torch.set_num_threads(config.threads)
    t_start, cpu_start = time.time(), time.process_time()
    # Unique even for two runs of one process within a second (the id only names the run's log entry).
    run_id = f"{datetime.datetime.now().isoformat(timespec='seconds')}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
    session = _Session(config, out, cache, progress, torch.device(device))
    run_entry = {
        "id": run_id,
        "command": command,
        "preset": config.preset,
        "selection": {k: config.to_dict()[k] for k in SELECTION_FIELDS},
        "started": datetime.datetime.now().isoformat(timespec="seconds"),
        "wall_s": 0.0,
        "cpu_s": 0.0,
        "records_run": 0,
        "load_average_start": os.getloadavg()[0],
        "cpus": os.cpu_count(),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "device": str(session.device),
        "finished": False,
    }
    plans = plan_records(config)
    ran: list[str] = []
    skipped: list[str] = []
    todo: list[RecordPlan] = []
    errors: dict[str, str] = {}

    def save_run(data: dict[str, Any], finished: bool = False) -> None:
        run_entry.update(
            wall_s=time.time() - t_start,
            cpu_s=time.process_time() - cpu_start,
            records_run=len(ran),
            records_failed=errors,
            load_average_end=os.getloadavg()[0],
            finished=finished,
        )
        data["runs"] = [r for r in data["runs"] if r.get("id") != run_id]
        if ran:  # a run that only found finished records adds nothing to the record
            data["runs"].append(dict(run_entry))
        for (key, seed), src in session.sources.items():
            if src.info:
                data["sources"][f"{key}|seed{seed}"] = {**data["sources"].get(f"{key}|seed{seed}", {}), **src.info}

    try:
        done = store.done()
        groups: dict[tuple[int, str], list[RecordPlan]] = {}
        for plan in plans:
            groups.setdefault((plan.seed, plan.source), []).append(plan)
        for plans_of in groups.values():
            for plan in plans_of:
                if done.get(plan.id) == session.record_hash(plan):
                    skipped.append(plan.id)
                else:
                    todo.append(plan)
        if dry_run:
            return BenchSummary(store.path, [], skipped, [p.id for p in todo], time.time() - t_start, 0.0)
        if progress:
            tqdm.write(f"benchmark {config.preset}: {len(todo)} records to run, {len(skipped)} already done")
        bar = tqdm(total=len(todo), desc="bench records", disable=not progress, position=0)
        figure_source, figure_target = split_pair(config.figure_pair)
        for seed, source in groups:
            group_todo = [p for p in todo if p.seed == seed and p.source == source]
            figure_here = seed == config.figure_seed and source == figure_source and config.figure_pair in config.pairs
            slices_missing = figure_here and not session.figures.has_rank_slices()
            if not group_todo and not slices_missing:
                continue
            src = session.build(source, seed)
            if figure_here:
                session.figures.save_rank_slices(src, session.target(figure_target))
            for plan in group_todo:
                try:
                    record = session.run(plan)
                except (ValueError, RuntimeError, FloatingPointError, OSError, MergeError) as e:
                    # One broken record must not stop a run of hours; it is not written, so it reruns next time.
                    errors[plan.id] = f"{type(e).__name__}: {e}"
                    tqdm.write(f"record {plan.id} FAILED ({errors[plan.id]}); going on")
                    bar.update(1)
                    continue
                store.add_record(record)
                ran.append(plan.id)
                store.update(save_run)
                bar.update(1)
                if progress:
                    tqdm.write(_log_line(record, len(ran), len(todo)))
            session.release(source, seed)
        bar.close()
        store.update(lambda data: save_run(data, finished=True))
    finally:
        torch.set_num_threads(threads)
        if not dry_run and run_entry["records_run"] != len(ran):  # interrupted: keep what this run did
            with contextlib.suppress(Exception):
                store.update(save_run)
    pending = [p.id for p in todo if p.id not in ran]
    wall, cpu = time.time() - t_start, time.process_time() - cpu_start
    return BenchSummary(store.path, ran, skipped, pending, wall, cpu, errors)
