"""Fair evaluation (spec §7): per-person angular error on the images not used for adaptation.

For every person of a target dataset, the first ``n_adapt`` images (dataset order) are the ones
personalization may see; the error is measured on the rest, per person, and summarized as the
unweighted mean (and standard deviation) over persons. Nothing here selects a step, an epoch or a
setting: the numbers are those of the model as given.

Also home to the small data helpers every stage shares (loading images and labels by index, running
a model over a dataset), so training, personalization and evaluation read data the same way.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn
from tqdm.auto import tqdm

from alfa.adapters import adapter_state, detach, load_adapter, read_adapter_metadata
from alfa.fileio import PORTABLE_CHARS, write_json

from .data.base import GazeDataset, images_differ, unit_images
from .folder_record import RECORD_FILE, read_record
from .geometry import angular_error
from .precision import autocast

__all__ = [
    "EVAL_BATCH_SIZE",
    "EvaluationReport",
    "load_images",
    "load_examples",
    "predict",
    "predict_images",
    "GazeError",
    "person_gaze_errors",
    "person_errors",
    "PersonScorer",
    "evaluate",
    "RECORD_FILE",
    "adapter_filename",
    "readable_failure",
]


# ----------------------------------------------------------------------------- data helpers


EVAL_BATCH_SIZE = 256
"""Images per forward when a model only predicts (evaluation, validation): a memory setting, since the model
is in eval mode and each prediction is its image's alone."""

INPUT_SCALING = "rgb float in [0, 1] (uint8 / 255), no mean/std normalization"
"""How :func:`load_images` scales pixels, the one convention of every gaze model here; checkpoints record it."""


def load_raw_images(dataset: GazeDataset, indices: Sequence[int], what: str | None = None) -> Tensor:
    """Images ``(N, 3, H, W)`` of the given items as the dataset stores them (:meth:`GazeDataset.raw_images`:
    uint8 where the source is 8-bit); :func:`~alfa.gaze.data.base.unit_images` makes them float32 in ``[0, 1]``.

    Raises a ``ValueError`` naming the dataset and item if a float image holds NaN or infinite values.
    """
    indices = [int(i) for i in indices]
    if not indices:
        raise ValueError(f"{dataset.name}: no images requested{f' ({what})' if what else ''}")
    raw = dataset.raw_images(indices)
    if raw.is_floating_point():  # 8-bit images are finite by their type
        bad = ~torch.isfinite(raw.float().flatten(1)).all(1)  # as float32: a float64 beyond its range is infinite
        if bad.any():
            first = indices[int(bad.nonzero()[0])]
            where = f" ({what})" if what else ""
            raise ValueError(f"{dataset.name}: image {first}{where} contains NaN or infinite values")
    return raw


def load_images(dataset: GazeDataset, indices: Sequence[int], what: str | None = None) -> Tensor:
    """Images ``(N, 3, H, W)`` float32 in ``[0, 1]`` of the given items; labels are not touched.

    Raises a ``ValueError`` naming the dataset and item if an image holds NaN or infinite values.
    """
    return unit_images(load_raw_images(dataset, indices, what))


def load_examples(dataset: GazeDataset, indices: Sequence[int]) -> tuple[Tensor, Tensor]:
    """Images (as :func:`load_images`) and ``(yaw, pitch)`` labels ``(N, 2)`` of the given items."""
    return load_images(dataset, indices), dataset.labels(indices)


def _device_of(model: nn.Module) -> torch.device:
    p = next(model.parameters(), None)
    return p.device if p is not None else torch.device("cpu")


@torch.no_grad()
def predict_images(model: nn.Module, images: Tensor, batch_size: int = EVAL_BATCH_SIZE) -> Tensor:
    """``(yaw, pitch)`` predictions ``(N, 2)`` for a tensor of images, model in eval mode (restored after),
    its forwards in the run's precision (:mod:`alfa.gaze.precision`), the predictions in fp32."""
    was_training = model.training
    model.eval()
    device = _device_of(model)
    out = []
    try:
        for start in range(0, images.shape[0], batch_size):
            with autocast(device):
                pred = model(images[start : start + batch_size].to(device))
            out.append(pred.float().cpu())
    finally:
        model.train(was_training)
    return torch.cat(out) if out else torch.zeros(0, 2)


