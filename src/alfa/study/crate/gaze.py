"""A small real use of CRATE: a tiny CRATE and a tiny ViT trained for gaze on the synthetic source.

    source data -> train CRATE and ViT (same width, depth, heads) -> in-domain and cross-domain errors
    -> per-layer probes (coding rate; ISTA sparsity for CRATE) on source and target images
    -> CRATE: SVD truncation + short recovery -> per-person Alfa personalization on each target
    -> results.json, a probe figure, a table (and a generated markdown page)

Everything reuses the gaze stack: :func:`alfa.gaze.train.train_source` (Adam, L1 plus the flip-symmetry
term, constant learning rate), :func:`alfa.gaze.train.truncate_and_recover`,
:func:`alfa.gaze.personalize.personalize_and_score` (per target, as the demo and the benchmark personalize and
score: the first ``n_adapt`` images of a target person are the unlabeled adaptation images, the rest are
scored), and :func:`alfa.study.crate.probes.probe_model`. The two models are trained here rather than by
:func:`alfa.gaze.pipeline.build_source_model`: they take constructor arguments, both are probed dense before
CRATE alone is truncated, and ``recovery_epochs`` 0 truncates without recovery. A run resumes what an interrupted
one with the same settings left (each stage's own resume, which refuses another run's files; results and a figure
of another run are refused before anything runs); ``replace`` starts over.

Decisions the gaze stack leaves open for a transformer:

* Truncation acts on every ``nn.Linear`` where rank ``rank`` saves parameters: the patch embedding,
  each block's ``subspaces`` (``U``) and ``proj``. The 2-output head saves nothing and stays dense;
  the ISTA dictionary ``D`` is a raw parameter, so it is neither truncated nor adapted.
* Alfa is attached to every factorized layer (as on ResNet-18). The recipe's ×10 learning rate for
  ResNet-18's ``layer3``/``layer4`` (its later half) becomes ×10 for the later half of the blocks,
  ``blocks.{depth//2} … blocks.{depth-1}``; the patch embedding and the earlier blocks keep the base rate.
* Errors are per person, then the unweighted mean over persons (± the population standard deviation over
  persons). In-domain: every image of the held-out source persons (the ``val`` split). Cross-domain:
  each target person's images after the first ``n_adapt``. A constant prediction (the mean gaze of the
  source training labels) is reported alongside, as the floor any model must beat.

Nothing is chosen on target labels: every setting is in :class:`CrateGazeConfig`, fixed in advance,
and target labels are read only to score. ``seed`` sets the initial weights, the batch order and the
personalization (adapter init, augmentation draws); the data are the same for every seed
(``data_seed``).
"""

from __future__ import annotations

import copy
import dataclasses
import json
import os
import shutil
import time
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from alfa.adapters import adapter_parameters, attach, detach, load_adapter, merge
from alfa.fileio import safe_filename, settings_differences, write_json
from alfa.gaze.data.base import GazeDataset
from alfa.gaze.data.registry import open_dataset
from alfa.gaze.evaluate import (
    adapter_filename,
    eval_indices,
    load_examples,
    load_images,
    person_errors,
    predict_images,
)
from alfa.gaze.geometry import angular_error
from alfa.gaze.personalize import personalize_and_score
from alfa.gaze.train import TruncateConfig, train_source, truncate_and_recover
from alfa.locks import refuse_held_inside
from alfa.models import create_model
from alfa.summary import parameter_summary
from alfa.truncate import truncate

from ..plotted import plotted_path
from ..timing import cpu_name, torch_threads
from .gaze_config import LABELS, MODEL_NAMES, MODELS, CrateGazeConfig, late_blocks_pattern, quick_config
from .gaze_report import format_markdown, format_summary, plot_gaze_probes
from .probes import ProbeResult, probe_model

# The settings live in gaze_config and the tables, page and figure in gaze_report; they are
# re-exported here so alfa.study.crate.gaze stays the one module a caller imports.
__all__ = [
    "CrateGazeConfig",
    "quick_config",
    "late_blocks_pattern",
    "run_crate_gaze",
    "format_summary",
    "format_markdown",
    "plot_gaze_probes",
]

RESULTS_FILE = "results.json"
FIGURE_FILE = "probes.png"


