"""The demo: the whole chain on the synthetic benchmark, in one call (``alfa demo``).

    source data -> pre-training -> truncation + recovery -> per target person: source-only, flip-TTA,
    Alfa with the default recipe, Alfa with the paper's recipe, and a user calibration from 9 labelled images
    -> evaluation -> table, JSON, figure

``alfa demo`` runs it twice (:func:`demo_configs`): a symmetric pair, where a flip sees little of the error,
and an asymmetric one, where it can see more (docs/flip-premise.md).

The source model (pre-trained and recovered) is cached under ``cache_dir/source-<key>``, where the key
is a hash of everything it depends on: the model, the source and validation data (their specs *and*
a hash of their pixels and labels, so a changed generator invalidates it), both training configs,
the SVD rank and the package version. A missing or stale cache is rebuilt (an interrupted build
resumes from its last state (:mod:`alfa.gaze.train_state`), and a second process that needs the same model
waits for the first one's build under the lock ``source-<key>.lock``, then loads it); nothing is ever
downloaded.
Personalization and evaluation always run.

Nothing is selected on target labels: every step count, learning rate and augmentation strength is
in :class:`DemoConfig`, and the target labels are read only by the final evaluation and by the one column that
is labelled by design (``alfa calibrate``'s default, on ``k`` labelled images per person that are never scored;
:class:`DemoImages` says which images each column uses). How one target is scored, column by column, is
:mod:`alfa.gaze.demo_scoring`.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import hashlib
import inspect
import json
import shutil
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from alfa.adapters import AlfaConfig
from alfa.checkpoint import load_model
from alfa.fileio import atomic_path, finite_or_none, write_json
from alfa.locks import locked
from alfa.models import create_model

from .augment import AugmentConfig
from .calibrate import CalibrateConfig
from .data.base import GazeDataset, InMemoryGazeDataset
from .data.registry import DatasetSpec
from .demo_scoring import COLUMNS, RECIPE_COLUMNS, DemoImages, calibrate_and_score, calibration_column, score_target
from .evaluate import EvaluationReport
from .personalize import PersonalizeConfig, PersonalizedTarget, personalize_and_score
from .train import TrainConfig, TruncateConfig, input_size, train_source, truncate_and_recover

__all__ = [
    "source_model_finished",
    "SourceSpec",
    "DemoConfig",
    "DemoResult",
    "demo_config",
    "real_config",
    "open_data",
    "data_fingerprint",
    "source_cache_key",
    "build_source_model",
    "run_demo",
    "demo_configs",
    "verdict",
    "plot_per_person",
    "summary_table",
    # defined in alfa.gaze.personalize and alfa.gaze.demo_scoring, still importable from here where they began
    "PersonalizedTarget",
    "personalize_and_score",
    "DemoImages",
    "calibrate_and_score",
    "COLUMNS",
    "calibration_column",
]

CACHE_FORMAT = 1


DEMO_SIZE = 48
"""The demo's face size in pixels (the benchmark's presets use 48 to 64)."""

DEMO_IMAGES = 60
"""Images per target person that the label-free columns see: the first ``n_adapt`` adapt, the rest are scored.
The demo renders ``CalibrateConfig().pool`` more per person after them, the calibration's pool (:class:`DemoImages`)."""


def _studio_specs(config: DemoConfig) -> dict[str, Any]:
    """The studio part's data: the default part's specs with the studio source and the window-lit target."""
    source, val = DatasetSpec.parse(config.source), DatasetSpec.parse(config.val_source)
    target = DatasetSpec.parse(config.targets[0])
    return {
        "source": str(dataclasses.replace(source, target="eth-studio")),
        "val_source": str(dataclasses.replace(val, target="eth-studio")),
        "targets": (str(dataclasses.replace(target, target="mpii-window")),),
    }


