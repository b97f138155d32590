"""User calibration's rows in the benchmark (issue 25, docs/user-calibration.md §4): a row
``calibrate-<method>[k=K]`` (or ``calibrate-<method>-spread[k=K]``) calibrates every target person with ``K``
labelled images by :func:`alfa.gaze.calibrate.calibrate_person`, exactly as ``alfa calibrate`` does, and scores
them on the images every other row scores.

Per person, the labelled images are drawn from a **pool** of the person's labelled images that are never
scored: their ``n_adapt`` adaptation images followed by the first of the oracle's extra labelled images (32 in
all at the standard preset, the pool of ``alfa calibrate``), so the scored images are those of source-only, the
oracle and every label-free row. Each person is calibrated ten times, with the draws of seeds 0–9, and their
error is the mean over the ten (one value per person).

The recipe (``λ_A``, ``λ_h``, the rate and steps) is chosen once per method, source and seed by the declared rule
on the source's **stand-in** (the held-out persons of another world, never a target; docs/user-calibration.md
§3): each recipe of the method's grid calibrates every stand-in person from the first images of that person
(``stand_in_pool``) at ``k`` = 9 with random draws (seeds 0–9), scored on the person's other images; the lowest
mean error wins, and a recipe within 0.05° of it that regularizes more wins the tie. The record stores the grid.

Every method here corrects only the model's linear head, so each draw's predictions are the corrected head
applied to the scored images' penultimate features, computed once per person: the same numbers as a forward
pass through the calibrated model (tests/test_bench_user_calibration.py checks it), at a fraction of the cost.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor, nn
from tqdm.auto import tqdm

from alfa.adapters import adapter_parameters, detach, save_adapter
from alfa.gaze.calibrate import CalibrateConfig, calibrate_person, draw_positions, estimate_offset_prior, find_head
from alfa.gaze.data.base import GazeDataset
from alfa.gaze.evaluate import GazeError, eval_indices, load_examples, predict_images
from alfa.gaze.faze import FazeGaze
from alfa.gaze.personalize import person_seed

from .methods import ADAPTER_CALIBRATIONS
from .user_calibration_settings import TIE_DEG

if TYPE_CHECKING:  # the session builds the models; this module only runs on what it is given
    from .plan import RecordPlan
    from .session import Session, SourceContext, TargetData

__all__ = [
    "HEAD_ONLY",
    "CACHED_PART",
    "choose_recipe",
    "pick_recipe",
    "run_user_calibration",
    "person_draw_errors",
]

HEAD_ONLY = ("offset", "affine", "ridge", "last-layer")
"""The library's calibration methods that change only the model's linear head (scored on cached features)."""
CACHED_PART = (*HEAD_ONLY, "faze")
"""... and those whose calibration changes one part fed by an unchanged one: the head on the penultimate
features, FAZE's gaze MLP on the frozen DT-ED's gaze codes. Each draw is scored by that part alone."""
_FAILURES = (ValueError, RuntimeError, FloatingPointError)  # what a calibration raises when it cannot fit
OFFSET_PRIOR_CAP = 1e6  # an estimate of "no offset worth correcting" (inf) as a finite prior: the offset is ~0


@contextmanager
def _init_rng(seed: int, person: str, device: torch.device) -> Iterator[None]:
    """The generators an adapter's initial weights are drawn from, seeded as ``alfa calibrate`` seeds them for
    ``(seed, person)``, and restored after: the CPU's and, on a GPU, the device's (``torch.manual_seed`` seeds
    both, so forking the CPU's alone would leave the GPU's reseeded for every record after this one)."""
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        torch.manual_seed(person_seed(seed, person, "init"))
        yield


@dataclass
class _Person:
    """One person's labelled pool and scored images, with the scored images' penultimate features."""

    pool_images: Tensor
    pool_gaze: Tensor
    scored_images: Tensor
    scored_gaze: Tensor
    head: str
    features: Tensor


def _person(
    base: nn.Module, pool: tuple[Tensor, Tensor], scored: tuple[Tensor, Tensor], cached: bool = True
) -> _Person:
    """One person's images; with ``cached``, the inputs of the part a calibration changes (the head's features,
    FAZE's gaze codes) on the scored images."""
    device = next(base.parameters()).device
    images, gaze = (t.to(device) for t in scored)
    if not cached:  # the whole network changes: every draw is scored by a full forward pass
        head, features = "", images[:0]
    elif isinstance(base, FazeGaze):  # PS-GEN changes the gaze MLP only, which reads the gaze codes
        with torch.no_grad():
            head, features = "gaze_mlp", base.gaze_code(images)
    else:
        head, features, _ = find_head(base, images)
    return _Person(pool[0].to(device), pool[1].to(device), images, gaze, head, features)


