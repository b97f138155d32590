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
import fcntl
import hashlib
import json
import os
import platform
import re
import shutil
import statistics
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn
from tqdm.auto import tqdm

from ..adapters import (
    AdapterConfig,
    AlfaConfig,
    BitfitConfig,
    DiagGateConfig,
    DoraConfig,
    FloraConfig,
    FullFinetuneConfig,
    LinearMixConfig,
    LoraConfig,
    MergeError,
    MiloraConfig,
    MosloraConfig,
    PissaConfig,
    SpectralConfig,
    adapted_layers,
    adapter_parameters,
    adapter_state,
    attach,
    detach,
    load_adapter,
    merge,
    param_groups,
    save_adapter,
)
from ..adapters.prompt import TPGazeConfig
from ..checkpoint import read_checkpoint
from ..data.base import GazeDataset, InMemoryGazeDataset
from ..data.synthetic import get_domain
from ..gaze.augment import AugmentConfig
from ..gaze.evaluate import (
    GazeError,
    adapter_filename,
    load_examples,
    load_images,
    person_errors,
    person_gaze_errors,
    write_json,
)
from ..gaze.losses import finite_or_raise, supervised_l1_loss
from ..gaze.personalize import PersonalizeConfig, person_seed, personalize_dataset
from ..gaze.pipeline import DemoConfig, build_source_model, data_fingerprint, open_data, source_cache_key
from ..gaze.tpgaze import MetaTrainConfig, meta_train_prompts, personalize_tpgaze_dataset, tpgaze_recipe
from ..gaze.train import TrainConfig, TruncateConfig, truncate_and_recover
from ..geometry import angular_error
from ..layers import is_factorized
from .methods import MAIN_METHODS, PAIRS, SANITY_METHODS, SOURCES, TARGETS

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

ABLATIONS = (
    "heads",
    "init",
    "rank",
    "svd_rank",
    "gate",
    "mix",
    "truncation",
    "loss",
    "detach",
    "steps",
    "lr",
    "anchor",
)
KINDS = ("source-only", "in-domain", "target-trained", "oracle", "adapter", "tpgaze")

RESULTS_FILE = "results.json"
FORMAT = "alfa-bench-results"
VERSION = 1
# What a record measures; part of every record's hash, so a change re-runs the records (v2: the yaw/pitch
# parts of the error, ``per_person_parts``).
SCORING = 2
FIGURE_DIR = "figure_data"
RANK_SLICES_FILE = "rank_slices.safetensors"
UPDATES_FILE = "updates.safetensors"
# Selection options: they say which records to run, not how; pieces of one benchmark may differ in them.
# The ablation value lists only choose which records exist (each record's hash covers what it depends
# on), so adding a value to a finished benchmark runs the new records and keeps the others.
SELECTION_FIELDS = (
    "pairs",
    "seeds",
    "methods",
    "ablations",
    "ablation_pairs",
    "threads",
    "keep_adapters",
    "heads_values",
    "rank_values",
    "svd_ranks",
    "step_values",
    "lr_values",
    "init_std_values",
    "anchor_values",
)


def _personalize_default() -> PersonalizeConfig:
    # The demo's augmentation for small faces: a 3-pixel blur kernel (the 5-pixel default is for 224×224).
    return PersonalizeConfig(steps=10, augment=AugmentConfig(blur_kernel=3, blur_sigma=(0.1, 1.0)))


@dataclass
class OracleConfig:
    """The oracle (the headroom, not a competitor): per target person, supervised fine-tuning of every
    parameter of the base with labels. Its data: the person's ``n_adapt`` adaptation images *and*
    ``extra_images`` more labelled images of the same person rendered after the evaluation images (so
    never an evaluation image). AdamW, lr 1e-4 on every parameter (``lr_scale`` empty), weight decay 0.01,
    the supervised L1 loss, ``steps`` steps on random batches of ``batch_size``; BatchNorm in eval mode; the
    last step is scored.

    Why not the personalization recipe's ×10 on layer3/layer4: tried on held-out *source* persons (the
    ``val`` split; no target label involved), supervised fine-tuning of every parameter with the ×10 rate
    ended worse than no fine-tuning at all, while one uniform rate gave a clear gain. A yardstick that
    cannot beat its own starting point measures nothing."""

    extra_images: int = 40
    steps: int = 60
    batch_size: int = 16
    lr: float = 1e-4
    lr_scale: dict[str, float] = field(default_factory=dict)
    weight_decay: float = 0.01

    def validate(self) -> None:
        if self.extra_images < 0 or self.steps < 1 or self.batch_size < 1 or not self.lr > 0:
            raise ValueError(f"bad OracleConfig: {self}")