@dataclass(frozen=True)
class SourceSpec:
    """What a source model depends on, besides the pixels of its data: the source and validation data (dataset
    specs, :class:`~alfa.gaze.data.registry.DatasetSpec` or their strings; ``val_source`` ``None`` holds out a
    fraction of ``source``), the registered model, the seed of its initial weights, its pre-training and its
    truncation with recovery. :func:`build_source_model` builds it; :func:`source_cache_key` names its cache."""

    source: str | DatasetSpec
    val_source: str | DatasetSpec | None
    model: str
    seed: int
    pretrain: TrainConfig
    truncation: TruncateConfig

    def __post_init__(self) -> None:
        # Held as strings: the cache key hashes the spec strings, whichever form was given.
        object.__setattr__(self, "source", str(self.source))
        if self.val_source is not None:
            object.__setattr__(self, "val_source", str(self.val_source))

    def to_dict(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "seed": self.seed,
            "source": self.source,
            "val_source": self.val_source,
            "pretrain": self.pretrain.to_dict(),
            "truncation": self.truncation.to_dict(),
        }


@dataclass
class DemoConfig:
    """Everything one part of the demo depends on (one source and its targets). Defaults are the small
    synthetic preset's symmetric part (48×48 faces, sources of 60 persons × 50 images, sized so that the whole
    demo runs in a few minutes on 2 CPU cores; :func:`demo_configs` gives both parts); :func:`real_config`
    gives the paper's settings.

    Data are dataset specs (:func:`alfa.gaze.data.registry.open_dataset`), options after ``?``.
    ``val_source`` holds the held-out source persons (``None``: hold out a fraction of ``source``).
    ``calibrate`` is the labelled column's recipe (``alfa calibrate``'s defaults); the last ``calibrate.pool``
    images of each target person are its pool, which no column scores (:class:`DemoImages`).
    """

    source: str = str(DatasetSpec.synthetic("eth", size=DEMO_SIZE, persons=60, images_per_person=50))
    val_source: str | None = str(
        DatasetSpec.synthetic("eth", split="val", size=DEMO_SIZE, persons=10, images_per_person=40)
    )
    targets: tuple[str, ...] = (
        str(DatasetSpec.synthetic("mpii", size=DEMO_SIZE, images_per_person=DEMO_IMAGES + CalibrateConfig().pool)),
    )
    model: str = "resnet18_gaze"
    seed: int = 0
    pretrain: TrainConfig = field(
        default_factory=lambda: TrainConfig(epochs=4, batch_size=64, lr=1e-3, symmetry_weight=1.0)
    )
    truncation: TruncateConfig = field(
        # The default rank d; only the recovery is shortened for the demo.
        default_factory=lambda: TruncateConfig(
            recovery=TrainConfig(epochs=1, batch_size=64, lr=1e-4, symmetry_weight=1.0)
        )
    )
    alfa: AlfaConfig = field(default_factory=AlfaConfig)
    personalize: PersonalizeConfig = field(
        default_factory=lambda: PersonalizeConfig(augment=AugmentConfig.small_faces())
    )
    calibrate: CalibrateConfig = field(default_factory=CalibrateConfig)
    out_dir: str = "runs/demo"
    cache_dir: str = "runs/cache"

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["alfa"] = self.alfa.to_dict()
        return d

    def source_model_spec(self) -> SourceSpec:
        """The part of this config its source model depends on."""
        return SourceSpec(self.source, self.val_source, self.model, self.seed, self.pretrain, self.truncation)


def seeded(config: DemoConfig, seed: int) -> DemoConfig:
    """``config`` with every draw of its chain from ``seed``: the source model's initial weights, the batch order and
    held-out share of its pre-training and of its recovery, each person's personalization (adapter init,
    augmentation) and the calibration's draw of labelled images (``alfa demo --seed``)."""
    return dataclasses.replace(
        config,
        seed=seed,
        pretrain=dataclasses.replace(config.pretrain, seed=seed),
        truncation=dataclasses.replace(
            config.truncation, recovery=dataclasses.replace(config.truncation.recovery, seed=seed)
        ),
        personalize=dataclasses.replace(config.personalize, seed=seed),
        calibrate=dataclasses.replace(config.calibrate, seed=seed),
    )


