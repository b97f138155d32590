"""A small real use of CRATE: a tiny CRATE and a tiny ViT trained for gaze on the synthetic source.

    source data -> train CRATE and ViT (same width, depth, heads) -> in-domain and cross-domain errors
    -> per-layer probes (coding rate; ISTA sparsity for CRATE) on source and target images
    -> CRATE: SVD truncation + short recovery -> per-person Alfa personalization on each target
    -> results.json, a probe figure, a table (and a generated markdown page)

Everything reuses the gaze stack: :func:`alfa.gaze.train.train_source` (Adam, L1 plus the flip-symmetry
term, constant learning rate), :func:`alfa.gaze.train.truncate_and_recover`,
:func:`alfa.gaze.personalize.personalize_dataset` and :func:`alfa.gaze.evaluate.evaluate` (the first
``n_adapt`` images of a target person are the unlabeled adaptation images, the rest are scored), and
:func:`alfa.crate.probes.probe_model`.

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
import math
import os
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from ..adapters import AlfaConfig, adapter_parameters, attach, detach, load_adapter, merge
from ..data.base import GazeDataset, InMemoryGazeDataset
from ..data.registry import open_dataset
from ..fileio import atomic_path, safe_filename, write_json
from ..gaze.augment import AugmentConfig
from ..gaze.evaluate import (
    adapter_filename,
    eval_indices,
    evaluate,
    load_examples,
    load_images,
    person_errors,
    predict_images,
)
from ..gaze.personalize import PersonalizeConfig, personalize_dataset
from ..gaze.train import TrainConfig, TruncateConfig, train_source, truncate_and_recover
from ..geometry import angular_error
from ..models import create_model
from ..summary import parameter_summary
from ..truncate import truncate
from .probes import DEFAULT_PROBE_EPS, ProbeResult, probe_model

__all__ = [
    "CrateGazeConfig",
    "quick_config",
    "late_blocks_pattern",
    "run_crate_gaze",
    "format_summary",
    "format_markdown",
    "plot_gaze_probes",
]

MODELS = ("crate", "vit")
MODEL_NAMES = {"crate": "crate_tiny", "vit": "vit_tiny"}  # registered constructors; sizes are overridden
LABELS = {"crate": "CRATE", "vit": "ViT"}
RESULTS_FILE = "results.json"
FIGURE_FILE = "probes.png"


def _demo_augment() -> AugmentConfig:
    # The gaze demo's augmentation for 64-pixel faces: a smaller blur than the 224-pixel default.
    return AugmentConfig(blur_kernel=3, blur_sigma=(0.1, 1.0))


def _default_recipe() -> PersonalizeConfig:
    # lr_scale is left empty here: the ×10 rule for the later blocks is added by personalize_recipe().
    return PersonalizeConfig(lr_scale={}, augment=_demo_augment())


def late_blocks_pattern(depth: int) -> str:
    """Parameter-name pattern of the later half of the blocks (``blocks.{depth//2}`` … ``blocks.{depth-1}``),
    the transformer counterpart of ResNet-18's ``layer3``/``layer4`` in the personalization recipe."""
    if depth < 1:
        raise ValueError(f"depth must be at least 1, got {depth}")
    return rf"(^|\.)blocks\.({'|'.join(str(i) for i in range(depth // 2, depth))})\."


@dataclass
class CrateGazeConfig:
    """Everything the run depends on. The defaults take about 6 minutes on one CPU thread.

    Models: CRATE and ViT with the same ``dim``/``depth``/``heads`` (the ViT's MLP has ratio 4, so it
    has about 3.6× the parameters), ``image_size``/``patch_size`` patches, a 2-output (yaw, pitch) head.
    Data: the synthetic worlds (``docs/synthetic.md``): ``source`` (train split) for training,
    ``val_persons`` of its ``val`` split for the in-domain error, ``targets`` (test split) for the
    cross-domain error and personalization. Training: ``epochs`` of Adam at ``lr``, batch ``batch_size``,
    L1 plus ``symmetry_weight`` × the flip-symmetry term (the gaze stack's pre-training). CRATE is then
    truncated at SVD rank ``rank`` and fine-tuned ``recovery_epochs`` on the source at ``recovery_lr``
    (0: no recovery), then personalized with ``alfa`` and the recipe ``personalize`` (its ``lr_scale``
    entries come first; ``late_blocks_lr_scale`` is added for the later half of the blocks).
    """

    image_size: int = 64
    patch_size: int = 8
    dim: int = 96
    depth: int = 6
    heads: int = 4
    source: str = "eth"
    source_persons: int = 50
    source_images_per_person: int = 100
    val_persons: int = 10
    val_images_per_person: int = 40
    targets: tuple[str, ...] = ("mpii", "eyediap")
    target_persons: int = 6
    target_images_per_person: int = 40
    data_seed: int = 0
    epochs: int = 6
    batch_size: int = 32
    lr: float = 5e-4
    symmetry_weight: float = 1.0
    rank: int = 32
    recovery_epochs: int = 1
    recovery_lr: float = 1e-4
    alfa: AlfaConfig = field(default_factory=AlfaConfig)
    personalize: PersonalizeConfig = field(default_factory=_default_recipe)
    late_blocks_lr_scale: float = 10.0
    probe_images_per_person: int = 4
    probe_eps: float = DEFAULT_PROBE_EPS
    seed: int = 0
    threads: int = 1
    preset: str = "default"  # a label only ("quick" marks the smoke-test preset in the outputs)

    def validate(self) -> None:
        """Raise a ``ValueError`` naming the first field that is out of range."""
        from ..data.synthetic import get_domain

        positive = (
            "image_size",
            "patch_size",
            "dim",
            "depth",
            "heads",
            "source_persons",
            "source_images_per_person",
            "val_persons",
            "val_images_per_person",
            "target_persons",
            "target_images_per_person",
            "epochs",
            "batch_size",
            "rank",
            "probe_images_per_person",
            "threads",
        )
        for name in (*positive, "recovery_epochs", "data_seed", "seed"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise ValueError(f"CrateGazeConfig.{name} must be an integer, got {value!r}")
            if name in positive and value < 1:
                raise ValueError(f"CrateGazeConfig.{name} must be at least 1, got {value}")
        if self.recovery_epochs < 0:
            raise ValueError(f"CrateGazeConfig.recovery_epochs must be non-negative, got {self.recovery_epochs}")
        if self.image_size < 16:
            raise ValueError(
                f"CrateGazeConfig.image_size must be at least 16 (the renderer's minimum), got {self.image_size}"
            )
        if self.image_size % self.patch_size:
            raise ValueError(
                f"CrateGazeConfig.image_size {self.image_size} is not divisible by patch_size {self.patch_size}"
            )
        if self.dim % self.heads:
            raise ValueError(f"CrateGazeConfig.dim {self.dim} is not divisible by heads {self.heads}")
        if 2 * self.rank >= self.dim:
            raise ValueError(
                f"CrateGazeConfig.rank {self.rank} saves nothing on the blocks' {self.dim}×{self.dim} layers "
                f"(needs rank < dim/2 = {self.dim / 2:g})"
            )
        if self.batch_size < 2:
            raise ValueError(f"CrateGazeConfig.batch_size must be at least 2, got {self.batch_size}")
        for name in ("lr", "recovery_lr", "late_blocks_lr_scale", "probe_eps"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
                raise ValueError(f"CrateGazeConfig.{name} must be a positive number, got {value!r}")
        if not (math.isfinite(self.symmetry_weight) and self.symmetry_weight >= 0):
            raise ValueError(f"CrateGazeConfig.symmetry_weight must be non-negative, got {self.symmetry_weight!r}")
        if self.source not in _domains("source", get_domain):
            raise ValueError(
                f"CrateGazeConfig.source {self.source!r} is not a synthetic source domain; "
                f"choose from {_domains('source', get_domain)}"
            )
        if isinstance(self.targets, str) or not self.targets:
            raise ValueError(f"CrateGazeConfig.targets must be a non-empty tuple of domain names, got {self.targets!r}")
        known_targets = _domains("target", get_domain)
        for target in self.targets:
            if target not in known_targets:
                raise ValueError(
                    f"CrateGazeConfig.targets: {target!r} is not a synthetic target domain; choose from {known_targets}"
                )
        if len(set(self.targets)) != len(self.targets):
            raise ValueError(f"CrateGazeConfig.targets lists a domain twice: {self.targets}")
        if not isinstance(self.personalize, PersonalizeConfig):
            raise ValueError(f"CrateGazeConfig.personalize must be a PersonalizeConfig, got {type(self.personalize)}")
        if not isinstance(self.alfa, AlfaConfig):
            raise ValueError(f"CrateGazeConfig.alfa must be an AlfaConfig, got {type(self.alfa).__name__}")
        self.personalize.validate()
        self.alfa.validate()
        n_adapt = self.personalize.n_adapt
        if self.target_images_per_person <= n_adapt:
            raise ValueError(
                f"CrateGazeConfig.target_images_per_person ({self.target_images_per_person}) must exceed the "
                f"{n_adapt} adaptation images per person, or nothing is left to score"
            )
        smallest = min(self.val_images_per_person, self.target_images_per_person)
        if self.probe_images_per_person > smallest:
            raise ValueError(
                f"CrateGazeConfig.probe_images_per_person ({self.probe_images_per_person}) exceeds the "
                f"{smallest} images per person of the smallest probed dataset"
            )

    def model_kwargs(self) -> dict[str, Any]:
        """Constructor arguments of both models (``create_model("crate_tiny" / "vit_tiny", **kwargs)``)."""
        return {
            "image_size": self.image_size,
            "patch_size": self.patch_size,
            "num_outputs": 2,
            "dim": self.dim,
            "depth": self.depth,
            "heads": self.heads,
        }

    def source_spec(self) -> str:
        return (
            f"synthetic:{self.source}?size={self.image_size}&persons={self.source_persons}"
            f"&images_per_person={self.source_images_per_person}&seed={self.data_seed}"
        )

    def val_spec(self) -> str:
        return (
            f"synthetic:{self.source}?split=val&size={self.image_size}&persons={self.val_persons}"
            f"&images_per_person={self.val_images_per_person}&seed={self.data_seed}"
        )

    def target_specs(self) -> list[str]:
        return [
            f"synthetic:{t}?size={self.image_size}&persons={self.target_persons}"
            f"&images_per_person={self.target_images_per_person}&seed={self.data_seed}"
            for t in self.targets
        ]

    def train_config(self) -> TrainConfig:
        return TrainConfig(
            epochs=self.epochs,
            batch_size=self.batch_size,
            lr=self.lr,
            symmetry_weight=self.symmetry_weight,
            seed=self.seed,
        )

    def personalize_recipe(self) -> PersonalizeConfig:
        """The recipe actually used: ``personalize`` with the later-blocks ×``late_blocks_lr_scale`` rule
        appended to its ``lr_scale`` and its seed set to ``seed``."""
        scales = {**self.personalize.lr_scale}
        scales.setdefault(late_blocks_pattern(self.depth), self.late_blocks_lr_scale)
        return dataclasses.replace(self.personalize, lr_scale=scales, seed=self.seed)

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["targets"] = list(self.targets)
        d["alfa"] = self.alfa.to_dict()
        return d


def _domains(role: str, get_domain) -> list[str]:
    from ..data.synthetic import list_domains

    return [name for name in list_domains() if get_domain(name).role == role]


def quick_config(**overrides: Any) -> CrateGazeConfig:
    """The ``--quick`` preset (a few seconds): 32-pixel faces, a 2-layer model, a handful of images.
    Its numbers only show that the chain runs; they say nothing about the models."""
    base = CrateGazeConfig(
        image_size=32,
        patch_size=8,
        dim=32,
        depth=2,
        heads=2,
        source_persons=6,
        source_images_per_person=10,
        val_persons=2,
        val_images_per_person=6,
        target_persons=2,
        target_images_per_person=8,
        epochs=1,
        batch_size=16,
        rank=8,
        alfa=AlfaConfig(heads=2, rank=2),
        personalize=dataclasses.replace(_default_recipe(), steps=2),
        probe_images_per_person=2,
        preset="quick",
    )
    return dataclasses.replace(base, **overrides)


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


def _labels(dataset: GazeDataset) -> Tensor:
    """All ``(yaw, pitch)`` labels ``(N, 2)`` without loading the images."""
    if isinstance(dataset, InMemoryGazeDataset):
        return dataset.gaze.float()
    return torch.stack([torch.as_tensor(dataset[i]["gaze"]).float() for i in range(len(dataset))])


def _constant_errors(mean_gaze: Tensor, dataset: GazeDataset, n_adapt: int) -> dict[str, float]:
    """Per-person error of always predicting ``mean_gaze`` (the source training labels' mean)."""
    out = {}
    for person in dataset.persons():
        _, gaze = load_examples(dataset, eval_indices(dataset, person, n_adapt))
        out[person] = float(angular_error(mean_gaze.double().expand_as(gaze), gaze.double()).mean())
    return out


def _probe_images(dataset: GazeDataset, per_person: int) -> Tensor:
    """The fixed probe batch: the first ``per_person`` images of every person (labels untouched)."""
    indices = [i for p in dataset.persons() for i in dataset.person_indices(p)[:per_person]]
    return load_images(dataset, indices, what="probe images")


def _probe_entry(result: ProbeResult) -> dict[str, Any]:
    entry = result.to_dict()
    rc = result.layer_rate()
    entry["coding_rate_std"] = (rc.std(0) if result.num_images > 1 else torch.zeros(rc.shape[1])).tolist()
    if result.sparsity is not None:
        s = result.sparsity
        entry["nonzero_fraction_std"] = (s.std(0) if result.num_images > 1 else torch.zeros(s.shape[1])).tolist()
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
) -> dict[str, Any]:
    """Run the whole comparison with ``config`` (default :class:`CrateGazeConfig`), write
    ``out_dir/results.json`` (atomically) and ``out_dir/probes.png``, and return the results.

    Checkpoints go to ``out_dir/crate``, ``out_dir/vit``, ``out_dir/crate-truncated`` and the per-person
    adapters to ``out_dir/adapters/<target>``; every run starts afresh (nothing is resumed). ``command``
    is recorded in the results (the markdown page quotes it). Torch runs on ``config.threads`` threads;
    the previous setting is restored on return.
    """
    config = config or CrateGazeConfig()
    config.validate()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    previous_threads = torch.get_num_threads()
    torch.set_num_threads(config.threads)
    try:
        return _run(config, out, progress, command)
    finally:
        torch.set_num_threads(previous_threads)


def _run(config: CrateGazeConfig, out: Path, progress: bool, command: str | None) -> dict[str, Any]:
    t_start = time.time()
    seconds: dict[str, float] = {}
    n_adapt = config.personalize.n_adapt

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

    mean_gaze = _labels(source).mean(0)
    in_domain: dict[str, Any] = {"constant": _errors_entry(_constant_errors(mean_gaze, val, 0))}
    cross_domain: dict[str, dict[str, Any]] = {
        name: {"constant": _errors_entry(_constant_errors(mean_gaze, d, n_adapt))} for name, d in targets.items()
    }

    # --- train both models on the source
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
            resume=False,
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

    # --- per-layer probes on a fixed batch of source and target images
    t0 = time.time()
    probe_sets = {val.name: _probe_images(val, config.probe_images_per_person)}
    probe_sets.update({name: _probe_images(d, config.probe_images_per_person) for name, d in targets.items()})
    probe_results = {
        kind: {name: probe_model(models[kind], images, eps=config.probe_eps) for name, images in probe_sets.items()}
        for kind in MODELS
    }
    probes = {kind: {name: _probe_entry(r) for name, r in per.items()} for kind, per in probe_results.items()}
    figure = plot_gaze_probes(probe_results, out / FIGURE_FILE, source_name=val.name)
    seconds["probes"] = time.time() - t0

    # --- truncate CRATE, recover briefly on the source
    t0 = time.time()
    base = copy.deepcopy(models["crate"])
    kwargs, crate_name = config.model_kwargs(), MODEL_NAMES["crate"]
    dense_params = parameter_summary(base).total
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
            resume=False,
            progress=progress,
        )
        trunc_errors, factorized, history = trunc.errors, trunc.factorized_layers, trunc.recovery_history
    else:
        before = _summary(list(person_errors(base, val, None, 0).values()))["mean"]
        report = truncate(base, config.rank)
        after = _summary(list(person_errors(base, val, None, 0).values()))["mean"]
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
        "in_domain_after_recovery": _errors_entry(person_errors(base, val, None, 0)),
        "recovery_epochs": config.recovery_epochs,
        "recovery_lr": config.recovery_lr,
        "recovery_history": history,
    }
    seconds["truncate"] = time.time() - t0
    _say(
        progress,
        f"CRATE truncated at rank {config.rank}: {dense_params} -> {truncation['parameters_truncated']} parameters; "
        f"in-domain {trunc_errors['before_truncation']:.2f} -> {trunc_errors['after_truncation']:.2f} deg, "
        f"{trunc_errors['after_recovery']:.2f} after {config.recovery_epochs} recovery epoch(s)",
    )

    # --- Alfa personalization of the truncated CRATE, per target person
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
        if folder.exists():
            shutil.rmtree(folder)  # adapters of an earlier run must not be reused
        run = personalize_dataset(base, data, config.alfa, recipe, folder, resume=False, progress=progress)
        report = evaluate(
            base, data, adapters=folder, n_adapt=n_adapt, before="truncated", after="alfa", progress=False
        )
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
        personalization[name] = {
            "persons": persons,
            "truncated": _summary([before[p] for p in common]),
            "alfa": _summary([after[p] for p in common]),
            "improved": sum(after[p] < before[p] for p in common),
            "compared": len(common),
            "failed": report.failed,
        }
        cross_domain[name]["crate_truncated"] = _errors_entry(before)
        cross_domain[name]["crate_alfa"] = _errors_entry(after)
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

    seconds["total"] = time.time() - t_start
    results = {
        "command": command,
        "config": config.to_dict(),
        "data": {
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
        },
        "models": model_info,
        "errors": {"in_domain": {val.name: in_domain}, "cross_domain": cross_domain},
        "probes": {
            "eps": config.probe_eps,
            "images_per_person": config.probe_images_per_person,
            "source": val.name,
            "results": probes,
        },
        "truncation": truncation,
        "alfa": {
            "config": config.alfa.to_dict(),
            "recipe": recipe.to_dict(),
            "adapted_layers": adapted_layers,
            "adapter_parameters": adapter_size,
            "adapter_compact_numbers": compact_size,
            "personalization": personalization,
            "merge_check": merge_check,
        },
        "figure": str(figure),
        "seconds": seconds,
        "torch_threads": config.threads,
        "torch_version": torch.__version__,
    }
    write_json(out / RESULTS_FILE, results)
    return results


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


# ----------------------------------------------------------------------------- the figure


def plot_gaze_probes(
    results: dict[str, dict[str, ProbeResult]], path: str | os.PathLike, source_name: str | None = None
) -> Path:
    """Two panels against depth: the tokens' coding rate ``R_c`` (sum over heads, mean ± std over the probe
    images) for both models, and CRATE's non-zero fraction after ISTA; colour = data set (source or
    target), solid = CRATE, dashed = ViT. Written atomically as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    sets = list(dict.fromkeys(name for per in results.values() for name in per))
    colours = {name: plt.get_cmap("tab10")(i) for i, name in enumerate(sets)}
    styles = {"crate": "-", "vit": "--"}
    fig, (ax_rate, ax_sparse) = plt.subplots(1, 2, figsize=(10.5, 4.0))
    eps = set()
    for kind, per in results.items():
        for name, res in per.items():
            eps.add(res.eps)
            layers = list(range(1, res.num_layers + 1))
            rc = res.layer_rate()
            mean = rc.mean(0).numpy()
            std = (rc.std(0) if res.num_images > 1 else torch.zeros_like(rc[0])).numpy()
            role = "source" if name == source_name else "target"
            label = f"{LABELS.get(kind, kind)} · {name} ({role})"
            style = styles.get(kind, ":")
            ax_rate.plot(layers, mean, style, marker="o", ms=3, color=colours[name], label=label)
            ax_rate.fill_between(layers, mean - std, mean + std, color=colours[name], alpha=0.12)
            if res.sparsity is not None:
                s_mean = res.sparsity.mean(0).numpy()
                s_std = (res.sparsity.std(0) if res.num_images > 1 else torch.zeros_like(res.sparsity[0])).numpy()
                ax_sparse.plot(layers, s_mean, style, marker="o", ms=3, color=colours[name], label=label)
                ax_sparse.fill_between(layers, s_mean - s_std, s_mean + s_std, color=colours[name], alpha=0.12)
    eps_text = ", ".join(f"{e:g}" for e in sorted(eps))
    ax_rate.set(
        xlabel="layer", ylabel="R_c (bits, sum over heads)", title=f"coding rate of the tokens (ε = {eps_text})"
    )
    ax_sparse.set(xlabel="layer", ylabel="non-zero fraction", title="CRATE: after ISTA", ylim=(0, 1.02))
    for ax in (ax_rate, ax_sparse):
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.grid(alpha=0.3)
        if ax.lines:
            ax.legend(fontsize=7)
    fig.tight_layout()
    path = Path(path)
    with atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=120)
    plt.close(fig)
    return path


# ----------------------------------------------------------------------------- text


def _pm(entry: dict[str, Any] | None) -> str:
    if not entry or entry.get("mean") is None or not math.isfinite(entry["mean"]):
        return "-"
    return f"{entry['mean']:.2f} ± {entry['std']:.2f}"


def _rows(results: dict[str, Any]) -> tuple[list[str], list[list[str]]]:
    """The summary table: one row per model, in-domain and each target's cross-domain error."""
    errors = results["errors"]
    ((val_name, in_domain),) = errors["in_domain"].items()
    targets = list(errors["cross_domain"])
    trunc = results["truncation"]
    params = {
        "constant": "0",
        "vit": f"{results['models']['vit']['parameters']:,}",
        "crate": f"{results['models']['crate']['parameters']:,}",
        "crate_truncated": f"{trunc['parameters_truncated']:,}",
        "crate_alfa": f"{trunc['parameters_truncated']:,} + {results['alfa']['adapter_parameters']:,}/person",
    }
    compact = results["alfa"].get("adapter_compact_numbers")
    if compact is not None:
        params["crate_alfa"] += f" (compact file: {compact:,})"
    names = {
        "constant": "constant (source mean gaze)",
        "vit": "ViT",
        "crate": "CRATE",
        "crate_truncated": f"CRATE truncated (rank {trunc['rank']}) + recovery",
        "crate_alfa": "CRATE truncated + Alfa (per person)",
    }
    in_domain_rows = {
        **in_domain,
        "crate_truncated": trunc["in_domain_after_recovery"],
    }
    header = ["model", "parameters", f"{val_name} (in-domain)", *(f"{t} (cross-domain)" for t in targets)]
    rows = []
    for key, label in names.items():
        rows.append(
            [
                label,
                params[key],
                _pm(in_domain_rows.get(key)),
                *(_pm(errors["cross_domain"][t].get(key)) for t in targets),
            ]
        )
    return header, rows


def format_summary(results: dict[str, Any]) -> str:
    """The plain-text table the command prints, with the truncation, personalization and merge lines."""
    header, rows = _rows(results)
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]

    def fmt(r: list[str]) -> str:
        return "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths)))

    lines = [
        "angular error (deg), mean ± std over persons; cross-domain: images after the first "
        f"{results['config']['personalize']['n_adapt']} of each person",
        fmt(header),
        "  ".join("-" * w for w in widths),
        *(fmt(r) for r in rows),
        "",
        *_findings(results),
    ]
    return "\n".join(lines)