@dataclass
class BenchConfig:
    """Everything the benchmark depends on. :meth:`quick`, :meth:`standard` and :meth:`full` are the presets.

    Data: the synthetic domains (``alfa.data.synthetic``) at ``image_size``; sources ``E``/``G`` with
    ``source_persons`` × ``source_images`` training images and ``val_persons`` × ``val_images`` held-out
    source persons (the domain's ``val`` split); targets ``M``/``D`` with ``target_persons`` persons
    (``None``: all, 15 and 14) × ``target_images`` images, of which the first ``personalize.n_adapt``
    are the adaptation images and the rest are scored.

    Ablation values: ``heads_values`` (H), ``rank_values`` (r, Alfa and LoRA), ``svd_ranks`` (d; each other
    than ``rank`` is its own truncation + recovery of the same pre-trained model), ``step_values``,
    ``lr_values`` (the recipe's base learning rate, Alfa and LoRA), ``init_std_values`` (σ of Alfa's
    Gaussian init of ``A_q`` and ``A_p``), ``anchor_values`` (the recipe's ``pitch_anchor`` weight, Alfa and
    LoRA: holds the mean predicted pitch, which the flip loss cannot see). Figures:
    rank-slice maps of ``slice_layer`` (slices ``figure_slices``) and update maps of ``update_layer``, on
    ``figure_pair`` with ``figure_seed``. Latency: median of ``latency_repeats`` forwards of
    ``latency_batch`` target images.

    Selection (which records run; see :data:`SELECTION_FIELDS`): ``pairs``, ``seeds``, ``methods`` (of
    :data:`MAIN_METHODS` and :data:`SANITY_METHODS`), ``ablations`` (of :data:`ABLATIONS`) on
    ``ablation_pairs``. ``threads``: torch threads (1 by default: on a shared machine OpenMP's spinning
    threads slow everything down; run pieces in parallel instead).
    """

    preset: str = "custom"
    image_size: int = 64
    source_persons: int = 80
    source_images: int = 100
    val_persons: int = 10
    val_images: int = 40
    target_persons: int | None = None
    target_images: int = 60
    model: str = "resnet18_gaze"
    pretrain: TrainConfig = field(
        default_factory=lambda: TrainConfig(epochs=8, batch_size=64, lr=1e-3, symmetry_weight=1.0)
    )
    recovery: TrainConfig = field(
        default_factory=lambda: TrainConfig(epochs=2, batch_size=64, lr=1e-4, symmetry_weight=1.0)
    )
    rank: int = 64
    personalize: PersonalizeConfig = field(default_factory=_personalize_default)
    alfa_heads: int = 8
    alfa_rank: int = 8
    meta: MetaTrainConfig = field(default_factory=MetaTrainConfig)
    tpgaze_init_std: float = 1.0
    oracle: OracleConfig = field(default_factory=OracleConfig)
    heads_values: tuple[int, ...] = (1, 2, 4, 8, 16)
    rank_values: tuple[int, ...] = (1, 2, 4, 8, 16)
    svd_ranks: tuple[int, ...] = (16, 32, 64, 128)
    step_values: tuple[int, ...] = (1, 3, 10, 30)
    lr_values: tuple[float, ...] = (1e-6, 1e-5, 3e-5, 1e-4, 3e-4)
    init_std_values: tuple[float, ...] = (0.002, 0.007, 0.02)
    anchor_values: tuple[float, ...] = (0.0, 1.0)
    slice_layer: str = "layer2.0.conv1"
    update_layer: str = "layer3.0.conv1"
    figure_pair: str = "E→M"
    figure_seed: int = 0
    figure_slices: tuple[int, ...] = (0, 1, 3, 15, 63)
    latency_batch: int = 32
    latency_repeats: int = 5
    # selection
    pairs: tuple[str, ...] = PAIRS
    seeds: tuple[int, ...] = (0, 1, 2)
    methods: tuple[str, ...] = MAIN_METHODS + SANITY_METHODS
    ablations: tuple[str, ...] = ABLATIONS
    ablation_pairs: tuple[str, ...] = PAIRS
    threads: int = 1
    keep_adapters: bool = False

    @classmethod
    def full(cls, **overrides: Any) -> BenchConfig:
        """The full benchmark: all four pairs, 3 seeds, every method and ablation, 64×64 faces, sources of
        80 persons × 100 images (8 pre-training + 2 recovery epochs), every target person (15 and 14) with
        60 images (5 adapt + 55 scored), 10 personalization steps; TPGaze meta-training with its reference
        settings (10 epochs × 100 meta-steps), every ablation on all four pairs. Many hours on 2 CPU cores
        (not run by us; ``docs/results.md`` comes from :meth:`standard`): run it in pieces (``--seeds``,
        ``--pairs``, ``--methods``, ``--ablations``) into one folder, two at a time."""
        return dataclasses.replace(cls(preset="full"), **overrides)

    @classmethod
    def standard(cls, **overrides: Any) -> BenchConfig:
        """The preset ``docs/results.md`` is made from (its wall time is in that page; run it in pieces,
        two processes at a time): the full code path, all four pairs, every method, seeds 0–2, 64×64 faces,
        sources of 80 persons × 100 images (4 pre-training + 1 recovery epochs), 5 persons per target with
        40 images (5 adapt + 35 scored), the full personalization recipe (10 steps), short TPGaze
        meta-training and oracle; every ablation with its full list of values on all four pairs."""
        base = cls(
            preset="standard",
            val_images=30,
            target_persons=5,
            target_images=40,
            pretrain=TrainConfig(epochs=4, batch_size=64, lr=1e-3, symmetry_weight=1.0),
            recovery=TrainConfig(epochs=1, batch_size=64, lr=1e-4, symmetry_weight=1.0),
            meta=MetaTrainConfig(epochs=1, steps_per_epoch=50),
            oracle=OracleConfig(extra_images=40, steps=60),
            latency_repeats=3,
        )
        return dataclasses.replace(base, **overrides)

    @classmethod
    def quick(cls, **overrides: Any) -> BenchConfig:
        """The quick check (about 15 minutes on 2 cores): the same code path, all four pairs and every
        method, one seed, 48×48 faces, small sources (24 persons × 60 images, 5 + 2 epochs), 4 persons per
        target with 25 images, 5 personalization steps, short TPGaze meta-training and oracle; the
        ablations on E→M only, each with one value besides the default. Its sources are too small for a
        clear domain gap: it checks that everything runs, not what wins."""
        base = cls(
            preset="quick",
            image_size=48,
            source_persons=24,
            source_images=60,
            val_persons=4,
            val_images=20,
            target_persons=4,
            target_images=25,
            pretrain=TrainConfig(epochs=5, batch_size=32, lr=1e-3, symmetry_weight=1.0),
            recovery=TrainConfig(epochs=2, batch_size=32, lr=1e-4, symmetry_weight=1.0),
            personalize=dataclasses.replace(_personalize_default(), steps=5),
            meta=MetaTrainConfig(epochs=1, steps_per_epoch=30),
            oracle=OracleConfig(extra_images=15, steps=30),
            heads_values=(1, 8),
            rank_values=(2, 8),
            svd_ranks=(32, 64),
            step_values=(1, 5),
            lr_values=(1e-5, 1e-4),
            init_std_values=(0.007, 0.02),
            figure_slices=(0, 1, 3, 15, 63),
            latency_repeats=3,
            seeds=(0,),
            ablation_pairs=("E→M",),
        )
        return dataclasses.replace(base, **overrides)

    def validate(self) -> None:
        for p in (*self.pairs, *self.ablation_pairs, self.figure_pair):
            if p not in PAIRS:
                raise ValueError(f"unknown pair {p!r}; pairs are {', '.join(PAIRS)}")
        known = set(MAIN_METHODS) | set(SANITY_METHODS)
        bad = [m for m in self.methods if m not in known]
        if bad:
            raise ValueError(f"unknown method(s) {bad}; methods are {', '.join(MAIN_METHODS + SANITY_METHODS)}")
        bad = [a for a in self.ablations if a not in ABLATIONS]
        if bad:
            raise ValueError(f"unknown ablation(s) {bad}; ablations are {', '.join(ABLATIONS)}")
        if not self.seeds:
            raise ValueError("no seed to run")
        if self.target_images <= self.personalize.n_adapt:
            raise ValueError(
                f"target_images ({self.target_images}) must exceed the {self.personalize.n_adapt} adaptation images"
            )
        if self.val_images <= self.personalize.n_adapt:
            raise ValueError(f"val_images ({self.val_images}) must exceed n_adapt ({self.personalize.n_adapt})")
        if self.threads < 1:
            raise ValueError(f"threads must be at least 1, got {self.threads}")
        self.personalize.validate()
        self.pretrain.validate()
        self.recovery.validate()
        self.meta.validate()
        self.oracle.validate()

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["personalize"] = self.personalize.to_dict()  # its own form (options at their off value left out)
        return json.loads(json.dumps(data))

    def protocol_dict(self) -> dict[str, Any]:
        """Everything but the selection: two runs writing to one ``results.json`` must agree on it."""
        return {k: v for k, v in self.to_dict().items() if k not in SELECTION_FIELDS}

    # ------------------------------------------------------------------ data specs

    def source_spec(self, source: str) -> str:
        """Training data of a source model. A target key (``M``/``D``) names the within-target model's:
        the target world's ``train`` persons, never the scored ones, as many as a source has."""
        if source in TARGETS:
            return (
                f"synthetic:{TARGETS[source]}?split=train&size={self.image_size}"
                f"&persons={self.source_persons}&images_per_person={self.source_images}"
            )
        return (
            f"synthetic:{SOURCES[source]}?size={self.image_size}"
            f"&persons={self.source_persons}&images_per_person={self.source_images}"
        )

    def val_spec(self, source: str) -> str:
        if source in TARGETS:
            persons = min(self.val_persons, get_domain(TARGETS[source]).persons["val"])
            return (
                f"synthetic:{TARGETS[source]}?split=val&size={self.image_size}"
                f"&persons={persons}&images_per_person={self.val_images}"
            )
        return (
            f"synthetic:{SOURCES[source]}?split=val&size={self.image_size}"
            f"&persons={self.val_persons}&images_per_person={self.val_images}"
        )

    def target_spec(self, target: str) -> str:
        """The rendered target: ``target_images`` per person for every method, then the oracle's extra ones."""
        persons = "" if self.target_persons is None else f"&persons={self.target_persons}"
        total = self.target_images + self.oracle.extra_images
        return f"synthetic:{TARGETS[target]}?size={self.image_size}{persons}&images_per_person={total}"

    def demo_config(self, source: str, seed: int, cache_dir: Path) -> DemoConfig:
        """The source-model part, in the form :func:`build_source_model` takes (and hashes)."""
        return DemoConfig(
            source=self.source_spec(source),
            val_source=self.val_spec(source),
            targets=(),
            model=self.model,
            seed=seed,
            pretrain=dataclasses.replace(self.pretrain, seed=seed),
            truncation=TruncateConfig(rank=self.rank, recovery=dataclasses.replace(self.recovery, seed=seed)),
            cache_dir=str(cache_dir),
        )

    def recipe(self, seed: int, **changes: Any) -> PersonalizeConfig:
        return dataclasses.replace(self.personalize, seed=seed, **changes)