def demo_config(**overrides: Any) -> DemoConfig:
    """The synthetic demo preset (the default of ``alfa demo``), with fields replaced by ``overrides``."""
    return dataclasses.replace(DemoConfig(), **overrides)


def real_config(source: str, targets: tuple[str, ...], val_source: str | None = None, **overrides: Any) -> DemoConfig:
    """The paper's settings for real 224×224 data: pre-training 50 epochs, recovery 25 epochs, Adam
    lr 1e-4, batch 120, SVD rank 64, Alfa with 8 heads of rank 8; the personalization recipe's
    defaults (5 images, 10 steps, AdamW lr 1e-4 ×10 on layer3/4). As in the demo, each target person's last
    ``calibrate.pool`` images are the labelled column's pool, which no column scores (:class:`DemoImages`)."""
    base = DemoConfig(
        source=source,
        val_source=val_source,
        targets=tuple(targets),
        pretrain=TrainConfig(),
        truncation=TruncateConfig(),
        alfa=AlfaConfig(),
        personalize=PersonalizeConfig(),
        out_dir="runs/real",
    )
    return dataclasses.replace(base, **overrides)


# ----------------------------------------------------------------------------- data and the cache


def open_data(spec: str) -> GazeDataset:
    """Open a dataset spec through :func:`alfa.gaze.data.registry.open_dataset` (imported here, lazily), every kind
    known: the loaders' and ``photos:`` (a person's calibration photos, :mod:`alfa.gaze.photo_data`, which needs the
    camera path beside the loaders and so registers from above them)."""
    from . import photo_data  # noqa: F401  (registers photos:)
    from .data.registry import open_dataset

    return open_dataset(spec)


def data_fingerprint(dataset: GazeDataset) -> str:
    """A hash of a dataset's pixels, labels and person structure (in-memory datasets; others are
    identified by name and size)."""
    h = hashlib.sha256()
    h.update(json.dumps([dataset.name, len(dataset), dataset.persons()]).encode())
    if isinstance(dataset, InMemoryGazeDataset):
        h.update(dataset.images.contiguous().numpy().tobytes())
        h.update(dataset.gaze.contiguous().numpy().tobytes())
        h.update(dataset.person_ids.contiguous().numpy().tobytes())
    return h.hexdigest()[:16]


def source_cache_key(spec: SourceSpec, fingerprints: dict[str, str | None], device: torch.device | str = "cpu") -> str:
    """The cache key of the source model: a hash of everything that determines it (``spec``, the
    fingerprints of its data, the cache format, the package version, and the kind of ``device`` it trains on).
    A model trained on a GPU has other bits than the CPU's, which the CPU's numbers are pinned to, so it gets a
    folder of its own: a CPU run sharing the cache never loads it. The CPU's keys hash no device (the keys
    cached before the device counted)."""
    from alfa import __version__

    parts = {"format": CACHE_FORMAT, "version": __version__, **spec.to_dict(), "data": fingerprints}
    kind = torch.device(device).type
    if kind != "cpu":
        parts["device"] = kind
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:12]


@dataclass
class SourceModels:
    """The dense pre-trained model, the truncated + recovered base, and what building them reported."""

    dense: nn.Module
    recovered: nn.Module
    cache: Path
    pretrain_history: list[dict[str, float]]
    truncation: dict[str, Any]
    seconds: dict[str, float]
    from_cache: bool


def source_model_finished(cache: Path) -> bool:
    """Whether the cache folder of a source model (:func:`build_source_model`) holds it finished: recovered after
    its truncation, so that it is loaded rather than trained."""
    return (Path(cache) / "recovered" / "model.safetensors").is_file()


