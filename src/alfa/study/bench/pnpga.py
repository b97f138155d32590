"""PnP-GA's record in the benchmark (kind ``"pnpga"``, an opt-in row: ``alfa bench --methods pnpga``): its
ensemble per (source, seed), each target person adapted from their unlabelled adaptation images, and two
protocols scored from the same adapted models.

* **The ensemble.** ``K`` members are the snapshots of the last ``K`` epochs of one source pre-training
  (:func:`alfa.gaze.pnpga.train_snapshot_members`), as the authors' members are epoch snapshots of their source
  trainings. That training is the record's own source model's pre-training: kept while the source model
  trains where a piece builds it with PnP-GA records to make (:meth:`Session.build`'s ``pnpga_members``), else
  run again (same seed, recipe and data; the cache keeps only its last epoch). Either way its last snapshot
  *is* the record's dense source model, and no two seeds share a member. **K = 10**, the paper's, at the
  standard preset (12 epochs: snapshots of epochs 3–12): snapshots cost at most one extra pre-training per
  (source, seed) whatever ``K`` is, where ``K`` separate
  source trainings would cost ``K − 1`` (each as long as the source's own pre-training, which the results'
  ``sources`` record), so the paper's size fits our budget; adapting costs ``K`` students and ``K`` teachers
  per person (the record's ``seconds_per_user``). A preset with fewer epochs has as many members as epochs
  (the smoke preset: 2). Below five members the outlier term cannot flag any member at the start (the largest
  z-score among ``K`` values is ``(K − 1)/√K``, under 1.645 for ``K ≤ 4``); it can once students and
  teachers drift apart.
* **Per person (our protocol, the record's ``per_person``).** Each person's ensemble starts from the source
  members, adapts on that person's first ``n_adapt`` images (the images every row adapts on, not the paper's
  10, so that every row is scored on the same images) and is scored on that person's other images with one
  adapted student, as PnP-GA predicts (1× inference cost): the one that started from the record's own source
  model (the last snapshot), where the authors' test script scores the third of their list (``net[2]``), an
  arbitrary snapshot; an early snapshot is a less trained model. The record keeps the third student's errors
  too (``pnpga.third_student``).
* **The domain protocol** (the record's ``domain_protocol``, the authors' own): the same adapted predictor
  scored on the scored images of *every* target person; one value per adapted person, their mean the row.
  :data:`PUBLISHED` holds the authors' README numbers for the real pairs our worlds are named after.

The record also keeps, for the report's sentences, the error of the adapted students' mean, of the unadapted
predicting member and of the unadapted members' mean (``pnpga``), and PnP-GA's cost per person
(:func:`alfa.gaze.pnpga.adaptation_cost`: time, parameter memory, what must ship to the device).
"""

from __future__ import annotations

import statistics
import time
from typing import Any

import torch
from torch import nn
from tqdm.auto import tqdm

from alfa.checkpoint import read_checkpoint
from alfa.gaze.evaluate import (
    GazeError,
    eval_indices,
    load_examples,
    load_images,
    person_errors,
    person_gaze_errors,
    predict_images,
)
from alfa.gaze.flip import FlipParts, person_flip_parts
from alfa.gaze.geometry import angular_error
from alfa.gaze.personalize import person_seed
from alfa.gaze.pnpga import (
    PUBLISHED,
    AdaptedEnsemble,
    adapt_person,
    adaptation_cost,
    source_examples,
    train_snapshot_members,
)
from alfa.gaze.train import STATE_FILE

from .measure import _latency_ms, _proc_status_mib, _reset_peak_memory
from .plan import RecordPlan
from .session import Session, SourceContext, TargetData, building

__all__ = ["AUTHORS_PREDICTOR", "PUBLISHED", "ensemble_members", "run_pnpga"]

AUTHORS_PREDICTOR = 2
"""The student the authors' test script scores (``net[2]``, the third of their list)."""


def ensemble_members(session: Session, src: SourceContext, members: int) -> list[nn.Module]:
    """The ``members`` snapshots of ``src``'s pre-training (kept while the source model trained, or that training
    run again once per (source, seed); cached next to its source model; resumable)."""
    if src.pnpga_members is None or len(src.pnpga_members) != members:
        folder = session.pnpga_folder(src, members)
        with building(folder):
            src.pnpga_members = train_snapshot_members(
                src.spec.model,
                src.spec.seed,
                src.data,
                src.val,
                src.spec.pretrain,
                folder,
                members,
                progress=session.progress,
                device=session.device,
            )
        header = read_checkpoint(folder / "pretrain" / "model.safetensors", header_only=True)[1].get("extra", {})
        history = header.get("history", [])
        src.info["pnpga_members"] = {
            "folder": str(folder),
            "members": members,
            "train_seconds": sum(float(e.get("seconds", 0.0)) for e in history),
            # kept while the source model itself trained (no training of their own: train_seconds is the
            # source's), or trained apart (a training state lies beside the final model)
            "kept_by_the_source_training": not (folder / "pretrain" / STATE_FILE).is_file(),
            "val_error_per_epoch": [e.get("val_error") for e in history],  # the source's held-out persons
        }
    return src.pnpga_members


