"""Personalization recipes chosen without target labels: the declared grid, the selection rule, and the
number the reference protocol would report (docs/flip-premise.md §3–4).

The grid and the rule were written down (docs/flip-premise.md, and this module) before any recipe of the
grid was scored. Selection reads only the errors on a labelled stand-in set that is neither a target nor
the source model's training persons; this module never sees a dataset, only those numbers.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from .default_recipe import DEFAULT_RECIPE_FIELDS, METHOD_RECIPE_FIELDS
from .personalize import LAYER34_PATTERN, PersonalizeConfig

__all__ = [
    "Recipe",
    "PAPER_RECIPE",
    "DEFAULT_RECIPE",
    "METHOD_RECIPES",
    "RECIPE_GRID",
    "TIE_DEGREES",
    "training_runs",
    "select_recipe",
    "select_pooled",
    "RECIPE_NAMES",
    "named_recipe",
    "reference_protocol_error",
]

TIE_DEGREES = 0.05
"""Two recipes whose stand-in errors differ by at most this many degrees count as tied."""


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
        """The tie-break order of the rule: fewer steps, then a lower learning rate, then the pitch anchor
        on, then no ×10, then the flipped branch detached (smaller is more conservative)."""
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


DEFAULT_RECIPE = Recipe(**DEFAULT_RECIPE_FIELDS)
"""Alfa's default recipe (``alfa personalize``): the grid's recipe the declared rule selects for the E source,
seeds pooled; generated from the benchmark's committed results into :mod:`alfa.gaze.default_recipe`, whose
``SELECTED_ON`` says from which and on what stand-in errors."""

METHOD_RECIPES: dict[str, Recipe] = {m: Recipe(**f) for m, f in METHOD_RECIPE_FIELDS.items()}
"""Per adapter method, its recipe selected by the same rule on the same stand-in errors (Alfa's is
:data:`DEFAULT_RECIPE`); generated into :mod:`alfa.gaze.default_recipe` with it. A method without a selection
there (TPGaze has its own optimizer and recipe) falls back to :data:`PAPER_RECIPE`."""

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


def reference_protocol_error(per_step: Mapping[str, Sequence[float]]) -> float:
    """What the reference code reports (test-label selection, never a result): per person the lowest error
    over the steps ``0 … steps`` (each measured with the person's labels), then the mean over persons."""
    if not per_step or any(len(v) == 0 for v in per_step.values()):
        raise ValueError("need at least one error per step for every person")
    return statistics.fmean(min(v) for v in per_step.values())
