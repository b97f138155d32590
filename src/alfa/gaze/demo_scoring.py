"""How the demo (:mod:`alfa.gaze.pipeline`, ``alfa demo``) scores one target: its columns (:data:`COLUMNS`), which
of each person's images each column adapts on, reads the labels of and is scored on (:class:`DemoImages`), the
labelled column (:func:`calibrate_and_score`) and every column of one target (:func:`score_target`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from alfa.adapters import AlfaConfig
from alfa.fileio import safe_filename

from .calibrate import CalibrateConfig, calibrate_dataset
from .data.base import GazeDataset
from .evaluate import EvaluationReport, adapter_filename, eval_indices, evaluate
from .folder_record import RECORD_FILE, read_record
from .personalize import PersonalizeConfig, personalize_and_score

__all__ = ["COLUMNS", "RECIPE_COLUMNS", "calibration_column", "DemoImages", "calibrate_and_score", "score_target"]


# ----------------------------------------------------------------------------- the columns


def calibration_column(config: CalibrateConfig) -> str:
    """The name of the labelled column for a calibration recipe."""
    return f"calibrated ({config.k} labels)"


COLUMNS = (
    "source-only",
    "flip-TTA",
    "alfa (default recipe)",
    "alfa (paper recipe)",
    calibration_column(CalibrateConfig()),
)
"""The demo's columns: the truncated + recovered source model, its flip test-time augmentation (the ceiling of
any flip-based correction, docs/flip-premise.md §1), Alfa with ``alfa personalize``'s default recipe (selected
without target labels, ``alfa/gaze/selected_recipes.json``), Alfa with the paper's recipe, and ``alfa
calibrate``'s default (an affine map of (yaw, pitch) pulled toward the identity) fitted on 9 labelled images
per person: the one column that reads target labels, what the label-free ones are up against."""

RECIPE_COLUMNS = {COLUMNS[2]: "default", COLUMNS[3]: "paper"}


# ----------------------------------------------------------------------------- which images each column uses


class _PersonOrder(GazeDataset):
    """``dataset`` with each person's images a given selection, in a given order, under their own indices (so that
    every index a report names is one of ``dataset``)."""

    def __init__(self, dataset: GazeDataset, order: dict[str, list[int]]) -> None:
        self.dataset, self.name, self._index = dataset, dataset.name, order

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, i: int) -> dict:
        return self.dataset[i]

    def labels(self, indices: Sequence[int]) -> Tensor:
        return self.dataset.labels(indices)

    def raw_images(self, indices: Sequence[int]) -> Tensor:
        return self.dataset.raw_images(indices).contiguous()  # as the items stacked were

    def persons(self) -> list[str]:
        return [p for p in self.dataset.persons() if p in self._index]


@dataclass(frozen=True)
class DemoImages:
    """Which of each target person's images (indices of ``dataset``, in its order) each column uses.

    ``adapt``: the first ``n_adapt``, which the label-free columns adapt on without their labels; ``pool``: the
    last ``pool``, from which the calibration draws its ``k`` labelled images; ``scored``: the images between,
    on which **every** column is scored, so the columns compare on the same images and no column is ever scored
    on an image it adapted on or whose label it read. The pool comes last rather than first (where
    ``alfa calibrate`` takes it) so that the label-free columns keep the protocol of every other command (adapt
    on a person's first images, score the ones after) and their images: the synthetic worlds render each
    person's images in a fixed sequence, so rendering ``pool`` more per person (as the demo's targets do) leaves
    the first ones, and the label-free columns' numbers, exactly what they were without the calibration."""

    dataset: GazeDataset
    adapt: dict[str, list[int]]
    scored: dict[str, list[int]]
    pool: dict[str, list[int]]

    @classmethod
    def split(cls, dataset: GazeDataset, n_adapt: int, pool: int) -> DemoImages:
        """Split each person's images; a ``ValueError`` names a person with fewer than ``n_adapt + pool + 1``."""
        adapt, scored, drawn = {}, {}, {}
        for person in dataset.persons():
            indices = dataset.person_indices(person)
            if len(indices) < n_adapt + pool + 1:
                raise ValueError(
                    f"{dataset.name}: person {person!r} has {len(indices)} images; the demo needs {n_adapt} to adapt "
                    f"on, {pool} for the calibration's pool and at least one to score"
                )
            cut = len(indices) - pool
            adapt[person], scored[person], drawn[person] = indices[:n_adapt], indices[n_adapt:cut], indices[cut:]
        return cls(dataset, adapt, scored, drawn)

    def label_free(self) -> GazeDataset:
        """The view the label-free columns run on: each person's ``adapt`` then ``scored`` images (score with
        ``n_adapt = len(adapt)``)."""
        return _PersonOrder(self.dataset, {p: self.adapt[p] + self.scored[p] for p in self.adapt})

    def calibration(self) -> GazeDataset:
        """The view the calibration runs on, laid out as ``alfa calibrate`` takes a dataset: each person's
        ``pool`` first, then the ``scored`` images (score with ``n_adapt = len(pool)``)."""
        return _PersonOrder(self.dataset, {p: self.pool[p] + self.scored[p] for p in self.pool})