def finished_folder_of_spec(cache_dir: Path, spec: SourceSpec) -> Path | None:
    """A finished source-model folder of ``cache_dir`` (:func:`source_model_finished`) whose ``key.json`` names
    ``spec`` (``None`` where none does), found without the data: its data, which the folder's key also hashes, may
    have been others (another machine's renders, another package version)."""
    wanted = json.loads(json.dumps(finite_or_none(spec.to_dict())))  # as build_source_model's write_json wrote it
    for folder in sorted(Path(cache_dir).glob("source-*")):
        stored = folder / "key.json"
        if source_model_finished(folder) and stored.is_file():
            with contextlib.suppress(ValueError):
                if json.loads(stored.read_text(encoding="utf-8")).get("config") == wanted:
                    return folder
    return None


def build_source_model(
    spec: SourceSpec,
    source: GazeDataset,
    val: GazeDataset | None,
    *,
    cache_dir: str | Path,
    rebuild: bool = False,
    progress: bool = True,
    device: torch.device | str = "cpu",
    on_pretrain_epoch: Callable[[int, nn.Module], None] | None = None,
) -> SourceModels:
    """Pre-train, truncate and recover on ``source`` (the data of ``spec.source``; ``val``, of
    ``spec.val_source``), or load the result from ``cache_dir/source-<key>``; the models live on ``device``.
    ``on_pretrain_epoch(epoch, model)`` runs after each pre-training epoch this call trains (none when the
    pre-training is already finished), as :func:`~alfa.gaze.train.train_source`'s ``on_epoch``.
    The build holds ``source-<key>.lock`` beside the folder: another process building the same model waits
    (saying so on stderr) and then loads what the first one finished."""
    fingerprints = {"source": data_fingerprint(source), "val": data_fingerprint(val) if val is not None else None}
    cache = Path(cache_dir) / f"source-{source_cache_key(spec, fingerprints, device)}"

    def say_waiting(holder: str) -> None:
        print(f"waiting for {holder} building {cache}", file=sys.stderr, flush=True)

    # Two processes (two pieces of one benchmark) may need the same model at once: the second waits for the
    # first to finish instead of resuming its half-written checkpoints beside it, then loads the finished one.
    with locked(cache, on_wait=say_waiting):
        if rebuild and cache.exists():
            shutil.rmtree(cache)
        finished = source_model_finished(cache)
        seconds: dict[str, float] = {}

        t0 = time.time()
        torch.manual_seed(spec.seed)  # the initial weights
        model = create_model(spec.model).to(device)
        result = train_source(
            model,
            source,
            spec.pretrain,
            cache / "pretrain",
            model_name=spec.model,
            val_dataset=val,
            progress=progress,
            extra={"cache_key": cache.name},
            on_epoch=on_pretrain_epoch or (lambda epoch, model: None),
        )
        seconds["pretrain"] = time.time() - t0

        t0 = time.time()
        dense, _ = load_model(cache / "pretrain" / "model.safetensors", expect_model=spec.model)
        dense.to(device)
        dense.eval()
        recovered = copy.deepcopy(dense)
        trunc = truncate_and_recover(
            recovered,
            source,
            spec.truncation,
            cache / "recovered",
            val_dataset=val if val is not None else source,
            val_persons=result.val_persons,
            model_name=spec.model,
            progress=progress,
        )
        seconds["truncate_recover"] = time.time() - t0
        write_json(cache / "key.json", {"key": cache.name, "config": spec.to_dict(), "data": fingerprints})
    return SourceModels(
        dense=dense,
        recovered=recovered.eval(),
        cache=cache,
        pretrain_history=result.history,
        truncation=trunc.to_dict(),
        seconds=seconds,
        from_cache=finished,
    )


# ----------------------------------------------------------------------------- the demo


@dataclass
class DemoResult:
    """Per-target reports (:data:`COLUMNS`), source-side numbers, wall times, and the plain-language verdict."""

    reports: dict[str, EvaluationReport]
    truncation: dict[str, Any]
    seconds: dict[str, float]
    verdict: list[str]
    json_path: Path
    figure_path: Path | None
    from_cache: bool

    def source_line(self) -> str:
        e = self.truncation.get("errors", {})
        return (
            f"source validation error (held-out source persons): {e.get('before_truncation', float('nan')):.2f} deg "
            f"dense, {e.get('after_truncation', float('nan')):.2f} truncated at rank {self.truncation.get('rank')}, "
            f"{e.get('after_recovery', float('nan')):.2f} after recovery"
        )