def person_draw_errors(
    base: nn.Module, person_id: str, person: _Person, config: CalibrateConfig, draws: int
) -> tuple[list[GazeError], list[float]]:
    """The person's :class:`GazeError` after calibration with the draws of seeds ``0 … draws − 1``, and the
    seconds each calibration took (the forward pass of its ``k`` images and the fit)."""
    errors, seconds = [], []
    cached = config.method in CACHED_PART
    for seed in range(draws):
        at = draw_positions(person.pool_gaze, len(person.pool_gaze), config.k, config.draw, seed, person_id)
        cfg = dataclasses.replace(config, seed=seed, pool=len(person.pool_gaze))
        with _init_rng(seed, person_id, person.features.device):  # an adapter's initial weights
            t0 = time.perf_counter()
            calibrate_person(base, person.pool_images[at], person.pool_gaze[at], cfg, unlabelled=person.pool_images)
            seconds.append(time.perf_counter() - t0)
        try:
            with torch.no_grad():
                if cached:  # the calibrated part on the inputs the calibration does not change
                    pred = base.get_submodule(person.head)(person.features)
                else:
                    pred = predict_images(base, person.scored_images)
        finally:
            detach(base)
        # on the CPU: predict_images answers there, the cached head on the model's device
        errors.append(GazeError.of(pred.cpu(), person.scored_gaze.cpu()))
    return errors, seconds


def _mean(errors: list[GazeError]) -> GazeError:
    fields = [f.name for f in dataclasses.fields(GazeError)]
    return GazeError(**{f: statistics.fmean(getattr(e, f) for e in errors) for f in fields})


def _config(settings: dict[str, Any], changes: dict[str, Any], k: int, draw: str) -> CalibrateConfig:
    method = settings.get("library_method", settings["method"])
    recipe = {**settings["defaults"], **changes}
    if "adapter" in settings:
        recipe["adapter_method"] = settings["adapter"]["method"]
        recipe["adapter_options"] = dict(settings["adapter"]["options"])
        recipe["flip_weight"] = settings.get("flip_weight", recipe["flip_weight"])
    return CalibrateConfig(**recipe, method=method, k=k, draw=draw, pool=settings["pool"])


def _offset_prior(base: nn.Module, data: GazeDataset) -> float:
    """The offset prior the stand-in's persons imply for ``base``: every labelled image of each person, its
    error before any calibration (:func:`~alfa.gaze.calibrate.estimate_offset_prior`), capped to a finite value."""
    residuals = []
    for p in data.persons():
        images, gaze = load_examples(data, data.person_indices(p))
        device = next(base.parameters()).device
        with torch.no_grad():
            residuals.append((gaze.to(device) - base(images.to(device))).double().cpu())
    return min(estimate_offset_prior(residuals), OFFSET_PRIOR_CAP)


def _stand_in_people(base: nn.Module, data: GazeDataset, pool: int, cached: bool) -> dict[str, _Person]:
    people = {}
    for p in data.persons():
        idx = data.person_indices(p)
        if len(idx) <= pool:
            raise ValueError(f"stand-in person {p!r} has {len(idx)} images: the pool of {pool} and one to score")
        people[p] = _person(base, load_examples(data, idx[:pool]), load_examples(data, idx[pool:]), cached)
    return people


def pick_recipe(scored: list[dict[str, Any]]) -> tuple[dict[str, Any], str]:
    """The rule (docs/user-calibration.md §3) on a grid scored on the stand-in, strongest regularization first:
    the lowest mean error wins, and the first recipe within :data:`TIE_DEG` of it (a stronger one) wins a tie.
    Returns the winner's changes and the case that applied; a recipe whose error is not finite is out."""
    finite = [s for s in scored if math.isfinite(s["error_deg"])]
    if not finite:
        raise ValueError("no recipe of the grid calibrated the stand-in persons to a finite error")
    lowest = min(s["error_deg"] for s in finite)
    winner = next(s for s in finite if s["error_deg"] <= lowest + TIE_DEG)
    return winner["changes"], "lowest" if winner["error_deg"] == lowest else "tie: the stronger regularization"


