"""Which records a benchmark run produces: a :class:`RecordPlan` per (variant, pair, seed), its id, and the
order they run in (:func:`plan_records`).

A record's id (``"alfa|E→M|seed0"``, :func:`record_id`) names it in ``results.json``; its hash (what it
depends on: :func:`~alfa.study.bench.schema.config_hash`) needs the rendered data, which the session
(:meth:`~alfa.study.bench.session.Session.record_hash`) provides. The configuration and its presets are
:class:`~alfa.study.bench.config.BenchConfig`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from dataclasses import dataclass

from .ablations import REGISTRY, ablation_variants
from .config import BenchConfig, split_pair
from .methods import (
    CONSTRUCTED_CONTROL_ROWS,
    CONSTRUCTED_CONTROL_SEEDS,
    CONSTRUCTED_CONTROLS,
    DECLARED_FAMILY_ROWS,
    EXTRA_METHODS,
    FAMILY_DEFAULTS,
    FAMILY_SEEDS,
    FIRST_SEEDS,
    OPT_IN_METHODS,
    PAIRS,
    PNPGA_FAMILY_SEEDS,
    REPLICATE_SEEDS,
    SOURCES,
    calibration_rows,
)
from .variants import SELECTED, Variant, default_variant, main_variants, selection_variants

__all__ = [
    "STAND_IN",
    "RecordPlan",
    "record_id",
    "plan_records",
    "grid_plan",
    "declared_run",
    "declared_run_parts",
    "DeclaredRunProgress",
    "declared_run_progress",
]


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
stand-in (:data:`~alfa.study.bench.methods.STAND_INS` of the configuration's worlds), never on a target."""


def plan_records(config: BenchConfig) -> list[RecordPlan]:
    """Every record the selection asks for, in run order (seed, then source, then pair), deduplicated. A
    method's recipe-selection record on the stand-in comes before its selected rows (which read it); on each
    pair the rows of the shipped default recipes come after the selected rows."""
    main = main_variants(config)
    selection = {m: selection_variants(config, m) for m in config.selected_methods}
    defaults = [default_variant(config, m) for m in config.default_methods]
    # an ablation's rows depend on the configuration alone: built once, not per pair and seed (seconds each time)
    ablation_rows = [v for name in config.ablations for v in ablation_variants(name, config)]
    plans: dict[str, RecordPlan] = {}
    for seed in config.seeds:
        for source in SOURCES:
            controls = CONSTRUCTED_CONTROLS if seed in CONSTRUCTED_CONTROL_SEEDS else ()
            pairs = [p for p in PAIRS + controls if p in config.pairs and split_pair(p)[0] == source]
            if any(p in PAIRS for p in pairs):
                for grid, _ in selection.values():
                    plan = RecordPlan(grid, f"{source}→{STAND_IN}", seed)
                    plans[plan.id] = plan
            for pair in pairs:
                if pair in CONSTRUCTED_CONTROLS:  # its ceiling and headroom only (docs/flip-premise.md §7.4)
                    variants = [main[m] for m in config.methods if m in CONSTRUCTED_CONTROL_ROWS]
                else:
                    variants = [main[m] for m in config.methods] + [row for _, row in selection.values()] + defaults
                    if pair in config.ablation_pairs:
                        variants += ablation_rows
                for v in variants:
                    plan = RecordPlan(v, pair, seed)
                    if plan.id not in plans:
                        plans[plan.id] = plan
    return list(plans.values())


def grid_plan(config: BenchConfig, plan: RecordPlan) -> RecordPlan:
    """The recipe-selection record a selected row reads."""
    method = plan.variant.label.removesuffix(SELECTED)
    return RecordPlan(selection_variants(config, method)[0], f"{plan.source}→{STAND_IN}", plan.seed)