def _trend(values: list[float]) -> str:
    """First → last value, where the curve peaks and bottoms out, and how many layer-to-layer steps go down."""
    downs = sum(b < a for a, b in zip(values, values[1:]))
    top = max(range(len(values)), key=values.__getitem__)
    low = min(range(len(values)), key=values.__getitem__)
    return (
        f"{values[0]:.3g} → {values[-1]:.3g} (highest {values[top]:.3g} at layer {top + 1}, lowest {values[low]:.3g} "
        f"at layer {low + 1}; {downs} of {len(values) - 1} layer steps down)"
    )


def _findings(results: dict[str, Any]) -> list[str]:
    """Plain sentences computed from the numbers (no judgement is hand-written)."""
    errors = results["errors"]
    ((val_name, in_domain),) = errors["in_domain"].items()
    lines = []
    c, v, k = in_domain["crate"]["mean"], in_domain["vit"]["mean"], in_domain["constant"]["mean"]
    better = "CRATE" if c < v else "ViT"
    lines.append(f"In-domain ({val_name}): CRATE {c:.2f}, ViT {v:.2f}, constant {k:.2f} deg; {better} is lower.")
    for target, cols in errors["cross_domain"].items():
        c, v, k = cols["crate"]["mean"], cols["vit"]["mean"], cols["constant"]["mean"]
        beat = [LABELS[m] for m in MODELS if cols[m]["mean"] < k]
        lines.append(
            f"Cross-domain ({target}): CRATE {c:.2f}, ViT {v:.2f}, constant {k:.2f} deg; "
            + (f"below the constant: {', '.join(beat)}." if beat else "neither model is below the constant prediction.")
        )
    t = results["truncation"]
    e = t["in_domain_error"]
    lines.append(
        f"Truncation at rank {t['rank']} ({t['factorized_layers']} layers): {t['parameters_dense']:,} -> "
        f"{t['parameters_truncated']:,} parameters; in-domain {e['before_truncation']:.2f} -> "
        f"{e['after_truncation']:.2f} deg, {e['after_recovery']:.2f} after {t['recovery_epochs']} recovery epoch(s)."
    )
    for target, p in results["alfa"]["personalization"].items():
        b, a = p["truncated"]["mean"], p["alfa"]["mean"]
        verb = "lowered" if a < b else "did NOT lower"
        lines.append(
            f"Alfa on {target} {verb} the error: {b:.2f} -> {a:.2f} deg ({a - b:+.2f}), lower for "
            f"{p['improved']} of {p['compared']} persons" + (f"; {len(p['failed'])} failed." if p["failed"] else ".")
        )
    m = results["alfa"]["merge_check"]
    if m is not None:
        lines.append(
            f"Merge check ({m['target']}, person {m['person']}): merged vs unmerged outputs differ by at most "
            f"{m['max_abs_diff']:.2e} (relative {m['max_rel_diff']:.2e}; the adapter itself moved them by up to "
            f"{m['max_abs_change_vs_base']:.2e} rad); parameters after merge "
            f"{m['parameters_merged']:,} (base {m['parameters_base']:,})."
        )
    probes = results["probes"]["results"]
    for kind in MODELS:
        for name, entry in probes[kind].items():
            text = f"Probe {LABELS[kind]} on {name}: R_c {_trend(entry['coding_rate'])}"
            if "nonzero_fraction" in entry:
                text += f"; non-zero after ISTA {_trend(entry['nonzero_fraction'])}"
            lines.append(text + ".")
    return lines


