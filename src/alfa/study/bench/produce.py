"""Making one record of the benchmark (:func:`produce_record`): per (method, pair, seed) each target person
is personalized with the shared recipe (:mod:`alfa.gaze.personalize`), scored on the images not used for
adaptation (spec §7), and the costs are measured. The rows without adaptation, the oracle (the headroom,
not a competitor) and the recipe selection on a source's stand-in are records of their own kinds.

Nothing is chosen on target labels: the target labels are read only by the evaluation (and by the oracle).
"""

from __future__ import annotations

import dataclasses
import datetime
import itertools
import re
import shutil
import statistics
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn
from tqdm.auto import tqdm

from alfa.adapters import FullFinetuneConfig, attach, detach, load_adapter, param_groups
from alfa.fileio import safe_filename
from alfa.gaze.data.base import GazeDataset
from alfa.gaze.distill import DISTILL_OBJECTIVE, inference_cost
from alfa.gaze.evaluate import (
    GazeError,
    adapter_filename,
    eval_indices,
    load_examples,
    person_errors,
    person_gaze_errors,
    predict_images,
)
from alfa.gaze.flip import FlipParts, person_flip_parts
from alfa.gaze.geometry import angular_error
from alfa.gaze.losses import finite_or_raise, supervised_l1_loss
from alfa.gaze.personalize import person_seed, personalize_and_score, personalize_dataset
from alfa.gaze.recipes import (
    PAPER_RECIPE,
    RECIPE_GRID,
    Recipe,
    reference_protocol_error,
    select_helping,
    select_recipe,
    training_runs,
)
from alfa.gaze.tpgaze import personalize_tpgaze_dataset, tpgaze_recipe
from alfa.gaze.tta import tta_kind
from alfa.layers import is_factorized

from .config import OracleConfig
from .measure import (
    _latency_ms,
    _param_count,
    _proc_status_mib,
    _reset_peak_memory,
    adapter_costs,
    constant_prediction_error,
)
from .methods import TTA_OF_ROW, TTA_ROWS
from .plan import RecordPlan
from .pnpga import run_pnpga
from .record import Record
from .session import Session, SourceContext, TargetData
from .user_calibration import run_user_calibration

__all__ = ["KINDS", "OPT_IN_KINDS", "PERSONALIZED", "RUN_KINDS", "TTA_ROW_KINDS", "UNADAPTED", "produce_record"]

# The kinds of a table row (a recipe-selection record is of kind "selection", never a row); the unadapted
# ones score a base as it is. The opt-in kinds are those of rows no claimed preset plans (methods.OPT_IN_METHODS
# and the user-calibration rows, methods.calibration_rows; the smoke check runs them once); the TTA kinds those of
# issue 26's label-free TTA rows, which of the claimed presets only the standard one plans (methods.TTA_ROWS).
KINDS = ("source-only", "flip-tta", "in-domain", "target-trained", "oracle", "adapter", "tpgaze", "ruda")
OPT_IN_KINDS = ("pnpga", "calibration")
TTA_ROW_KINDS = tuple(TTA_ROWS)
UNADAPTED = ("source-only", "flip-tta", *TTA_ROW_KINDS, "in-domain", "target-trained")
PERSONALIZED = ("adapter", "tpgaze", "ruda")  # personalized person by person (_run_personalization)
# Every kind produce_record has a branch for: a recipe selection, then each branch's kinds in its order.
RUN_KINDS = ("selection", *UNADAPTED, "oracle", "pnpga", "calibration", *PERSONALIZED)


