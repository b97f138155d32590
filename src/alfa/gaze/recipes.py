"""Personalization recipes chosen without target labels: the declared grid, the selection rules, and the
number the reference protocol would report (docs/flip-premise.md §3–4 and §7).

The grid and each rule were written down (docs/flip-premise.md, and this module) before any recipe of the
grid was scored under it. Selection reads only the errors on a labelled stand-in set that is neither a
target nor the source model's training persons; this module never sees a dataset, only those numbers.

Two rules, one per protocol (:data:`SELECTION_RULES`): the first protocol's ``"lowest-cautious"``
(:func:`select_recipe`: the lowest stand-in error, ties to the most conservative recipe) and the second's
``"helps-under-bound"`` (:func:`select_helping`: among the recipes whose harm to the stand-in persons is
bounded, the lowest error, ties to the recipe that adapts more).
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from importlib import resources
from typing import Any

from . import tdist
from .personalize import LAYER34_PATTERN, PersonalizeConfig

__all__ = [
    "Recipe",
    "PAPER_RECIPE",
    "DEFAULT_RECIPE",
    "METHOD_RECIPES",
    "SELECTED_RECIPES",
    "RECIPE_GRID",
    "TIE_DEGREES",
    "NO_HARM_DEGREES",
    "CONFIDENCE",
    "SELECTION_RULES",
    "RULE_SPECS",
    "Selection",
    "training_runs",
    "select_recipe",
    "select_pooled",
    "paired_upper_bound",
    "select_helping",
    "select_pooled_helping",
    "RECIPE_NAMES",
    "named_recipe",
    "reference_protocol_error",
]

TIE_DEGREES = 0.05
"""Two recipes whose stand-in errors differ by at most this many degrees count as tied."""

NO_HARM_DEGREES = 0.1
"""The second rule's no-harm bound (docs/flip-premise.md §7): a recipe is eligible when the upper end of the
:data:`CONFIDENCE` interval of its mean paired difference to the unadapted model, over the stand-in persons,
is at most this many degrees. Not zero: a bound of zero asks for proof of a gain, which ten persons give
only for gains of several tenths, so the rule would refuse nearly every recipe; 0.1° is two tie margins and
about 1 % of a cross-domain error of about 10°, a harm no user would see."""

CONFIDENCE = 0.95
"""The two-sided level of the interval the no-harm bound reads (its upper end: a one-sided 97.5 % bound)."""

SELECTION_RULES = ("lowest-cautious", "helps-under-bound")
"""The rules by name: the first protocol's (docs/flip-premise.md §4) and the second's (§7)."""

RULE_SPECS: dict[str, dict[str, Any]] = {
    # Exactly what the first protocol's selection records hashed (their hashes must not change).
    "lowest-cautious": {"tie": TIE_DEGREES, "order": "steps, lr, anchor on, no x10, detached"},
    "helps-under-bound": {
        "name": "helps-under-bound",
        "paired": "recipe minus the unadapted model, per stand-in person",
        "interval": f"t, {CONFIDENCE:g} two-sided, over stand-in persons",
        "bound": NO_HARM_DEGREES,
        "tie": TIE_DEGREES,
        "order": "more steps, higher lr, no anchor, x10, both branches",
        "none eligible": "steps, lr, anchor on, no x10, detached",
    },
}
"""What a selection record's hash says of its rule (:func:`alfa.study.bench.schema.config_hash`)."""


@dataclass(frozen=True, order=True)
class Recipe:
    """One point of the recipe grid: the settings the selection may change, everything else as the base
    :class:`~alfa.gaze.personalize.PersonalizeConfig` has it."""

    detach_flipped: bool = True
    lr: float = 1e-4
    layer34_x10: bool = True
    steps: int = 10
    pitch_anchor: float = 0.0

    def apply(self, base: PersonalizeConfig) -> PersonalizeConfig:
        """``base`` with this recipe's settings (the ×10 rule on ResNet-18's ``layer3``/``layer4`` on or off)."""
        lr_scale = {LAYER34_PATTERN: 10.0} if self.layer34_x10 else {}
        return dataclasses.replace(
            base,
            detach_flipped=self.detach_flipped,
            lr=self.lr,
            lr_scale=lr_scale,
            steps=self.steps,
            pitch_anchor=self.pitch_anchor,
        )

    def changes(self) -> dict[str, Any]:
        """This recipe as changes to a :class:`~alfa.gaze.personalize.PersonalizeConfig` (the fields it sets)."""
        applied = self.apply(PersonalizeConfig())
        return {k: getattr(applied, k) for k in ("detach_flipped", "lr", "lr_scale", "steps", "pitch_anchor")}

    @property
    def label(self) -> str:
        """A short name, e.g. ``"detached lr=1e-4 ×10 steps=10"`` (the anchor only when on)."""
        parts = [
            "detached" if self.detach_flipped else "both branches",
            f"lr={self.lr:g}",
            "×10" if self.layer34_x10 else "×1",
            f"steps={self.steps}",
        ]
        if self.pitch_anchor:
            parts.append(f"anchor={self.pitch_anchor:g}")
        return " ".join(parts)

    def caution(self) -> tuple:
        """The tie-break order of the rules: fewer steps, then a lower learning rate, then the pitch anchor
        on, then no ×10, then the flipped branch detached (smaller is more conservative). The first rule takes
        the smallest of tied recipes, the second the largest (the recipe that adapts more)."""
        return (self.steps, self.lr, not self.pitch_anchor, self.layer34_x10, not self.detach_flipped)