def choose_recipe(session: Session, base: nn.Module, plan: RecordPlan, settings: dict[str, Any]) -> dict[str, Any]:
    """The stand-in rule's choice for ``plan``'s method, source and seed (made once per session; every row of
    the method on the source's pairs and every ``k`` reads the same): the grid's errors and the winner."""
    grid = settings["grid"]
    key = (plan.source, plan.seed, settings["method"], repr(grid), settings["stand_in_pool"])
    if key in session.calibration_choices:
        return session.calibration_choices[key]
    standin = session.stand_in(plan.source)
    prior = {}
    if "offset_prior" in settings:  # estimated once on the stand-in, then part of every recipe of the grid
        prior = {"offset_prior": _offset_prior(base, standin.data)}
        grid = [{**g, **prior} for g in grid]
    if len(grid) == 1:
        case = "the declared recipe (§5.2)" if settings["method"] in ADAPTER_CALIBRATIONS else "nothing to choose"
        choice = {"stand_in": standin.spec, "grid": [], "chosen": grid[0], "case": case, **prior}
        session.calibration_choices[key] = choice
        return choice
    cached = settings.get("library_method", settings["method"]) in CACHED_PART
    people = _stand_in_people(base, standin.data, settings["stand_in_pool"], cached)
    k, draws = settings["selection_k"], settings["draws"]
    scored = []
    for changes in grid:
        config = dataclasses.replace(_config(settings, changes, k, "random"), pool=settings["stand_in_pool"])
        try:
            per_person = {
                p: statistics.fmean(e.angular for e in person_draw_errors(base, p, person, config, draws)[0])
                for p, person in people.items()
            }
        except _FAILURES as e:  # a recipe that fails on a stand-in person is out of the running
            scored.append({"changes": changes, "error_deg": math.inf, "failed": f"{type(e).__name__}: {e}"})
            continue
        mean = statistics.fmean(per_person.values())
        scored.append({"changes": changes, "error_deg": mean, "per_person": per_person})
    chosen, case = pick_recipe(scored)
    choice = {"stand_in": standin.spec, "k": k, "grid": scored, "chosen": chosen, "case": case, **prior}
    session.calibration_choices[key] = choice
    return choice


def _target_pool(tgt: TargetData, person: str, n_adapt: int, pool: int) -> tuple[Tensor, Tensor]:
    """The person's labelled pool: their adaptation images, then the oracle's extra images, ``pool`` in all."""
    images, gaze = load_examples(tgt.data, tgt.data.person_indices(person)[:n_adapt])
    need = pool - len(images)
    extra = tgt.extra.person_indices(person)[:need] if tgt.extra is not None and need > 0 else []
    if len(images) + len(extra) < pool:
        raise ValueError(
            f"{tgt.data.name}: person {person!r} has {len(images) + len(extra)} labelled images outside the scored "
            f"ones; the calibration pool needs {pool}"
        )
    if extra:
        more = load_examples(tgt.extra, extra)
        images, gaze = torch.cat([images, more[0]]), torch.cat([gaze, more[1]])
    return images, gaze


def _calibrated_model(
    session: Session, base: nn.Module, src: SourceContext, settings: dict[str, Any], record: dict[str, Any]
) -> nn.Module:
    """The model a row calibrates: the record's base, or for FAZE's rows a FAZE model of the same source and
    seed (the record then names it and counts its parameters)."""
    if "faze" not in settings:
        return base
    faze = settings["faze"]
    model = session.faze_models(src, faze["train"], faze["meta"])[faze["model"]]
    record["base"] = f"FAZE ({'meta-learned' if faze['model'] == 'meta' else 'plain'} gaze MLP)"
    record["inference_params"] = record["compact_merge_params"] = sum(p.numel() for p in model.parameters())
    return model