def predict(
    model: nn.Module, dataset: GazeDataset, indices: Sequence[int], batch_size: int = EVAL_BATCH_SIZE
) -> Tensor:
    """``(yaw, pitch)`` predictions ``(N, 2)`` for the given items, model in eval mode (restored after)."""
    indices = list(indices)
    out = [
        predict_images(model, load_images(dataset, indices[s : s + batch_size]), batch_size)
        for s in range(0, len(indices), batch_size)
    ]
    return torch.cat(out) if out else torch.zeros(0, 2)


def eval_indices(dataset: GazeDataset, person: str, n_adapt: int) -> list[int]:
    """The person's images not used for adaptation (all but the first ``n_adapt`` in dataset order)."""
    return dataset.person_indices(person)[n_adapt:]


@dataclass(frozen=True)
class GazeError:
    """One person's error over the scored images, in degrees: the angular error, and per component the mean
    absolute error, the mean signed bias (prediction − label) and the mean square (degrees²). The bias separates a
    shift of every prediction (e.g. a pitch offset, which the flip-symmetry loss cannot see) from scatter; since
    ``mean square = bias² + variance`` per component, ``bias² / (yaw_ms + pitch_ms)`` is the exact share of the
    person's (yaw, pitch) mean-square error that one constant correction removes."""

    angular: float
    yaw: float
    pitch: float
    yaw_bias: float
    pitch_bias: float
    yaw_ms: float
    pitch_ms: float

    @classmethod
    def of(cls, pred: Tensor, gaze: Tensor) -> GazeError:
        pred, gaze = pred.double(), gaze.double()
        diff = torch.rad2deg(pred - gaze)  # (yaw, pitch) in radians
        return cls(
            angular=float(angular_error(pred, gaze).mean()),
            yaw=float(diff[:, 0].abs().mean()),
            pitch=float(diff[:, 1].abs().mean()),
            yaw_bias=float(diff[:, 0].mean()),
            pitch_bias=float(diff[:, 1].mean()),
            yaw_ms=float((diff[:, 0] ** 2).mean()),
            pitch_ms=float((diff[:, 1] ** 2).mean()),
        )

    def parts(self) -> dict[str, float]:
        """The component errors, for a results file (the angular error is stored on its own)."""
        return {
            "yaw": self.yaw,
            "pitch": self.pitch,
            "yaw_bias": self.yaw_bias,
            "pitch_bias": self.pitch_bias,
            "yaw_ms": self.yaw_ms,
            "pitch_ms": self.pitch_ms,
        }


def person_gaze_errors(
    model: nn.Module,
    dataset: GazeDataset,
    persons: Sequence[str] | None = None,
    n_adapt: int = 5,
    batch_size: int = EVAL_BATCH_SIZE,
    progress: bool = False,
    desc: str = "evaluate",
) -> dict[str, GazeError]:
    """:class:`GazeError` per person over the images after the first ``n_adapt``. Images are read a batch at a
    time (a person of ETH-XGaze has 9,000 faces: 5 GB as one float tensor), in the batches the model sees."""
    persons = list(dataset.persons() if persons is None else persons)
    errors: dict[str, GazeError] = {}
    for person in tqdm(persons, desc=desc, disable=not progress, leave=False):
        idx = eval_indices(dataset, person, n_adapt)
        if not idx:
            raise ValueError(f"{dataset.name}: person {person!r} has no image left for evaluation after {n_adapt}")
        errors[person] = GazeError.of(predict(model, dataset, idx, batch_size), dataset.labels(idx))
    return errors


def person_errors(
    model: nn.Module,
    dataset: GazeDataset,
    persons: Sequence[str] | None = None,
    n_adapt: int = 5,
    batch_size: int = EVAL_BATCH_SIZE,
    progress: bool = False,
    desc: str = "evaluate",
) -> dict[str, float]:
    """Mean angular error (degrees) per person over the images after the first ``n_adapt``."""
    parts = person_gaze_errors(model, dataset, persons, n_adapt, batch_size, progress, desc)
    return {person: e.angular for person, e in parts.items()}