def produce_record(session: Session, plan: RecordPlan) -> Record:
    """The record of ``plan``: build (or reuse) its base in ``session``, adapt and score it, measure the costs.
    The runners below fill its JSON form, which :meth:`Record.from_dict` then checks."""
    v = plan.variant
    if v.kind not in RUN_KINDS:  # before anything is built: no kind is run as another by default
        raise _unknown_kind(plan)
    src = session.build(session.model_key(plan), plan.seed)
    base = session.base(src, v.base)
    t0, cpu0 = time.time(), time.process_time()
    record = _new_record(plan, session.record_hash(plan), base)
    if v.kind == "selection":
        _run_selection(session, base, plan, record)
        record["wall_s"], record["cpu_s"] = time.time() - t0, time.process_time() - cpu0
        record["finished"] = datetime.datetime.now().isoformat(timespec="seconds")
        return Record.from_dict(record)
    if v.selected:  # the recipe chosen on the stand-in, read from its selection record
        chosen = session.selected_recipe(plan)
        record["selected_recipe"] = {"label": chosen.label, **dataclasses.asdict(chosen)}
        # the chosen settings on top of the row's own changes (its objective, for a row such as alfa[loss=roll])
        plan = dataclasses.replace(plan, variant=dataclasses.replace(v, recipe={**v.recipe, **chosen.changes()}))
    if v.shipped is not None:  # the recipe alfa personalize ships for the method, which the variant applies
        record["default_recipe"] = {"label": v.shipped.label, **dataclasses.asdict(v.shipped)}
    tgt = session.target(plan.target, plan.seed)
    flips: dict[str, FlipParts] = {}
    if v.kind in UNADAPTED:
        errors = _score_unadapted(session, base, src, tgt, record, flips)
    elif v.kind == "oracle":
        errors = _run_oracle(session, base, tgt, plan, record, flips)
    elif v.kind == "pnpga":
        errors = run_pnpga(session, base, src, tgt, plan, record, flips)
    elif v.kind == "calibration":
        errors = run_user_calibration(session, base, src, tgt, plan, record)
    elif v.kind in PERSONALIZED:
        errors = _run_personalization(session, base, src, tgt, plan, record, flips)
    else:  # a kind of RUN_KINDS that this chain has no branch for
        raise _unknown_kind(plan)
    _add_errors(record, errors, flips)
    record["wall_s"] = time.time() - t0
    record["cpu_s"] = time.process_time() - cpu0
    record["finished"] = datetime.datetime.now().isoformat(timespec="seconds")
    return Record.from_dict(record)


def _unknown_kind(plan: RecordPlan) -> ValueError:
    return ValueError(
        f"record {plan.id}: unknown record kind {plan.variant.kind!r} (the kinds a record is made for: "
        f"{', '.join(RUN_KINDS)})"
    )


# ----------------------------------------------------------------------------- the parts of a record