def split_pair(pair: str) -> tuple[str, str]:
    source, _, target = pair.partition("→")
    return source, target


# ----------------------------------------------------------------------------- variants


@dataclass
class Variant:
    """One row of a table: a method, or an ablated variant of one, and how to run it.

    ``kind``: ``"source-only"`` (no adaptation), ``"in-domain"`` (the base on held-out source persons),
    ``"oracle"``, ``"adapter"`` (an adapter method with the shared recipe) or ``"tpgaze"``. ``base``:
    ``"truncated"`` (the rank-``d`` base), ``"dense"`` (the pre-trained model before truncation) or
    ``"rank=<d>"`` (truncated at another rank and recovered the same way). ``recipe`` holds changes to the
    personalization recipe; ``group``/``value`` place the row in an ablation table.
    """

    label: str
    kind: str
    group: str = "main"
    value: Any = None
    adapter: AdapterConfig | None = None
    recipe: dict[str, Any] = field(default_factory=dict)
    base: str = "truncated"
    same_layers_as_truncated: bool = False  # target the layers the truncated model factorizes

    def describe(self) -> dict[str, Any]:
        """What determines this variant's numbers (part of a record's hash)."""
        adapter = None
        if self.adapter is not None:
            adapter = {"method": self.adapter.method, **self.adapter.to_dict()}
            if self.same_layers_as_truncated:
                adapter["target"] = "the layers the truncated model factorizes"
        return {"kind": self.kind, "adapter": adapter, "recipe": self.recipe, "base": self.base}


