"""Which records a benchmark run produces: a :class:`RecordPlan` per (variant, pair, seed), its id, and the
order they run in (:func:`plan_records`).

A record's id (``"alfa|E→M|seed0"``, :func:`record_id`) names it in ``results.json``; its hash (what it
depends on: :func:`~alfa.study.bench.schema.config_hash`) needs the rendered data, which the session
(:meth:`~alfa.study.bench.session.Session.record_hash`) provides. The configuration and its presets are
:class:`~alfa.study.bench.config.BenchConfig`.
"""

from __future__ import annotations

from dataclasses import dataclass

from .ablations import ablation_variants
from .config import BenchConfig, split_pair
from .methods import PAIRS, SOURCES
from .variants import SELECTED, Variant, default_variant, main_variants, selection_variants

__all__ = ["STAND_IN", "RecordPlan", "record_id", "plan_records", "grid_plan"]


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
    plans: dict[str, RecordPlan] = {}
    for seed in config.seeds:
        for source in SOURCES:
            pairs = [p for p in PAIRS if p in config.pairs and split_pair(p)[0] == source]
            if pairs:
                for grid, _ in selection.values():
                    plan = RecordPlan(grid, f"{source}→{STAND_IN}", seed)
                    plans[plan.id] = plan
            for pair in pairs:
                variants = [main[m] for m in config.methods] + [row for _, row in selection.values()] + defaults
                if pair in config.ablation_pairs:
                    for name in config.ablations:
                        variants += ablation_variants(name, config)
                for v in variants:
                    plan = RecordPlan(v, pair, seed)
                    if plan.id not in plans:
                        plans[plan.id] = plan
    return list(plans.values())


def grid_plan(config: BenchConfig, plan: RecordPlan) -> RecordPlan:
    """The recipe-selection record a selected row reads."""
    method = plan.variant.label.removesuffix(SELECTED)
    return RecordPlan(selection_variants(config, method)[0], f"{plan.source}→{STAND_IN}", plan.seed)