# ----------------------------------------------------------------------------- helpers


def _summary(values: list[float]) -> dict[str, float]:
    """Mean, population std, min and max over persons (``nan`` for no value)."""
    if not values:
        return {"mean": float("nan"), "std": float("nan"), "min": float("nan"), "max": float("nan"), "persons": 0}
    t = torch.tensor(values, dtype=torch.float64)
    return {
        "mean": float(t.mean()),
        "std": float(t.std(unbiased=False)) if len(values) > 1 else 0.0,
        "min": float(t.min()),
        "max": float(t.max()),
        "persons": len(values),
    }


def _errors_entry(per_person: dict[str, float]) -> dict[str, Any]:
    return {"per_person": per_person, **_summary(list(per_person.values()))}


def _constant_errors(mean_gaze: Tensor, dataset: GazeDataset, n_adapt: int) -> dict[str, float]:
    """Per-person error of always predicting ``mean_gaze`` (the source training labels' mean)."""
    out = {}
    for person in dataset.persons():
        _, gaze = load_examples(dataset, eval_indices(dataset, person, n_adapt))
        out[person] = float(angular_error(mean_gaze.double().expand_as(gaze), gaze.double()).mean())
    return out


def _probe_images(dataset: GazeDataset, per_person: int) -> tuple[Tensor, list[str]]:
    """The fixed probe batch: the first ``per_person`` images of every person (labels untouched), and each
    image's person."""
    chosen = [(i, str(p)) for p in dataset.persons() for i in dataset.person_indices(p)[:per_person]]
    return load_images(dataset, [i for i, _ in chosen], what="probe images"), [p for _, p in chosen]


def _per_person(values: Tensor, persons: list[str]) -> dict[str, list[float]]:
    """``values`` ``(images, layers)`` averaged over each person's images: the persons are the unit of the page's
    intervals (a person's images are not independent draws)."""
    return {p: values[[i for i, q in enumerate(persons) if q == p]].mean(0).tolist() for p in dict.fromkeys(persons)}


def _probe_entry(result: ProbeResult, persons: list[str]) -> dict[str, Any]:
    entry = result.to_dict()
    rc = result.layer_rate()
    entry["coding_rate_std"] = (rc.std(0) if result.num_images > 1 else torch.zeros(rc.shape[1])).tolist()
    entry["coding_rate_per_person"] = _per_person(rc, persons)
    if result.sparsity is not None:
        s = result.sparsity
        entry["nonzero_fraction_std"] = (s.std(0) if result.num_images > 1 else torch.zeros(s.shape[1])).tolist()
        entry["nonzero_fraction_per_person"] = _per_person(s, persons)
    return entry


def _relative_difference(a: Tensor, b: Tensor) -> tuple[float, float]:
    diff = float((a - b).abs().max())
    return diff, diff / max(float(a.abs().max()), 1e-12)


def _say(progress: bool, message: str) -> None:
    if progress:
        print(message, flush=True)


# ----------------------------------------------------------------------------- the run


def run_crate_gaze(
    config: CrateGazeConfig | None = None,
    out_dir: str | os.PathLike = "runs/crate-gaze",
    progress: bool = True,
    *,
    command: str | None = None,
    replace: bool = False,
) -> dict[str, Any]:
    """Run the whole comparison with ``config`` (default :class:`CrateGazeConfig`), write
    ``out_dir/results.json`` (atomically) and ``out_dir/probes.png``, and return the results.

    Checkpoints go to ``out_dir/crate``, ``out_dir/vit``, ``out_dir/crate-truncated`` and the per-person
    adapters to ``out_dir/adapters/<target>``. What an interrupted run with the same settings left there is resumed
    (the results then list the stages found begun under ``resumed``: their times count this run's part only);
    another run's files are refused (its results and figure before anything runs), unless ``replace``, which first
    removes this command's folders there (``crate``, ``vit``, ``crate-truncated``, ``adapters``: whatever they hold)
    and its results and figure.
    ``command`` is recorded in the results (the markdown page quotes it). Torch runs on ``config.threads``
    threads; the previous setting is restored on return.
    """
    config = config or CrateGazeConfig()
    config.validate()
    out = Path(out_dir)
    if replace:
        _remove_outputs(out)
    else:  # before any work: the stages check their own folders, the results and figure are checked here
        _refuse_another_runs_files(out, config)
    out.mkdir(parents=True, exist_ok=True)
    with torch_threads(config.threads):
        return _run(config, out, progress, command)