def summary_table(reports: dict[str, EvaluationReport]) -> str:
    """One row per target: mean ± std over persons of each column (the columns each report has)."""
    names = list(dict.fromkeys(c for rep in reports.values() for c in rep.columns))
    header = ["target", "persons", *names]
    rows = []
    for name, rep in reports.items():
        s = rep.summary()
        cells = [f"{s[c]['mean']:.2f} ± {s[c]['std']:.2f}" if c in s else "-" for c in names]
        rows.append([name, str(len(rep.common_persons())), *cells])
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]

    def fmt(r: list[str]) -> str:
        return "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths)))

    title = (
        "mean angular error (deg) over persons ± std over persons, on images no column adapted on or read the label of"
    )
    return "\n".join([title, fmt(header), "  ".join("-" * w for w in widths), *(fmt(r) for r in rows)])


def verdict(reports: dict[str, EvaluationReport], before: str = COLUMNS[0]) -> list[str]:
    """Plain sentences per target: did each column lower the mean error of ``before``, and for how many persons;
    and, where a report has a labelled column (``meta["calibration"]["column"]``), did its labels beat every
    label-free column."""
    lines = []
    for name, rep in reports.items():
        s = rep.summary()
        others = [c for c in rep.columns if c != before]
        if not rep.common_persons():
            lines.append(f"{name}: no person could be compared ({len(rep.failed)} failed).")
            continue
        b = s[before]["mean"]
        parts = []
        for c in others:
            k, n = rep.improved(before, c)
            a = s[c]["mean"]
            # the difference of the means as printed (a reader subtracts those), so a change that shows as 0.00 is
            # no change to speak of, whichever its sign
            d = _printed_difference(a, b)
            said = "left it unchanged" if d == 0 else "lowered it" if d < 0 else "did NOT lower it"
            parts.append(f"{c} {said} ({a:.2f} deg, {d:+.2f}; lower for {k} of {n} persons)")
        lines.append(f"{name}: {before} {b:.2f} deg; " + "; ".join(parts) + ".")
        labelled = rep.meta.get("calibration", {}).get("column")
        if labelled in rep.columns:
            lines.append(_labels_line(name, rep, labelled))
        if rep.failed:
            failed = ", ".join(map(str, sorted(rep.failed)))
            lines.append(f"{name}: {len(rep.failed)} person(s) failed and are left out: {failed}")
    return lines


def _printed_difference(a: float, b: float) -> float:
    """``a − b`` of the two means as the sentences print them (two decimals): a sentence's numbers then add up."""
    return round(round(a, 2) - round(b, 2), 2)


def _labels_line(name: str, rep: EvaluationReport, labelled: str) -> str:
    """Whether the labelled column beat the best label-free one (by the mean over persons), in words."""
    s = rep.summary()
    free = min((c for c in rep.columns if c != labelled), key=lambda c: s[c]["mean"], default=None)
    if free is None:
        return f"{name}: {labelled} is the only column; there is no label-free one to compare it with."
    a, b = s[labelled]["mean"], s[free]["mean"]
    k, n = rep.improved(free, labelled)
    recipe = rep.meta["calibration"].get("recipe", {})
    how = f"{recipe.get('k', '?')} labelled images per person ({recipe.get('method', '?')} calibration)"
    d = _printed_difference(a, b)
    if d < 0:
        return (
            f"{name}: {how} beat every label-free column: {a:.2f} deg against the best of them, {free} at {b:.2f} "
            f"({d:+.2f}; lower for {k} of {n} persons)."
        )
    return (
        f"{name}: {how} did NOT beat the label-free columns: {a:.2f} deg against {free} at {b:.2f} "
        f"({d:+.2f}; lower for {k} of {n} persons)."
    )