PAPER_RECIPE = Recipe()
"""The paper's recipe: flipped branch detached, AdamW 1e-4 with ×10 on layer3/4, 10 steps, no anchor."""

RECIPE_GRID: tuple[Recipe, ...] = tuple(
    Recipe(detach, lr, x10, steps, anchor)
    for detach, lr, x10, steps, anchor in itertools.product(
        (True, False), (1e-5, 3e-5, 1e-4), (True, False), (3, 10), (0.0, 1.0)
    )
)
"""The declared grid (48 recipes); it contains :data:`PAPER_RECIPE`."""


def _read_selected_recipes() -> dict[str, Any]:
    return json.loads(resources.files(__package__).joinpath("selected_recipes.json").read_text(encoding="utf-8"))


SELECTED_RECIPES: dict[str, Any] = _read_selected_recipes()
"""The package data ``alfa/gaze/selected_recipes.json``, generated by ``alfa pages --write`` from the
benchmark's committed results: per adapter method (``methods``), the recipe the declared rule selected for
the E source, its label, the seeds pooled and the stand-in errors it was chosen on; ``results`` and
``source`` say from what."""

METHOD_RECIPES: dict[str, Recipe] = {m: Recipe(**e["recipe"]) for m, e in SELECTED_RECIPES["methods"].items()}
"""Per adapter method, its recipe selected by the declared rule on the stand-in errors (from
:data:`SELECTED_RECIPES`). A method without a selection there (TPGaze has its own optimizer and recipe)
falls back to :data:`PAPER_RECIPE`."""

DEFAULT_RECIPE = METHOD_RECIPES["alfa"]
"""Alfa's default recipe (``alfa personalize``): the grid's recipe the declared rule selects for the E source,
seeds pooled; :data:`SELECTED_RECIPES` says from which results and on what stand-in errors."""

RECIPE_NAMES = ("default", "paper")
"""The recipes a user can ask for by name: ``default`` (the method's selected recipe, :data:`METHOD_RECIPES`)
and ``paper`` (:data:`PAPER_RECIPE`)."""


def named_recipe(name: str, method: str = "alfa") -> Recipe:
    """The recipe called ``name`` (:data:`RECIPE_NAMES`) for the adapter method ``method``: ``default`` is its
    selected recipe where it has one, the paper's otherwise."""
    if name == "paper":
        return PAPER_RECIPE
    if name == "default":
        return METHOD_RECIPES.get(method, PAPER_RECIPE)
    raise ValueError(f"unknown recipe {name!r}; known: {', '.join(RECIPE_NAMES)}")


def training_runs(grid: Iterable[Recipe] = RECIPE_GRID) -> dict[Recipe, list[int]]:
    """The runs that cover ``grid``: recipes that differ only in their step count share one run of the
    largest count, evaluated after each of the counts (there is no schedule, so step ``k`` of a longer run
    is the ``k``-step recipe). Maps each run's recipe to the step counts to evaluate, ascending."""
    runs: dict[Recipe, set[int]] = {}
    for recipe in grid:
        key = dataclasses.replace(recipe, steps=0)
        runs.setdefault(key, set()).add(recipe.steps)
    return {dataclasses.replace(key, steps=max(s)): sorted(s) for key, s in runs.items()}


def select_recipe(errors: Mapping[Recipe, float], tie: float = TIE_DEGREES) -> Recipe:
    """The declared rule: the recipe with the lowest stand-in error; recipes within ``tie`` degrees of it
    are tied, and the most conservative of them (:meth:`Recipe.caution`) wins. ``errors`` holds one
    number per recipe (mean over the stand-in persons, then over seeds); non-finite ones are ignored."""
    finite = {r: e for r, e in errors.items() if math.isfinite(e)}
    if not finite:
        raise ValueError("no recipe has a finite stand-in error to select on")
    best = min(finite.values())
    return min((r for r, e in finite.items() if e <= best + tie), key=Recipe.caution)


def select_pooled(per_seed: Sequence[Mapping[Recipe, float]], tie: float = TIE_DEGREES) -> tuple[Recipe, float]:
    """The same rule on stand-in errors averaged over seeds (how ``alfa personalize``'s default is chosen:
    docs/flip-premise.md §4). Only recipes scored on every seed compete; a recipe that is not finite on some
    seed is out. Returns the recipe and its pooled error."""
    if not per_seed:
        raise ValueError("no seed's stand-in errors to pool")
    common = set(per_seed[0]).intersection(*per_seed[1:])
    pooled = {r: statistics.fmean(errors[r] for errors in per_seed) for r in common}
    chosen = select_recipe(pooled, tie)
    return chosen, pooled[chosen]