def _stage_folders(out: Path) -> dict[str, Path]:
    """Each stage's folder under ``out``, by the name the results' ``resumed`` list gives it."""
    folders = {f"train {kind}": out / kind for kind in MODELS}
    folders["truncate"] = out / "crate-truncated"
    folders["personalize"] = out / "adapters"
    return folders


def _remove_outputs(out: Path) -> None:
    """What this command writes under ``out`` (``--replace``): its stage folders, results and figure."""
    folders = [folder for folder in _stage_folders(out).values() if folder.is_dir()]
    for folder in folders:  # all checked before any is removed
        refuse_held_inside(folder)
    for folder in folders:
        shutil.rmtree(folder)
    for path in (out / RESULTS_FILE, out / FIGURE_FILE, plotted_path(out / FIGURE_FILE)):
        path.unlink(missing_ok=True)


def _refuse_another_runs_files(out: Path, config: CrateGazeConfig) -> None:
    """Refuse (``ValueError``) a results file or figure in ``out`` that this run would overwrite but is not its own
    to redo: results of other settings, a file that is no results of this command, or a figure with neither this
    run's results nor both trained models beside it. A run cut short after its probes leaves the figure and both
    training folders but no results (they are written last); the stages then check their checkpoints are this run's
    before the figure is drawn again, so such a figure is left to the resumed run."""
    results, figure = out / RESULTS_FILE, out / FIGURE_FILE
    if results.exists():
        other = _other_results(results, config)
        if other is not None:
            raise ValueError(f"--out {out}: {results} {other}; use another --out, or --replace to start over")
        return  # this run's results: its figure is this run's too, and both are written again
    drawn = [path for path in (figure, plotted_path(figure)) if path.exists()]
    trained = all(folder.is_dir() and any(folder.iterdir()) for folder in (out / kind for kind in MODELS))
    if drawn and not trained:
        raise ValueError(
            f"--out {out}: {drawn[0]} is not this run's (no results or trained models of it beside it); use another "
            "--out, or --replace to start over"
        )


def _other_results(path: Path, config: CrateGazeConfig) -> str | None:
    """Why the file at ``path`` is not the results of a run with ``config`` (words to follow its path), ``None`` if
    it is. The thread count is not compared: the stages' checkpoints do not record it, so a rerun at another count
    resumes them and redoes the rest."""
    try:
        saved = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError):
        return "is not a results file of alfa crate gaze (it does not read as JSON)"
    theirs = saved.get("config") if isinstance(saved, dict) else None
    if not isinstance(theirs, dict):
        return "is not a results file of alfa crate gaze (it holds no run's settings)"
    ours = json.loads(json.dumps(config.to_dict()))  # tuples become lists, as in the saved file
    differing = settings_differences(*({k: v for k, v in c.items() if k != "threads"} for c in (theirs, ours)))
    if not differing:
        return None
    return f"holds the results of another run (its settings vs this run's: {', '.join(differing)})"