def _new_record(plan: RecordPlan, config_hash: str, base: nn.Module) -> dict[str, Any]:
    """The fields every record has, at their values for no adaptation (the runners below fill in theirs)."""
    v = plan.variant
    return {
        "id": plan.id,
        "config_hash": config_hash,
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


def _score(model: nn.Module, data: GazeDataset, persons: list[str], n_adapt: int, flips: dict[str, FlipParts]):
    """Per-person errors of ``model`` on the scored images, and (into ``flips``) what a flip sees of them."""
    flips.update(person_flip_parts(model, data, persons, n_adapt))
    return person_gaze_errors(model, data, persons, n_adapt)


def _add_errors(record: dict[str, Any], errors: dict[str, GazeError], flips: dict[str, FlipParts]) -> None:
    """The scored part of a record: per-person errors (their yaw/pitch parts, what a flip sees of them:
    :mod:`alfa.gaze.flip`) and their means; ``flip_tta_error_deg`` is flip-TTA on top of the record's model."""
    record["per_person_flip"] = {p: flips[p].to_dict() for p in errors if p in flips}
    if record["per_person_flip"]:
        parts = list(record["per_person_flip"].values())
        record["flip"] = {k: statistics.fmean(x[k] for x in parts) for k in parts[0]}
        record["flip_tta_error_deg"] = record["flip"]["tta_error"]
    angular = {p: e.angular for p, e in errors.items()}
    record["per_person"] = angular
    record["per_person_parts"] = {p: e.parts() for p, e in errors.items()}
    record["persons"] = len(angular)
    record["error_deg"] = sum(angular.values()) / len(angular) if angular else float("nan")
    record["std_over_persons"] = statistics.pstdev(angular.values()) if len(angular) > 1 else 0.0


def _score_unadapted(
    session: Session,
    base: nn.Module,
    src: SourceContext,
    tgt: TargetData,
    record: dict[str, Any],
    flips: dict[str, FlipParts],
) -> dict[str, GazeError]:
    """The rows without adaptation: in-domain (on held-out source persons), target-trained, source-only and the
    TTA rows (the base wrapped in a kind of :mod:`alfa.gaze.tta`: flip-TTA, roll-TTA, flip × roll; on the
    target, each storing its kind and forward passes per image), each with the error of a constant prediction on
    its set; and source-only's and the TTA rows' latency."""
    n_adapt = session.config.personalize.n_adapt
    kind = record["kind"]
    data = src.val if kind == "in-domain" else tgt.data
    tta = tta_kind(TTA_OF_ROW[kind]) if kind in TTA_OF_ROW else None
    model = tta.wrap(base) if tta is not None else base
    if tta is not None:
        record["tta"] = {"kind": tta.name, "passes": tta.passes}
    errors = _score(model, data, data.persons(), n_adapt, flips)
    record["constant_prediction_deg"] = constant_prediction_error(data, data.persons(), n_adapt)
    if kind == "source-only" or tta is not None:
        images = session.latency_images(tgt)
        record["latency_ms"], record["base_latency_ms"] = _latency_ms(
            [model, base], images, session.config.latency_repeats
        )
    return errors


def _run_personalization(
    session: Session,
    base: nn.Module,
    src: SourceContext,
    tgt: TargetData,
    plan: RecordPlan,
    record: dict[str, Any],
    flips: dict[str, FlipParts],
) -> dict[str, GazeError]:
    """An adapter method (or TPGaze) with the shared recipe on every target person: personalize, score each
    person's saved adapter, measure the costs of one of them."""
    c, v = session.config, plan.variant
    folder = session.adapter_dir(plan)
    run, recipe, cpu, scored = _personalize_persons(session, base, src, tgt, plan, folder, record, flips)
    ok = [p for p, o in run.persons.items() if o.status in ("ok", "skipped")]
    fresh = [p for p, o in run.persons.items() if o.status == "ok"]
    _add_run_summary(record, run, recipe, cpu, ok, fresh)
    if scored is None:  # TPGaze's own personalization: its persons are scored here
        scored = {}
        for person in ok:
            load_adapter(base, folder / adapter_filename(person))
            try:
                scored.update(_score(base, tgt.data, [person], c.personalize.n_adapt, flips))
            finally:
                detach(base)
    errors = {p: scored[p] for p in ok if p in scored}  # an adapter left from an earlier run is not this record's
    if ok:
        images = session.latency_images(tgt)
        record.update(adapter_costs(base, folder / adapter_filename(ok[0]), images, c.latency_repeats))
    if v.kind == "tpgaze":
        record["meta_only"] = _meta_only_errors(session, base, src, tgt)
    if getattr(recipe, "loss", None) == DISTILL_OBJECTIVE and ok:  # any row trained with it, selected ones too
        record["distill"] = _distill_summary(base, tgt.data, ok, c.personalize.n_adapt)
    if session.shows_updates(plan):
        session.figures.save_updates(base, src, tgt, plan, folder, record["config_hash"])
    if not session.keeps_adapters(plan):
        shutil.rmtree(folder, ignore_errors=True)
    return errors


def _distill_summary(base: nn.Module, data: GazeDataset, persons: list[str], n_adapt: int) -> dict[str, Any]:
    """A TTA-distillation row's inference cost (one forward pass against the teacher TTA's ``K``) and its teacher,
    the base with that TTA, scored on the same persons' images: the error the distilled model approaches."""
    cost = inference_cost()
    errors = person_gaze_errors(tta_kind(cost["teacher"]).wrap(base), data, persons, n_adapt)
    per_person = {p: e.angular for p, e in errors.items()}
    return {**cost, "teacher_per_person": per_person, "teacher_error_deg": statistics.fmean(per_person.values())}


def _step_errors(data: GazeDataset, indices: dict[str, list[int]], at: set[int] | None = None):
    """``track`` for :func:`personalize_dataset`: per person, a function giving the model's mean angular error
    on that person's images ``indices[person]`` (with their labels), measured at the calls numbered in ``at``
    (0: before the first step; every call when ``at`` is None) and NaN at the others."""

    def for_person(person: str):
        images, labels = load_examples(data, indices[person])
        calls = itertools.count()

        def measure(model: nn.Module) -> float:
            if at is not None and next(calls) not in at:
                return float("nan")
            return float(angular_error(predict_images(model, images), labels).mean())

        return measure

    return for_person


class _PersonScores:
    """The benchmark's measurement of each adapted person in :func:`personalize_and_score`: their
    :class:`GazeError` and (into ``flips``) what a flip sees of them. It notes the process time and the peak
    memory when the first person is scored, where personalization has ended, so that the record's
    per-user costs are those of personalizing alone."""

    def __init__(self, flips: dict[str, FlipParts]) -> None:
        self.flips = flips
        self.errors: dict[str, GazeError] = {}
        self.personalized_at: tuple[float, float | None] | None = None  # (process time, peak MiB)

    def __call__(self, model: nn.Module, data: GazeDataset, persons: list[str], n_adapt: int) -> dict[str, GazeError]:
        if self.personalized_at is None:
            self.personalized_at = (time.process_time(), _proc_status_mib("VmHWM"))
        errors = _score(model, data, persons, n_adapt, self.flips)
        self.errors.update(errors)
        return errors


def _personalize_persons(
    session: Session,
    base: nn.Module,
    src: SourceContext,
    tgt: TargetData,
    plan: RecordPlan,
    folder: Path,
    record: dict[str, Any],
    flips: dict[str, FlipParts],
) -> tuple[Any, Any, float, dict[str, GazeError] | None]:
    """Personalize every target person into ``folder``; the peak memory goes to ``record``. An adapter
    method's persons are scored by the shared :func:`personalize_and_score` too. Returns the run's summary,
    the recipe it used, the CPU seconds personalizing took, and the scored persons' errors (``None`` for
    TPGaze, whose persons are scored afterwards)."""
    v = plan.variant
    recipe = session.config.recipe(plan.seed, **v.recipe)
    persons = tgt.data.persons()
    # The reference protocol, replayed: every step scored with labels on all of a person's images (the
    # adaptation images too), as the reference code does; reported as test-label selection, never a result.
    replay = _step_errors(tgt.data, {p: tgt.data.person_indices(p) for p in persons})
    before_mib = _reset_peak_memory()
    cpu0 = time.process_time()
    scores: _PersonScores | None = None
    if v.kind == "tpgaze":
        prompts = session.tpgaze_prompts(src)
        before_mib = _reset_peak_memory()  # meta-training is a per-source cost, not a per-user one
        cpu0 = time.process_time()
        recipe = tpgaze_recipe(recipe)
        run = personalize_tpgaze_dataset(
            base, tgt.data, prompts, folder, recipe, persons=persons, progress=session.progress, track=replay
        )
    else:
        adapter = v.adapter
        assert adapter is not None
        if v.same_layers_as_truncated:
            names = [n for n, m in src.models.recovered.named_modules() if is_factorized(m)]
            adapter = dataclasses.replace(adapter, target="^(" + "|".join(re.escape(n) for n in names) + ")$")
        scores = _PersonScores(flips)
        run = personalize_and_score(
            base,
            tgt.data,
            adapter,
            recipe,
            folder,
            n_adapt=session.config.personalize.n_adapt,
            persons=persons,
            after=v.label,
            track=replay,
            score=scores,
            progress=session.progress,
        ).run
    if scores is not None and scores.personalized_at is not None:
        cpu_end, peak = scores.personalized_at
    else:
        cpu_end, peak = time.process_time(), _proc_status_mib("VmHWM")
    cpu = cpu_end - cpu0
    if before_mib is not None and peak is not None:
        record["peak_rss_mib"] = peak
        record["peak_rss_increase_mib"] = max(0.0, peak - before_mib)
    return run, recipe, cpu, None if scores is None else scores.errors


def _add_run_summary(
    record: dict[str, Any], run: Any, recipe: Any, cpu: float, ok: list[str], fresh: list[str]
) -> None:
    """What the personalization run reports: failures, steps, configs, time per user, first/final loss."""
    record["failed"] = run.failed
    record["steps"] = recipe.steps
    record["method_config"] = run.method_config
    record["recipe"] = {k: v for k, v in run.config.items() if k != "augment"}
    record["seconds_per_user"] = statistics.mean(run.persons[p].seconds for p in ok) if ok else None
    record["cpu_seconds_per_user"] = cpu / len(fresh) if fresh else None
    steps = {p: run.persons[p].tracked for p in ok if run.persons[p].tracked}
    if steps:
        record["per_person_steps"] = steps
        record["reference_protocol_deg"] = reference_protocol_error(steps)
    losses = [run.persons[p] for p in ok if run.persons[p].losses]
    if losses:
        record["loss"] = {
            "first": statistics.mean(o.losses[0] for o in losses),
            "final": statistics.mean(o.final_loss for o in losses),
        }


def _run_selection(session: Session, base: nn.Module, plan: RecordPlan, record: dict[str, Any]) -> None:
    """The declared recipe grid (docs/flip-premise.md §4) for one method on its source's stand-in: every run
    of :func:`~alfa.gaze.recipes.training_runs`, each person scored before the first step (the unadapted
    model) and after the step counts the grid asks for; the configuration's rule picks the recipe. Reads the
    stand-in's labels and nothing of any target."""
    c, v = session.config, plan.variant
    assert v.adapter is not None
    standin = session.stand_in(plan.source)
    n_adapt = c.personalize.n_adapt
    persons = standin.data.persons()
    scored = {p: eval_indices(standin.data, p, n_adapt) for p in persons}
    folder = session.adapter_dir(plan)
    errors: dict[Recipe, dict[str, float]] = {}
    failed: dict[str, str] = {}
    source_only: dict[str, float] = {}
    for run_recipe, evals in training_runs(RECIPE_GRID).items():
        recipe = run_recipe.apply(c.recipe(plan.seed, **v.recipe))  # v.recipe: the objective, if not the flip
        track = _step_errors(standin.data, scored, at={0, *evals})
        run = personalize_dataset(
            base,
            standin.data,
            v.adapter,
            recipe,
            folder / safe_filename(run_recipe.label),
            persons=persons,
            resume=False,
            progress=False,
            track=track,
        )
        ok = {p: o for p, o in run.persons.items() if o.status == "ok"}
        failed.update({f"{run_recipe.label} {p}": o.error or "" for p, o in run.persons.items() if p not in ok})
        for k in evals:
            # a recipe that fails on a person is out of the running (its mean is not finite)
            per_person = {p: o.tracked[k] for p, o in ok.items()}
            if len(ok) < len(persons):
                per_person = {p: per_person.get(p, float("inf")) for p in persons}
            errors[dataclasses.replace(run_recipe, steps=k)] = per_person
        for p, o in ok.items():  # step 0 is the unadapted model (every adapter starts as the identity)
            source_only.setdefault(p, o.tracked[0])
    shutil.rmtree(folder, ignore_errors=True)
    means = {r: statistics.fmean(e.values()) for r, e in errors.items()}
    helping = None
    if c.selection_rule == "helps-under-bound":
        # a person whose every run failed has no unadapted error either: the rule refuses to choose
        helping = select_helping(errors, {p: source_only.get(p, float("inf")) for p in persons})
        chosen = helping.recipe
    else:
        chosen = select_recipe(means)
    record.update(
        {
            "stand_in": standin.spec,
            "persons": len(persons),
            "per_person": errors[chosen],
            "error_deg": means[chosen],
            "source_only_deg": statistics.fmean(source_only.values()) if source_only else None,
            "source_only_per_person": source_only,
            "selected": dataclasses.asdict(chosen),
            "selected_label": chosen.label,
            "paper_recipe_deg": means.get(PAPER_RECIPE),
            "grid": [
                {"recipe": dataclasses.asdict(r), "label": r.label, "error_deg": means[r], "per_person": e}
                for r, e in errors.items()
            ],
            "failed": failed,
        }
    )
    if helping is not None:  # the second rule says which case applied and what each recipe's bound was
        record["selection_rule"], record["selection_case"] = c.selection_rule, helping.case
        for entry, r in zip(record["grid"], errors):
            entry["mean_difference_deg"] = helping.mean_difference.get(r)
            entry["upper_deg"] = helping.upper.get(r)


def _meta_only_errors(session: Session, base: nn.Module, src: SourceContext, tgt: TargetData) -> dict[str, Any]:
    """TPGaze's meta-trained prompts before any personalization step, on the same scored images."""
    persons = tgt.data.persons()
    load_adapter(base, session.tpgaze_prompts(src))
    try:
        meta_only = person_errors(base, tgt.data, persons, session.config.personalize.n_adapt)
    finally:
        detach(base)
    return {"error_deg": sum(meta_only.values()) / len(meta_only), "per_person": meta_only}


def _run_oracle(
    session: Session,
    base: nn.Module,
    tgt: TargetData,
    plan: RecordPlan,
    record: dict[str, Any],
    flips: dict[str, FlipParts],
) -> dict[str, GazeError]:
    """Per person: supervised fine-tuning of every parameter on labelled images that are never scored."""
    c, oc = session.config, session.config.oracle
    n_adapt = c.personalize.n_adapt
    errors: dict[str, GazeError] = {}
    seconds = []
    before_mib = _reset_peak_memory()
    cpu0 = time.process_time()
    persons = tgt.data.persons()
    for person in tqdm(persons, desc=f"oracle {tgt.data.name}", disable=not session.progress, leave=False):
        t0 = time.time()
        images, gaze = _oracle_examples(tgt, person, n_adapt, oc)
        attach(base, FullFinetuneConfig())
        try:
            _fine_tune(base, images, gaze, oc, torch.Generator().manual_seed(person_seed(plan.seed, person, "oracle")))
            seconds.append(time.time() - t0)
            errors.update(_score(base, tgt.data, [person], n_adapt, flips))
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


def _oracle_examples(tgt: TargetData, person: str, n_adapt: int, oc: OracleConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """The oracle's labelled images of ``person``: the adaptation images and the extra ones."""
    images, gaze = load_examples(tgt.data, tgt.data.person_indices(person)[:n_adapt])
    if tgt.extra is not None and oc.extra_images > 0:
        more = load_examples(tgt.extra, tgt.extra.person_indices(person))
        images, gaze = torch.cat([images, more[0]]), torch.cat([gaze, more[1]])
    return images, gaze


def _fine_tune(
    model: nn.Module, images: torch.Tensor, gaze: torch.Tensor, oc: OracleConfig, generator: torch.Generator
) -> None:
    """The oracle's supervised fine-tuning of ``model`` (its full fine-tune adapter attached)."""
    model.eval()
    device = next(model.parameters()).device
    images, gaze = images.to(device), gaze.to(device)
    groups = param_groups(model, oc.lr, lr_scale=oc.lr_scale, weight_decay=oc.weight_decay)
    optimizer = torch.optim.AdamW(groups, lr=oc.lr, weight_decay=oc.weight_decay)
    for _ in range(oc.steps):
        idx = torch.randperm(images.shape[0], generator=generator)[: oc.batch_size]
        loss = finite_or_raise(supervised_l1_loss(model(images[idx]), gaze[idx]), "oracle")
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