def demo_configs(**overrides: Any) -> list[DemoConfig]:
    """The demo's two parts: the E source on the symmetric MPII-like target (a negative control, where a flip
    sees little of the error) and the studio source S (trained without the symmetry term) on the window-lit
    target W (a positive control), as in the benchmark (docs/flip-premise.md §2); ``overrides`` apply to both."""
    studio_training = {"symmetry_weight": 0.0}
    base = DemoConfig()
    studio = dataclasses.replace(
        base,
        **_studio_specs(base),
        pretrain=dataclasses.replace(base.pretrain, **studio_training),
        truncation=dataclasses.replace(
            base.truncation, recovery=dataclasses.replace(base.truncation.recovery, **studio_training)
        ),
    )
    return [dataclasses.replace(c, **overrides) for c in (base, studio)]


def _declared_size(spec: str) -> int | None:
    """The image side a synthetic world's spec renders at, read from the spec alone; ``None`` for other kinds, whose
    size only their files say."""
    from .data.registry import canonical_spec
    from .data.synthetic import make_domain

    kind, _, options = canonical_spec(spec)
    if kind != "synthetic":
        return None
    return int(dict(options).get("size", inspect.signature(make_domain).parameters["size"].default))


def check_demo_specs(config: DemoConfig) -> None:
    """Refuse, before anything is opened (the source world renders for a minute or more), a spec that is wrong by
    itself (:func:`~alfa.gaze.data.registry.check_spec`) or a synthetic world of another size than the source's."""
    from .data.registry import check_spec

    specs = [config.source, *([config.val_source] if config.val_source else []), *config.targets]
    for spec in specs:
        check_spec(spec)
    trained = _declared_size(config.source)
    for spec in specs[1:]:
        here = _declared_size(spec)
        if trained is not None and here is not None and here != trained:
            raise ValueError(
                f"{spec}: {here}×{here} images, the demo's source model trains on {trained}×{trained}; use data of "
                "that size (a synthetic world takes ?size=N)"
            )


def _check_sizes(source: GazeDataset, others: dict[str | None, GazeDataset | None]) -> None:
    """Refuse, before any training, data of another image size than the source model trains on (a ResNet runs on
    any size and silently gives much worse predictions)."""
    trained = input_size(source)
    for spec, data in others.items():
        if data is not None and (here := input_size(data)) != trained:
            raise ValueError(
                f"{spec}: {here[0]}×{here[1]} images, the demo's source model trains on {trained[0]}×{trained[1]}; "
                "use data of that size (a synthetic world takes ?size=N)"
            )


def run_demo(
    config: DemoConfig | None = None,
    *,
    rebuild: bool = False,
    progress: bool = True,
    device: torch.device | str = "cpu",
) -> DemoResult:
    """Run the whole chain for one source and its targets and write ``results.json`` and ``per_person.png``
    under ``config.out_dir``: per target, :data:`COLUMNS`, each scored on the same images of each person
    (:class:`DemoImages`)."""
    from .recipes import named_recipe

    config = config or DemoConfig()
    t_start = time.time()
    out = Path(config.out_dir)
    seconds: dict[str, float] = {}

    check_demo_specs(config)
    t0 = time.time()
    source = open_data(config.source)
    val = open_data(config.val_source) if config.val_source else None
    targets = {spec: open_data(spec) for spec in config.targets}
    _check_sizes(source, {config.val_source: val, **targets})
    seconds["data"] = time.time() - t0
    out.mkdir(parents=True, exist_ok=True)
    if progress:
        sizes = ", ".join(
            f"{d.name} {len(d)} images / {len(d.persons())} persons" for d in [source, val, *targets.values()] if d
        )
        print(f"data ({seconds['data']:.0f} s): {sizes}", flush=True)

    models = build_source_model(
        config.source_model_spec(),
        source,
        val,
        cache_dir=config.cache_dir,
        rebuild=rebuild,
        progress=progress,
        device=device,
    )
    seconds.update(models.seconds)
    recipes = {column: named_recipe(name) for column, name in RECIPE_COLUMNS.items()}

    reports: dict[str, EvaluationReport] = {}
    for spec, data in targets.items():
        t0 = time.time()
        report = score_target(
            models.recovered, spec, data, config.alfa, config.personalize, config.calibrate, recipes, out, progress
        )
        reports[data.name] = report
        seconds[f"target {data.name}"] = time.time() - t0
        if progress:
            print(report.format_table(), flush=True)

    lines = verdict(reports)
    seconds["total"] = time.time() - t_start
    figure = plot_per_person(reports, out / "per_person.png")
    payload = {
        "config": config.to_dict(),
        "source_cache": str(models.cache),
        "source_from_cache": models.from_cache,
        "pretrain_history": models.pretrain_history,
        "truncation": models.truncation,
        "targets": {name: rep.to_dict() for name, rep in reports.items()},
        "verdict": lines,
        "seconds": seconds,
        "torch_threads": torch.get_num_threads(),
    }
    json_path = write_json(out / "results.json", payload)
    return DemoResult(reports, models.truncation, seconds, lines, json_path, figure, models.from_cache)


