"""The rows of the benchmark's tables: a :class:`Variant` says what a row runs; :func:`main_variants`
gives Table 1's methods and the sanity rows (the ablations' rows are in :mod:`alfa.study.bench.ablations`)."""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field
from typing import Any, Protocol

from alfa.adapters import METHODS, AdapterConfig, AlfaConfig
from alfa.gaze.distill import DISTILL_OBJECTIVE
from alfa.gaze.objectives import OBJECTIVES
from alfa.gaze.pnpga import PnPGAConfig
from alfa.gaze.recipes import Recipe, named_recipe
from alfa.gaze.ruda import RUDA_RECIPE, ruda_method

from .methods import (
    ADAPTER_CALIBRATIONS,
    ADAPTER_OPTION_CHANGES,
    EXTRA_METHODS,
    OPT_IN_METHODS,
    SANITY_METHODS,
    TTA_ROWS,
    calibration_rows,
    parse_calibration_label,
    table_methods,
)
from .names import DEFAULT, SELECTED  # rows with a selected (alfa[selected]) or shipped (alfa[default]) recipe
from .user_calibration_settings import calibration_settings

__all__ = [
    "Variant",
    "VariantSettings",
    "alfa_config",
    "method_config",
    "main_variants",
    "selection_variants",
    "split_loss",
    "default_variant",
    "pnpga_variant",
    "SELECTED",
    "DEFAULT",
    "GRID",
]

GRID = "[grid]"
"""Suffix of a method's recipe-selection record (scored on the stand-in, never a table row)."""


class VariantSettings(Protocol):
    """What the rows read from the benchmark's configuration (a
    :class:`~alfa.study.bench.config.BenchConfig`). Stated here, not imported: the configuration imports
    the ablations, which build variants, so the dependency runs one way."""

    alfa_heads: int
    alfa_rank: int
    personalize: Any  # its n_adapt: the images every row adapts on
    pretrain: Any  # its epochs: how many snapshots PnP-GA's ensemble can have
    oracle: Any  # its extra labelled images: with n_adapt, a user-calibration row's pool
    target_images: int  # a stand-in person's images: half of them a user-calibration row's stand-in pool


@dataclass
class Variant:
    """One row of a table: a method, or an ablated variant of one, and how to run it.

    ``kind``: ``"source-only"`` (no adaptation), ``"flip-tta"`` (no training: the base's prediction
    averaged with its mirrored prediction on the flipped image), ``"roll-tta"`` and ``"group-tta"`` (no training:
    the base with the roll's or the flip × roll test-time augmentation, :data:`~alfa.study.bench.methods.TTA_ROWS`),
    ``"in-domain"`` (the base on held-out source persons),
    ``"oracle"``, ``"adapter"`` (an adapter method with the shared recipe), ``"calibration"`` (user calibration
    from labelled images, ``calibration`` its settings: :mod:`alfa.study.bench.user_calibration`),
    ``"tpgaze"``, ``"ruda"`` (RUDA:
    the whole network with its rotation-consistency objective, :mod:`alfa.gaze.ruda`), or ``"pnpga"`` (PnP-GA's
    ensemble adaptation, ``pnpga`` its settings: :mod:`alfa.study.bench.pnpga`). ``base``:
    ``"truncated"`` (the rank-``d`` base), ``"dense"`` (the pre-trained model before truncation) or
    ``"rank=<d>"`` (truncated at another rank and recovered the same way). ``recipe`` holds changes to the
    personalization recipe; ``group``/``value`` place the row in an ablation table. What its records' hashes
    see of it is :func:`alfa.study.bench.schema.variant_key`.
    """

    label: str
    kind: str
    group: str = "main"
    value: Any = None
    adapter: AdapterConfig | None = None
    recipe: dict[str, Any] = field(default_factory=dict)
    base: str = "truncated"
    same_layers_as_truncated: bool = False  # target the layers the truncated model factorizes
    selected: bool = False  # the recipe is the one selected on the stand-in (docs/flip-premise.md §4)
    shipped: Recipe | None = None  # the recipe alfa personalize ships for the method, which ``recipe`` applies
    pnpga: PnPGAConfig | None = None  # PnP-GA's settings (kind "pnpga")
    calibration: dict[str, Any] | None = None  # a user-calibration row's settings (kind "calibration")


def alfa_config(config: VariantSettings, **changes: Any) -> AlfaConfig:
    """Alfa with the benchmark's heads and rank, and ``changes``."""
    return AlfaConfig(**{"heads": config.alfa_heads, "rank": config.alfa_rank, **changes})


def method_config(method: str, config: VariantSettings) -> AdapterConfig:
    """A registered method at the benchmark's settings: Alfa at the configuration's heads and rank (the
    settings its ablations sweep), every other method at its own defaults."""
    cls = METHODS[method]
    return alfa_config(config) if cls is AlfaConfig else cls()