def _run(config: CrateGazeConfig, out: Path, progress: bool, command: str | None) -> dict[str, Any]:
    t_start = time.time()
    resumed = [stage for stage, folder in _stage_folders(out).items() if folder.is_dir() and any(folder.iterdir())]
    seconds: dict[str, float] = {}  # wall time per stage, in the order the stages run
    n_adapt = config.personalize.n_adapt
    source, val, targets = _open_data(config, seconds, progress)

    mean_gaze = source.labels(range(len(source))).mean(0)  # the label table: no image is read
    in_domain: dict[str, Any] = {"constant": _errors_entry(_constant_errors(mean_gaze, val, 0))}
    cross_domain: dict[str, dict[str, Any]] = {
        name: {"constant": _errors_entry(_constant_errors(mean_gaze, d, n_adapt))} for name, d in targets.items()
    }
    models, model_info = _train_models(config, out, source, val, targets, in_domain, cross_domain, seconds, progress)

    # --- per-layer probes on a fixed batch of source and target images
    t0 = time.time()
    probe_sets = {val.name: _probe_images(val, config.probe_images_per_person)}
    probe_sets.update({name: _probe_images(d, config.probe_images_per_person) for name, d in targets.items()})
    probes = {
        kind: {
            name: _probe_entry(probe_model(models[kind], images, eps=config.probe_eps), persons)
            for name, (images, persons) in probe_sets.items()
        }
        for kind in MODELS
    }
    figure = plot_gaze_probes(probes, out / FIGURE_FILE, source_name=val.name)
    seconds["probes"] = time.time() - t0

    t0 = time.time()
    base, truncation = _truncate_crate(config, models["crate"], source, val, out, progress)
    seconds["truncate"] = time.time() - t0
    alfa_entry = _personalize_targets(config, base, targets, out, cross_domain, seconds, progress)

    seconds["total"] = time.time() - t_start
    results = {
        "command": command,
        "config": config.to_dict(),
        "data": _data_entry(config, source, val, targets, mean_gaze),
        "models": model_info,
        "errors": {"in_domain": {val.name: in_domain}, "cross_domain": cross_domain},
        "probes": {
            "eps": config.probe_eps,
            "images_per_person": config.probe_images_per_person,
            "source": val.name,
            "results": probes,
        },
        "truncation": truncation,
        "alfa": alfa_entry,
        "figure": str(figure),
        "seconds": seconds,
        "resumed": resumed,
        "torch_threads": config.threads,
        "torch_version": torch.__version__,
        "cpu": cpu_name(),  # another kind of machine renders the worlds a few bits apart: other models
    }
    write_json(out / RESULTS_FILE, results)
    return results


def _open_data(
    config: CrateGazeConfig, seconds: dict[str, float], progress: bool
) -> tuple[GazeDataset, GazeDataset, dict[str, GazeDataset]]:
    """The source, its held-out persons and the targets (by name); the time it took goes to ``seconds``."""
    t0 = time.time()
    source = open_dataset(config.source_spec())
    val = open_dataset(config.val_spec())
    targets: dict[str, GazeDataset] = {}
    for spec in config.target_specs():
        data = open_dataset(spec)
        targets[data.name] = data
    seconds["data"] = time.time() - t0
    _say(
        progress,
        f"data ({seconds['data']:.0f} s): {source.name} {len(source)} images, {val.name} {len(val)}, "
        + ", ".join(f"{name} {len(d)}" for name, d in targets.items()),
    )
    return source, val, targets


def _train_models(
    config: CrateGazeConfig,
    out: Path,
    source: GazeDataset,
    val: GazeDataset,
    targets: dict[str, GazeDataset],
    in_domain: dict[str, Any],
    cross_domain: dict[str, dict[str, Any]],
    seconds: dict[str, float],
    progress: bool,
) -> tuple[dict[str, nn.Module], dict[str, Any]]:
    """Train both models on the source; each one's errors go into ``in_domain`` and ``cross_domain`` (by
    model kind). Returns the trained models (in eval mode) and what the results record of each."""
    n_adapt = config.personalize.n_adapt
    models: dict[str, nn.Module] = {}
    model_info: dict[str, Any] = {}
    for kind in MODELS:
        t0 = time.time()
        torch.manual_seed(config.seed)  # the initial weights
        model = create_model(MODEL_NAMES[kind], **config.model_kwargs())
        result = train_source(
            model,
            source,
            config.train_config(),
            out / kind,
            model_name=MODEL_NAMES[kind],
            model_kwargs=config.model_kwargs(),
            val_dataset=val,
            resume=True,
            progress=progress,
        )
        models[kind] = model.eval()
        seconds[f"train {kind}"] = time.time() - t0
        model_info[kind] = {
            "constructor": MODEL_NAMES[kind],
            "kwargs": config.model_kwargs(),
            "parameters": parameter_summary(model).total,
            "history": result.history,
        }
        in_domain[kind] = _errors_entry(person_errors(model, val, None, 0))
        for name, data in targets.items():
            cross_domain[name][kind] = _errors_entry(person_errors(model, data, None, n_adapt))
        _say(
            progress,
            f"{LABELS[kind]} trained ({seconds[f'train {kind}']:.0f} s): in-domain {in_domain[kind]['mean']:.2f} deg, "
            + ", ".join(f"{name} {cross_domain[name][kind]['mean']:.2f}" for name in targets),
        )
    return models, model_info