def _whole_target_error(model: nn.Module, images: torch.Tensor, labels: torch.Tensor) -> float:
    return float(angular_error(predict_images(model, images), labels).mean())


def _mean_of(errors: dict[str, float]) -> dict[str, Any]:
    return {"error_deg": statistics.fmean(errors.values()) if errors else None, "per_person": errors}


def run_pnpga(
    session: Session,
    base: nn.Module,
    src: SourceContext,
    tgt: TargetData,
    plan: RecordPlan,
    record: dict[str, Any],
    flips: dict[str, FlipParts],
) -> dict[str, GazeError]:
    """PnP-GA on every target person of ``tgt``: adapt, score per person (returned, with what a flip sees of
    it into ``flips``) and on the whole target (``record["domain_protocol"]``), and fill the record's costs."""
    config = plan.variant.pnpga
    assert config is not None
    config.validate()
    n_adapt = session.config.personalize.n_adapt
    members = ensemble_members(session, src, config.members)
    source = source_examples(src.data, config.source_images)
    data, persons = tgt.data, tgt.data.persons()
    everyone, everyone_labels = load_examples(data, [i for p in persons for i in eval_indices(data, p, n_adapt)])
    errors: dict[str, GazeError] = {}
    adapted_mean: dict[str, float] = {}
    domain: dict[str, float] = {}
    third: dict[str, float] = {}  # the student the authors' test script scores, where it is not the predictor
    seconds, cpu, losses = [], 0.0, []
    before_mib = _reset_peak_memory()
    for person in tqdm(persons, desc=f"pnpga {data.name}", disable=not session.progress, leave=False):
        images = load_images(data, data.person_indices(person)[:n_adapt])
        cpu0 = time.process_time()
        ensemble = adapt_person(members, images, source, config, person_seed(plan.seed, person, "pnpga"))
        cpu += time.process_time() - cpu0
        seconds.append(ensemble.seconds)
        losses.append((ensemble.losses[0]["loss"], ensemble.losses[-1]["loss"]))
        predictor = ensemble.predictor
        flips.update(person_flip_parts(predictor, data, [person], n_adapt))
        errors.update(person_gaze_errors(predictor, data, [person], n_adapt))
        mean = AdaptedEnsemble(list(ensemble.students), list(ensemble.teachers), None)
        adapted_mean.update(person_errors(mean, data, [person], n_adapt))
        domain[person] = _whole_target_error(predictor, everyone, everyone_labels)
        if config.members > AUTHORS_PREDICTOR != config.predict_with:
            third.update(person_errors(ensemble.students[AUTHORS_PREDICTOR], data, [person], n_adapt))
    peak = _proc_status_mib("VmHWM")
    unadapted = AdaptedEnsemble(list(members), list(members), config.predict_with)
    unadapted_mean = AdaptedEnsemble(list(members), list(members), None)
    cost = adaptation_cost(members, source, config, statistics.fmean(seconds) if seconds else 0.0)
    record.update(
        steps=len(ensemble.losses) if persons else None,
        trainable_params=config.members * cost.params_per_member,
        inference_params=cost.inference_params,
        compact_merge_params=cost.inference_params,
        merge="a whole model per person",
        adapter_bytes=cost.inference_params * 4,  # what is kept per person: the predicting model(s), float32
        compact_bytes=cost.inference_params * 4,
        seconds_per_user=cost.seconds if seconds else None,
        cpu_seconds_per_user=cpu / len(persons) if persons else None,
        method_config=config.to_dict(),
        loss={"first": statistics.fmean(a for a, _ in losses), "final": statistics.fmean(b for _, b in losses)}
        if losses
        else None,
    )
    if before_mib is not None and peak is not None:
        record["peak_rss_mib"], record["peak_rss_increase_mib"] = peak, max(0.0, peak - before_mib)
    if persons:
        images = session.latency_images(tgt)
        record["latency_ms"], record["base_latency_ms"] = _latency_ms(
            [unadapted.predictor, base], images, session.config.latency_repeats
        )
    record["pnpga"] = {
        "members": config.members,
        "member_epochs": list(range(src.spec.pretrain.epochs - config.members + 1, src.spec.pretrain.epochs + 1)),
        "predict_with": config.predict_with,
        "adaptation_images": n_adapt,
        "adapted_mean": _mean_of(adapted_mean),
        "unadapted": _mean_of(person_errors(unadapted, data, persons, n_adapt)),
        "unadapted_mean": _mean_of(person_errors(unadapted_mean, data, persons, n_adapt)),
        "third_student": None
        if not third
        else {
            "adapted": _mean_of(third),
            "unadapted": _mean_of(person_errors(members[AUTHORS_PREDICTOR], data, persons, n_adapt)),
        },
        "member_training": src.info.get("pnpga_members"),
        "cost": cost.to_dict(),
    }
    record["domain_protocol"] = {
        **_mean_of(domain),
        "scored_images": len(everyone),
        "unadapted_deg": _whole_target_error(unadapted, everyone, everyone_labels),
    }
    return errors