def run_user_calibration(
    session: Session,
    base: nn.Module,
    src: SourceContext,
    tgt: TargetData,
    plan: RecordPlan,
    record: dict[str, Any],
) -> dict[str, GazeError]:
    """A user-calibration row: the recipe chosen on the stand-in, then every target person calibrated ``draws``
    times at the row's ``k`` and scored; the record gets the recipe, the choice, each person's error per draw
    and before calibration, and the costs (seconds per calibration, the bytes of one person's file, the
    correction's numbers)."""
    settings = plan.variant.calibration
    assert settings is not None
    base = _calibrated_model(session, base, src, settings, record)
    k, draw, n_adapt = settings["k"], settings["draw"], session.config.personalize.n_adapt
    if k > settings["pool"]:
        raise ValueError(f"{plan.id}: k = {k} labelled images cannot come from a pool of {settings['pool']}")
    choice = choose_recipe(session, base, plan, settings)
    config = _config(settings, choice["chosen"], k, draw)
    errors: dict[str, GazeError] = {}
    per_draw: dict[str, list[float]] = {}
    uncalibrated: dict[str, float] = {}  # the model before calibration, on the same images (k = 0)
    seconds: list[float] = []
    cpu0 = time.process_time()
    persons = tgt.data.persons()
    for p in tqdm(persons, desc=f"{plan.variant.label} {tgt.data.name}", disable=not session.progress, leave=False):
        scored = load_examples(tgt.data, eval_indices(tgt.data, p, n_adapt))
        person = _person(base, _target_pool(tgt, p, n_adapt, settings["pool"]), scored, config.method in CACHED_PART)
        if config.method in CACHED_PART:
            with torch.no_grad():
                before = base.get_submodule(person.head)(person.features)
            uncalibrated[p] = GazeError.of(before.cpu(), person.scored_gaze.cpu()).angular
        try:
            draws, secs = person_draw_errors(base, p, person, config, settings["draws"])
        except _FAILURES as e:  # recorded, as a personalization's failure is; the person has no error
            record["failed"][p] = f"{type(e).__name__}: {e}"
            continue
        errors[p], per_draw[p] = _mean(draws), [e.angular for e in draws]
        seconds += secs
    if not errors:
        raise ValueError(f"{plan.id}: no person could be calibrated ({'; '.join(record['failed'].values())})")
    record.update(_costs(base, tgt, next(iter(errors)), n_adapt, config))
    trained = {"last-layer": config.steps, "adapter": config.steps, "faze": config.faze_steps}
    record["steps"] = trained.get(config.method)  # None: a closed form
    record["seconds_per_user"] = statistics.fmean(seconds)
    record["cpu_seconds_per_user"] = (time.process_time() - cpu0) / (len(errors) * settings["draws"])
    record["labelled_images_per_person"] = k
    recipe = {f: v for f, v in dataclasses.asdict(config).items() if f not in ("seed",)}
    record["calibration"] = {
        "recipe": recipe,
        "draws": settings["draws"],
        "choice": choice,
        "per_person_draws": per_draw,
    }
    if uncalibrated:
        record["calibration"]["uncalibrated_per_person"] = uncalibrated
        record["calibration"]["uncalibrated_deg"] = statistics.fmean(uncalibrated.values())
    return errors


def _costs(base: nn.Module, tgt: TargetData, person: str, n_adapt: int, config: CalibrateConfig) -> dict[str, Any]:
    """What one calibrated user costs: the correction's numbers and the bytes of its file (one person's, as
    ``alfa calibrate`` writes it), and that it merges into the head in place."""
    images, gaze = _target_pool(tgt, person, n_adapt, config.pool)
    at = draw_positions(gaze, config.pool, config.k, config.draw, 0, person)
    with _init_rng(0, person, next(base.parameters()).device):
        calibrate_person(base, images[at], gaze[at], dataclasses.replace(config, seed=0), unlabelled=images)
    try:
        numbers = sum(t.numel() for t in adapter_parameters(base).values())
        with tempfile.TemporaryDirectory() as folder:
            size = save_adapter(base, Path(folder) / "user.safetensors").stat().st_size
    finally:
        detach(base)
    merge = "in place" if config.method in CACHED_PART else f"as {config.adapter_method}'s own rows merge"
    return {"trainable_params": numbers, "adapter_bytes": size, "merge": merge}