def _truncate_crate(
    config: CrateGazeConfig, crate: nn.Module, source: GazeDataset, val: GazeDataset, out: Path, progress: bool
) -> tuple[nn.Module, dict[str, Any]]:
    """A truncated copy of the trained CRATE, recovered briefly on the source (with ``recovery_epochs`` > 0),
    in eval mode, and the results' truncation entry."""
    base = copy.deepcopy(crate)
    kwargs, crate_name = config.model_kwargs(), MODEL_NAMES["crate"]
    dense_params = parameter_summary(base).total
    # the in-domain error per person right after truncation, before any recovery, so the page can give it an
    # interval over persons like every other error (truncate_and_recover keeps only its mean)
    unrecovered = copy.deepcopy(crate)
    truncate(unrecovered, config.rank)
    after_truncation = _errors_entry(person_errors(unrecovered.eval(), val, None, 0))
    del unrecovered
    if config.recovery_epochs > 0:
        recovery = dataclasses.replace(config.train_config(), epochs=config.recovery_epochs, lr=config.recovery_lr)
        trunc = truncate_and_recover(
            base,
            source,
            TruncateConfig(rank=config.rank, recovery=recovery),
            out / "crate-truncated",
            val_dataset=val,
            val_persons=val.persons(),
            model_name=crate_name,
            model_kwargs=kwargs,
            resume=True,
            progress=progress,
        )
        trunc_errors, factorized, history = trunc.errors, trunc.factorized_layers, trunc.recovery_history
    else:
        before = _summary(list(person_errors(base, val, None, 0).values()))["mean"]
        report = truncate(base, config.rank)
        after = after_truncation["mean"]  # the same truncation, scored above
        trunc_errors = {"before_truncation": before, "after_truncation": after, "after_recovery": after}
        factorized, history = len(report.factorized), []
    base.eval()
    left_dense = [n for n, m in base.named_modules() if isinstance(m, nn.Linear)]
    truncation = {
        "rank": config.rank,
        "factorized_layers": factorized,
        "left_dense": left_dense,
        "parameters_dense": dense_params,
        "parameters_truncated": parameter_summary(base).total,
        "in_domain_error": trunc_errors,
        "in_domain_after_truncation": after_truncation,
        "in_domain_after_recovery": _errors_entry(person_errors(base, val, None, 0)),
        "recovery_epochs": config.recovery_epochs,
        "recovery_lr": config.recovery_lr,
        "recovery_history": history,
    }
    _say(
        progress,
        f"CRATE truncated at rank {config.rank}: {dense_params} -> {truncation['parameters_truncated']} parameters; "
        f"in-domain {trunc_errors['before_truncation']:.2f} -> {trunc_errors['after_truncation']:.2f} deg, "
        f"{trunc_errors['after_recovery']:.2f} after {config.recovery_epochs} recovery epoch(s)",
    )
    return base, truncation


def _personalize_targets(
    config: CrateGazeConfig,
    base: nn.Module,
    targets: dict[str, GazeDataset],
    out: Path,
    cross_domain: dict[str, dict[str, Any]],
    seconds: dict[str, float],
    progress: bool,
) -> dict[str, Any]:
    """Alfa personalization of the truncated CRATE, per target person; each target's errors before and after
    go into ``cross_domain`` and its time into ``seconds``. Returns the results' ``alfa`` entry."""
    n_adapt = config.personalize.n_adapt
    recipe = config.personalize_recipe()
    probe_copy = copy.deepcopy(base)
    adapted_layers = attach(probe_copy, config.alfa)
    adapter_size = sum(p.numel() for p in adapter_parameters(probe_copy).values())
    # What a compact adapter file stores (alfa.save_adapter(..., compact=True)): one d×d mix per layer.
    compact_size = sum(base.get_submodule(name).V.shape[0] ** 2 for name in adapted_layers)
    del probe_copy
    personalization: dict[str, Any] = {}
    merge_check: dict[str, Any] | None = None
    for name, data in targets.items():
        t0 = time.time()
        folder = out / "adapters" / safe_filename(name)
        scored = personalize_and_score(
            base,
            data,
            config.alfa,
            recipe,
            folder,
            n_adapt=n_adapt,
            before="truncated",
            after="alfa",
            resume=True,  # a person's adapter of another recipe or base is made again, not reused
            progress=progress,
        )
        run, report = scored.run, scored.report
        personalization[name] = _personalization_entry(data, run, report)
        common = report.common_persons()
        cross_domain[name]["crate_truncated"] = _errors_entry(report.columns["truncated"])
        cross_domain[name]["crate_alfa"] = _errors_entry(report.columns["alfa"])
        if merge_check is None and common:
            merge_check = _merge_check(base, data, common[0], folder / adapter_filename(common[0]), n_adapt)
            merge_check["target"] = name
        seconds[f"personalize {name}"] = time.time() - t0
        _say(
            progress,
            f"{name}: truncated CRATE {personalization[name]['truncated']['mean']:.2f} -> Alfa "
            f"{personalization[name]['alfa']['mean']:.2f} deg, lower for {personalization[name]['improved']} of "
            f"{len(common)} persons",
        )
    return {
        "config": config.alfa.to_dict(),
        "recipe": recipe.to_dict(),
        "adapted_layers": adapted_layers,
        "adapter_parameters": adapter_size,
        "adapter_compact_numbers": compact_size,
        "personalization": personalization,
        "merge_check": merge_check,
    }