PersonScorer = Callable[[nn.Module, GazeDataset, list[str], int], dict[str, GazeError]]
"""``(model, dataset, persons, n_adapt) -> {person: GazeError}`` over each person's scored images, as
:func:`person_gaze_errors`."""


def readable_failure(error: BaseException) -> str:
    """A person's failure as a user reads it: a refusal of the data or the recipe (``ValueError``, ``KeyError``)
    by its message alone, anything else with its kind (an ``OSError`` of a file, a ``RuntimeError`` of PyTorch,
    a ``FloatingPointError`` of a diverging loss)."""
    if isinstance(error, KeyError) and error.args:
        return str(error.args[0])
    if isinstance(error, ValueError):
        return str(error)
    return f"{type(error).__name__}: {error}"


def adapter_filename(person: str) -> str:
    """File name of a person's adapter: the id with anything but ``[A-Za-z0-9._-]`` replaced by ``_``.

    ASCII (:data:`alfa.fileio.PORTABLE_CHARS`), not :func:`alfa.fileio.safe_filename`'s rule: that one keeps
    ``=`` and non-ASCII letters, which no user id ``alfa serve`` takes has, and every ASCII id keeps the name it
    always had."""
    safe = "".join(c if c in PORTABLE_CHARS else "_" for c in person)
    return f"{safe or '_'}.safetensors"


# ----------------------------------------------------------------------------- the report


def _mean_std(values: Sequence[float]) -> tuple[float, float]:
    if not values:
        return float("nan"), float("nan")
    t = torch.tensor(list(values), dtype=torch.float64)
    std = float(t.std(unbiased=False)) if len(values) > 1 else 0.0
    return float(t.mean()), std