def _alfa(config: BenchConfig, **changes: Any) -> AlfaConfig:
    return AlfaConfig(**{"heads": config.alfa_heads, "rank": config.alfa_rank, **changes})


def main_variants(config: BenchConfig) -> dict[str, Variant]:
    """The methods of Table 1 and the two sanity rows, by label."""
    adapters: dict[str, AdapterConfig] = {
        "full": FullFinetuneConfig(),
        "bitfit": BitfitConfig(),
        "lora": LoraConfig(),
        "pissa": PissaConfig(),
        "milora": MiloraConfig(),
        "moslora": MosloraConfig(),
        "spectral": SpectralConfig(),
        "dora": DoraConfig(),
        "flora": FloraConfig(),
        "alfa": _alfa(config),
    }
    out = {
        "source-only": Variant("source-only", "source-only"),
        "tpgaze": Variant("tpgaze", "tpgaze"),
        **{name: Variant(name, "adapter", adapter=cfg) for name, cfg in adapters.items()},
        "in-domain": Variant("in-domain", "in-domain", group="sanity"),
        "target-trained": Variant("target-trained", "target-trained", group="sanity"),
        "oracle": Variant("oracle", "oracle", group="sanity"),
    }
    return {name: out[name] for name in (*MAIN_METHODS, *SANITY_METHODS)}


def ablation_variants(name: str, config: BenchConfig) -> list[Variant]:
    """The rows of one ablation, its reference row (the main ``alfa``, ``lora`` or ``source-only``) included.

    A value equal to the main setting gives the main method's label, so it is run (and counted) once.
    """
    main = main_variants(config)
    steps = config.personalize.steps

    def tagged(v: Variant, value: Any) -> Variant:
        return dataclasses.replace(v, group=name, value=value)

    rows: list[Variant] = []
    if name == "heads":
        for h in config.heads_values:
            rows.append(
                tagged(main["alfa"], h)
                if h == config.alfa_heads
                else Variant(f"alfa[H={h}]", "adapter", name, h, _alfa(config, heads=h))
            )
    elif name == "init":
        default = AlfaConfig().init_std
        for std in config.init_std_values:
            rows.append(
                tagged(main["alfa"], std)
                if std == default
                else Variant(f"alfa[σ={std:g}]", "adapter", name, std, _alfa(config, init_std=std))
            )
    elif name == "rank":
        for r in config.rank_values:
            rows.append(
                tagged(main["alfa"], r)
                if r == config.alfa_rank
                else Variant(f"alfa[r={r}]", "adapter", name, r, _alfa(config, rank=r))
            )
        for r in config.rank_values:
            # alpha = 2r keeps LoRA's scale alpha/r at its default 2 while the rank changes.
            rows.append(
                tagged(main["lora"], r)
                if r == LoraConfig().rank
                else Variant(f"lora[r={r}]", "adapter", name, r, LoraConfig(rank=r, alpha=2.0 * r))
            )
    elif name == "svd_rank":
        for d in config.svd_ranks:
            if d == config.rank:
                rows += [tagged(main["source-only"], d), tagged(main["alfa"], d)]
            else:
                rows += [
                    Variant(f"source-only[d={d}]", "source-only", name, d, base=f"rank={d}"),
                    Variant(f"alfa[d={d}]", "adapter", name, d, _alfa(config), base=f"rank={d}"),
                ]
    elif name == "gate":
        rows = [
            tagged(main["alfa"], "attention"),
            Variant("diag_gate", "adapter", name, "diagonal gate", DiagGateConfig()),
        ]
    elif name == "mix":
        rows = [
            tagged(main["alfa"], "attention"),
            Variant("linear_mix", "adapter", name, "linear mix", LinearMixConfig(rank=config.alfa_rank)),
        ]
    elif name == "truncation":
        rows = [
            tagged(main["source-only"], "truncated"),
            tagged(main["alfa"], "truncated"),
            Variant("source-only[dense]", "source-only", name, "dense", base="dense"),
            Variant(
                "alfa[dense]",
                "adapter",
                name,
                "dense",
                _alfa(config, layers="dense"),
                base="dense",
                same_layers_as_truncated=True,
            ),
        ]
    elif name == "loss":
        rows = [
            tagged(main["source-only"], "none"),
            tagged(main["alfa"], "flip"),
            Variant("alfa[loss=augment]", "adapter", name, "augment", _alfa(config), {"loss": "augment"}),
        ]
    elif name == "detach":
        rows = [
            tagged(main["alfa"], "detached"),
            Variant(
                "alfa[flip not detached]", "adapter", name, "not detached", _alfa(config), {"detach_flipped": False}
            ),
        ]
    elif name == "steps":
        for method in ("alfa", "lora"):
            for k in config.step_values:
                rows.append(
                    tagged(main[method], k)
                    if k == steps
                    else Variant(f"{method}[steps={k}]", "adapter", name, k, main[method].adapter, {"steps": k})
                )
    elif name == "anchor":
        rows.append(tagged(main["source-only"], "none"))
        for method in ("alfa", "lora"):
            for w in config.anchor_values:
                rows.append(
                    tagged(main[method], w)
                    if w == config.personalize.pitch_anchor
                    else Variant(
                        f"{method}[anchor={w:g}]", "adapter", name, w, main[method].adapter, {"pitch_anchor": w}
                    )
                )
    elif name == "lr":
        for method in ("alfa", "lora"):
            for lr in config.lr_values:
                rows.append(
                    tagged(main[method], lr)
                    if lr == config.personalize.lr
                    else Variant(f"{method}[lr={lr:g}]", "adapter", name, lr, main[method].adapter, {"lr": lr})
                )
    else:
        raise ValueError(f"unknown ablation {name!r}; ablations are {', '.join(ABLATIONS)}")
    return rows


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


