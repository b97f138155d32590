"""The benchmark's configuration: :class:`BenchConfig` (its presets, data specs and recipe) and the oracle's.

Everything a record depends on is in :class:`BenchConfig`; the fields in :data:`SELECTION_FIELDS` only
choose which records run. The ablations' value lists are :class:`BenchConfig` fields named by the
ablation objects (:mod:`alfa.study.bench.ablations`), which also give their defaults and the quick preset's
values.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from typing import Any

from alfa.adapters import METHODS, AlfaConfig
from alfa.adapters.prompt import TPGazeConfig
from alfa.gaze.augment import AugmentConfig
from alfa.gaze.data.registry import DatasetSpec
from alfa.gaze.data.synthetic import get_domain
from alfa.gaze.objectives import OBJECTIVES
from alfa.gaze.personalize import PersonalizeConfig
from alfa.gaze.pipeline import SourceSpec
from alfa.gaze.tpgaze import MetaTrainConfig
from alfa.gaze.train import TrainConfig, TruncateConfig

from .ablations import REGISTRY
from .methods import (
    CALIBRATION_ROW_METHODS,
    CONSTRUCTED_CONTROL_ROWS,
    CONSTRUCTED_CONTROLS,
    EXTRA_METHODS,
    MAIN_METHODS,
    OPT_IN_METHODS,
    PAIRS,
    SANITY_METHODS,
    SELECTION_RULE,
    SOURCE_TRAINING,
    SOURCES,
    STAND_INS,
    TARGETS,
    TTA_ROWS,
    calibration_label,
    calibration_label_problem,
    calibration_rows,
    table_methods,
    with_tta_rows,
    world_name,
)
from .variants import split_loss

__all__ = [
    "ABLATIONS",
    "SELECTION_FIELDS",
    "TARGET_DRAWS",
    "WORLDS",
    "OracleConfig",
    "BenchConfig",
    "split_pair",
    "world_name",
]

TARGET_DRAWS = ("per_seed", "fixed")
WORLDS = ("v2", "v1")
"""The versions of the synthetic worlds: ``v1``, the first worlds (their bare names: ``eth``, ``mpii``, ...),
and ``v2``, calibrated to the real cross-domain regime (``eth-v2``, ``mpii-v2``, ...; docs/synthetic.md)."""


V2_SOURCE_TRAINING = TrainConfig(epochs=12, batch_size=64, lr=1e-3, symmetry_weight=1.0, schedule="cosine")
"""The source models' pre-training on the v2 worlds (the standard preset's): with the first presets' constant
rate the error at the last epoch wandered by degrees from epoch to epoch (docs/synthetic.md § Calibration)."""
V2_SOURCE_IMAGES = 200
"""Images per person of every v2 source and within-target model (the standard preset's): at 100 the
within-target yardstick of the MPII-like world was 6.2°, above 0.6 × any source-only error it could meet;
at 200, 5.0° (docs/synthetic.md § Calibration, the scouts M-v2a and M-v2a-x2)."""
V2_WITHIN_IMAGES = 400
"""Images per person of every v2 within-target model (the standard preset's; the sources keep
:data:`V2_SOURCE_IMAGES`): real within-dataset models train on thousands of images per person, and at 200 the
MPII-like yardstick (5.0°) stayed above 0.6 × G→M (docs/synthetic.md § Calibration, the fourth round)."""
ABLATIONS = tuple(REGISTRY)
"""The ablations a benchmark runs by default: every registered one, in the registry's order."""
SELECTABLE = tuple(m for m in MAIN_METHODS if m in METHODS and not METHODS[m].trains_prompts) + (
    "diag_gate",
    "linear_mix",
)
"""The built-in methods that get a second row with their recipe selected on the stand-in (docs/flip-premise.md
§4): every adapter method of the shared recipe (TPGaze has its own optimizer, outside the grid) and Alfa's two
simpler mixes; :func:`selectable_methods` adds every other registered one. The same methods get a third row
with the recipe ``alfa personalize`` ships for them (``<method>[default]``, docs/flip-premise.md §7)."""


STANDARD_METHODS = (*MAIN_METHODS, *SANITY_METHODS)
"""The standard preset's rows (:meth:`BenchConfig.first_standard`'s; :meth:`BenchConfig.standard` adds the TTA
rows), written out rather than read from the method registry: a protocol is declared before its runs, so a method
registered later (``@register_method``) must not grow it, nor the declared run of ``docs/results-v2.md``; a method
joins it only by a declared change. Table 1's built-in rows (:data:`~.methods.MAIN_METHODS`, a list written out,
which a registration does not grow) and the sanity rows, as they were when the second protocol was declared
(``tests/test_extension_points.py`` checks the declared run's size)."""
SMOKE_CALIBRATIONS = (
    *(calibration_label(method, 3) for method in CALIBRATION_ROW_METHODS),
    calibration_label(CALIBRATION_ROW_METHODS[0], 3, "spread"),
)
"""The smoke preset's user-calibration rows: every method :data:`~.methods.CALIBRATION_ROW_METHODS` names at
k = 3 (a k every one of them has rows at, within a smoke target person's eight images), and the default's spread
draw."""
STANDARD_SELECTABLE = SELECTABLE
"""The standard preset's rows with a recipe selected on the stand-in, and (on the v2 worlds) with the shipped
recipe: :data:`SELECTABLE` as it was declared, frozen like :data:`STANDARD_METHODS`."""


def selectable_methods() -> tuple[str, ...]:
    """:data:`SELECTABLE`, then every other Table-1 adapter method of the shared recipe (a registered method)."""
    extra = [m for m in table_methods() if m in METHODS and not METHODS[m].trains_prompts and m not in SELECTABLE]
    return SELECTABLE + tuple(extra)


def _selectable(method: str, selectable: tuple[str, ...]) -> bool:
    """Whether ``method`` (``"alfa"``, or ``"alfa[loss=roll]"``: with another objective) gets a recipe selection."""
    name, loss = split_loss(method)
    return name in selectable and (loss is None or loss in OBJECTIVES)


def _values(name: str) -> tuple[Any, ...]:
    return REGISTRY[name].default_values


def _quick_values() -> dict[str, tuple[Any, ...]]:
    """The quick preset's ablation values, by value field."""
    return {a.values_field: a.quick_values for a in REGISTRY.values() if a.values_field and a.quick_values}


def _personalize_default() -> PersonalizeConfig:
    return PersonalizeConfig(steps=10, augment=AugmentConfig.small_faces())


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
    """Everything the benchmark depends on. :meth:`smoke`, :meth:`quick`, :meth:`standard` and :meth:`full` are
    the presets.

    Data: the synthetic domains (``alfa.gaze.data.synthetic``) at ``image_size``; sources ``E``/``G`` with
    ``source_persons`` × ``source_images`` training images and ``val_persons`` × ``val_images`` held-out
    source persons (the domain's ``val`` split); a within-target model (the ``target-trained`` row) trains on
    ``source_persons`` of the target world's ``train`` persons × ``within_images`` (``None``: ``source_images``);
    targets ``M``/``D`` with ``target_persons`` persons
    (``None``: all, 15 and 14) × ``target_images`` images, of which the first ``personalize.n_adapt``
    are the adaptation images and the rest are scored. ``target_draw``: ``"per_seed"`` renders each seed's
    target persons afresh (the world's persons drawn with the record's seed: persons are a random effect,
    and no person is counted twice), ``"fixed"`` the same persons for every seed (the first records'
    design). ``worlds``: which version of the synthetic worlds the letters name (:data:`WORLDS`): ``"v2"``,
    the worlds calibrated to the real cross-domain regime (docs/synthetic.md), or ``"v1"``, the first
    worlds, behind the first committed records.

    Ablation values: ``heads_values`` (H), ``rank_values`` (r, Alfa and LoRA), ``svd_ranks`` (d; each other
    than ``rank`` is its own truncation + recovery of the same pre-trained model), ``step_values``,
    ``lr_values`` (the recipe's base learning rate, Alfa and LoRA), ``init_std_values`` (σ of Alfa's
    Gaussian init of ``A_q`` and ``A_p``), ``anchor_values`` (the recipe's ``pitch_anchor`` weight, Alfa and
    LoRA: holds the mean predicted pitch, which the flip loss cannot see). Figures:
    rank-slice maps of ``slice_layer`` (slices ``figure_slices``) and update maps of ``update_layer``, on
    ``figure_pair`` with ``figure_seed``. Latency: median of ``latency_repeats`` forwards of
    ``latency_batch`` target images.

    Selection (which records run; see :data:`SELECTION_FIELDS`): ``pairs``, ``seeds``, ``methods`` (of
    :data:`MAIN_METHODS` and :data:`SANITY_METHODS`, the label-free TTA rows :data:`~.methods.TTA_ROWS`, and the
    rows run only when named, :data:`EXTRA_METHODS`),
    ``selected_methods`` (of :data:`SELECTABLE`: a second row each, with the recipe selected on the stand-in),
    ``default_methods`` (of :data:`SELECTABLE`: a row
    each with the recipe ``alfa personalize`` ships for the method), ``ablations`` (of :data:`ABLATIONS`) on
    ``ablation_pairs``. ``threads``: torch threads (1 by default: on a shared machine OpenMP's spinning
    threads slow everything down; run pieces in parallel instead).
    """

    preset: str = "custom"
    image_size: int = 64
    source_persons: int = 80
    source_images: int = 100
    within_images: int | None = None
    val_persons: int = 10
    val_images: int = 40
    target_persons: int | None = None
    target_images: int = 60
    target_draw: str = "per_seed"
    worlds: str = "v2"
    model: str = "resnet18_gaze"
    pretrain: TrainConfig = field(
        default_factory=lambda: TrainConfig(epochs=8, batch_size=64, lr=1e-3, symmetry_weight=1.0)
    )
    recovery: TrainConfig = field(
        default_factory=lambda: TrainConfig(epochs=2, batch_size=64, lr=1e-4, symmetry_weight=1.0)
    )
    rank: int = TruncateConfig().rank
    personalize: PersonalizeConfig = field(default_factory=_personalize_default)
    alfa_heads: int = AlfaConfig().heads
    alfa_rank: int = AlfaConfig().rank
    meta: MetaTrainConfig = field(default_factory=MetaTrainConfig)
    tpgaze_init_std: float = TPGazeConfig().init_std
    oracle: OracleConfig = field(default_factory=OracleConfig)
    # The ablations' values (their defaults live with the ablations; the field order is the stored order).
    heads_values: tuple[int, ...] = _values("heads")
    rank_values: tuple[int, ...] = _values("rank")
    svd_ranks: tuple[int, ...] = _values("svd_rank")
    step_values: tuple[int, ...] = _values("steps")
    lr_values: tuple[float, ...] = _values("lr")
    init_std_values: tuple[float, ...] = _values("init")
    anchor_values: tuple[float, ...] = _values("anchor")
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
    methods: tuple[str, ...] = field(default_factory=lambda: table_methods() + SANITY_METHODS)
    selected_methods: tuple[str, ...] = field(default_factory=selectable_methods)
    default_methods: tuple[str, ...] = field(default_factory=selectable_methods)
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
        (not run by us; ``docs/results.md`` comes from :meth:`first_standard`): run it in pieces (``--seeds``,
        ``--pairs``, ``--methods``, ``--ablations``) into one folder, two at a time."""
        return dataclasses.replace(cls(preset="full"), **overrides)

    @classmethod
    def standard(cls, **overrides: Any) -> BenchConfig:
        """The second protocol's preset, behind ``docs/results-v2.md`` (run it in pieces,
        two processes at a time): the full code path, all six pairs, every method (with the paper's recipe, the
        recipe selected on the stand-in and the recipe ``alfa personalize`` ships), seeds 0–2, on the v2
        worlds (calibrated to the real regime, docs/synthetic.md), 64×64 faces, sources of 80 persons × 200
        images trained 12 epochs with a cosine schedule (docs/synthetic.md § Calibration: the budget is part of
        what puts the worlds in the real regime) + 1 recovery epoch, every target person (15 and 14, drawn
        afresh for each seed) with 40 images (5 adapt + 35 scored), the full personalization recipe (10 steps),
        short TPGaze meta-training and oracle; every ablation with its full list of values on all four pairs. On
        the v2 worlds its methods also have issue 26's label-free TTA rows (:data:`~.methods.TTA_ROWS`, after
        flip-TTA), which the first records' preset does not have, and its pairs the constructed control S→R
        (docs/flip-premise.md §7.4: source-only, flip-TTA and the oracle on seeds 0–2 only)."""
        base = dataclasses.replace(cls.first_standard(), preset="standard", target_persons=None)
        if overrides.get("worlds", "v2") == "v2":  # the TTA rows and §7.4's control exist on the second worlds only
            base = dataclasses.replace(base, methods=with_tta_rows(base.methods), pairs=PAIRS + CONSTRUCTED_CONTROLS)
        base = dataclasses.replace(
            base,
            target_draw="per_seed",
            worlds="v2",
            default_methods=STANDARD_SELECTABLE,
            pretrain=V2_SOURCE_TRAINING,
            source_images=V2_SOURCE_IMAGES,
            within_images=V2_WITHIN_IMAGES,
        )
        return dataclasses.replace(base, **overrides)

    @classmethod
    def first_standard(cls, **overrides: Any) -> BenchConfig:
        """The standard preset as the first committed records (docs/data/bench-standard, bench-flip) ran it:
        the v1 worlds, the same 5 persons per target in every seed, sources trained 4 + 1 epochs, and no rows
        of the shipped default recipes (they came with the second protocol)."""
        base = cls(
            preset="standard",
            val_images=30,
            target_persons=5,
            target_images=40,
            target_draw="fixed",
            worlds="v1",
            pretrain=TrainConfig(epochs=4, batch_size=64, lr=1e-3, symmetry_weight=1.0),
            recovery=TrainConfig(epochs=1, batch_size=64, lr=1e-4, symmetry_weight=1.0),
            meta=MetaTrainConfig(epochs=1, steps_per_epoch=50),
            oracle=OracleConfig(extra_images=40, steps=60),
            latency_repeats=3,
            methods=STANDARD_METHODS,
            selected_methods=STANDARD_SELECTABLE,
            default_methods=(),
        )
        return dataclasses.replace(base, **overrides)

    @classmethod
    def quick(cls, **overrides: Any) -> BenchConfig:
        """The quick check: the same code path, every pair (the four symmetric ones and the positive controls
        S→W, S→C) and every method, Alfa's recipe selection, one seed,
        48×48 faces, small sources (24 persons × 60 images, 5 + 2 epochs), 4 persons per target with 25 images,
        5 personalization steps, short TPGaze meta-training and oracle; the
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
            **_quick_values(),
            figure_slices=(0, 1, 3, 15, 63),
            latency_repeats=3,
            seeds=(0,),
            selected_methods=("alfa",),
            default_methods=(),
            ablation_pairs=("E→M",),
        )
        return dataclasses.replace(base, **overrides)

    @classmethod
    def smoke(cls, **overrides: Any) -> BenchConfig:
        """The smoke test: every row kind, every method and every ablation once, on tiny data (the shortest preset). It
        makes no claims: its numbers are noise (a source of a dozen persons trained two epochs) and only say
        that each code path runs and that the report renders.

        One seed; the symmetric pair E→M with everything (the ablations too, each with one value besides the
        default) and the positive control S→W (its source trained without the symmetry term) with the main,
        test-time augmentation and sanity rows; on both, the rows no claimed preset runs unless named (RUDA,
        :data:`EXTRA_METHODS`; PnP-GA and TTA distillation, :data:`OPT_IN_METHODS`), Alfa's shipped recipe, and
        every user-calibration method at k = 3 (:data:`SMOKE_CALIBRATIONS`); Alfa's recipe selection (its grid on
        the stand-in and its selected row). 32×32 faces, sources of 12 persons × 24 images (2 pre-training + 1
        recovery epochs), 2 held-out source persons × 8 images, 2 persons per target with 8 images (5 adapt + 3
        scored), 2 personalization steps, TPGaze meta-trained 2 meta-steps on batches of 8, an oracle of 2
        steps. 96 records, 17 CPU-minutes (26 minutes of wall time beside two other runs on two cores;
        single-threaded like every preset), three quarters of it in the user-calibration rows (FAZE's training,
        once per source, and the adapters' ten draws a person), the other rows about 4. ``alfa report`` renders
        every row but the user-calibration ones, which only docs/results-user-calibration.md's page reads."""
        base = cls(
            preset="smoke",
            image_size=32,
            source_persons=12,
            source_images=24,
            val_persons=2,
            val_images=8,
            target_persons=2,
            target_images=8,
            pretrain=TrainConfig(epochs=2, batch_size=32, lr=1e-3, symmetry_weight=1.0),
            recovery=TrainConfig(epochs=1, batch_size=32, lr=1e-4, symmetry_weight=1.0),
            personalize=dataclasses.replace(_personalize_default(), steps=2),
            meta=MetaTrainConfig(epochs=1, steps_per_epoch=2, batch_size=8),
            oracle=OracleConfig(extra_images=4, steps=2, batch_size=8),
            # one value besides the default for each ablation: the quick one, but the steps sweep's quick
            # values both differ from the 2 steps here
            **{**_quick_values(), "step_values": (1, 2)},
            latency_batch=8,
            latency_repeats=1,
            pairs=("E→M", "S→W"),
            seeds=(0,),
            methods=table_methods() + SANITY_METHODS + EXTRA_METHODS + OPT_IN_METHODS + SMOKE_CALIBRATIONS,
            selected_methods=("alfa",),
            default_methods=("alfa",),
            ablation_pairs=("E→M",),
        )
        if overrides.get("worlds", "v2") == "v2":  # the TTA rows exist on the second worlds only (as in standard)
            base = dataclasses.replace(base, methods=with_tta_rows(base.methods))
        return dataclasses.replace(base, **overrides)

    def validate(self) -> None:
        for p in self.pairs:
            if p in CONSTRUCTED_CONTROLS and self.worlds != "v2":
                raise ValueError(
                    f"the constructed control {p} exists on the second worlds only (alfa bench --standard; worlds v2)"
                )
            if p not in PAIRS + CONSTRUCTED_CONTROLS:
                raise ValueError(f"unknown pair {p!r}; pairs are {', '.join(PAIRS + CONSTRUCTED_CONTROLS)}")
        if self.pairs and set(self.pairs) <= set(CONSTRUCTED_CONTROLS):
            if not set(self.methods) & set(CONSTRUCTED_CONTROL_ROWS):
                rows = ", ".join(CONSTRUCTED_CONTROL_ROWS)
                raise ValueError(f"the constructed control {', '.join(self.pairs)} runs only {rows}: name one")
        for p in (*self.ablation_pairs, self.figure_pair):
            if p not in PAIRS:
                raise ValueError(f"unknown pair {p!r} for the ablations or the figure; they are {', '.join(PAIRS)}")
        known = table_methods() + SANITY_METHODS + tuple(TTA_ROWS) + EXTRA_METHODS + OPT_IN_METHODS
        bad = [m for m in self.methods if m not in known + calibration_rows()]
        problems = [problem for problem in map(calibration_label_problem, bad) if problem]
        if problems:  # a known calibration at a k it has no rows at: say the k, not "unknown method"
            raise ValueError("; ".join(problems))
        if bad:
            raise ValueError(
                f"unknown method(s) {bad}; methods are {', '.join(known)}, and the user-calibration rows "
                f"calibrate-<method>[k=K] of {', '.join(CALIBRATION_ROW_METHODS)} (docs/user-calibration.md §5)"
            )
        selectable = selectable_methods()
        bad = [m for m in self.selected_methods if not _selectable(m, selectable)]
        if bad:
            raise ValueError(
                f"no recipe selection for {bad}; it runs for {', '.join(selectable)}, each also with another "
                f"registered objective (alfa[loss=roll]: {', '.join(OBJECTIVES)})"
            )
        bad = [m for m in self.default_methods if m not in selectable]
        if bad:
            raise ValueError(f"no default-recipe row for {bad}; it runs for {', '.join(selectable)}")
        bad = [a for a in self.ablations if a not in REGISTRY]
        if bad:
            raise ValueError(f"unknown ablation(s) {bad}; ablations are {', '.join(REGISTRY)}")
        if not self.seeds:
            raise ValueError("no seed to run")
        if self.target_images <= self.personalize.n_adapt:
            raise ValueError(
                f"target_images ({self.target_images}) must exceed the {self.personalize.n_adapt} adaptation images"
            )
        if self.val_images <= self.personalize.n_adapt:
            raise ValueError(f"val_images ({self.val_images}) must exceed n_adapt ({self.personalize.n_adapt})")
        if self.within_images is not None and self.within_images < 1:
            raise ValueError(f"within_images must be at least 1, got {self.within_images}")
        if self.threads < 1:
            raise ValueError(f"threads must be at least 1, got {self.threads}")
        if self.target_draw not in TARGET_DRAWS:
            raise ValueError(f"target_draw must be one of {', '.join(TARGET_DRAWS)}, got {self.target_draw!r}")
        if self.worlds not in WORLDS:
            raise ValueError(f"worlds must be one of {', '.join(WORLDS)}, got {self.worlds!r}")
        self.personalize.validate()
        self.pretrain.validate()
        self.recovery.validate()
        self.meta.validate()
        self.oracle.validate()

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["personalize"] = self.personalize.to_dict()  # its own form (options at their off value left out)
        return json.loads(json.dumps(data))

    @property
    def selection_rule(self) -> str:
        """The rule that selects a recipe on the stand-in in this configuration's protocol (:data:`SELECTION_RULE`)."""
        return SELECTION_RULE[self.worlds]

    def protocol_dict(self) -> dict[str, Any]:
        """Everything but the selection: two runs writing to one ``results.json`` must agree on it."""
        return {k: v for k, v in self.to_dict().items() if k not in SELECTION_FIELDS}

    # ------------------------------------------------------------------ data specs

    def world(self, key: str) -> str:
        """The synthetic world a source or target letter names in this configuration's :attr:`worlds`."""
        return world_name({**SOURCES, **TARGETS}[key], self.worlds)

    def source_spec(self, source: str) -> str:
        """Training data of a source model. A target key (``M``/``D``) names the within-target model's:
        the target world's ``train`` persons, never the scored ones, as many as a source has."""
        counts = {"persons": self.source_persons, "images_per_person": self.source_images}
        if source in TARGETS:
            counts["images_per_person"] = self.within_images or self.source_images
            return str(DatasetSpec.synthetic(self.world(source), split="train", size=self.image_size, **counts))
        return str(DatasetSpec.synthetic(self.world(source), size=self.image_size, **counts))

    def val_spec(self, source: str) -> str:
        domain = self.world(source)
        if source in TARGETS:
            persons = min(self.val_persons, get_domain(domain).persons["val"])
        else:
            persons = self.val_persons
        spec = DatasetSpec.synthetic(
            domain, split="val", size=self.image_size, persons=persons, images_per_person=self.val_images
        )
        return str(spec)

    def stand_in_spec(self, source: str) -> str:
        """The labelled stand-in target of a source's recipe selection: the held-out (``val``) persons of the
        world :data:`~alfa.study.bench.methods.STAND_INS` names for this version of the worlds (docs/flip-premise.md
        §4 for v1, §7 for v2), as many persons and images as a target has."""
        world = STAND_INS[self.worlds][source]
        available = get_domain(world).persons["val"]
        persons = available if self.target_persons is None else min(self.target_persons, available)
        spec = DatasetSpec.synthetic(
            world, split="val", size=self.image_size, persons=persons, images_per_person=self.target_images
        )
        return str(spec)

    def target_spec(self, target: str, seed: int) -> str:
        """The rendered target of a seed: ``target_images`` per person for every method, then the oracle's
        extra ones; with ``target_draw="per_seed"`` its persons are drawn with ``seed`` (so each seed scores
        other persons), else the same persons for every seed."""
        persons = {} if self.target_persons is None else {"persons": self.target_persons}
        drawn = {"seed": seed} if self.target_draw == "per_seed" else {}
        total = self.target_images + self.oracle.extra_images
        spec = DatasetSpec.synthetic(
            self.world(target), size=self.image_size, **persons, images_per_person=total, **drawn
        )
        return str(spec)

    def source_model_spec(self, source: str, seed: int) -> SourceSpec:
        """What the model of ``source`` with ``seed`` depends on, as :func:`build_source_model` takes (and
        hashes) it. A source's own training changes (:data:`~alfa.study.bench.methods.SOURCE_TRAINING`: the
        studio control without the symmetry term) apply to its pre-training and its recovery."""
        changes = SOURCE_TRAINING.get(source, {})
        return SourceSpec(
            source=self.source_spec(source),
            val_source=self.val_spec(source),
            model=self.model,
            seed=seed,
            pretrain=dataclasses.replace(self.pretrain, seed=seed, **changes),
            truncation=TruncateConfig(
                rank=self.rank, recovery=dataclasses.replace(self.recovery, seed=seed, **changes)
            ),
        )

    def recipe(self, seed: int, **changes: Any) -> PersonalizeConfig:
        return dataclasses.replace(self.personalize, seed=seed, **changes)


_VALUE_FIELDS = {a.values_field for a in REGISTRY.values() if a.values_field}
_unknown = _VALUE_FIELDS - {f.name for f in dataclasses.fields(BenchConfig)}
if _unknown:  # an ablation naming a value field BenchConfig lacks would fail at its first plan
    raise TypeError(f"ablations name value fields that BenchConfig does not have: {sorted(_unknown)}")

# Selection options: they say which records to run, not how; pieces of one benchmark may differ in them.
# The ablation value lists only choose which records exist (each record's hash covers what it depends
# on), so adding a value to a finished benchmark runs the new records and keeps the others. The value
# fields come in BenchConfig's field order (the order each run's stored selection lists them in).
SELECTION_FIELDS = (
    "pairs",
    "seeds",
    "methods",
    "selected_methods",
    "default_methods",
    "ablations",
    "ablation_pairs",
    "threads",
    "keep_adapters",
    *(f.name for f in dataclasses.fields(BenchConfig) if f.name in _VALUE_FIELDS),
)


def split_pair(pair: str) -> tuple[str, str]:
    source, _, target = pair.partition("→")
    return source, target
