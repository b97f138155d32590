"""One benchmark record, typed: :class:`Record`, its fields, and its JSON form in ``results.json``.

A record is one (method, pair, seed) row of the report's tables, or one recipe selection of a method on a
source's stand-in (kind ``"selection"``, never a row). Every record has the fields of :data:`REQUIRED`; the
others are measured only by some kinds (a selection's grid, a personalized method's losses, an oracle's
labelled images) or only by records scored since the measure exists (the yaw/pitch parts, their mean squares,
what a flip sees), and are ``None`` where a record does not have them.

:meth:`Record.from_dict` reads the JSON form and refuses a missing required key or an unknown key by name;
:meth:`Record.to_dict` writes it back in the order :func:`~alfa.study.bench.produce.produce_record` fills it,
so a record read and written again is the same JSON text. How a record's ``config_hash`` is computed, and the
version of the results file, are :mod:`alfa.study.bench.schema`'s.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = ["REQUIRED", "OPTIONAL", "Record", "as_records"]


@dataclass
class Record:
    """One record of ``results.json`` (see the module's docstring). Per-person values are keyed by person;
    errors are in degrees, times in seconds, memory in MiB, sizes in parameters or bytes."""

    # What the record is: its id (``"alfa|E→M|seed0"``), its hash (the resume key), its row and base.
    id: str
    config_hash: str
    method: str  # the row's label, e.g. "alfa[H=1]"
    group: str  # "main", "sanity", "selection", "selected" or the ablation's name
    ablation: dict[str, Any] | None  # {"name", "value"} of an ablation row
    kind: str  # see alfa.study.bench.variants.Variant
    pair: str
    source: str
    target: str
    seed: int
    base: str  # "truncated", "dense" or "truncated d=<rank>"
    # What it cost (None: not measured for its kind).
    steps: int | None
    failed: dict[str, str]  # person (or "recipe person") -> why it failed
    trainable_params: int
    inference_params: int
    compact_merge_params: int
    merge: str
    adapter_bytes: int | None
    compact_bytes: int | None
    seconds_per_user: float | None
    cpu_seconds_per_user: float | None
    peak_rss_mib: float | None
    peak_rss_increase_mib: float | None
    latency_ms: float | None
    base_latency_ms: float | None
    # What it scored (None: a NaN mean, which JSON stores as null).
    persons: int
    per_person: dict[str, float]
    error_deg: float | None
    wall_s: float
    cpu_s: float
    finished: str  # ISO time
    # A table row's measures, by kind.
    selected_recipe: dict[str, Any] | None = None  # a selected row: the recipe its selection chose
    default_recipe: dict[str, Any] | None = None  # a default row: the recipe alfa personalize shipped for it
    constant_prediction_deg: float | None = None  # the rows without adaptation: always predicting the mean gaze
    labelled_images_per_person: int | None = None  # the oracle, a user-calibration row (its k)
    calibration: dict[str, Any] | None = None  # a user-calibration row: its recipe, the stand-in's choice, draws
    method_config: dict[str, Any] | None = None  # a personalized method: its adapter's config
    recipe: dict[str, Any] | None = None  # ... and the personalization recipe it ran
    per_person_steps: dict[str, list[float]] | None = None  # ... the error on all images after every step
    reference_protocol_deg: float | None = None  # ... the best of those steps per person (test-label selection)
    loss: dict[str, float] | None = None  # ... the first and final loss, mean over persons
    meta_only: dict[str, Any] | None = None  # TPGaze: its meta-trained prompts before any step
    pnpga: dict[str, Any] | None = None  # PnP-GA: its ensemble, other predictors' errors, its cost per person
    distill: dict[str, Any] | None = None  # TTA distilled: passes (1) against the teacher TTA's, the teacher's error
    domain_protocol: dict[str, Any] | None = None  # ... adapted on one person, scored on the whole target
    tta: dict[str, Any] | None = None  # a TTA row: its kind of alfa.gaze.tta and forward passes per image
    per_person_flip: dict[str, dict[str, float]] | None = None  # what a flip sees of each person's error
    flip: dict[str, float] | None = None  # ... its mean over persons
    flip_tta_error_deg: float | None = None  # the error with flip-TTA on top of the record's model
    per_person_parts: dict[str, dict[str, float]] | None = None  # yaw/pitch error, bias, mean square per person
    std_over_persons: float | None = None
    # A recipe selection's results, on its source's stand-in.
    stand_in: str | None = None  # the stand-in's data spec
    source_only_deg: float | None = None
    source_only_per_person: dict[str, float] | None = None  # the unadapted model, per stand-in person
    selection_rule: str | None = None  # the rule that chose (the second protocol's records name it)
    selection_case: str | None = None  # ... and which of its cases applied
    selected: dict[str, Any] | None = None  # the chosen recipe's fields
    selected_label: str | None = None
    paper_recipe_deg: float | None = None
    grid: list[dict[str, Any]] | None = None  # every grid recipe: its fields, label, error, per-person errors
    # The optional keys the record stores as null: written back as null, not left out.
    nulls: frozenset[str] = field(default=frozenset(), repr=False, compare=False)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Record:
        """The record of one JSON object of ``results.json``'s ``records`` (a missing required key or an
        unknown key is a :class:`ValueError` naming it)."""
        name = f"record {data['id']!r}" if "id" in data else "a record without an id"
        unknown = [k for k in data if k not in _KEYS]
        if unknown:
            raise ValueError(f"{name}: unknown key(s) {', '.join(map(repr, unknown))}")
        missing = [k for k in REQUIRED if k not in data]
        if missing:
            raise ValueError(f"{name}: missing required key(s) {', '.join(map(repr, missing))}")
        for key, value in data.items():
            wrong = _type_problem(_ANNOTATIONS[key], value)
            if wrong:
                raise ValueError(f"{name}: {key!r} {wrong}")
        nulls = frozenset(k for k in OPTIONAL if k in data and data[k] is None)
        return cls(**data, nulls=nulls)

    def to_dict(self) -> dict[str, Any]:
        """The JSON form: the required keys and the optional ones the record has, in the producer's order."""
        order = _SELECTION_ORDER if self.kind == "selection" else _ROW_ORDER
        out: dict[str, Any] = {}
        for key in order:
            value = getattr(self, key)
            if value is not None or key in _REQUIRED or key in self.nulls:
                out[key] = value
        return out