def plot_per_person(reports: dict[str, EvaluationReport], path: str | Path) -> Path | None:
    """Per-person error of the source-only model (x) against every other column (y: flip-TTA, Alfa with each
    recipe, the labelled calibration), one panel per target; points below the diagonal are persons it helped."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if not reports:
        return None
    styles = {COLUMNS[1]: ("tab:gray", "s"), COLUMNS[2]: ("tab:green", "o"), COLUMNS[3]: ("tab:red", "^")}
    labelled_style = ("tab:blue", "D")  # the calibration, whatever its k
    fig, axes = plt.subplots(1, len(reports), figsize=(4.8 * len(reports), 4.6), squeeze=False)
    for ax, (name, rep) in zip(axes[0], reports.items()):
        persons = rep.common_persons()
        if not persons or COLUMNS[0] not in rep.columns:
            continue
        before = [rep.columns[COLUMNS[0]][p] for p in persons]
        s = rep.summary()
        afters = {c: [rep.columns[c][p] for p in persons] for c in rep.columns if c != COLUMNS[0]}
        # x spans the source-only errors; y as far again above them and no further, so that a far-off column (the
        # paper's recipe, tens of degrees off on some persons) does not squash the others onto the diagonal: its
        # points beyond sit just under the frame's top edge, and a line of the legend says how many and how far
        x_lo, x_hi = min(before), max(before)
        x_pad = 0.05 * (x_hi - x_lo + 1e-9)
        top = x_hi + max(x_hi - x_lo, 0.25 * x_hi)
        y_lo = min(x_lo, *(min(v) for v in afters.values()))
        y_hi = min(top, max(x_hi, *(max(v) for v in afters.values())))
        y_pad = 0.05 * (y_hi - y_lo + 1e-9)
        above = []
        for column, after in afters.items():
            color, marker = styles.get(column, labelled_style)
            shown = [min(a, y_hi + 0.5 * y_pad) for a in after]
            ax.scatter(
                before, shown, c=color, marker=marker, s=26, zorder=3, label=f"{column}: {s[column]['mean']:.2f}"
            )
            if far := [a for a in after if a > y_hi]:
                above.append(f"{column}: {len(far)} above the frame, up to {max(far):.1f} deg")
        for note in above:  # a line of the legend, which keeps clear of the points
            ax.plot([], [], " ", label=note)
        line = [x_lo - x_pad, x_hi + x_pad]
        ax.plot(line, line, color="0.6", lw=1, ls="--", label="no change")
        ax.set_title(
            f"{name}: source-only {s[COLUMNS[0]]['mean']:.2f} deg (mean over {len(persons)} persons)", fontsize=9
        )
        ax.legend(loc="best", fontsize=7, framealpha=0.85)
        ax.set_xlabel("error of the source-only model (deg)")
        ax.set_ylabel("error after (deg)")
        ax.set_xlim(*line)
        ax.set_ylim(y_lo - y_pad, y_hi + y_pad)
        ax.grid(alpha=0.3)
    fig.tight_layout()
    path = Path(path)
    with atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=130)
    plt.close(fig)
    return path
