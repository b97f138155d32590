"""The session of one benchmark run: the rendered data, the source models and the paths every record is made
from, and each record's hash (:meth:`Session.record_hash`: what the record depends on, so a rerun skips what
is finished and redoes what changed; the hash's schema is :mod:`alfa.study.bench.schema`'s).

Per (source, seed) one source model is pre-trained, truncated at rank ``d`` and recovered
(:func:`alfa.gaze.pipeline.build_source_model`, cached by a hash of everything it depends on); the other-rank
bases and TPGaze's meta-trained prompts are cached next to it, each built under a lock on its folder
(:func:`building`), as the source model is. Making a record from a session is
:func:`alfa.study.bench.produce.produce_record`.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import json
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from alfa.adapters import detach
from alfa.adapters.prompt import TPGazeConfig
from alfa.checkpoint import load_model, read_checkpoint
from alfa.fileio import safe_filename, write_bytes, write_json
from alfa.gaze.data.base import GazeDataset, InMemoryGazeDataset
from alfa.gaze.evaluate import adapter_filename, load_images
from alfa.gaze.faze_train import MODEL_FILE as FAZE_MODEL_FILE
from alfa.gaze.faze_train import FazeTrainConfig, meta_train_faze, train_faze
from alfa.gaze.faze_train import MetaTrainConfig as FazeMetaConfig
from alfa.gaze.pipeline import SourceSpec, build_source_model, data_fingerprint, open_data, source_cache_key
from alfa.gaze.pnpga import ensemble_trained, snapshot_paths, snapshot_saver
from alfa.gaze.recipes import Recipe
from alfa.gaze.tpgaze import MetaTrainConfig, meta_train_prompts
from alfa.gaze.train import MODEL_FILE, TruncateConfig, input_size, truncate_and_recover
from alfa.locks import locked

from ..timing import cpu_kind
from .config import BenchConfig
from .plan import STAND_IN, RecordPlan, grid_plan
from .record import as_records
from .results import FIGURE_DIR, RANK_SLICES_FILE, UPDATES_FILE, load_results
from .schema import config_hash, stable_hash

__all__ = ["TargetData", "SourceContext", "Session", "building", "refuse_a_different_model"]


def building(folder: Path) -> contextlib.AbstractContextManager[None]:
    """Hold ``folder``'s build lock (``folder.lock`` beside it, :func:`alfa.locks.locked`) around a cached build:
    two pieces of one benchmark that need the same model or prompts at once must not train into one folder side
    by side; the second waits (saying so on stderr, as the source model's build does) and then reads what the
    first one finished."""

    def say_waiting(holder: str) -> None:
        print(f"waiting for {holder} building {folder}", file=sys.stderr, flush=True)

    return locked(folder, on_wait=say_waiting)


def refuse_a_different_model(recorded: dict[str, Any], built: dict[str, Any]) -> None:
    """Refuse (``RuntimeError``) a model built again under its recorded cache key (its cache was lost) that does
    not end at the recorded errors exactly: records of two models under one name would mix silently. Training is
    deterministic on one kind of machine and device, so a faithful rebuild ends where the recorded one did."""
    if not recorded or Path(str(recorded.get("cache"))).name != Path(str(built.get("cache"))).name:
        return
    val = "pretrain_final_val_error"
    for what, old, new in (
        ("pre-training's validation error", recorded.get(val), built.get(val)),
        ("error after recovery", _after_recovery(recorded), _after_recovery(built)),
    ):
        if old is not None and new is not None and float(old) != float(new):
            raise RuntimeError(
                f"the model in {built.get('cache')} was built again and differs from the one the results were "
                f"made with ({what} {new!r}, recorded {old!r}); refusing to add its records beside theirs"
            )


TRAINED_ON_FILE = "trained_on.json"
"""Beside a source's cached models: the kind of machine that trained them. A run stopped after the models were
built and before its first record wrote none into results.json; its resume reads them from the cache."""


def _trained_on(cache: Path, from_cache: bool) -> str | None:
    """The CPU that trained the models in ``cache``: this one (and written down) when this run trained them, else
    what the cache says (``None`` for a cache made before it said)."""
    path = cache / TRAINED_ON_FILE
    if not from_cache:
        kind = cpu_kind()
        write_json(path, kind)
        return kind["cpu"]
    if not path.is_file():
        return None
    try:
        return str(json.loads(path.read_text(encoding="utf-8"))["cpu"])
    except (OSError, ValueError, KeyError, TypeError):
        return None  # unreadable: not recorded, as before the file existed


def _after_recovery(info: dict[str, Any]) -> Any:
    return ((info.get("truncation") or {}).get("errors") or {}).get("after_recovery")


# ----------------------------------------------------------------------------- contexts


@dataclass
class TargetData:
    """A rendered target (or a source's stand-in): the images every method sees and is scored on."""

    key: str
    spec: str
    data: InMemoryGazeDataset  # target_images per person: what every method sees and is scored on
    extra: InMemoryGazeDataset | None  # the oracle's extra labelled images
    fingerprint: str


@dataclass
class SourceContext:
    """A (source, seed): its data, its cache key, and its models once built (released after its records)."""

    key: str
    seed: int
    spec: SourceSpec
    data: GazeDataset
    val: GazeDataset
    cache_key: str
    models: Any = None  # SourceModels once built
    other_ranks: dict[int, nn.Module] = field(default_factory=dict)
    prompts: Path | None = None
    info: dict[str, Any] = field(default_factory=dict)
    pnpga_members: list[nn.Module] | None = None  # PnP-GA's ensemble once trained (alfa.study.bench.pnpga)


class Session:
    """Data, source models and paths of one :func:`~alfa.study.bench.runner.run_bench` call, and the hash
    of each record; :func:`~alfa.study.bench.produce.produce_record` makes a record from it."""

    def __init__(
        self,
        config: BenchConfig,
        out: Path,
        cache: Path,
        progress: bool,
        device: torch.device | None = None,
        precision: str = "fp32",
        recorded_sources: dict[str, dict[str, Any]] | None = None,
    ) -> None:
        self.config, self.out, self.cache, self.progress = config, out, cache, progress
        self.device = torch.device("cpu") if device is None else device
        self.precision = precision  # of the personalization and evaluation forwards (alfa.gaze.precision)
        self.figures = _FigureData(config, out)
        self.targets: dict[str, TargetData] = {}
        self.sources: dict[tuple[str, int], SourceContext] = {}
        self.source_data: dict[str, tuple[GazeDataset, GazeDataset]] = {}
        # the user-calibration recipe chosen on a stand-in, per (source, seed, method, grid): every k reads it
        self.calibration_choices: dict[tuple[Any, ...], dict[str, Any]] = {}
        self.faze: dict[Path, dict[str, nn.Module]] = {}  # FAZE models per cache folder (faze_models)
        # the results' ``sources`` entries when the run started: a model built again must match its entry
        self.recorded_sources = recorded_sources or {}

    # ---------------------------------------------------------------- data

    def target(self, key: str, seed: int) -> TargetData:
        """The scored target ``key`` of ``seed`` (the same data for every seed unless the persons are drawn
        per seed)."""
        c = self.config
        spec = c.target_spec(key, seed)
        if spec not in self.targets:
            full = open_data(spec)
            keep, extra = [], []
            for p in full.persons():
                idx = full.person_indices(p)
                keep += idx[: c.target_images]
                extra += idx[c.target_images :]
            data = full.subset(keep)
            self.targets[spec] = TargetData(
                key, spec, data, full.subset(extra) if extra else None, data_fingerprint(data)
            )
        return self.targets[spec]

    def source(self, key: str, seed: int) -> SourceContext:
        if (key, seed) not in self.sources:
            c = self.config
            if key not in self.source_data:
                self.source_data[key] = (open_data(c.source_spec(key)), open_data(c.val_spec(key)))
            data, val = self.source_data[key]
            spec = c.source_model_spec(key, seed)
            fingerprints = {"source": data_fingerprint(data), "val": data_fingerprint(val)}
            self.sources[(key, seed)] = SourceContext(
                key, seed, spec, data, val, source_cache_key(spec, fingerprints, self.device)
            )
        return self.sources[(key, seed)]

    def release(self, key: str, seed: int) -> None:
        """Free the models of the context ``(key, seed)`` (its data and its log stay; :meth:`build` loads
        them again from the cache)."""
        src = self.sources.get((key, seed))
        if src is not None:
            src.models, src.other_ranks, src.pnpga_members = None, {}, None

    # ---------------------------------------------------------------- hashes

    def stand_in(self, source: str) -> TargetData:
        """The labelled stand-in of ``source``'s recipe selection (another world's held-out persons)."""
        key = f"{source}→{STAND_IN}"
        if key not in self.targets:
            spec = self.config.stand_in_spec(source)
            data = open_data(spec)
            self.targets[key] = TargetData(key, spec, data, None, data_fingerprint(data))
        return self.targets[key]

    def record_hash(self, plan: RecordPlan) -> str:
        """The record's ``config_hash`` (:func:`~alfa.study.bench.schema.config_hash`) from this session's data."""
        v = plan.variant
        source_model = self.source(self.model_key(plan), plan.seed).cache_key
        if v.kind == "selection":  # scored on the stand-in: no target is opened, let alone its labels
            stand_in = self.stand_in(plan.source)
            return config_hash(self.config, plan, source_model, stand_in, self.device, precision=self.precision)
        scored = None if v.kind == "in-domain" else self.target(plan.target, plan.seed)
        selection = self.record_hash(grid_plan(self.config, plan)) if v.selected else None
        stand_in = self.stand_in(plan.source) if v.kind == "calibration" else None
        return config_hash(
            self.config, plan, source_model, scored, self.device, selection, self.precision, stand_in=stand_in
        )

    # ---------------------------------------------------------------- models

    def source_cache(self, src: SourceContext) -> Path:
        """The cache folder of ``src``'s models (:func:`~alfa.gaze.pipeline.build_source_model` names it)."""
        return self.cache / f"source-{src.cache_key}"

    def pnpga_folder(self, src: SourceContext, members: int) -> Path:
        """Where PnP-GA's ensemble of ``members`` snapshots of ``src``'s pre-training lies: in its source model's
        cache folder (:func:`alfa.study.bench.pnpga.ensemble_members`)."""
        return self.source_cache(src) / f"pnpga-last{members}"

    def build(self, key: str, seed: int, pnpga_members: int = 0) -> SourceContext:
        """Build (or load) the models of ``(key, seed)``. With ``pnpga_members``, a pre-training this call runs
        also keeps PnP-GA's ensemble (that many epoch snapshots, :func:`alfa.gaze.pnpga.snapshot_saver`): the
        same training the ensemble would otherwise run a second time. The ensemble's folder is held while the
        source builds, so that no other piece starts that second training meanwhile."""
        src = self.source(key, seed)
        if src.models is None:
            folder = self.pnpga_folder(src, pnpga_members) if pnpga_members else None
            with building(folder) if folder is not None else contextlib.nullcontext():
                src.models = self._build_sharing_snapshots(src, folder, pnpga_members)
            if src.models.cache.name != self.source_cache(src).name:
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
            trained_on = _trained_on(src.models.cache, src.models.from_cache)
            if trained_on is not None:  # the kind of machine that trained it; else the record's, if any, is kept
                src.info["cpu"] = trained_on
            src.info.update(self.recorded_training(src))
            refuse_a_different_model(self.recorded_sources.get(f"{key}|seed{seed}", {}), src.info)
        return src

    def _build_sharing_snapshots(self, src: SourceContext, folder: Path | None, members: int) -> Any:
        pretrain = src.spec.pretrain
        kept = snapshot_paths(folder, members, pretrain.epochs) if folder is not None else []
        finished = folder is None or ensemble_trained(folder, members, pretrain.epochs)
        size = input_size(src.data)
        hook = None if finished else snapshot_saver(folder, src.spec.model, members, pretrain.epochs, size)
        torch.manual_seed(src.seed)
        models = build_source_model(
            src.spec,
            src.data,
            src.val,
            cache_dir=self.cache,
            progress=self.progress,
            device=self.device,
            on_pretrain_epoch=hook,
        )
        if hook is not None and all(p.is_file() for p in kept):
            # The snapshots came from the source's own pre-training: its final model is the ensemble's
            # training's (what ensemble_members reads its history from and takes as the sign it is finished).
            write_bytes(folder / "pretrain" / MODEL_FILE, (models.cache / "pretrain" / MODEL_FILE).read_bytes())
        return models

    def base(self, src: SourceContext, which: str) -> nn.Module:
        if which == "truncated":
            return src.models.recovered
        if which == "dense":
            return src.models.dense
        d = int(which.removeprefix("rank="))
        if d == self.config.rank:
            return src.models.recovered
        if d not in src.other_ranks:
            model = copy.deepcopy(src.models.dense)
            folder = src.models.cache / f"rank-{d}"
            with building(folder):
                result = truncate_and_recover(
                    model,
                    src.data,
                    TruncateConfig(rank=d, recovery=dataclasses.replace(self.config.recovery, seed=src.seed)),
                    folder,
                    val_dataset=src.val,
                    val_persons=src.val.persons(),
                    model_name=self.config.model,
                    progress=self.progress,
                )
            src.info.setdefault("other_ranks", {})[str(d)] = {"errors": result.errors, "params": result.params}
            src.info.update(self.recorded_training(src))  # now with this rank's recovery
            src.other_ranks[d] = model.eval()
        return src.other_ranks[d]

    def recorded_training(self, src: SourceContext) -> dict[str, Any]:
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
        for folder in sorted(p for p in cache.glob("rank-*") if p.is_dir()):  # not the build locks beside them
            history = header(folder / "model.safetensors").get("result", {}).get("recovery_history")
            if history:
                parts[f"recovery at {folder.name}"] = epochs(history)
        meta_log = self.tpgaze_setup(src)[2] / "meta_train.json"
        if meta_log.is_file():
            parts["tpgaze meta-training"] = epochs(json.loads(meta_log.read_text()).get("history"))
        return {"recorded_train_seconds": sum(parts.values()), "recorded_train_parts": parts}

    def tpgaze_setup(self, src: SourceContext) -> tuple[MetaTrainConfig, TPGazeConfig, Path]:
        """TPGaze's meta-training settings for ``src`` and the cache folder they hash to."""
        c = self.config
        meta = dataclasses.replace(c.meta, seed=src.seed)
        prompt = TPGazeConfig(image_size=c.image_size, init_std=c.tpgaze_init_std)
        spec = {"source": src.cache_key, "meta": meta.to_dict(), "prompt": prompt.to_dict()}
        if self.precision != "fp32":  # prompts meta-trained in another precision are other prompts
            spec["precision"] = self.precision
        key = stable_hash(spec)
        return meta, prompt, self.cache / f"tpgaze-{key}"

    def tpgaze_prompts(self, src: SourceContext) -> Path:
        """Meta-train TPGaze's prompts once per (source, seed) base (resumable, cached by a hash)."""
        if src.prompts is None:
            meta, prompt, folder = self.tpgaze_setup(src)
            base = src.models.recovered
            t0 = time.time()
            with building(folder):
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

    def faze_models(self, src: SourceContext, train: dict[str, Any], meta: dict[str, Any]) -> dict[str, nn.Module]:
        """FAZE trained on ``src``'s source data (``alfa faze train``: DT-ED and its gaze MLP) and the same model
        with its MLP meta-learned (``alfa faze meta-train``), by ``"plain"`` and ``"meta"``; ``train`` and ``meta``
        are the two configurations' fields (their seeds are the source's). Trained once per (source, seed,
        configurations), cached by a hash, resumable; loaded from the cache afterwards."""
        train_config = FazeTrainConfig(**{**train, "seed": src.seed})
        meta_config = FazeMetaConfig(**{**meta, "seed": src.seed})
        spec = {"source": src.cache_key, "train": dataclasses.asdict(train_config)}
        spec["meta"] = dataclasses.asdict(meta_config)
        folder = self.cache / f"faze-{stable_hash(spec)}"
        if folder in self.faze:
            return self.faze[folder]
        with building(folder):  # each stage resumes from its state, or finds itself complete and only saves
            train_faze(src.data, train_config, folder / "plain", progress=self.progress)
            model, saved = load_model(folder / "plain" / FAZE_MODEL_FILE)
            meta_train_faze(model, saved, src.data, meta_config, folder / "meta", progress=self.progress)
        models = {name: load_model(folder / name / FAZE_MODEL_FILE)[0].eval() for name in ("plain", "meta")}
        self.faze[folder] = models
        return models

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
        grid = grid_plan(self.config, plan)
        stored = next((r for r in as_records(load_results(self.out)["records"]) if r.id == grid.id), None)
        if stored is None or stored.config_hash != self.record_hash(grid) or stored.selected is None:
            raise RuntimeError(f"{plan.id} needs the recipe-selection record {grid.id}, which has not run")
        return Recipe(**stored.selected)

    def latency_images(self, tgt: TargetData) -> torch.Tensor:
        persons = tgt.data.persons()
        idx = [i for p in persons for i in tgt.data.person_indices(p)[self.config.personalize.n_adapt :]]
        return load_images(tgt.data, idx[: self.config.latency_batch])


# ----------------------------------------------------------------------------- figure data


class _FigureData:
    """The data behind the report's two model figures, stored in the results folder's ``figure_data``."""

    def __init__(self, config: BenchConfig, out: Path) -> None:
        self.config, self.folder = config, out / FIGURE_DIR

    def has_rank_slices(self) -> bool:
        return _figure_stamp(self.folder / RANK_SLICES_FILE) is not None

    def save_rank_slices(self, src: SourceContext, tgt: TargetData) -> None:
        """Rank-slice maps of the figure layer on two target persons (once per source model and target)."""
        from .figures import rank_slice_data, save_figure_data

        path = self.folder / RANK_SLICES_FILE
        stamp = stable_hash({"source": src.cache_key, "target": tgt.fingerprint, "layer": self.config.slice_layer})
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
        self, base: nn.Module, src: SourceContext, tgt: TargetData, plan: RecordPlan, folder: Path, record_hash: str
    ) -> None:
        """The update ΔW of the figure layer for three persons of this record, next to the other methods'
        (kept while they come from the same source model)."""
        from .figures import save_figure_data, update_data

        path = self.folder / UPDATES_FILE
        persons = [p for p in tgt.data.persons() if (folder / adapter_filename(p)).is_file()][:3]
        tensors, meta = update_data(base, {p: folder / adapter_filename(p) for p in persons}, self.config.update_layer)
        # Read, add to and rewrite the file in one turn: two pieces of the run (``--methods alfa`` and
        # ``--methods lora``) adding their methods at once would otherwise each drop the other's.
        with locked(path):
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