@dataclass
class EvaluationReport:
    """Per-person errors of one or more models ("columns") on one dataset.

    ``columns`` maps a column name (e.g. ``"source-only"``, ``"alfa"``) to ``person -> error`` in
    degrees; a person missing from a column (its personalization failed) is listed in ``failed``
    with the reason. Means and standard deviations are over the persons present in every column,
    so the columns are always compared on the same persons. The first column is the one every other is
    compared with (the source model alone); ``without_tta`` maps a column of test-time augmentation to the
    column of the same model without it, which it is compared with too (:meth:`comparisons`). ``pool``: images
    at the end of each person's that no column scored, set aside for a labelled calibration (the demo's), said
    with the adaptation images wherever the report says what it scored.
    """

    dataset: str
    n_adapt: int
    persons: list[str]
    n_eval: dict[str, int]
    columns: dict[str, dict[str, float]] = field(default_factory=dict)
    failed: dict[str, str] = field(default_factory=dict)
    meta: dict[str, Any] = field(default_factory=dict)
    without_tta: dict[str, str] = field(default_factory=dict)
    pool: int = 0

    def common_persons(self) -> list[str]:
        return [p for p in self.persons if all(p in col for col in self.columns.values())]

    def summary(self) -> dict[str, dict[str, float]]:
        """Per column: mean and std over the common persons, and their number."""
        common = self.common_persons()
        out = {}
        for name, col in self.columns.items():
            mean, std = _mean_std([col[p] for p in common])
            out[name] = {"mean": mean, "std": std, "persons": len(common)}
        return out

    def improved(self, before: str, after: str) -> tuple[int, int]:
        """(number of persons whose error dropped from ``before`` to ``after``, number compared)."""
        common = self.common_persons()
        return sum(self.columns[after][p] < self.columns[before][p] for p in common), len(common)

    def comparisons(self) -> list[tuple[str, str]]:
        """The ``(before, after)`` pairs of columns the table and the JSON count persons for: every column against
        the first (the source model alone), then each column of test-time augmentation against the same model
        without it (``without_tta``; the base's is the first pair already), then against the base under the same
        augmentation (what adapting adds once the free augmentation is applied). Only these: two neighbouring
        columns may be unrelated (the personalized model and the base under TTA)."""
        names = list(self.columns)
        pairs = [(names[0], after) for after in names[1:]]
        base_tta = next((tta for tta, plain in self.without_tta.items() if plain == names[0]), None)
        for after, before in self.without_tta.items():
            if after in self.columns and before in self.columns and (before, after) not in pairs:
                pairs.append((before, after))
        for after, before in self.without_tta.items():
            if before != names[0] and after in self.columns and base_tta in self.columns:
                pairs.append((base_tta, after))
        return pairs

    def to_dict(self) -> dict[str, Any]:
        pairs = {}
        for a, b in self.comparisons():
            k, n = self.improved(a, b)
            pairs[f"{b} vs {a}"] = {"improved": k, "compared": n}
        return {
            "dataset": self.dataset,
            "n_adapt": self.n_adapt,
            **({"pool": self.pool} if self.pool else {}),
            "protocol": (
                "angular error in degrees per person over that person's images except the first n_adapt "
                "(used for adaptation)"
                + (f" and the last {self.pool} (a labelled calibration's pool)" if self.pool else "")
                + ", unweighted mean over persons; last step reported, nothing selected"
            ),
            "persons": {
                p: {"n_eval": self.n_eval[p], **{c: col.get(p) for c, col in self.columns.items()}}
                for p in self.persons
            },
            "summary": self.summary(),
            "improved": pairs,
            "failed": self.failed,
            "meta": self.meta,
        }

    def failure_lines(self) -> list[str]:
        """One ``FAILED person: why`` line per person who could not be scored."""
        return [f"FAILED {p}: {why}" for p, why in self.failed.items()]

    def format_table(self, per_person: bool = True, failures: bool = True) -> str:
        """The per-person table (``per_person``), the means and the :meth:`comparisons`, then, with ``failures``,
        the :meth:`failure_lines` (a command that pipes the table to stdout says them on stderr instead). The Δ
        column is the last column's error minus the first's."""
        names = list(self.columns)
        header = ["person", "n_eval", *names]
        if len(names) >= 2:
            header.append(f"Δ {names[-1]}")
        rows: list[list[str]] = []
        if per_person:
            for p in self.persons:
                vals = [self.columns[c].get(p) for c in names]
                row = [p, str(self.n_eval.get(p, "")), *("failed" if v is None else f"{v:.2f}" for v in vals)]
                if len(names) >= 2:
                    a, b = vals[0], vals[-1]
                    row.append("" if a is None or b is None else f"{b - a:+.2f}")
                rows.append(row)
        summary = self.summary()
        mean_row = ["mean ± std", ""] + [f"{summary[c]['mean']:.2f} ± {summary[c]['std']:.2f}" for c in names]
        if len(names) >= 2:
            mean_row.append(f"{summary[names[-1]]['mean'] - summary[names[0]]['mean']:+.2f}")
        widths = [max(len(r[i]) for r in [header, *rows, mean_row]) for i in range(len(header))]

        def fmt(r: list[str]) -> str:
            return "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths)))

        rule = "  ".join("-" * w for w in widths)
        n_common = len(self.common_persons())
        lines = [
            f"{self.dataset}: angular error (deg) per person, {self.n_adapt} adaptation "
            f"image{'' if self.n_adapt == 1 else 's'} "
            + (f"and the calibration's pool of {self.pool} " if self.pool else "")
            + f"excluded, mean over {n_common} persons",
            fmt(header),
            rule,
            *(fmt(r) for r in rows),
        ]
        if rows:
            lines.append(rule)
        if n_common == 0:  # a mean and a count over nobody would print nan and "0 of 0"
            lines.append("no person was scored in every column: no mean and no comparison")
        else:
            lines.append(fmt(mean_row))
            for a, b in self.comparisons():
                k, n = self.improved(a, b)
                lines.append(f"{b} vs {a}: error lower for {k} of {n} persons")
        if failures:
            lines += self.failure_lines()
        return "\n".join(lines)

    def save_json(self, path: str | os.PathLike) -> Path:
        return write_json(path, self.to_dict())


# ----------------------------------------------------------------------------- before / after