_JSON_TYPES: dict[str, tuple[type, ...]] = {
    "str": (str,),
    "int": (int,),
    "float": (int, float),
    "bool": (bool,),
    "dict": (dict,),
    "list": (list,),
    "None": (type(None),),
}


def _type_problem(annotation: str, value: Any) -> str | None:
    """Why ``value`` (read from JSON) does not fit the field's ``annotation`` (``"dict[str, float] | None"``), or
    ``None`` where it fits: its outer type, and a per-person mapping's values (numbers or null), so that a damaged
    file is refused by name when read, not with a traceback halfway through a page."""
    kinds, allowed = _json_types(annotation)
    if not isinstance(value, allowed) or (isinstance(value, bool) and bool not in allowed):
        return f"must be {' or '.join(kinds)}, not {type(value).__name__}"
    if isinstance(value, dict) and annotation.startswith("dict[str, float]"):
        odd = [
            k for k, v in value.items() if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float)))
        ]
        if odd:
            return f"must map to numbers (or null), not at {odd[0]!r}"
    return None


@functools.cache
def _json_types(annotation: str) -> tuple[tuple[str, ...], tuple[type, ...]]:
    """The outer kinds an annotation names and the JSON types they allow (read once per field: a page reads
    thousands of records)."""
    kinds = tuple(part.strip().split("[")[0] for part in annotation.split("|"))
    return kinds, tuple(t for k in kinds for t in _JSON_TYPES.get(k, (object,)))


def as_records(records: Iterable[Record | Mapping[str, Any]]) -> list[Record]:
    """``records`` as :class:`Record` objects (JSON objects are read with :meth:`Record.from_dict`)."""
    return [r if isinstance(r, Record) else Record.from_dict(r) for r in records]


# The JSON key order: the fields every record starts with, what its kind adds, and the times it ends with.
_FIELDS = [f.name for f in dataclasses.fields(Record)]
_ANNOTATIONS = {f.name: str(f.type) for f in dataclasses.fields(Record)}
_HEAD = tuple(_FIELDS[: _FIELDS.index("persons")])
_TAIL = ("wall_s", "cpu_s", "finished")
_ROW_RESULTS = (
    "selected_recipe",
    "default_recipe",
    "constant_prediction_deg",
    "labelled_images_per_person",
    "calibration",
    "method_config",
    "recipe",
    "per_person_steps",
    "reference_protocol_deg",
    "loss",
    "meta_only",
    "pnpga",
    "distill",
    "domain_protocol",
    "tta",
    "per_person_flip",
    "flip",
    "flip_tta_error_deg",
    "per_person",
    "per_person_parts",
    "persons",
    "error_deg",
    "std_over_persons",
)
_SELECTION_RESULTS = (
    "stand_in",
    "persons",
    "per_person",
    "error_deg",
    "source_only_deg",
    "source_only_per_person",
    "selection_rule",
    "selection_case",
    "selected",
    "selected_label",
    "paper_recipe_deg",
    "grid",
)


def _order(own: tuple[str, ...], other: tuple[str, ...]) -> tuple[str, ...]:
    # a key of the other kind's (in a hand-made record) still goes out, before the times
    return _HEAD + own + tuple(k for k in other if k not in own) + _TAIL


_ROW_ORDER = _order(_ROW_RESULTS, _SELECTION_RESULTS)
_SELECTION_ORDER = _order(_SELECTION_RESULTS, _ROW_RESULTS)

REQUIRED: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(Record) if f.default is dataclasses.MISSING)
"""The keys every record has."""
OPTIONAL: tuple[str, ...] = tuple(k for k in _ROW_ORDER if k not in REQUIRED)
"""The keys only some records have."""
_REQUIRED = frozenset(REQUIRED)
_KEYS = frozenset(_ROW_ORDER)

if _KEYS != set(_FIELDS) - {"nulls"} or len(_ROW_ORDER) != len(_KEYS):
    raise TypeError("the JSON key order of a record must name every field of Record once")
