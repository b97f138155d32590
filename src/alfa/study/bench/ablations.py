"""The benchmark's ablations, one object each, in one registry.

An :class:`Ablation` holds everything about one ablation: its name and title, the values it sweeps, how it
turns the benchmark's configuration into table rows (:class:`~alfa.study.bench.variants.Variant`), the
sentences the report writes about it, and how the report shows it (in the summary or not, a column of
trainable parameters, a figure). The runner, the presets, the selection options, the results file's
layout and the report all iterate over :data:`REGISTRY`; adding an ablation is one more :func:`register`
call below.

Values: an ablation whose values a preset changes names a :class:`~alfa.study.bench.config.BenchConfig` field
(``values_field``, e.g. ``heads_values``): the field's default is ``default_values``, the quick preset
uses ``quick_values``, and the field is a selection option stored with each run. An ablation without such
a field sweeps its ``default_values`` (or a fixed set of rows).

Every ablation's rows include its reference row (the main ``alfa``, ``lora`` or ``source-only``): a value
equal to the main setting gives the main method's label, so it is run (and counted) once.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from alfa.adapters import AdapterConfig, AlfaConfig, DiagGateConfig, LinearMixConfig, LoraConfig
from alfa.gaze.objectives import OBJECTIVES
from alfa.gaze.personalize import PersonalizeConfig

from .markdown import spans
from .measures import part
from .names import SELECTED, display_name
from .stats import Diff, Index, cell_on, diff, pooled
from .variants import Variant, VariantSettings, alfa_config, main_variants

__all__ = [
    "Ablation",
    "AblationSettings",
    "Figure",
    "Rows",
    "Evidence",
    "REGISTRY",
    "register",
    "unregister",
    "ablation_variants",
    "family_of",
    "table_layout",
]


def family_of(label: str) -> str:
    """The method a row belongs to: ``alfa[H=1]`` -> ``alfa``."""
    return label.split("[")[0]


# ----------------------------------------------------------------------------- what an ablation is


class AblationSettings(VariantSettings, Protocol):
    """What the ablations read from the benchmark's configuration (a
    :class:`~alfa.study.bench.config.BenchConfig`), besides an ablation's ``values_field``. Stated here, not
    imported: the configuration imports this module (the value fields' defaults are here)."""

    rank: int
    personalize: PersonalizeConfig


@dataclass
class Rows:
    """What an ablation's row builder gets: the configuration, the values to sweep and the main rows."""

    name: str
    config: AblationSettings
    values: tuple[Any, ...]
    main: dict[str, Variant]

    def reference(self, label: str, value: Any) -> Variant:
        """The main row ``label``, placed in this ablation's table at ``value``."""
        return dataclasses.replace(self.main[label], group=self.name, value=value)

    def variant(
        self,
        label: str,
        kind: str,
        value: Any,
        adapter: AdapterConfig | None = None,
        recipe: dict[str, Any] | None = None,
        **options: Any,
    ) -> Variant:
        """An ablated row of this ablation."""
        return Variant(label, kind, self.name, value, adapter, recipe or {}, **options)

    def swept(self, method: str, value: Any, default: Any, label: str, **options: Any) -> Variant:
        """The main ``method`` row where ``value`` is its setting ``default``, else the adapter row ``label``."""
        if value == default:
            return self.reference(method, value)
        return self.variant(label, "adapter", value, **options)


class Evidence:
    """What an ablation's verdicts are written from (its rows' records, pooled over ``pairs``), and the
    two kinds of sentence they use: a paired comparison of two rows and a sweep over a setting."""

    def __init__(self, idx: Index, layout: Sequence[dict[str, Any]], pairs: Sequence[str]) -> None:
        self.idx, self.pairs = idx, list(pairs)
        self.by_value = {(family_of(r["label"]), r["value"]): r["label"] for r in layout}
        self.present = {m for (m, _, _) in idx}
        self.lines: list[str] = []

    def in_order(self) -> list[tuple[tuple[str, Any], str]]:
        """``by_value``'s items by family, then by value: numbers by size (``d=16`` before ``d=128``, which their
        text put after), anything else after them by its text; rows that tie keep their order."""

        def key(item: tuple[tuple[str, Any], str]) -> tuple[str, int, float, str]:
            (family, value), _ = item
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                return (family, 0, value, "")
            return (family, 1, 0.0, str(value))

        return sorted(self.by_value.items(), key=key)

    def shared(self, a: str, b: str, d: Diff, pairs: Sequence[str]) -> str:
        """``", on seeds 3–5 (those both rows have)"`` where ``d`` is on other seeds than either row's mean over
        ``pairs``: a difference pairs the rows seed by seed, while the table gives each row's mean over its own
        seeds, so a reader needs the seeds to see why ``d`` is not the difference of the table's means."""
        own = [pooled(self.idx, m, pairs) for m in (a, b)]
        if all(s is not None and s.values.keys() == d.per_seed.keys() for s in own):
            return ""
        return f", on seeds {spans(d.per_seed)} (those both rows have)"

    def compare(self, a: str, b: str, what: str) -> None:
        """``"<what>: A − B = Δ° [lo, hi] ..."`` when both rows ran (on the seeds both have, said where those are
        not each row's own)."""
        if a in self.present and b in self.present:
            d = diff(self.idx, a, b, self.pairs)
            if d is not None:
                on = self.shared(a, b, d, self.pairs)
                self.lines.append(f"{what}{on}: {display_name(a)} − {display_name(b)} = {d.describe()}.")

    def per_pair(self, a: str, b: str, what: str) -> None:
        """``"<what>, per pair: A − B = p₁ Δ [lo, hi]; ...: the mean error is not below on k of n pairs (...)"``
        when both rows ran; the seeds both rows have are said once where every pair's are the same, else per
        pair, where they are not each row's own."""
        if a not in self.present or b not in self.present:
            return
        per = [(p, d) for p in self.pairs if (d := diff(self.idx, a, b, [p])) is not None]
        if not per:
            return
        notes = [self.shared(a, b, d, [p]) for p, d in per]
        once = notes[0] if len(set(notes)) == 1 else ""
        seeds = ["" if once or not note else f" (seeds {spans(d.per_seed)})" for (_, d), note in zip(per, notes)]
        not_below = [p for p, d in per if d.mean >= 0]
        where = f"not below on {len(not_below)} of {len(per)} pairs ({', '.join(not_below)})"
        self.lines.append(
            f"{what}{once}, per pair: {display_name(a)} − {display_name(b)} = "
            + "; ".join(f"{p} {d.compact()}{on}" for (p, d), on in zip(per, seeds))
            + f"; in the means the error is {where if not_below else f'below on all {len(per)} pairs'}"
            + f", with the 95 % interval below zero on {sum(d.below_zero for _, d in per)}"
            + f" ({sum(d.clear for _, d in per)} of the {len(per)} clear)."
        )

    def sweep(self, family: str, setting: str) -> None:
        """The mean error of ``family``'s rows by numeric value of ``setting``, the lowest of those means and
        their trend (point estimates: the steps between values are not judged), and the last value against the
        first (judged). The means are on the seeds every value has where the rows' seeds differ (a trend
        across means of other seeds would mix the seeds' spread into it); with no seed shared, each on its own."""
        values = sorted(v for (f, v) in self.by_value if f == family and isinstance(v, (int, float)))
        stats = [(v, pooled(self.idx, self.by_value[(family, v)], self.pairs)) for v in values]
        stats = [(v, s) for v, s in stats if s is not None]
        if len(stats) < 2:
            return
        on = ""
        if len({tuple(s.values) for _, s in stats}) > 1:
            common = set.intersection(*(set(s.values) for _, s in stats))
            if common:
                stats = [(v, cell_on(self.idx, self.by_value[(family, v)], self.pairs, common)) for v, _ in stats]
                on = f", on seeds {spans(common)} (those every value has)"
            else:
                on = ", each on its own seeds (no seed has every value)"
        series = ", ".join(f"{setting}={v:g}: {s.format()}" for v, s in stats)
        best = min(stats, key=lambda t: t[1].mean)
        steps = [b[1].mean - a[1].mean for a, b in zip(stats, stats[1:])]
        trend = (
            "decreasing" if all(x < 0 for x in steps) else "increasing" if all(x > 0 for x in steps) else "not monotone"
        )
        self.lines.append(
            f"{display_name(family)} error (mean over {', '.join(self.pairs)}{on}) by {setting}: {series} deg; of "
            f"these {len(stats)} means the lowest is at {setting}={best[0]:g}; the means are {trend} in {setting}."
        )
        first, last = self.by_value[(family, stats[0][0])], self.by_value[(family, stats[-1][0])]
        self.compare(last, first, f"{setting}={stats[-1][0]:g} against {setting}={stats[0][0]:g}")


@dataclass(frozen=True)
class Figure:
    """An error-against-setting plot of an ablation: one line per (family, pair)."""

    xlabel: str
    families: tuple[str, ...]
    title: str


@dataclass(frozen=True)
class Ablation:
    """One ablation of the benchmark (see the module's docstring).

    ``rows`` builds the table's rows from :class:`Rows`; ``verdicts`` adds the report's sentences to an
    :class:`Evidence`. ``in_summary``: its first two sentences go to the report's summary;
    ``extra_params``: its table has a column of trainable parameters; ``figure``: its plot, if any;
    ``selected_rows``: its table shows, after each of its rows, that row's recipe selected on the stand-in
    (``alfa[loss=roll][selected]``, a selection row no ablation plans) where the records have one.
    """

    name: str
    title: str
    what: str
    rows: Callable[[Rows], list[Variant]]
    verdicts: Callable[[Evidence], None] | None = None
    values_field: str | None = None
    default_values: tuple[Any, ...] = ()
    quick_values: tuple[Any, ...] | None = None
    in_summary: bool = False
    extra_params: bool = False
    figure: Figure | None = None
    selected_rows: bool = False

    def values(self, config: AblationSettings) -> tuple[Any, ...]:
        """The values this ablation sweeps under ``config``."""
        return tuple(getattr(config, self.values_field)) if self.values_field else self.default_values

    def variants(self, config: AblationSettings, main: dict[str, Variant] | None = None) -> list[Variant]:
        """The rows of this ablation, its reference rows included; ``main``: :func:`main_variants` of ``config``
        where the caller has them (a thousand rows: one results layout reads every ablation's rows)."""
        main = main_variants(config) if main is None else main
        return self.rows(Rows(self.name, config, self.values(config), main))

    def sentences(self, idx: Index, layout: Sequence[dict[str, Any]], pairs: Sequence[str]) -> list[str]:
        """The report's sentences about this ablation, pooled over ``pairs``."""
        evidence = Evidence(idx, layout, pairs)
        if self.verdicts is not None:
            self.verdicts(evidence)
        return evidence.lines


REGISTRY: dict[str, Ablation] = {}
"""Every ablation by name, in the order the results file's layout (and so the report) lists them."""


def register(ablation: Ablation) -> Ablation:
    """Add ``ablation`` to :data:`REGISTRY` (a name may be registered once)."""
    if ablation.name in REGISTRY:
        raise ValueError(f"ablation {ablation.name!r} is already registered")
    REGISTRY[ablation.name] = ablation
    return ablation


def unregister(name: str) -> None:
    """Remove an ablation from :data:`REGISTRY` (tests register their own)."""
    del REGISTRY[name]


def ablation_variants(name: str, config: AblationSettings) -> list[Variant]:
    """The rows of one ablation, its reference row (the main ``alfa``, ``lora`` or ``source-only``) included.

    A value equal to the main setting gives the main method's label, so it is run (and counted) once.
    """
    if name not in REGISTRY:
        raise ValueError(f"unknown ablation {name!r}; ablations are {', '.join(REGISTRY)}")
    return REGISTRY[name].variants(config)


def table_layout(name: str, layout: Sequence[dict[str, Any]], present: set[str]) -> list[dict[str, Any]]:
    """The rows of ablation ``name``'s table: its stored ``layout``, and, for an ablation with
    ``selected_rows``, each row's selected-recipe row right after it where ``present`` (the labels with
    records) has one, at the same setting. The selection rows are planned by ``--selected-methods``
    (``alfa[loss=roll]``), not by the ablation, so the stored layout does not hold them."""
    ablation = REGISTRY.get(name)
    if ablation is None or not ablation.selected_rows:
        return list(layout)
    out: list[dict[str, Any]] = []
    for row in layout:
        out.append(row)
        if f"{row['label']}{SELECTED}" in present:
            out.append({**row, "label": f"{row['label']}{SELECTED}"})
    return out


# ----------------------------------------------------------------------------- the ablations


def _heads_rows(r: Rows) -> list[Variant]:
    c = r.config
    return [r.swept("alfa", h, c.alfa_heads, f"alfa[H={h}]", adapter=alfa_config(c, heads=h)) for h in r.values]


def _heads_verdicts(e: Evidence) -> None:
    e.sweep("alfa", "H")
    e.lines.append(
        "The paper reports 6.20° → 5.72° from H=1 to H=16 on real data (SVD rank 64); compare the sign and size above."
    )


register(
    Ablation(
        "heads",
        "Heads H",
        "Alfa with H heads (rank r and SVD rank d at their defaults).",
        _heads_rows,
        _heads_verdicts,
        values_field="heads_values",
        default_values=(1, 2, 4, 8, 16),
        quick_values=(1, 8),
        in_summary=True,
        extra_params=True,
        figure=Figure("heads H", ("alfa",), "error vs heads (Alfa)"),
    )
)


def _init_rows(r: Rows) -> list[Variant]:
    default = AlfaConfig().init_std
    return [
        r.swept("alfa", std, default, f"alfa[σ={std:g}]", adapter=alfa_config(r.config, init_std=std))
        for std in r.values
    ]


register(
    Ablation(
        "init",
        "Init scale σ",
        "σ of the Gaussian init of A_q and A_p (B_q = B_p = 0, so every σ starts at the base model). At the "
        "start the attention is uniform and every head gives the same mean dictionary row, so the update "
        "B_p A_p Z is rank-1 with a size ∝ σ·√(H·d): σ = 0.007 at H = 8 matches σ = 0.02 at H = 1.",
        _init_rows,
        lambda e: e.sweep("alfa", "σ"),
        values_field="init_std_values",
        default_values=(0.002, 0.007, 0.02),
        quick_values=(0.007, 0.02),
    )
)


def _rank_rows(r: Rows) -> list[Variant]:
    c = r.config
    rows = [r.swept("alfa", k, c.alfa_rank, f"alfa[r={k}]", adapter=alfa_config(c, rank=k)) for k in r.values]
    # alpha = 2r keeps LoRA's scale alpha/r at its default 2 while the rank changes.
    lora_rank = LoraConfig().rank
    rows += [r.swept("lora", k, lora_rank, f"lora[r={k}]", adapter=LoraConfig(rank=k, alpha=2.0 * k)) for k in r.values]
    return rows


def _rank_verdicts(e: Evidence) -> None:
    e.sweep("alfa", "r")
    e.sweep("lora", "r")


register(
    Ablation(
        "rank",
        "Low rank r",
        "Alfa's low rank r, and LoRA's rank r with α = 2r (scale α/r = 2 as in the default).",
        _rank_rows,
        _rank_verdicts,
        values_field="rank_values",
        default_values=(1, 2, 4, 8, 16),
        quick_values=(2, 8),
        extra_params=True,
        figure=Figure("rank r", ("alfa", "lora"), "error vs low rank r (Alfa; LoRA dashed)"),
    )
)


def _svd_rank_rows(r: Rows) -> list[Variant]:
    rows: list[Variant] = []
    for d in r.values:
        if d == r.config.rank:
            rows += [r.reference("source-only", d), r.reference("alfa", d)]
        else:
            rows += [
                r.variant(f"source-only[d={d}]", "source-only", d, base=f"rank={d}"),
                r.variant(f"alfa[d={d}]", "adapter", d, alfa_config(r.config), base=f"rank={d}"),
            ]
    return rows


def _svd_rank_verdicts(e: Evidence) -> None:
    e.sweep("source-only", "d")
    e.sweep("alfa", "d")
    for (f, v), lab in e.in_order():
        if f == "alfa":
            base = e.by_value.get(("source-only", v))
            if base:
                e.compare(lab, base, f"Alfa's gain over its own base at d={v}")


register(
    Ablation(
        "svd_rank",
        "SVD rank d",
        "The dense source model truncated at rank d and recovered the same way; no adaptation and Alfa on each.",
        _svd_rank_rows,
        _svd_rank_verdicts,
        values_field="svd_ranks",
        default_values=(16, 32, 64, 128),
        quick_values=(32, 64),
        figure=Figure("SVD rank d", ("alfa", "source-only"), "error vs SVD rank d"),
    )
)

register(
    Ablation(
        "gate",
        "Diagonal gate instead of attention",
        "V_adapt = diag(1+γ) V_base, γ = 0 at the start.",
        lambda r: [
            r.reference("alfa", "attention"),
            r.variant("diag_gate", "adapter", "diagonal gate", DiagGateConfig()),
        ],
        lambda e: e.compare("alfa", "diag_gate", "Attention against a diagonal gate diag(1+γ)"),
        in_summary=True,
        extra_params=True,
    )
)

register(
    Ablation(
        "mix",
        "Linear mix without softmax",
        "V_adapt = V_base + B A V_base (Alfa's projection without attention).",
        lambda r: [
            r.reference("alfa", "attention"),
            r.variant("linear_mix", "adapter", "linear mix", LinearMixConfig(rank=r.config.alfa_rank)),
        ],
        lambda e: e.compare("alfa", "linear_mix", "Attention against a linear low-rank mix without softmax"),
        in_summary=True,
        extra_params=True,
    )
)


def _truncation_rows(r: Rows) -> list[Variant]:
    return [
        r.reference("source-only", "truncated"),
        r.reference("alfa", "truncated"),
        r.variant("source-only[dense]", "source-only", "dense", base="dense"),
        r.variant(
            "alfa[dense]",
            "adapter",
            "dense",
            alfa_config(r.config, layers="dense"),
            base="dense",
            same_layers_as_truncated=True,
        ),
    ]


def _truncation_verdicts(e: Evidence) -> None:
    e.compare(
        "source-only", "source-only[dense]", "Truncation + recovery against the dense source model, no adaptation"
    )
    e.compare("alfa", "alfa[dense]", "Alfa on the truncated base against Alfa on the dense layers (full SVD)")
    e.compare("alfa[dense]", "source-only[dense]", "Alfa on the dense model against its own dense base")


register(
    Ablation(
        "truncation",
        "Without truncation",
        "Alfa on the dense pre-trained model (before truncation), on the same layers, each with the dictionary "
        "of its full SVD (d = min(m, n), up to 512).",
        _truncation_rows,
        _truncation_verdicts,
        in_summary=True,
        extra_params=True,
    )
)


def _loss_verdicts(e: Evidence) -> None:
    e.compare("alfa", "alfa[loss=augment]", "Flip-symmetry loss against augmentation consistency")
    e.compare("alfa", "source-only", "Flip-symmetry loss against no adaptation")
    e.compare("alfa[loss=augment]", "source-only", "Augmentation consistency against no adaptation")
    e.per_pair("alfa", "source-only", "With the flip loss against no adaptation")
    e.per_pair("alfa", "alfa[loss=augment]", "With the flip loss against augmentation consistency")
    for name, objective in OBJECTIVES.items():  # objectives registered beyond the two first ones
        if name not in ("flip", "augment") and objective.ablation:
            what = objective.description[:1].upper() + objective.description[1:]
            e.compare(f"alfa[loss={name}]", "source-only", f"{what} against no adaptation")
            e.compare("alfa", f"alfa[loss={name}]", f"Flip-symmetry loss against {name}")


def _loss_rows(r: Rows) -> list[Variant]:
    """Source-only, Alfa with the main loss, and Alfa with every other registered objective of the ablation."""
    main = r.config.personalize.loss
    others = [
        r.variant(f"alfa[loss={name}]", "adapter", name, alfa_config(r.config), {"loss": name})
        for name, objective in OBJECTIVES.items()
        if name != main and objective.ablation
    ]
    return [r.reference("source-only", "none"), r.reference("alfa", main), *others]


register(
    Ablation(
        "loss",
        "Self-supervised loss: flip symmetry against the other objectives",
        "The same batch and recipe, only the loss changes: flip symmetry, augmentation consistency (the augmented "
        "copy is asked to match the original, detached) and, where the results have their rows, the other "
        "objectives of `alfa.gaze.objectives` (roll consistency, flip + roll). Rows marked *selected recipe*: that "
        "loss with its recipe selected on the stand-in (§ Recipes selected without target labels), where the "
        "results have one.",
        _loss_rows,
        _loss_verdicts,
        in_summary=True,
        selected_rows=True,
    )
)

register(
    Ablation(
        "detach",
        "Flipped branch detached or not",
        "With `detach_flipped=False` both branches of the flip loss get gradients.",
        lambda r: [
            r.reference("alfa", "detached"),
            r.variant(
                "alfa[flip not detached]", "adapter", "not detached", alfa_config(r.config), {"detach_flipped": False}
            ),
        ],
        lambda e: e.compare(
            "alfa", "alfa[flip not detached]", "Flipped branch detached (default) against not detached"
        ),
    )
)


def _recipe_sweep(option: str, default: Callable[[AblationSettings], Any], label: Callable[[str, Any], str]):
    """Rows of a sweep of one recipe option for Alfa, then LoRA (the main row where it is the default)."""

    def rows(r: Rows) -> list[Variant]:
        out = []
        for method in ("alfa", "lora"):
            adapter = r.main[method].adapter
            out += [
                r.swept(method, v, default(r.config), label(method, v), adapter=adapter, recipe={option: v})
                for v in r.values
            ]
        return out

    return rows


def _alfa_and_lora_sweep(setting: str) -> Callable[[Evidence], None]:
    def verdicts(e: Evidence) -> None:
        e.sweep("alfa", setting)
        e.sweep("lora", setting)

    return verdicts


register(
    Ablation(
        "steps",
        "Number of steps",
        "Each step count is its own personalization run (never a per-step evaluation used to pick).",
        _recipe_sweep("steps", lambda c: c.personalize.steps, lambda m, k: f"{m}[steps={k}]"),
        _alfa_and_lora_sweep("steps"),
        values_field="step_values",
        default_values=(1, 3, 10, 30),
        quick_values=(1, 5),
        figure=Figure("steps", ("alfa", "lora"), "error vs personalization steps (Alfa; LoRA dashed)"),
    )
)

register(
    Ablation(
        "lr",
        "Learning rate",
        "The recipe's base learning rate (the ×10 on layer3/layer4 kept); every main row uses the paper's 1e-4. "
        "A sensitivity check, not a choice: a rate picked here would be picked on target labels.",
        _recipe_sweep("lr", lambda c: c.personalize.lr, lambda m, lr: f"{m}[lr={lr:g}]"),
        _alfa_and_lora_sweep("lr"),
        values_field="lr_values",
        default_values=(1e-6, 1e-5, 3e-5, 1e-4, 3e-4),
        quick_values=(1e-5, 1e-4),
        figure=Figure("base learning rate", ("alfa", "lora"), "error vs learning rate (Alfa; LoRA dashed)"),
    )
)


def _anchor_rows(r: Rows) -> list[Variant]:
    sweep = _recipe_sweep("pitch_anchor", lambda c: c.personalize.pitch_anchor, lambda m, w: f"{m}[anchor={w:g}]")
    return [r.reference("source-only", "none"), *sweep(r)]


def _anchor_verdicts(e: Evidence) -> None:
    for (f, v), lab in e.in_order():
        if f in ("alfa", "lora") and v:
            e.compare(lab, f, f"{display_name(f)} with the pitch anchor (weight {v:g}) against without")
            e.compare(
                lab, "source-only", f"{display_name(f)} with the pitch anchor (weight {v:g}) against no adaptation"
            )
            d = diff(e.idx, lab, f, e.pairs, part("pitch")) if f in e.present and lab in e.present else None
            if d is not None:
                on = e.shared(lab, f, d, e.pairs)
                e.lines.append(f"Pitch error{on}, {display_name(lab)} − {display_name(f)} = {d.describe()}.")
    for (f, v), lab in e.in_order():
        if f == "alfa" and v and ("lora", v) in e.by_value:
            e.compare(lab, e.by_value[("lora", v)], f"With the pitch anchor (weight {v:g}), Alfa against LoRA")


register(
    Ablation(
        "anchor",
        "Pitch anchor",
        "Not in the paper: a test of the yaw/pitch finding (see Where the error goes). The recipe's loss plus "
        "w·|mean predicted pitch − its value before the first step| over the batch: it holds the one direction "
        "the flip loss cannot see, with the model's own start as reference (no label).",
        _anchor_rows,
        _anchor_verdicts,
        values_field="anchor_values",
        default_values=(0.0, 1.0),
        in_summary=True,
    )
)