def calibrate_and_score(
    base: nn.Module, images: DemoImages, config: CalibrateConfig, folder: str | Path, column: str
) -> EvaluationReport:
    """``alfa calibrate`` with ``config`` on every person of ``images`` (:func:`~alfa.gaze.calibrate.calibrate_dataset`:
    ``k`` labelled images drawn from the person's pool, one file each in ``folder``), then each person scored
    with their own file on their ``scored`` images (column ``column``; :func:`~alfa.gaze.evaluate.evaluate`
    refuses a file whose labelled images would be scored). ``meta``: per person, the ``labelled`` indices and
    the ``scored`` ones. The fit is redone on every run (a closed form takes milliseconds), so no file of an
    earlier run, made for other data under the same name, stands in for this one's."""
    if any(len(drawn) != config.pool for drawn in images.pool.values()):
        raise ValueError(f"the calibration draws from a pool of {config.pool} images; these images hold another")
    folder = Path(folder)
    if (record := read_record(folder)) is not None:  # only the files the earlier run listed: alfa replaces only its own
        for person in record["persons"]:
            (folder / adapter_filename(person)).unlink(missing_ok=True)
        (folder / RECORD_FILE).unlink()
    view = images.calibration()
    # calibrate_dataset seeds the global generator per person; the run's own stream is restored after it
    with torch.random.fork_rng(devices=[]):
        done = calibrate_dataset(base, view, config, folder, progress=False)
    report = evaluate(base, view, adapters=folder, n_adapt=config.pool, before=None, after=column, progress=False)
    for person, entry in done["persons"].items():
        if entry["status"] == "failed":
            report.failed[person] = f"calibration failed: {entry['error']}"
    report.meta = {
        "labelled": {p: e["labelled"] for p, e in done["persons"].items() if e["status"] == "ok"},
        "scored": {p: eval_indices(view, p, config.pool) for p in report.columns[column]},
    }
    return report


# ----------------------------------------------------------------------------- one target


def score_target(
    base: nn.Module,
    spec: str,
    data: GazeDataset,
    alfa: AlfaConfig,
    personalize: PersonalizeConfig,
    calibrate: CalibrateConfig,
    recipes: dict[str, Any],
    out: Path,
    progress: bool,
) -> EvaluationReport:
    """One target's report: every column of :data:`COLUMNS` scored on the same images (:class:`DemoImages`), with
    a demo part's Alfa config, personalization and calibration recipes (``recipes``: each Alfa column's)."""
    from .flip import FlipTTA

    n_adapt = personalize.n_adapt
    images = DemoImages.split(data, n_adapt, calibrate.pool)
    label_free = images.label_free()
    options = {"n_adapt": n_adapt, "progress": False}
    report = evaluate(base, label_free, before=COLUMNS[0], **options)
    tta = evaluate(base, label_free, before=COLUMNS[1], predictor=FlipTTA, **options)
    report.columns.update(tta.columns)
    losses = {}
    folders = out / "adapters" / safe_filename(data.name)
    for column, recipe in recipes.items():
        adapted = personalize_and_score(
            base,
            label_free,
            alfa,
            recipe.apply(personalize),
            folders / RECIPE_COLUMNS[column],
            n_adapt=n_adapt,
            after=column,
            progress=progress,
            label=f"personalize {data.name} ({RECIPE_COLUMNS[column]} recipe)",
        )
        report.columns[column] = adapted.report.columns[column]
        report.failed.update({p: f"{column}: {why}" for p, why in adapted.report.failed.items()})
        losses[column] = {
            p: {"first": o.losses[0], "final": o.final_loss} for p, o in adapted.run.persons.items() if o.losses
        }
    report.pool = calibrate.pool  # the label-free view holds none of it: said where the report says what it scored
    scored = {p: eval_indices(label_free, p, n_adapt) for p in report.persons}
    labelled = calibration_column(calibrate)
    calibrated = calibrate_and_score(base, images, calibrate, folders / "calibrated", labelled)
    report.columns[labelled] = calibrated.columns[labelled]
    report.failed.update({p: f"{labelled}: {why}" for p, why in calibrated.failed.items()})
    report.meta = {
        "spec": spec,
        "recipes": {column: {"label": r.label, **dataclasses.asdict(r)} for column, r in recipes.items()},
        "personalization_loss": losses,
        "calibration": {"column": labelled, "recipe": dataclasses.asdict(calibrate)},
        # the dataset indices each column read: the label-free columns adapt on "adapted" (unlabelled), the
        # calibration reads the labels of "labelled"; every column is scored on its "scored" images
        "images": {
            "protocol": (
                f"every column scored on each person's images after the first {n_adapt} (adapted on, unlabelled) "
                f"and before the last {calibrate.pool} (the calibration's pool, of which it read "
                f"{calibrate.k} labels)"
            ),
            "adapted": images.adapt,
            "labelled": calibrated.meta["labelled"],
            "scored": {**{c: scored for c in report.columns if c != labelled}, labelled: calibrated.meta["scored"]},
        },
    }
    return report