def format_markdown(results: dict[str, Any], figure: str | None = None) -> str:
    """A generated markdown page: how it was made, the error table, truncation, personalization per
    person, the merge check, the probe figure (``figure``: its path relative to the page) and per-layer
    probe tables, and the limits of what it shows."""
    cfg = results["config"]
    command = results.get("command") or "(run through the Python API: alfa.crate.gaze.run_crate_gaze)"
    data = results["data"]
    n_adapt = cfg["personalize"]["n_adapt"]
    header, rows = _rows(results)
    recipe = results["alfa"]["recipe"]
    lines = [
        "# A small real use of CRATE: gaze on the synthetic worlds",
        "",
        f"<!-- Generated by `{command}`. Do not edit by hand: re-run the command. -->",
        "",
        f"Generated by `{command}` (seed {cfg['seed']}, data seed {cfg['data_seed']}, "
        f"{results['torch_threads']} torch thread(s), {results['seconds']['total'] / 60:.1f} min wall time, "
        f"torch {results['torch_version']}). Every number below comes from that run's `results.json`.",
        "",
        "A tiny CRATE and a tiny ViT of the same width, depth and heads are trained from scratch for a few epochs "
        "on CPU. This is a small use, not a benchmark: one seed, few images, short training, synthetic faces.",
        "",
        *(
            ["**Preset `quick`**: a smoke test of the chain; its numbers say nothing about the models.", ""]
            if cfg.get("preset") == "quick"
            else []
        ),
        "## Setup",
        "",
        f"- **Data** (`docs/synthetic.md`): source `{data['source']['spec']}` ({data['source']['persons']} persons, "
        f"{data['source']['images']} images); in-domain error on `{data['val']['spec']}` (held-out source persons, "
        f"every image scored); targets "
        + ", ".join(
            f"`{t['spec']}` ({t['persons']} persons, {t['scored_per_person']} scored images each)"
            for t in data["targets"].values()
        )
        + f". The first {n_adapt} images of each target person are the unlabeled adaptation images, never scored.",
        f"- **Models**: `{results['models']['crate']['constructor']}` and `{results['models']['vit']['constructor']}` "
        f"with {cfg['image_size']}×{cfg['image_size']} images, patch {cfg['patch_size']}, dim {cfg['dim']}, "
        f"depth {cfg['depth']}, {cfg['heads']} heads, a 2-output (yaw, pitch) head; "
        f"{results['models']['crate']['parameters']:,} and {results['models']['vit']['parameters']:,} parameters "
        "(the ViT's MLP has ratio 4).",
        f"- **Training** (`alfa.gaze.train.train_source`, both models): {cfg['epochs']} epoch(s), "
        f"Adam lr {cfg['lr']:g}, "
        f"batch {cfg['batch_size']}, L1 loss + {cfg['symmetry_weight']:g} × flip-symmetry term, constant learning "
        "rate, the last epoch kept.",
        f"- **Truncation** (CRATE only): SVD rank {cfg['rank']} on every Linear layer where it saves parameters, then "
        f"{cfg['recovery_epochs']} recovery epoch(s) on the source at lr {cfg['recovery_lr']:g} "
        "(`truncate_and_recover`). Left dense: "
        + ", ".join(f"`{n}`" for n in results["truncation"]["left_dense"])
        + "; the ISTA dictionaries are not Linear layers and are neither truncated nor adapted.",
        f"- **Personalization** (`personalize_dataset`, per target person): Alfa with {cfg['alfa']['heads']} heads of "
        f"rank {cfg['alfa']['rank']} on all {len(results['alfa']['adapted_layers'])} factorized layers "
        f"({results['alfa']['adapter_parameters']:,} trained adapter parameters per person; a compact adapter file, "
        f"one d×d mix per layer, holds {results['alfa'].get('adapter_compact_numbers', 0):,} numbers); the "
        f"{n_adapt} images, one augmented copy each and the flips of all in one batch; flip-symmetry loss; "
        f"{recipe['steps']} AdamW steps "
        f"at lr {recipe['lr']:g}, ×{cfg['late_blocks_lr_scale']:g} on the later half of the blocks "
        f"(`{late_blocks_pattern(cfg['depth'])}`; ResNet-18's layer3/layer4 rule carried over); the last step is "
        "the result. Nothing is chosen on target labels.",
        "- **Errors**: angular error in degrees per person, then mean ± standard deviation over persons "
        "(population std). The constant row always predicts the mean gaze of the source training labels.",
        "",
        "## Errors",
        "",
        "| " + " | ".join(header) + " |",
        "| " + " | ".join(["---"] + ["---:"] * (len(header) - 1)) + " |",
        *("| " + " | ".join(r) + " |" for r in rows),
        "",
        *(f"- {line}" for line in _findings(results) if not line.startswith("Probe ")),
        "",
        "### Per person (cross-domain)",
        "",
    ]
    for target, p in results["alfa"]["personalization"].items():
        cols = results["errors"]["cross_domain"][target]
        lines += [
            f"**{target}** (min–max over persons: CRATE {cols['crate']['min']:.2f}–{cols['crate']['max']:.2f}, "
            f"ViT {cols['vit']['min']:.2f}–{cols['vit']['max']:.2f}, "
            f"Alfa {p['alfa']['min']:.2f}–{p['alfa']['max']:.2f})",
            "",
            "| person | constant | ViT | CRATE | CRATE truncated | + Alfa | Δ Alfa | flip loss first → last |",
            "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
        ]
        for person, row in p["persons"].items():
            vals = [cols[k]["per_person"].get(person) for k in ("constant", "vit", "crate")]
            b, a = row["truncated"], row["alfa"]
            cells = [f"{x:.2f}" if x is not None else "-" for x in (*vals, b, a)]
            delta = f"{a - b:+.2f}" if a is not None and b is not None else "-"
            loss = (
                f"{row['first_loss']:.4f} → {row['final_loss']:.4f}"
                if row["first_loss"] is not None and row["final_loss"] is not None
                else "failed"
            )
            lines.append(f"| {person} | " + " | ".join(cells) + f" | {delta} | {loss} |")
        lines.append("")
    probes = results["probes"]
    lines += [
        "## Per-layer probes",
        "",
        f"On a fixed batch (the first {probes['images_per_person']} images of every person of each data set; labels "
        f"unused), `alfa.crate.probes.probe_model` records per layer the coding rate `R_c` of the tokens (per head on "
        f"`U_kᵀ z` for CRATE and on the value projection for the ViT, tokens normalized, ε = {probes['eps']:g}, "
        "summed over heads) and, for CRATE, the fraction of non-zero coordinates after ISTA (spec crate.md §3).",
        "",
    ]
    if figure:
        lines += [f"![probe curves]({figure})", ""]
    sets = list(probes["results"]["crate"])
    head = ["layer"] + [f"{LABELS[k]} R_c {s}" for k in MODELS for s in sets] + [f"CRATE non-zero {s}" for s in sets]
    lines += ["| " + " | ".join(head) + " |", "| " + " | ".join(["---:"] * len(head)) + " |"]
    depth = len(probes["results"]["crate"][sets[0]]["coding_rate"])
    for layer in range(depth):
        cells = [str(layer + 1)]
        for kind in MODELS:
            for s in sets:
                e = probes["results"][kind][s]
                cells.append(f"{e['coding_rate'][layer]:.2f} ± {e['coding_rate_std'][layer]:.2f}")
        for s in sets:
            e = probes["results"]["crate"][s]
            cells.append(f"{e['nonzero_fraction'][layer]:.3f} ± {e['nonzero_fraction_std'][layer]:.3f}")
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", *(f"- {line}" for line in _findings(results) if line.startswith("Probe ")), ""]
    lines += [
        "## What this does and does not show",
        "",
        f"- Both models are trained from scratch for {cfg['epochs']} epoch(s) on {data['source']['images']:,} "
        f"{cfg['image_size']}-pixel faces with a constant learning rate: a short budget. Differences between CRATE "
        "and ViT here are differences after that budget, not of the architectures at convergence.",
        "- One seed: no spread over seeds is measured; the ± is the spread over persons only.",
        "- The data are procedural faces (`docs/synthetic.md`), not the paper's datasets.",
        "",
        "## Re-running",
        "",
        "```",
        command,
        "```",
        "",
        "Seconds per stage: " + ", ".join(f"{k} {v:.0f}" for k, v in results["seconds"].items()) + ".",
        "",
    ]
    return "\n".join(lines)