@dataclass(frozen=True)
class Selection:
    """What the second rule (:func:`select_helping`) chose, and why: the recipe, its mean stand-in error, the
    case that applied (``"eligible"``: the lowest error among the recipes under the no-harm bound;
    ``"none eligible"``: no recipe was, so the most conservative one), and per recipe that competed the
    upper end of the interval of its mean paired difference to the unadapted model."""

    recipe: Recipe
    error: float
    case: str
    upper: dict[Recipe, float]
    mean_difference: dict[Recipe, float]


def paired_upper_bound(differences: Sequence[float], confidence: float = CONFIDENCE) -> float:
    """The upper end of the two-sided ``confidence`` t-interval of the mean of ``differences`` (one per
    person). With fewer than two there is no interval, and the bound is infinite (nothing is shown harmless)."""
    if len(differences) < 2:
        return math.inf
    half = float(tdist.t_quantile(1.0 - confidence, len(differences) - 1)) * statistics.stdev(differences)
    return statistics.fmean(differences) + half / math.sqrt(len(differences))


def select_helping(
    errors: Mapping[Recipe, Mapping[str, float]],
    base: Mapping[str, float],
    bound: float = NO_HARM_DEGREES,
    tie: float = TIE_DEGREES,
) -> Selection:
    """The second rule (docs/flip-premise.md §7). ``errors``: per recipe, each stand-in person's error;
    ``base``: each person's error of the unadapted model. A recipe with a missing or non-finite error for a
    person of ``base`` is out of the running. *Eligible*: the upper end of the t-interval
    (:func:`paired_upper_bound`) of the mean over persons of ``error − base`` is at most ``bound``. Among the
    eligible, the lowest mean error wins; those within ``tie`` of it are tied, and the one that adapts more
    wins (the largest :meth:`Recipe.caution`: the stand-in cannot tell them apart, so the rule prefers the
    recipe that moves). With none eligible, the most conservative recipe (the smallest :meth:`Recipe.caution`)."""
    persons = sorted(base)
    if not persons or not all(math.isfinite(base[p]) for p in persons):
        raise ValueError("the unadapted model needs a finite error for every stand-in person")
    means, upper, mean_difference = {}, {}, {}
    for recipe, per_person in errors.items():
        values = [per_person.get(p, math.inf) for p in persons]
        if all(math.isfinite(v) for v in values):
            differences = [v - base[p] for v, p in zip(values, persons)]
            means[recipe] = statistics.fmean(values)
            mean_difference[recipe] = statistics.fmean(differences)
            upper[recipe] = paired_upper_bound(differences)
    if not means:
        raise ValueError("no recipe has a finite stand-in error for every person to select on")
    eligible = {r: e for r, e in means.items() if upper[r] <= bound}
    if not eligible:
        chosen = min(means, key=Recipe.caution)
        return Selection(chosen, means[chosen], "none eligible", upper, mean_difference)
    best = min(eligible.values())
    chosen = max((r for r, e in eligible.items() if e <= best + tie), key=Recipe.caution)
    return Selection(chosen, means[chosen], "eligible", upper, mean_difference)


def select_pooled_helping(
    per_seed: Sequence[tuple[Mapping[Recipe, Mapping[str, float]], Mapping[str, float]]],
    bound: float = NO_HARM_DEGREES,
    tie: float = TIE_DEGREES,
) -> Selection:
    """The second rule on several seeds' selections (how ``alfa personalize``'s default is chosen under it):
    each ``(errors, base)`` as :func:`select_helping` takes them; per person (the stand-in's persons are the
    same in every seed) each error is averaged over the seeds, so a person counts once in the interval and a
    recipe must be finite on every seed. Only persons of every seed's ``base`` are kept."""
    if not per_seed:
        raise ValueError("no seed's stand-in errors to pool")
    persons = sorted(set(per_seed[0][1]).intersection(*(set(base) for _, base in per_seed[1:])))
    base = {p: statistics.fmean(b[p] for _, b in per_seed) for p in persons}
    common = set(per_seed[0][0]).intersection(*(set(e) for e, _ in per_seed[1:]))
    pooled = {r: {p: statistics.fmean(e[r].get(p, math.inf) for e, _ in per_seed) for p in persons} for r in common}
    return select_helping(pooled, base, bound, tie)


def reference_protocol_error(per_step: Mapping[str, Sequence[float]]) -> float:
    """What the reference code reports (test-label selection, never a result): per person the lowest error
    over the steps ``0 … steps`` (each measured with the person's labels), then the mean over persons."""
    if not per_step or any(len(v) == 0 for v in per_step.values()):
        raise ValueError("need at least one error per step for every person")
    return statistics.fmean(min(v) for v in per_step.values())