def declared_run_parts(worlds: str) -> dict[str, list[RecordPlan]]:
    """The declared run of ``worlds`` in its three parts, each without the records of the parts before it:
    ``first``, every row on seeds 0–2; ``family``, the family's rows on
    :data:`~alfa.study.bench.methods.FAMILY_SEEDS` and PnP-GA's on
    :data:`~alfa.study.bench.methods.PNPGA_FAMILY_SEEDS`; ``replicate``, the other rows of seeds 0–2 (PnP-GA's
    aside) on :data:`~alfa.study.bench.methods.REPLICATE_SEEDS`. Empty for anything but ``v2``."""
    if worlds != "v2":
        return {}
    standard = BenchConfig.standard()
    methods = standard.methods + EXTRA_METHODS + OPT_IN_METHODS + calibration_rows()
    every_row = dataclasses.replace(standard, seeds=FIRST_SEEDS, methods=methods)
    selectable = standard.selected_methods  # the preset's declared list, not the registry's today
    family = dataclasses.replace(
        standard,
        pairs=PAIRS,
        seeds=FAMILY_SEEDS,
        methods=tuple(m for m in DECLARED_FAMILY_ROWS if m in standard.methods),
        selected_methods=tuple(m for m in DECLARED_FAMILY_ROWS if m in selectable),
        default_methods=FAMILY_DEFAULTS,
        ablations=(),
    )
    pnpga = dataclasses.replace(
        family, seeds=PNPGA_FAMILY_SEEDS, methods=("pnpga",), selected_methods=(), default_methods=()
    )
    replicate = dataclasses.replace(every_row, seeds=REPLICATE_SEEDS, methods=tuple(m for m in methods if m != "pnpga"))
    parts: dict[str, list[RecordPlan]] = {}
    seen: set[str] = set()
    for name, plans in (
        ("first", plan_records(every_row)),
        ("family", plan_records(family) + plan_records(pnpga)),
        ("replicate", plan_records(replicate)),
    ):
        parts[name] = [p for p in plans if p.id not in seen]
        seen.update(p.id for p in parts[name])
    return parts


def declared_run(worlds: str) -> list[RecordPlan]:
    """Every record of the run the protocol of ``worlds`` declares as a whole (docs/flip-premise.md §7–7.4): for
    ``v2``, the standard preset on seeds 0–2 with the rows of the domain-adaptation issue (RUDA, PnP-GA, the
    distilled TTA) and of user calibration (every ``k`` and draw of each method the benchmark has rows of;
    docs/user-calibration.md §4), the family's rows on :data:`~alfa.study.bench.methods.FAMILY_SEEDS`
    (§7.1's command), PnP-GA's on :data:`~alfa.study.bench.methods.PNPGA_FAMILY_SEEDS` (§7.2's amendment
    of 2026-12-03, 18:30 UTC), and every other row of seeds 0–2 on
    :data:`~alfa.study.bench.methods.REPLICATE_SEEDS` (§7.2's amendment of 2026-12-04).
    Empty for ``v1``: each of its files was its own run, its plan its own configuration."""
    return [p for plans in declared_run_parts(worlds).values() for p in plans]


@dataclass(frozen=True)
class DeclaredRunProgress:
    """How much of a declared run (:func:`declared_run`) a results file holds: ``held`` of ``total`` records;
    of the missing ones on seeds 0–2, ``selections`` recipe selections, ``ablations`` ablation rows and ``rows``
    the others; ``family_missing`` of the family's rows (and PnP-GA's) on its seeds; ``replicate_missing`` of
    the other rows of seeds 0–2 repeated on :data:`~alfa.study.bench.methods.REPLICATE_SEEDS`."""

    held: int
    total: int
    selections: int
    ablations: int
    rows: int
    family_missing: int
    replicate_missing: int


def declared_run_progress(worlds: str, record_ids: Iterable[str]) -> DeclaredRunProgress | None:
    """What of the declared run of ``worlds`` the records ``record_ids`` hold (``None`` where no run is declared
    as a whole): a page made before the run is done says what it lacks, and reads nothing from the absence."""
    parts = declared_run_parts(worlds)
    if not parts:
        return None
    have = set(record_ids)
    missing = {name: [p for p in plans if p.id not in have] for name, plans in parts.items()}
    first = missing["first"]
    selections = sum(p.variant.kind == "selection" for p in first)
    ablations = sum(p.variant.kind != "selection" and p.variant.group in REGISTRY for p in first)
    total = sum(len(plans) for plans in parts.values())
    return DeclaredRunProgress(
        held=total - sum(len(m) for m in missing.values()),
        total=total,
        selections=selections,
        ablations=ablations,
        rows=len(first) - selections - ablations,
        family_missing=len(missing["family"]),
        replicate_missing=len(missing["replicate"]),
    )