def plan_records(config: BenchConfig) -> list[RecordPlan]:
    """Every record the selection asks for, in run order (seed, then source, then pair), deduplicated."""
    main = main_variants(config)
    plans: dict[str, RecordPlan] = {}
    for seed in config.seeds:
        for source in SOURCES:
            for pair in (p for p in PAIRS if p in config.pairs and split_pair(p)[0] == source):
                variants = [main[m] for m in config.methods]
                if pair in config.ablation_pairs:
                    for name in config.ablations:
                        variants += ablation_variants(name, config)
                for v in variants:
                    plan = RecordPlan(v, pair, seed)
                    if plan.id not in plans:
                        plans[plan.id] = plan
    return list(plans.values())


# ----------------------------------------------------------------------------- results.json


def _empty_results(config: BenchConfig) -> dict[str, Any]:
    return {
        "format": FORMAT,
        "version": VERSION,
        "preset": config.preset,
        "config": config.protocol_dict(),
        "records": [],
        "sources": {},
        "runs": [],
        "sanity": {},
        "figures": {},
        "layout": layout(config),
    }


def layout(config: BenchConfig) -> dict[str, Any]:
    """The rows of every table the report draws (labels and ablated values), from the protocol alone."""
    return {
        "pairs": list(PAIRS),
        "main": list(MAIN_METHODS),
        "sanity": list(SANITY_METHODS),
        "ablations": {
            name: [{"label": v.label, "value": v.value} for v in ablation_variants(name, config)] for name in ABLATIONS
        },
    }


def load_results(path: str | os.PathLike) -> dict[str, Any]:
    """Read a ``results.json`` (a file, or the folder holding one); a clear error if it is not one."""
    path = Path(path)
    if path.is_dir():
        path = path / RESULTS_FILE
    if not path.is_file():
        raise FileNotFoundError(f"no benchmark results at {path}")
    try:
        data = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"{path}: not valid JSON ({e})") from e
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise ValueError(f"{path}: not an alfa benchmark results file (no format {FORMAT!r})")
    if data.get("version") != VERSION:
        raise ValueError(f"{path}: results format version {data.get('version')}, this alfa reads {VERSION}")
    if not isinstance(data.get("records"), list):
        raise ValueError(f"{path}: 'records' must be a list")
    for i, r in enumerate(data["records"]):
        if not isinstance(r, dict) or "id" not in r or "config_hash" not in r:
            raise ValueError(f"{path}: record {i} has no 'id'/'config_hash'")
    return data


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    """An exclusive lock on ``path`` + ``.lock`` (several pieces of a benchmark may share one folder)."""
    lock = path.with_name(path.name + ".lock")
    with open(lock, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


class ResultsStore:
    """``results.json`` of one benchmark folder: read, merged and rewritten atomically under a lock."""

    def __init__(self, out: Path, config: BenchConfig, create: bool = True) -> None:
        self.path = out / RESULTS_FILE
        self.config = config
        if not create and not self.path.is_file():
            self.empty = _empty_results(config)
            return
        with _locked(self.path):
            if self.path.is_file():
                data = load_results(self.path)
                self._check_protocol(data)
                if data.get("layout") != layout(config):
                    data["layout"] = layout(config)
                    write_json(self.path, data)
            else:
                write_json(self.path, _empty_results(config))

    def _check_protocol(self, data: dict[str, Any]) -> None:
        here = self.config.protocol_dict()
        # Files written before a field became a selection field still hold it: ignore it there too.
        stored = {k: v for k, v in data.get("config", {}).items() if k not in SELECTION_FIELDS}
        if stored != here:
            keys = sorted(k for k in set(stored) | set(here) if stored.get(k) != here.get(k))
            raise ValueError(
                f"{self.path} was made with another benchmark configuration (preset {data.get('preset')!r}; "
                f"differs in: {', '.join(keys)}); use another --out folder"
            )

    def read(self) -> dict[str, Any]:
        if not self.path.is_file() and hasattr(self, "empty"):
            return self.empty
        return load_results(self.path)

    def update(self, change: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
        """Re-read the file, apply ``change`` to it, recompute the sanity summary and write it atomically."""
        from .report import sanity_summary

        with _locked(self.path):
            data = load_results(self.path)
            self._check_protocol(data)
            change(data)
            data["sanity"] = sanity_summary(data["records"])
            write_json(self.path, data)
        return data

    def done(self) -> dict[str, str]:
        """Finished records: id -> config hash."""
        return {r["id"]: r["config_hash"] for r in self.read()["records"]}

    def add_record(self, record: dict[str, Any]) -> None:
        def change(data: dict[str, Any]) -> None:
            data["records"] = [r for r in data["records"] if r["id"] != record["id"]] + [record]

        self.update(change)


def _hash(obj: Any) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()[:16]


# ----------------------------------------------------------------------------- measuring


def _proc_status_mib(key: str) -> float | None:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1]) / 1024.0
    except OSError:
        pass
    return None