def evaluate(
    model: nn.Module,
    dataset: GazeDataset,
    *,
    adapters: str | os.PathLike | None = None,
    n_adapt: int = 5,
    persons: Sequence[str] | None = None,
    before: str | None = "source-only",
    after: str = "personalized",
    batch_size: int = EVAL_BATCH_SIZE,
    progress: bool = True,
    predictor: Callable[[nn.Module], nn.Module] | None = None,
    score: PersonScorer | None = None,
) -> EvaluationReport:
    """Per-person error of ``model`` (the shared base, no adapter attached) and, if ``adapters`` is a
    folder of per-person adapter files (as :func:`alfa.gaze.personalize.personalize_dataset` writes),
    of the base with each person's own adapter loaded.

    ``predictor`` wraps the model that predicts (adapters still load into ``model`` itself), e.g.
    :class:`alfa.gaze.flip.FlipTTA` to score flip test-time augmentation of the base and of every adapter.

    ``before`` ``None`` leaves the base's own column out. ``score(model, dataset, [person], n_adapt)``, if
    given, measures each person with their adapter loaded (:func:`person_gaze_errors` by default), so a
    caller can keep more of the measurement than the angular error the report holds.

    A person whose adapter file is missing or does not load is left out of the ``after`` column and
    listed in ``report.failed``; the run goes on. So is a user calibration (``alfa calibrate``) whose labelled
    images, which its file records, would be among the scored ones.
    """
    if adapter_state(model) is not None:
        raise RuntimeError("evaluate expects the base model without an adapter attached (call alfa.detach)")
    if after == before:  # one column would silently replace the other
        raise ValueError(f"the adapted column and the base's are both named {after!r}: name them apart")
    persons = list(dataset.persons() if persons is None else persons)
    n_eval = {p: len(eval_indices(dataset, p, n_adapt)) for p in persons}
    empty = [p for p, n in n_eval.items() if n == 0]
    report = EvaluationReport(dataset=dataset.name, n_adapt=n_adapt, persons=persons, n_eval=n_eval)
    for p in empty:
        report.failed[p] = f"fewer than {n_adapt + 1} images: nothing left to evaluate"
    scored = [p for p in persons if n_eval[p] > 0]
    predicting = model if predictor is None else predictor(model)
    if before is not None:
        report.columns[before] = person_errors(predicting, dataset, scored, n_adapt, batch_size, progress, desc=before)
    if adapters is None:
        return report
    folder = Path(adapters)
    col: dict[str, float] = {}
    for person in tqdm(scored, desc=after, disable=not progress, leave=False):
        path = folder / adapter_filename(person)
        if not path.is_file():
            report.failed[person] = _failure_reason(folder, person) or f"no adapter file {path}"
            continue
        try:
            about = read_adapter_metadata(path)["about"]
            made_for = (about.get("dataset", dataset.name), about.get("person", person))
            if made_for != (dataset.name, person):  # files from before this record pass
                raise ValueError(
                    f"it was made for person {made_for[1]!r} of {made_for[0]!r}, not {person!r} of {dataset.name!r}"
                )
            other_images = images_differ(about.get("data"), dataset, person)
            if other_images is not None:
                named = f"another dataset named {dataset.name!r}"
                raise ValueError(f"it was made from the images of {named}: {other_images}")
            labelled = about.get("labelled", [])
            if not (isinstance(labelled, list) and all(type(i) is int for i in labelled)):
                raise ValueError("its record of the labelled images ('labelled') is not a list of image indices")
            seen = sorted(set(labelled) & set(eval_indices(dataset, person, n_adapt)))
            if seen:  # a user calibration's labelled images are never scored
                raise ValueError(f"it was calibrated on the labels of images {seen[:5]}, which would be scored")
            load_adapter(model, path)
        except (ValueError, RuntimeError, OSError) as e:
            report.failed[person] = f"adapter {path} does not load: {e}"
            continue
        try:
            if score is None:
                col.update(person_errors(predicting, dataset, [person], n_adapt, batch_size))
            else:
                col.update({p: e.angular for p, e in score(predicting, dataset, [person], n_adapt).items()})
        finally:
            detach(model)
    report.columns[after] = col
    return report


def _failure_reason(folder: Path, person: str) -> str | None:
    """The error recorded by personalization for a person without an adapter, if any."""
    try:
        record = read_record(folder)
    except ValueError:  # a damaged record says nothing of why
        return None
    entry = (record or {}).get("persons", {}).get(person, {})
    return f"personalization failed: {entry['error']}" if entry.get("error") else None