def _main_row(label: str, config: VariantSettings) -> Variant:
    if label in SANITY_METHODS:
        return Variant(label, label, group="sanity")
    if label in ("source-only", "flip-tta", *TTA_ROWS):
        return Variant(label, label)
    if label == "ruda":  # its method and its changes to the shared recipe (the views and loss of its objective)
        return Variant(label, "ruda", adapter=ruda_method(), recipe=dict(RUDA_RECIPE))
    if label == "pnpga":
        return pnpga_variant(config)
    calibration = parse_calibration_label(label)
    if calibration is not None:
        adapter = ADAPTER_CALIBRATIONS.get(calibration[0])
        options = method_config(adapter, config).to_dict() if adapter is not None else None
        if options is not None:
            options.update(ADAPTER_OPTION_CHANGES.get(calibration[0], {}))
        settings = calibration_settings(config, *calibration, adapter_options=options)
        return Variant(label, "calibration", group="calibration", value=calibration[1], calibration=settings)
    if label == DISTILL_OBJECTIVE:  # Alfa at the benchmark's settings, the shared recipe with the distillation loss
        return Variant(label, "adapter", adapter=alfa_config(config), recipe={"loss": DISTILL_OBJECTIVE})
    method = METHODS[label]
    if method.trains_prompts:  # TPGaze: meta-trained prompts and its own optimizer, not the shared recipe
        return Variant(label, "tpgaze")
    return Variant(label, "adapter", adapter=method_config(label, config))


def split_loss(label: str) -> tuple[str, str | None]:
    """``"alfa[loss=roll]"`` -> ``("alfa", "roll")``; a label without a ``[loss=…]`` suffix -> ``(label, None)``."""
    match = re.fullmatch(r"(.+)\[loss=([^\]]+)\]", label)
    return (match[1], match[2]) if match else (label, None)


def pnpga_variant(config: VariantSettings) -> Variant:
    """PnP-GA's row (:mod:`alfa.study.bench.pnpga`, docs/pnpga.md): its authors' settings, adapting on the
    images every row adapts on (the benchmark's ``n_adapt``, so that it is scored on the same images as every
    other row), with an ensemble of the paper's ``K = 10`` dense source models, or as many as the source's
    pre-training has epochs (the members are the snapshots of its last ``K`` epochs). One adapted student
    predicts, as in the authors' test script, but the one that started from the record's own source model (the
    last snapshot), not the third: an earlier snapshot is a less trained model, and no other row starts from it
    (the snapshots' source validation errors are in the results' ``sources``)."""
    paper = PnPGAConfig()
    members = min(paper.members, config.pretrain.epochs)
    settings = dataclasses.replace(paper, members=members, images=config.personalize.n_adapt, predict_with=members - 1)
    return Variant("pnpga", "pnpga", base="dense", pnpga=settings)


def selection_variants(config: VariantSettings, method: str) -> tuple[Variant, Variant]:
    """A method's recipe-selection record (the declared grid on the stand-in) and its row with the selected
    recipe. ``method`` is a Table-1 adapter method or an ablation's (``diag_gate``, ``linear_mix``), or one of
    those personalized with another registered objective (``alfa[loss=roll]``): the same declared grid and rule,
    every recipe of it with that objective (its records are new ones; the method's own hash as before)."""
    name, loss = split_loss(method)
    if name not in METHODS or METHODS[name].trains_prompts:
        raise ValueError(f"no recipe selection for {method!r}: it needs an adapter method of the shared recipe")
    if loss is not None and loss not in OBJECTIVES:
        raise ValueError(f"no recipe selection for {method!r}: {loss!r} is not a registered objective")
    adapter = method_config(name, config)
    recipe = {} if loss is None else {"loss": loss}
    grid = Variant(f"{method}{GRID}", "selection", group="selection", adapter=adapter, recipe=dict(recipe))
    row = Variant(f"{method}{SELECTED}", "adapter", group="selected", adapter=adapter, recipe=recipe, selected=True)
    return grid, row


def default_variant(config: VariantSettings, method: str) -> Variant:
    """A method's row with the recipe ``alfa personalize`` ships for it (:func:`alfa.gaze.recipes.named_recipe`
    ``"default"``, read from the package's ``selected_recipes.json`` when the plan is made). Its ``recipe``
    holds that recipe's settings, so its records' hashes change with the shipped default
    (docs/flip-premise.md §7)."""
    if method not in METHODS or METHODS[method].trains_prompts:
        raise ValueError(f"no default-recipe row for {method!r}: it needs an adapter method of the shared recipe")
    shipped = named_recipe("default", method)
    adapter = method_config(method, config)
    return Variant(
        f"{method}{DEFAULT}", "adapter", group="default", adapter=adapter, recipe=shipped.changes(), shipped=shipped
    )


def main_variants(config: VariantSettings) -> dict[str, Variant]:
    """Every row a run may name, by label: the methods of Table 1 (every adapter method at its defaults, Alfa with
    the benchmark's heads and rank), the sanity rows, the label-free TTA rows (:data:`TTA_ROWS`, which of the
    claimed presets only the standard one plans), and the rows no claimed preset runs unless named:
    :data:`EXTRA_METHODS`, :data:`OPT_IN_METHODS` and the user-calibration rows
    (:func:`~alfa.study.bench.methods.calibration_rows`); the smoke check (no claims) plans each of them once."""
    labels = (*table_methods(), *SANITY_METHODS, *TTA_ROWS, *EXTRA_METHODS, *OPT_IN_METHODS, *calibration_rows())
    return {label: _main_row(label, config) for label in labels}