def _reset_peak_memory() -> float | None:
    """Reset the process's peak resident memory (Linux ``VmHWM``); returns the resident memory now (MiB)."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        return None
    return _proc_status_mib("VmRSS")


def constant_prediction_error(data: GazeDataset, persons: Sequence[str], n_adapt: int) -> float:
    """How spread the labels of a set are: the mean over persons of the error of always predicting the
    set's mean gaze (over the scored images). Errors on sets with narrow and wide gaze ranges are only
    comparable against this; it is a description of the labels, never used to choose anything."""
    per_person = {p: load_examples(data, data.person_indices(p)[n_adapt:])[1].double() for p in persons}
    mean = torch.cat(list(per_person.values())).mean(0)
    return statistics.fmean(float(angular_error(mean.expand_as(g), g).mean()) for g in per_person.values())


def _param_count(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def _safe(name: str) -> str:
    return "".join(c if c.isalnum() or c in "._=-" else "_" for c in name)


@torch.no_grad()
def _latency_ms(models: Sequence[nn.Module], images: torch.Tensor, repeats: int) -> list[float]:
    """Median wall-clock ms of one forward of ``images`` through each model, timed in interleaved rounds."""
    for m in models:
        m.eval()
        m(images)  # warm-up
    times: list[list[float]] = [[] for _ in models]
    for _ in range(repeats):
        for i, m in enumerate(models):
            t = time.perf_counter()
            m(images)
            times[i].append(1000.0 * (time.perf_counter() - t))
    return [statistics.median(ts) for ts in times]


def adapter_costs(base: nn.Module, adapter_file: Path, images: torch.Tensor, repeats: int) -> dict[str, Any]:
    """Costs of one saved per-user adapter on ``base``: trainable tensors, parameters after merging (the
    dense update of a LoRA-style method on a factorized layer is densified; prompts cannot be merged and
    stay attached), parameters of the exact compact merge (``merge(..., extend=True)``: rank ``d + r`` instead of
    dense), file bytes (and the compact ``d×d``-mix form of dictionary methods), and the latency of the
    merged model against ``base``."""
    model = copy.deepcopy(base)
    load_adapter(model, adapter_file)
    state = adapter_state(model)
    assert state is not None
    out: dict[str, Any] = {
        "trainable_params": sum(p.numel() for p in adapter_parameters(model).values()),
        "adapter_bytes": adapter_file.stat().st_size,
        "compact_bytes": None,
    }
    layers = adapted_layers(model)
    if layers and all(hasattr(layer, "mixing") for layer in layers.values()):
        compact = adapter_file.with_name(adapter_file.stem + ".compact.tmp")
        out["compact_bytes"] = save_adapter(model, compact, compact=True).stat().st_size
        compact.unlink()
    total = _param_count(model)
    try:
        extended = copy.deepcopy(model)
        merge(extended, extend=True)
        compact_params = _param_count(extended)
    except MergeError:  # TPGaze's prompts: nothing to merge them into
        compact_params = total
    needs_densify = any(layer.base_is_factorized and not layer.factorized_merge for layer in layers.values())
    try:
        merge(model, densify=needs_densify)
        if state.config.scope == "model":
            kind = "in place"
        elif needs_densify:
            kind = "densified"
        elif any(layer.base_is_factorized for layer in layers.values()):
            kind = "factorized (rank d)"
        else:
            kind = "dense"
    except MergeError:
        kind = "not mergeable (kept attached)"
    out["merge"] = kind
    out["inference_params"] = _param_count(model)
    out["compact_merge_params"] = min(compact_params, out["inference_params"])
    out["latency_ms"], out["base_latency_ms"] = _latency_ms([model, base], images, repeats)
    return out


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
    """Data, source models and runners of one :func:`run_bench` call."""

    def __init__(self, config: BenchConfig, out: Path, cache: Path, progress: bool) -> None:
        self.config, self.out, self.cache, self.progress = config, out, cache, progress
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

    def record_hash(self, plan: RecordPlan) -> str:
        c, v = self.config, plan.variant
        src, tgt = self.source(self.model_key(plan), plan.seed), self.target(plan.target)
        spec: dict[str, Any] = {
            "id": plan.id,
            "variant": v.describe(),
            "source_model": src.cache_key,
            "seed": plan.seed,
            "n_adapt": c.personalize.n_adapt,
            "scoring": SCORING,
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
        return _hash(spec)

    # ---------------------------------------------------------------- models

    def build(self, key: str, seed: int) -> _Source:
        src = self.source(key, seed)
        if src.models is None:
            torch.manual_seed(seed)
            src.models = build_source_model(src.demo, src.data, src.val, progress=self.progress)
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
        return (
            self.out / "adapters" / _safe(plan.pair.replace("→", "-")) / f"seed{plan.seed}" / _safe(plan.variant.label)
        )

    def keeps_adapters(self, plan: RecordPlan) -> bool:
        c = self.config
        figure = plan.pair == c.figure_pair and plan.seed == c.figure_seed and plan.variant.label in ("alfa", "lora")
        return c.keep_adapters or figure

    @staticmethod
    def model_key(plan: RecordPlan) -> str:
        """Whose model a record uses: the pair's source, or for the within-target yardstick the target's."""
        return plan.target if plan.variant.kind == "target-trained" else plan.source

    def run(self, plan: RecordPlan) -> dict[str, Any]:
        c, v = self.config, plan.variant
        src = self.build(self.model_key(plan), plan.seed)
        tgt = self.target(plan.target)
        base = self.base(src, v.base)
        n_adapt = c.personalize.n_adapt
        t0, cpu0 = time.time(), time.process_time()
        record: dict[str, Any] = {
            "id": plan.id,
            "config_hash": self.record_hash(plan),
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
        if v.kind == "in-domain":
            errors = person_gaze_errors(base, src.val, src.val.persons(), n_adapt)
            record["constant_prediction_deg"] = constant_prediction_error(src.val, src.val.persons(), n_adapt)
        elif v.kind == "target-trained":
            errors = person_gaze_errors(base, tgt.data, tgt.data.persons(), n_adapt)
            record["constant_prediction_deg"] = constant_prediction_error(tgt.data, tgt.data.persons(), n_adapt)
        elif v.kind == "source-only":
            errors = person_gaze_errors(base, tgt.data, tgt.data.persons(), n_adapt)
            record["constant_prediction_deg"] = constant_prediction_error(tgt.data, tgt.data.persons(), n_adapt)
            images = self.latency_images(tgt)
            record["latency_ms"] = record["base_latency_ms"] = _latency_ms([base], images, c.latency_repeats)[0]
        elif v.kind == "oracle":
            errors = self.run_oracle(base, tgt, plan, record)
        else:
            errors = self.run_personalization(base, src, tgt, plan, record)
        angular = {p: e.angular for p, e in errors.items()}
        record["per_person"] = angular
        record["per_person_parts"] = {p: e.parts() for p, e in errors.items()}
        record["persons"] = len(angular)
        record["error_deg"] = sum(angular.values()) / len(angular) if angular else float("nan")
        record["std_over_persons"] = statistics.pstdev(angular.values()) if len(angular) > 1 else 0.0
        record["wall_s"] = time.time() - t0
        record["cpu_s"] = time.process_time() - cpu0
        record["finished"] = datetime.datetime.now().isoformat(timespec="seconds")
        return record

    def latency_images(self, tgt: _Target) -> torch.Tensor:
        persons = tgt.data.persons()
        idx = [i for p in persons for i in tgt.data.person_indices(p)[self.config.personalize.n_adapt :]]
        return load_images(tgt.data, idx[: self.config.latency_batch])

    def run_personalization(
        self, base: nn.Module, src: _Source, tgt: _Target, plan: RecordPlan, record: dict[str, Any]
    ) -> dict[str, GazeError]:
        c, v = self.config, plan.variant
        recipe = c.recipe(plan.seed, **v.recipe)
        folder = self.adapter_dir(plan)
        persons = tgt.data.persons()
        before_mib = _reset_peak_memory()
        cpu0 = time.process_time()
        if v.kind == "tpgaze":
            prompts = self.tpgaze_prompts(src)
            before_mib = _reset_peak_memory()  # meta-training is a per-source cost, not a per-user one
            cpu0 = time.process_time()
            recipe = tpgaze_recipe(recipe)
            run = personalize_tpgaze_dataset(
                base, tgt.data, prompts, folder, recipe, persons=persons, progress=self.progress
            )
        else:
            adapter = v.adapter
            assert adapter is not None
            if v.same_layers_as_truncated:
                names = [n for n, m in src.models.recovered.named_modules() if is_factorized(m)]
                adapter = dataclasses.replace(adapter, target="^(" + "|".join(re.escape(n) for n in names) + ")$")
            run = personalize_dataset(base, tgt.data, adapter, recipe, folder, persons=persons, progress=self.progress)
        cpu = time.process_time() - cpu0
        peak = _proc_status_mib("VmHWM")
        if before_mib is not None and peak is not None:
            record["peak_rss_mib"] = peak
            record["peak_rss_increase_mib"] = max(0.0, peak - before_mib)
        ok = [p for p, o in run.persons.items() if o.status in ("ok", "skipped")]
        fresh = [p for p, o in run.persons.items() if o.status == "ok"]
        record["failed"] = run.failed
        record["steps"] = recipe.steps
        record["method_config"] = run.method_config
        record["recipe"] = {k: v for k, v in run.config.items() if k != "augment"}
        record["seconds_per_user"] = statistics.mean(run.persons[p].seconds for p in ok) if ok else None
        record["cpu_seconds_per_user"] = cpu / len(fresh) if fresh else None
        losses = [run.persons[p] for p in ok if run.persons[p].losses]
        if losses:
            record["loss"] = {
                "first": statistics.mean(o.losses[0] for o in losses),
                "final": statistics.mean(o.final_loss for o in losses),
            }
        errors: dict[str, GazeError] = {}
        for person in ok:
            path = folder / adapter_filename(person)
            load_adapter(base, path)
            try:
                errors.update(person_gaze_errors(base, tgt.data, [person], c.personalize.n_adapt))
            finally:
                detach(base)
        if ok:
            costs = adapter_costs(base, folder / adapter_filename(ok[0]), self.latency_images(tgt), c.latency_repeats)
            record.update(costs)
        if v.kind == "tpgaze":
            load_adapter(base, self.tpgaze_prompts(src))
            try:
                meta_only = person_errors(base, tgt.data, persons, c.personalize.n_adapt)
            finally:
                detach(base)
            record["meta_only"] = {
                "error_deg": sum(meta_only.values()) / len(meta_only),
                "per_person": meta_only,
            }
        if plan.pair == c.figure_pair and plan.seed == c.figure_seed and v.label in ("alfa", "lora"):
            self.save_update_data(base, src, tgt, plan, folder, record["config_hash"])
        if not self.keeps_adapters(plan):
            shutil.rmtree(folder, ignore_errors=True)
        return errors

    def run_oracle(
        self, base: nn.Module, tgt: _Target, plan: RecordPlan, record: dict[str, Any]
    ) -> dict[str, GazeError]:
        """Per person: supervised fine-tuning of every parameter on labelled images that are never scored."""
        c, oc = self.config, self.config.oracle
        n_adapt = c.personalize.n_adapt
        errors: dict[str, GazeError] = {}
        seconds = []
        before_mib = _reset_peak_memory()
        cpu0 = time.process_time()
        persons = tgt.data.persons()
        for person in tqdm(persons, desc=f"oracle {tgt.data.name}", disable=not self.progress, leave=False):
            t0 = time.time()
            images, gaze = load_examples(tgt.data, tgt.data.person_indices(person)[:n_adapt])
            if tgt.extra is not None and oc.extra_images > 0:
                more = load_examples(tgt.extra, tgt.extra.person_indices(person))
                images, gaze = torch.cat([images, more[0]]), torch.cat([gaze, more[1]])
            attach(base, FullFinetuneConfig())
            try:
                base.eval()
                groups = param_groups(base, oc.lr, lr_scale=oc.lr_scale, weight_decay=oc.weight_decay)
                optimizer = torch.optim.AdamW(groups, lr=oc.lr, weight_decay=oc.weight_decay)
                g = torch.Generator().manual_seed(person_seed(plan.seed, person, "oracle"))
                for _ in range(oc.steps):
                    idx = torch.randperm(images.shape[0], generator=g)[: oc.batch_size]
                    loss = finite_or_raise(supervised_l1_loss(base(images[idx]), gaze[idx]), "oracle")
                    optimizer.zero_grad(set_to_none=True)
                    loss.backward()
                    optimizer.step()
                seconds.append(time.time() - t0)
                errors.update(person_gaze_errors(base, tgt.data, [person], n_adapt))
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

    # ---------------------------------------------------------------- figure data

    def figure_dir(self) -> Path:
        return self.out / FIGURE_DIR

    def save_rank_slices(self, src: _Source, tgt: _Target) -> None:
        from .figures import rank_slice_data, save_figure_data

        path = self.figure_dir() / RANK_SLICES_FILE
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

    def save_update_data(
        self, base: nn.Module, src: _Source, tgt: _Target, plan: RecordPlan, folder: Path, record_hash: str
    ) -> None:
        from .figures import save_figure_data, update_data

        path = self.figure_dir() / UPDATES_FILE
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
) -> BenchSummary:
    """Run (or resume) the benchmark described by ``config`` into ``out_dir``.

    Records already in ``out_dir/results.json`` with the same id and config hash are skipped; the others
    run, each written as soon as it is finished. Source models are cached under ``cache_dir`` (default
    ``out_dir/cache``), TPGaze's meta-trained prompts and the other-rank bases next to them. With
    ``dry_run`` nothing is trained: the pending records are listed (the data are rendered to hash them).
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
        "finished": False,
    }
    session = _Session(config, out, cache, progress)
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
            slices_missing = figure_here and _figure_stamp(session.figure_dir() / RANK_SLICES_FILE) is None
            if not group_todo and not slices_missing:
                continue
            src = session.build(source, seed)
            if figure_here:
                session.save_rank_slices(src, session.target(figure_target))
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