def _personalization_entry(data: GazeDataset, run: Any, report: Any) -> dict[str, Any]:
    """One target's personalization: per person the errors before and after and the first and last loss,
    then the summaries over the persons scored in both columns."""
    before, after = report.columns["truncated"], report.columns["alfa"]
    persons = {
        p: {
            "truncated": before.get(p),
            "alfa": after.get(p),
            "first_loss": run.persons[p].losses[0] if run.persons[p].losses else None,
            "final_loss": run.persons[p].final_loss,
        }
        for p in data.persons()
    }
    common = report.common_persons()
    return {
        "persons": persons,
        "truncated": _summary([before[p] for p in common]),
        "alfa": _summary([after[p] for p in common]),
        "improved": sum(after[p] < before[p] for p in common),
        "compared": len(common),
        "failed": report.failed,
    }


def _data_entry(
    config: CrateGazeConfig,
    source: GazeDataset,
    val: GazeDataset,
    targets: dict[str, GazeDataset],
    mean_gaze: Tensor,
) -> dict[str, Any]:
    """The results' ``data`` entry: every data set's spec and size, and the source's mean gaze."""
    n_adapt = config.personalize.n_adapt
    return {
        "source": {
            "spec": config.source_spec(),
            "name": source.name,
            "images": len(source),
            "persons": len(source.persons()),
        },
        "val": {"spec": config.val_spec(), "name": val.name, "images": len(val), "persons": len(val.persons())},
        "targets": {
            name: {
                "spec": spec,
                "images": len(d),
                "persons": len(d.persons()),
                "scored_per_person": config.target_images_per_person - n_adapt,
            }
            for spec, (name, d) in zip(config.target_specs(), targets.items())
        },
        "source_mean_gaze_rad": mean_gaze.tolist(),
    }


def _merge_check(model: nn.Module, data: GazeDataset, person: str, adapter: Path, n_adapt: int) -> dict[str, Any]:
    """Outputs on the person's scored images with the adapter attached vs folded in by :func:`alfa.merge`."""
    images = load_images(data, eval_indices(data, person, n_adapt))
    base_outputs = predict_images(model, images)
    load_adapter(model, adapter)
    try:
        unmerged = predict_images(model, images)
        merged_model = copy.deepcopy(model)
        merge(merged_model)
        merged = predict_images(merged_model, images)
        merged_params = parameter_summary(merged_model).total
    finally:
        detach(model)
    abs_diff, rel_diff = _relative_difference(unmerged, merged)
    # How far the adapter moved the outputs: a merge check is only meaningful next to a real change.
    change, rel_change = _relative_difference(unmerged, base_outputs)
    return {
        "person": person,
        "images": images.shape[0],
        "max_abs_diff": abs_diff,
        "max_rel_diff": rel_diff,
        "max_abs_change_vs_base": change,
        "max_rel_change_vs_base": rel_change,
        "parameters_merged": merged_params,
        "parameters_base": parameter_summary(model).total,
    }
