"""Test-time personalization (spec §4): one adapter per person, from 5 unlabeled images.

The recipe, per person:

1. the person's first ``n_adapt`` (5) images in dataset order; labels are never read;
2. one augmented copy of each (ColorJitter, GaussianBlur, RandomAffine), drawn **once** per person
   with a seed derived from ``(seed, person)`` and kept fixed over the steps ("each image appears once
   more as an augmented copy"), giving 10 images; each of the 10 also gets its horizontal flip;
3. the 10 images and their 10 flips go through the model as **one** batch of 20 per step, so a
   weight-only adapter such as Alfa computes its adapted weights once per step;
4. loss: flip symmetry ``mean_k ||f(I_k) − FlipYaw(f(flip I_k))||_1`` over the 10 (flipped branch
   detached by default), or the augmentation-consistency alternative; another registered objective
   (:mod:`alfa.gaze.objectives`: roll consistency, flip+roll, RUDA's) declares the views its batch holds
   instead of the flips (:mod:`alfa.gaze.views`: rolls inside the inscribed disc), still one batch per step;
   one that declares targets (TTA distillation's) gets them computed once from the base before the adapter
   is attached;
5. AdamW on the adapter parameters only, base lr 1e-4, ×10 for ResNet-18's ``layer3``/``layer4``;
   the model stays in eval mode (BatchNorm statistics frozen); a fixed number of steps; the last step
   is the result.

The forwards run in the run's precision (:func:`alfa.gaze.precision.forward_precision`; fp32 unless the
caller sets another), the loss and the optimizer in fp32; in fp16 a gradient scaler guards the backward
pass, and a step whose gradients overflow is skipped (the scale is lowered for the next one).

:func:`personalize_and_score` personalizes every person of a dataset and scores each with their own adapter: the
one step the demo, the benchmark and CRATE's gaze study share.

Any registered adapter method works: :func:`personalize` takes its config (``alfa.AlfaConfig()``,
a LoRA config, ...). The base model is shared: the adapter is attached for the person, trained,
saved, and detached, which restores the base bit for bit.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn
from tqdm.auto import tqdm

from alfa.adapters import (
    AdapterConfig,
    adapter_state,
    attach,
    detach,
    load_adapter,
    param_groups,
    read_adapter_metadata,
    save_adapter,
)
from alfa.adapters.groups import is_number
from alfa.fileio import settings_differences, write_json

from .augment import AugmentConfig, augment_images, build_augmentation
from .data.base import GazeDataset, images_differ
from .evaluate import (
    EvaluationReport,
    PersonScorer,
    adapter_filename,
    evaluate,
    load_images,
    readable_failure,
)
from .folder_record import RECORD_FILE, read_record, write_record
from .losses import finite_or_raise
from .objectives import OBJECTIVES
from .precision import autocast, grad_scaler, run_precision
from .views import build_views

__all__ = [
    "LAYER34_PATTERN",
    "PersonalizeConfig",
    "PersonalizeResult",
    "recipe_lr_scale",
    "PersonOutcome",
    "PersonalizationRun",
    "person_seed",
    "build_batch",
    "personalize",
    "personalize_dataset",
    "PersonalizedTarget",
    "personalize_and_score",
    "foreign_adapters",
    "listed_files",
    "RECORD_FILE",
]

# Parameter names inside ResNet-18's third and fourth stage (the paper's ×10 learning rate).
LAYER34_PATTERN = r"(^|\.)layer[34]\."


def _default_lr_scale() -> dict[str, float]:
    return {LAYER34_PATTERN: 10.0}


def recipe_lr_scale(model: nn.Module, lr_scale: dict[str, float]) -> dict[str, float]:
    """A recipe's ``lr_scale`` for ``model`` (its adapter attached): the paper's ×10 on ResNet-18's layer3/layer4
    (:data:`LAYER34_PATTERN`, every recipe's default) is left out where no trained parameter lies in such a stage
    (a ViT gaze model, an adapter on the early layers only), as there it has nothing to scale; ``param_groups``
    refuses any other pattern that selects nothing (a misspelt one)."""
    scales = dict(lr_scale)
    if LAYER34_PATTERN in scales:
        trained = [name for name, p in model.named_parameters() if p.requires_grad]
        if not any(re.search(LAYER34_PATTERN, name) for name in trained):
            del scales[LAYER34_PATTERN]
    return scales


@dataclass
class PersonalizeConfig:
    """The personalization recipe; every value is fixed in advance (never chosen on target labels).

    ``steps``: optimizer steps per person (the number is a per-method setting; 10 is the default
    for every method, as in TPGaze's personalization). ``lr`` is AdamW's base learning rate,
    ``lr_scale`` maps parameter-name patterns to factors (first match wins), ``weight_decay`` is
    AdamW's (PyTorch's default 0.01). ``loss``: a registered objective (:data:`alfa.gaze.objectives.OBJECTIVES`:
    ``"flip"``, flip symmetry, ``"augment"``, augmentation consistency, ``"roll"``, roll consistency, or
    ``"flip+roll"``, ...); ``detach_flipped`` makes the transformed branch (flipped, rolled) a fixed target.
    ``n_adapt``: images per person used for adaptation.

    ``pitch_anchor`` (not in the paper; 0 = off): the weight of a term ``|mean pitch − mean pitch at
    the start|`` over the batch. Neither loss can see a pitch offset shared by all images (pitch is
    mirror-invariant, and both branches shift alike), so nothing else holds it; the anchor holds only
    that one direction, with the model's own start as the reference (no label).
    """

    steps: int = 10
    lr: float = 1e-4
    lr_scale: dict[str, float] = field(default_factory=_default_lr_scale)
    weight_decay: float = 0.01
    n_adapt: int = 5
    loss: str = "flip"
    detach_flipped: bool = True
    augment: AugmentConfig = field(default_factory=AugmentConfig)
    seed: int = 0
    pitch_anchor: float = 0.0

    def validate(self) -> None:
        if self.steps < 1 or self.n_adapt < 1:
            raise ValueError(f"steps and n_adapt must be at least 1, got steps={self.steps}, n_adapt={self.n_adapt}")
        if not self.lr > 0 or self.weight_decay < 0:
            raise ValueError(f"need lr > 0 and weight_decay >= 0, got lr={self.lr}, weight_decay={self.weight_decay}")
        if self.loss not in OBJECTIVES:
            raise ValueError(f"loss must be one of {tuple(OBJECTIVES)}, got {self.loss!r}")
        if not self.pitch_anchor >= 0:
            raise ValueError(f"pitch_anchor must be non-negative, got {self.pitch_anchor}")
        self.augment.validate()

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        if not self.pitch_anchor:  # off: the recipe (and every hash of it) as before the option existed
            del data["pitch_anchor"]
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> PersonalizeConfig:
        data = dict(data)
        aug = data.pop("augment", {})
        aug = {k: tuple(v) if isinstance(v, list) else v for k, v in aug.items()}
        return cls(**data, augment=AugmentConfig(**aug))


@dataclass
class PersonalizeResult:
    """One person's personalization: the loss before each step and after the last one."""

    losses: list[float]
    final_loss: float
    trained_parameters: int
    seconds: float
    tracked: list[float] = field(default_factory=list)  # ``track(model)`` before the first step and after each

    @property
    def initial_loss(self) -> float:
        return self.losses[0]


def person_seed(seed: int, person: str, purpose: str) -> int:
    """A seed for one person and one purpose (``"init"``, ``"augment"``), independent of the order
    in which persons are processed and of Python's hash randomization."""
    digest = hashlib.sha256(f"{seed}\0{person}\0{purpose}".encode()).digest()
    return int.from_bytes(digest[:4], "little") & 0x7FFFFFFF


def build_batch(images: Tensor, config: PersonalizeConfig, seed: int) -> Tensor:
    """The personalization batch: the views the recipe's objective declares (:mod:`alfa.gaze.views`), ``N``
    rows each, made from the ``N`` images and one augmented copy of each (drawn with ``seed``). For the flip
    objectives ``(4·N, 3, H, W)``: the images, their augmented copies, then the horizontal flips of those
    ``2·N`` in the same order."""
    if images.ndim != 4 or images.shape[1] != 3:
        raise ValueError(f"images must be (N, 3, H, W), got {tuple(images.shape)}")
    if not torch.isfinite(images).all():
        raise ValueError("personalization images contain NaN or infinite values")
    pipeline = build_augmentation(config.augment, min(images.shape[-2:]))
    augmented = augment_images(images, config.augment, seed, pipeline)
    return build_views(images, augmented, OBJECTIVES[config.loss].views)


def _loss(
    pred: Tensor, config: PersonalizeConfig, start_pitch: Tensor | None = None, targets: Tensor | None = None
) -> Tensor:
    loss = OBJECTIVES[config.loss](pred, config, targets)
    if config.pitch_anchor and start_pitch is not None:
        loss = loss + config.pitch_anchor * (pred[:, 1].mean() - start_pitch).abs()
    return loss


def _targets(model: nn.Module, images: Tensor, config: PersonalizeConfig) -> Tensor | None:
    """The person's targets if the recipe's objective declares them: computed once, from ``model`` as it is (the
    base, no adapter attached yet), without gradient; ``None`` for the other objectives."""
    objective = OBJECTIVES[config.loss]
    if objective.targets is None:
        return None
    if adapter_state(model) is not None:
        raise RuntimeError(f"the {objective.name!r} targets are the base's: detach the adapter first")
    with torch.no_grad():
        targets = objective.targets(model, images).float()
    if not torch.isfinite(targets).all():
        raise FloatingPointError(f"the {objective.name!r} targets of the base are NaN or infinite")
    return targets.to(next(model.parameters()).device)


def personalize(
    model: nn.Module,
    images: Tensor,
    method: AdapterConfig,
    config: PersonalizeConfig | None = None,
    *,
    seed: int | None = None,
    track: Callable[[nn.Module], float] | None = None,
) -> PersonalizeResult:
    """Personalize ``model`` to one person from ``images`` ``(N, 3, H, W)`` (unlabeled, in ``[0, 1]``).

    Attaches the adapter described by ``method`` to ``model`` (in place), trains it with the recipe of
    ``config`` and **leaves it attached**: save it with :func:`alfa.save_adapter`, fold it in with
    :func:`alfa.merge`, or drop it with :func:`alfa.detach`. ``seed`` fixes the adapter's random init
    and the augmentation (default: ``config.seed``). On any error the adapter is detached again and
    the base is left exactly as it was.

    ``track``, if given, is called with the model (in eval mode, under ``no_grad``) before the first step
    and after every step; its values come back as ``tracked`` (``steps + 1`` of them). It measures, it does
    not change what is trained: no random draw, no gradient (the benchmark's replay of the reference
    protocol uses it to score every step with labels, which the recipe itself never sees).
    """
    config = config or PersonalizeConfig()
    config.validate()
    seed = config.seed if seed is None else seed
    if images.shape[0] < 1:
        raise ValueError("no images to personalize on")
    t0 = time.time()
    device = next(model.parameters()).device
    batch = build_batch(images.float(), config, seed=seed + 1).to(device)
    targets = _targets(model, images.float(), config)
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        torch.manual_seed(seed)
        attach(model, method)
    try:
        was_training = model.training
        model.eval()  # BatchNorm keeps the source statistics; there is no dropout
        scales = recipe_lr_scale(model, config.lr_scale)
        groups = param_groups(model, config.lr, lr_scale=scales, weight_decay=config.weight_decay)
        trained = sum(p.numel() for g in groups for p in g["params"])
        optimizer = torch.optim.AdamW(groups, lr=config.lr, weight_decay=config.weight_decay)
        precision = run_precision()
        scaler = grad_scaler(device, precision)

        def forward() -> Tensor:
            with autocast(device, precision):
                return model(batch).float()  # the loss in fp32

        start_pitch = None
        if config.pitch_anchor:
            with torch.no_grad():
                start_pitch = forward()[:, 1].mean()
        losses, tracked = [], []

        def measure() -> None:
            if track is not None:
                with torch.no_grad():
                    tracked.append(float(track(model)))

        measure()
        for _ in range(config.steps):
            loss = finite_or_raise(_loss(forward(), config, start_pitch, targets), "personalization")
            optimizer.zero_grad(set_to_none=True)
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
            losses.append(loss.item())
            measure()
        with torch.no_grad():
            final = float(finite_or_raise(_loss(forward(), config, start_pitch, targets), "personalization"))
        model.train(was_training)
    except BaseException:
        detach(model)
        raise
    return PersonalizeResult(
        losses=losses, final_loss=final, trained_parameters=trained, seconds=time.time() - t0, tracked=tracked
    )


# ----------------------------------------------------------------------------- a whole dataset


@dataclass
class PersonOutcome:
    """What happened to one person: ``status`` is ``"ok"``, ``"skipped"`` (an adapter of the same
    configuration was already there) or ``"failed"`` (``error`` says why)."""

    person: str
    status: str
    adapter: str | None = None
    losses: list[float] = field(default_factory=list)
    final_loss: float | None = None
    seconds: float = 0.0
    error: str | None = None
    tracked: list[float] = field(default_factory=list)  # see personalize_dataset's ``track``


@dataclass
class PersonalizationRun:
    """All persons of one dataset; written to ``out_dir/personalization.json``."""

    dataset: str
    method: str
    method_config: dict[str, Any]
    config: dict[str, Any]
    persons: dict[str, PersonOutcome]
    written: set[str] = field(default_factory=set)  # file names in the folder that runs there wrote (or began)

    @property
    def failed(self) -> dict[str, str]:
        return {p: o.error or "" for p, o in self.persons.items() if o.status == "failed"}

    def counts(self) -> dict[str, int]:
        """How many persons are ``ok``, ``skipped`` (already done) and ``failed``."""
        return {s: sum(o.status == s for o in self.persons.values()) for s in ("ok", "skipped", "failed")}

    def raise_if_failed(self, allow_partial: bool = False) -> None:
        """Print each failed person to stderr; a run in which a person failed is an error (a script must be
        able to see it), unless ``allow_partial`` and at least one person succeeded. Where several persons, every
        one, failed for the same reason, the reason is said once, in the error."""
        reasons = set(self.failed.values())
        if len(self.failed) > 1 and len(self.failed) == len(self.persons) and len(reasons) == 1:
            raise RuntimeError(
                f"personalization failed for every person ({len(self.failed)}), each alike: {reasons.pop()}"
            )
        for person, error in self.failed.items():
            print(f"FAILED {person}: {error}", file=sys.stderr)
        if not self.failed:
            return
        if len(self.failed) == len(self.persons):
            raise RuntimeError("personalization failed for every person")
        if not allow_partial:
            raise RuntimeError(
                f"personalization failed for {len(self.failed)} of {len(self.persons)} persons (listed above); the "
                "others' adapters are kept, a rerun redoes only the failed ones, --allow-partial accepts the run"
            )

    def to_dict(self) -> dict[str, Any]:
        return {
            "dataset": self.dataset,
            "method": self.method,
            "method_config": self.method_config,
            "config": self.config,
            "persons": {p: dataclasses.asdict(o) for p, o in self.persons.items()},
            "written": sorted(self.written),
        }


def _run_key(method: AdapterConfig, config: PersonalizeConfig) -> dict[str, Any]:
    return {"method": method.method, "method_config": method.to_dict(), "config": config.to_dict()}


def _already_done(
    model: nn.Module, adapter: Path, sidecar: Path, key: dict[str, Any], dataset: GazeDataset, person: str
) -> PersonOutcome | None:
    """The recorded outcome if ``adapter`` was made with the same method and recipe, from ``person``'s images in
    ``dataset`` (:func:`~alfa.gaze.data.base.images_differ`), and fits the base."""
    if not (adapter.is_file() and sidecar.is_file()):
        return None
    try:
        record = json.loads(sidecar.read_text())
        if not isinstance(record, dict) or record.get("key") != json.loads(json.dumps(key)):
            return None
        outcome = _recorded_outcome(record.get("outcome"))
        if outcome is None:  # a sidecar of the wrong shape says nothing of the adapter: the person is redone
            return None
        if images_differ(read_adapter_metadata(adapter).get("about", {}).get("data"), dataset, person) is not None:
            return None
        load_adapter(model, adapter)  # checks the layers and the base fingerprint
    except (ValueError, RuntimeError, OSError, json.JSONDecodeError):
        return None
    detach(model)
    return dataclasses.replace(outcome, status="skipped")


_OUTCOME_KINDS: dict[str, tuple[type, ...]] = {
    "person": (str,),
    "status": (str,),
    "adapter": (str, type(None)),
    "losses": (list,),
    "final_loss": (int, float, type(None)),
    "seconds": (int, float),
    "error": (str, type(None)),
    "tracked": (list,),
}


def _recorded_outcome(out: Any) -> PersonOutcome | None:
    """The :class:`PersonOutcome` a sidecar's ``outcome`` records, or ``None`` where it is not one (valid JSON of
    the wrong kind: not an object, an unknown or missing entry, a number that is text)."""
    if not isinstance(out, dict) or not {"person", "status"} <= set(out) or not set(out) <= set(_OUTCOME_KINDS):
        return None
    for key, value in out.items():
        if isinstance(value, bool) or not isinstance(value, _OUTCOME_KINDS[key]):
            return None
    if not all(is_number(v) for v in (*out.get("losses", ()), *out.get("tracked", ()))):
        return None
    return PersonOutcome(**out)


def foreign_adapters(
    model: nn.Module, dataset: GazeDataset, method: AdapterConfig, config: PersonalizeConfig, out_dir: str | Path
) -> str | None:
    """Why ``out_dir`` holds adapters that a run of ``method`` with ``config`` on ``dataset`` and ``model`` would
    replace (another dataset, or another dataset's images under the same name; another method, recipe or base), or
    ``None`` if it holds none of those. What the command line checks before it writes (``personalize_dataset``
    itself redoes any person whose adapter differs)."""
    out = Path(out_dir)
    try:
        before = read_record(out)
    except ValueError as e:
        return str(e)
    if before is None:
        return None
    made = [p for p, o in before["persons"].items() if o.get("status") in ("ok", "skipped")]
    made = [p for p in made if (out / adapter_filename(p)).is_file()]
    if not made:
        return None  # a run where every person failed left no adapter to replace: any run may go on there
    key = json.loads(json.dumps(_run_key(method, config)))
    if before.get("dataset") != dataset.name:
        return f"its adapters were made on the dataset {before.get('dataset')!r}, not {dataset.name!r}"
    if before.get("method") != key["method"]:
        return f"its adapters are {before.get('method')}, not {key['method']}"
    if before.get("method_config") != key["method_config"]:
        changed = _said_differences(before.get("method_config"), key["method_config"])
        return f"its adapters are {key['method']} with other options ({changed})"
    if before.get("config") != key["config"]:
        return f"its adapters were made with another recipe ({_said_differences(before.get('config'), key['config'])})"
    here = set(dataset.persons())
    readable = []
    for person in made:
        try:
            about = read_adapter_metadata(out / adapter_filename(person)).get("about", {})
        except (ValueError, OSError):
            continue  # a file that does not read is no one's: the run redoes that person
        readable.append(person)
        other_images = made_from_other_images(about, dataset, person, "adapter") if person in here else None
        if other_images is not None:
            return other_images
    for person in readable[:1]:  # a damaged file says nothing of the base: the first that reads is asked
        try:
            load_adapter(model, out / adapter_filename(person))
        except (ValueError, RuntimeError) as e:
            return f"its adapters were trained on another base ({e})"
        detach(model)
    return None


def _said_differences(recorded: Any, ours: dict[str, Any]) -> str:
    """How the record's settings differ from this run's ``ours``, a setting one side leaves out being at its default
    there; a record that holds no mapping of them says so."""
    if not isinstance(recorded, dict):
        return "the folder's record holds none of them"
    return f"the folder's vs this run's: {', '.join(settings_differences(recorded, ours, absent='its default'))}"


class _WriteFailed(Exception):
    """The folder could not be written: the run stops with ``error`` (a person's failure is recorded instead)."""

    def __init__(self, error: OSError) -> None:
        super().__init__(str(error))
        self.error = error


def made_from_other_images(about: dict[str, Any], dataset: GazeDataset, person: str, what: str) -> str | None:
    """Why ``person``'s file (its ``about``), a ``what`` of an earlier run, was not made from this ``dataset``'s
    images of ``person``, or ``None``: made for another person (files renamed or swapped by hand: saying "another
    dataset" then sent the user looking for the wrong thing), or from another dataset's images under this name."""
    recorded = about.get("person")
    if recorded is not None and str(recorded) != person:
        return f"its file for {person!r} holds the {what} of person {recorded!r} (renamed or swapped by hand?)"
    mismatch = images_differ(about.get("data"), dataset, person)
    if mismatch is None:
        return None
    return f"its {what} for {person!r} was made from the images of another dataset named {dataset.name!r}: {mismatch}"


def listed_files(out_dir: str | Path) -> set[str]:
    """The names of the files in ``out_dir`` that personalization runs there wrote or began, as its record
    lists them (the record itself included; a record from before the list: its persons' adapters and sidecars);
    empty without a record. Only these may be replaced or removed by a later run, even with ``--replace``.
    ``ValueError`` if ``personalization.json`` is there but is not such a record."""
    try:
        record = read_record(out_dir)
    except ValueError as e:
        raise ValueError(f"{e}; move it away") from None
    if record is None:
        return set()
    written = set(record.get("written", ()))
    written |= {n for p in record["persons"] for n in (adapter_filename(p), Path(adapter_filename(p)).stem + ".json")}
    return {Path(n).name for n in written} | {RECORD_FILE}


def _refuse_unlisted(out: Path, names: Sequence[str], listed: set[str]) -> None:
    """A file this run would write that is already in ``out`` but that no run there listed is not ours to
    replace (a person named like another file there: ``model`` and the checkpoint)."""
    found = sorted(n for n in names if n not in listed and (out / n).exists())
    if found:
        raise ValueError(
            f"{out} holds {', '.join(found[:3])}{' and more' if len(found) > 3 else ''}, which no personalization "
            "run there wrote: alfa replaces only files it listed; move them, or choose another --out"
        )


def personalize_dataset(
    model: nn.Module,
    dataset: GazeDataset,
    method: AdapterConfig,
    config: PersonalizeConfig | None,
    out_dir: str | Path,
    *,
    persons: Sequence[str] | None = None,
    resume: bool = True,
    progress: bool = True,
    track: Callable[[str], Callable[[nn.Module], float]] | None = None,
    label: str | None = None,
) -> PersonalizationRun:
    """Personalize ``model`` to every person of ``dataset`` and save one adapter per person as
    ``out_dir/<person>.safetensors`` (plus ``<person>.json``: recipe and losses).

    Persons are independent: each one's adapter is initialized and its augmentation drawn from
    ``(config.seed, person)``, and a failure (too few images, NaN input, a diverging loss) is recorded
    and reported while the run goes on. With ``resume``, a person whose adapter already exists with
    the same method, recipe and base, made from the same images (:meth:`GazeDataset.person_signature`), is
    skipped. The base ``model`` is unchanged on return.

    ``track(person)``, if given, returns the measuring function :func:`personalize` calls before the first
    step and after each one for that person; the values land in each outcome's ``tracked`` (a person
    resumed from an earlier run without them is personalized again). ``label``: the progress bar's (default
    ``personalize <dataset>``).
    """
    config = config or PersonalizeConfig()
    config.validate()
    if adapter_state(model) is not None:
        raise RuntimeError("personalize_dataset expects the base model without an adapter (call alfa.detach)")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    persons = list(dataset.persons() if persons is None else persons)
    names = [adapter_filename(p) for p in persons]
    if len(set(names)) != len(names):
        raise ValueError(f"{dataset.name}: person ids collide once made file-safe: {names}")
    key = _run_key(method, config)
    listed = listed_files(out)
    _refuse_unlisted(out, [RECORD_FILE, *names, *(Path(n).stem + ".json" for n in names)], listed)
    run = PersonalizationRun(dataset.name, method.method, method.to_dict(), config.to_dict(), {})
    run.written = listed - {RECORD_FILE}
    bar = tqdm(persons, desc=label or f"personalize {dataset.name}", disable=not progress)
    for person in bar:
        adapter = out / adapter_filename(person)
        sidecar = adapter.with_suffix(".json")
        if not {adapter.name, sidecar.name} <= run.written:  # listed before they exist: a crash leaves them ours
            run.written |= {adapter.name, sidecar.name}
            write_record(out, run.to_dict())
        done = _already_done(model, adapter, sidecar, key, dataset, person) if resume else None
        if done is not None and track is not None and len(done.tracked) != config.steps + 1:
            done = None  # made without the per-step measurements this run asks for
        if done is not None:
            run.persons[person] = done
            continue
        try:
            outcome = _personalize_person(
                model, dataset, person, method, config, adapter, None if track is None else track(person)
            )
        except _WriteFailed as e:
            raise e.error from None
        run.persons[person] = outcome
        if outcome.status == "ok":
            write_json(sidecar, {"key": key, "outcome": dataclasses.asdict(outcome)})
        elif progress:  # said as it happens beside the bar; the command's summary says each failure once more
            tqdm.write(f"personalization of {person!r} failed: {outcome.error}")
        write_record(out, run.to_dict())
    write_record(out, run.to_dict())
    return run


def _personalize_person(
    model: nn.Module,
    dataset: GazeDataset,
    person: str,
    method: AdapterConfig,
    config: PersonalizeConfig,
    path: Path,
    track: Callable[[nn.Module], float] | None = None,
) -> PersonOutcome:
    try:
        indices = dataset.person_indices(person)
        if len(indices) < config.n_adapt + 1:
            raise ValueError(
                f"{len(indices)} images; personalization needs {config.n_adapt} plus at least one to evaluate"
            )
        images = load_images(dataset, indices[: config.n_adapt], what=f"person {person!r}")
        # read before training: a person whose images cannot be read fails here, not after the work
        signature = dataset.person_signature(person, labels=False)  # label-free: the file holds none of the labels
        about = {"dataset": dataset.name, "person": person, "data": signature}
        result = personalize(
            model, images, method, config, seed=person_seed(config.seed, person, "personalize"), track=track
        )
        try:
            save_adapter(model, path, about=about)
        except OSError as e:
            # The folder cannot be written (a full disk): not this person's failure, every next one would fail
            # the same way. The run stops; the adapters done so far are whole and listed, a rerun resumes.
            raise _WriteFailed(e) from e
        finally:
            detach(model)
    except (ValueError, RuntimeError, FloatingPointError, KeyError, OSError) as e:
        if adapter_state(model) is not None:
            detach(model)
        # An adapter left by an earlier run must not stand in for this failed person.
        path.unlink(missing_ok=True)
        path.with_suffix(".json").unlink(missing_ok=True)
        return PersonOutcome(person=person, status="failed", error=readable_failure(e))
    return PersonOutcome(
        person=person,
        status="ok",
        adapter=str(path),
        losses=result.losses,
        final_loss=result.final_loss,
        seconds=result.seconds,
        tracked=result.tracked,
    )


@dataclass
class PersonalizedTarget:
    """Every person of one target personalized with one method and recipe (``run``: each person's outcome and
    losses), then scored with their own adapter (``report``: its ``after`` column, and ``before`` if asked)."""

    run: PersonalizationRun
    report: EvaluationReport


def personalize_and_score(
    base: nn.Module,
    data: GazeDataset,
    method: AdapterConfig,
    recipe: PersonalizeConfig,
    adapter_folder: str | Path,
    *,
    n_adapt: int | None = None,
    persons: Sequence[str] | None = None,
    before: str | None = None,
    after: str = "personalized",
    resume: bool = True,
    track: Callable[[str], Callable[[nn.Module], float]] | None = None,
    score: PersonScorer | None = None,
    progress: bool = True,
    label: str | None = None,
) -> PersonalizedTarget:
    """Personalize ``base`` to every person of ``data`` (or ``persons``) with ``method`` and ``recipe``, one
    adapter each in ``adapter_folder`` (:func:`~alfa.gaze.personalize.personalize_dataset`, with ``resume``
    and ``track``), then score each person's images after the first ``n_adapt`` (``recipe.n_adapt`` by
    default) with that person's adapter loaded (:func:`~alfa.gaze.evaluate.evaluate`: column ``after``, the
    bare base as column ``before`` unless it is ``None``, ``score`` the per-person measurement); ``label``: the
    progress bar's."""
    run = personalize_dataset(
        base,
        data,
        method,
        recipe,
        adapter_folder,
        persons=persons,
        resume=resume,
        progress=progress,
        track=track,
        label=label,
    )
    report = evaluate(
        base,
        data,
        adapters=adapter_folder,
        n_adapt=recipe.n_adapt if n_adapt is None else n_adapt,
        persons=persons,
        before=before,
        after=after,
        progress=False,
        score=score,
    )
    return PersonalizedTarget(run, report)
