"""One way to name a dataset everywhere (CLI, configs, tests): a spec string.

    synthetic:<domain>                  the procedural benchmark (alfa.gaze.data.synthetic.make_domain)
    gazehub:<dataset>:<root>            a GazeHub-normalized folder; dataset is mpiifacegaze,
                                        eyediap, gaze360 or eth-xgaze (aliases mpii, diap, eth, xgaze)
    xgaze-h5:<path>                     raw ETH-XGaze subject h5 file(s): a file, a folder, or the root

Options can ride along after ``?``, e.g. ``gazehub:gaze360:/data/Gaze360?split=val&size=224``;
keyword arguments to :func:`open_dataset` override them. In code a spec is a :class:`DatasetSpec` (kind,
what follows it, options in order), whose string form is the one above: the string is only the
command line's and the configs' way of writing it. :func:`split_spec` is the one reading of that string's
parts, for whoever needs them (the command line's input checks too); :func:`check_spec` refuses a spec without
opening it (a command that opens two datasets checks the second before it makes the first).

Each kind is registered by its loader module with :func:`register_dataset` (``@register_dataset("gazehub",
form="gazehub:<dataset>:<root>")`` on a small opener function); :mod:`alfa.gaze.data` imports the built-in
loaders, so a new dataset is one loader module plus one import line there. Also here: person-wise train/validation
splits for the source datasets (:func:`split_persons`, :class:`PersonSubset`).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from .base import GazeDataset, UnknownPersonError

__all__ = [
    "DatasetSpec",
    "split_spec",
    "open_dataset",
    "check_spec",
    "canonical_spec",
    "register_dataset",
    "unregister_dataset",
    "list_datasets",
    "spec_forms",
    "DatasetKind",
    "split_persons",
    "PersonSubset",
]


@dataclass(frozen=True)
class DatasetSpec:
    """A dataset spec: its ``kind`` (``synthetic``, ``gazehub``, ``xgaze-h5`` or a registered one), what
    follows the kind (a domain, ``<dataset>:<root>``, a path) and its options, in the order they are written.
    ``str(spec)`` is the spec string, ``DatasetSpec.parse(text)`` reads one back; the option values are
    checked when the dataset is opened."""

    kind: str
    target: str
    options: tuple[tuple[str, Any], ...] = ()

    @classmethod
    def parse(cls, text: str) -> DatasetSpec:
        kind, target, query = split_spec(text)
        return cls(kind, target, tuple(_query_items(text, query, _OPTION_TYPES)))

    @classmethod
    def synthetic(cls, domain: str, **options: Any) -> DatasetSpec:
        """A synthetic world, options in the order given (``DatasetSpec.synthetic("eth", size=64)``)."""
        return cls("synthetic", domain, tuple(options.items()))

    def with_options(self, **changes: Any) -> DatasetSpec:
        """The same spec with options replaced where they are set and appended where they are not."""
        current = dict(self.options)
        current.update(changes)
        return DatasetSpec(self.kind, self.target, tuple(current.items()))

    def __str__(self) -> str:
        query = "&".join(f"{k}={v}" for k, v in self.options)
        return f"{self.kind}:{self.target}" + (f"?{query}" if query else "")


def split_spec(text: str) -> tuple[str, str, str]:
    """A spec string's parts: its kind (stripped, lower case), what follows ``<kind>:`` and its query (what follows
    ``?``, ``""`` without one). The one reading of the ``<kind>:<target>?<query>`` form: a string without a kind
    and a target is a ``ValueError`` naming the forms."""
    body, _, query = text.partition("?")
    kind, sep, target = body.partition(":")
    if not sep or not target:
        raise ValueError(f"dataset spec {text!r}: expected one of {', '.join(spec_forms())}")
    return kind.strip().lower(), target, query


def _query_items(
    spec: str, query: str, listed: Iterable[str], known: Collection[str] | None = None
) -> list[tuple[str, str]]:
    """A query's ``key=value`` options as text, in order. An item without ``=`` (or, with ``known``, whose key is
    not one of those) is a ``ValueError`` listing ``listed``; so is a key given twice."""
    items: list[tuple[str, str]] = []
    for item in filter(None, query.split("&")):
        key, sep, value = item.partition("=")
        if not sep or (known is not None and key not in known):
            raise ValueError(f"dataset spec {spec!r}: bad option {item!r}; options are {', '.join(listed)}")
        if any(key == k for k, _ in items):  # which of two values was meant cannot be guessed
            raise ValueError(f"dataset spec {spec!r}: option {key!r} given twice")
        items.append((key, value))
    return items


# How a kind turns the rest of its spec into a dataset: ``opener(rest, options, spec)``, where ``rest``
# is what follows ``<kind>:`` (without the ``?`` options), ``options`` the parsed options merged with
# the caller's keyword arguments, and ``spec`` the whole string (for error messages).
DatasetOpener = Callable[[str, dict[str, Any], str], GazeDataset]
# A kind's check of the same three, raising ValueError for what they alone show wrong (register_dataset's check).
SpecCheck = Callable[[str, dict[str, Any], str], None]


@dataclass(frozen=True)
class DatasetKind:
    """One registered dataset kind: its name, the spec form shown in error messages, other names it
    answers to, and the function that opens it."""

    name: str
    form: str
    opener: DatasetOpener
    aliases: tuple[str, ...] = ()
    options: tuple[str, ...] | None = None  # the options its opener takes; None: not checked here
    what: str = "this kind of dataset"  # how a refusal of an option names the data
    option_types: tuple[tuple[str, Callable[[str], object]], ...] = ()  # its own query options' parsers
    check: SpecCheck | None = None  # what the spec alone shows wrong, without the data (check_spec)


# Kinds in registration order (alfa.gaze.data imports the loaders in a fixed order, so the messages that
# list the forms are stable); _BY_NAME also holds the aliases.
REGISTERED_ABOVE = {"photos": "alfa.gaze.photo_data"}
"""Kinds registered by a module above this layer (``photos:`` needs the camera path, which sits beside the loaders),
by that module's name: a spec of one opened before its module is imported is told what to do, not that the kind is
unknown. ``alfa.gaze.pipeline.open_data`` imports them all."""

_KINDS: list[DatasetKind] = []
_BY_NAME: dict[str, DatasetKind] = {}


def register_dataset(
    name: str,
    *,
    form: str,
    aliases: Sequence[str] = (),
    options: Sequence[str] | None = None,
    what: str = "this kind of dataset",
    option_types: Mapping[str, Callable[[str], object]] | None = None,
    check: SpecCheck | None = None,
) -> Callable[[DatasetOpener], DatasetOpener]:
    """Decorator: make ``opener`` the one that opens specs ``<name>:…`` (and ``<alias>:…``).

    ``form`` is the spec's shape for error messages, e.g. ``"gazehub:<dataset>:<root>"``. ``options``: the
    options (of the spec or the keyword arguments) the opener takes; :func:`open_dataset` refuses any other in
    one line naming ``what`` the data is, before the opener runs. ``option_types``: how a query option of this kind
    alone is read from its text (``{"fps": int}``; the shared ones, ``size``, ``seed``…, are read by the registry:
    a kind's own parser of one of those is refused). ``check``: called as the opener is, it refuses in one line what
    the spec alone shows wrong (an unknown world, a missing folder) without making or reading the data, for
    :func:`check_spec`. A loader module registers its opener at import;
    :mod:`alfa.gaze.data` imports every built-in loader module.
    """

    def decorate(opener: DatasetOpener) -> DatasetOpener:
        taken = None if options is None else tuple(options)
        own = tuple((option_types or {}).items())
        shared = [key for key, _ in own if key in _OPTION_TYPES]
        if shared:  # one option, one meaning everywhere a spec is read
            raise ValueError(f"dataset kind {name!r}: {', '.join(shared)} is read by the registry for every kind")
        kind = DatasetKind(name.lower(), form, opener, tuple(a.lower() for a in aliases), taken, what, own, check)
        for key in (kind.name, *kind.aliases):
            if key in _BY_NAME:
                raise ValueError(f"dataset kind {key!r} is already registered")
        _KINDS.append(kind)
        for key in (kind.name, *kind.aliases):
            _BY_NAME[key] = kind
        return opener

    return decorate


def unregister_dataset(name: str) -> None:
    """Remove a registered kind and its aliases (tests register their own)."""
    kind = _BY_NAME[name]
    _KINDS.remove(kind)
    for key in [k for k, v in _BY_NAME.items() if v is kind]:
        del _BY_NAME[key]


def list_datasets() -> list[str]:
    """The registered kinds (without aliases), in registration order."""
    return [kind.name for kind in _KINDS]


def spec_forms() -> tuple[str, ...]:
    """The spec form of every registered kind, e.g. ``("synthetic:<domain>", …)``."""
    return tuple(kind.form for kind in _KINDS)


def __getattr__(name: str) -> Any:
    # SPEC_FORMS is computed on each access: loaders register after this module loads.
    if name == "SPEC_FORMS":
        return spec_forms()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _whole_number(value: str) -> int:
    try:
        return int(value)
    except ValueError:
        raise ValueError("expected a whole number") from None


_OPTION_TYPES: dict[str, Callable[[str], object]] = {
    "split": str,
    "size": lambda v: _face_side(v),
    "seed": lambda v: _at_least("seed", v, 0),  # numpy's generators take no negative seed
    "images_per_person": lambda v: _at_least("images_per_person", v, 1),
    "check_files": lambda v: _parse_bool("check_files", v),
    "verify_3d": lambda v: _parse_bool("verify_3d", v),
    "stored_order": str,
    "persons": lambda v: [p for p in v.split(",") if p],
}


MAX_FACE_SIDE = 2048
"""The largest ``?size=`` taken: the real releases are 224 and 448 pixels; a typo of 100000 filled the memory."""


def _face_side(value: str) -> int:
    side = _at_least("size", value, 1)
    if side > MAX_FACE_SIDE:
        raise ValueError(f"size must be at most {MAX_FACE_SIDE} (pixels a side), got {side}")
    return side


def _at_least(key: str, value: str, low: int) -> int:
    number = _whole_number(value)
    if number < low:
        raise ValueError(f"{key} must be at least {low}, got {number}")
    return number


def _parse_bool(key: str, value: str) -> bool:
    lowered = value.strip().lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"{key} must be true or false, got {value!r}")


def _parse_options(spec: str, query: str, kind: DatasetKind | None = None) -> dict:
    """The options of a spec's query, typed by the registry's parsers and ``kind``'s own; ``kind``'s options are
    the ones a bad option's error lists (``None``: every shared one)."""
    types = {**_OPTION_TYPES, **dict(kind.option_types if kind else ())}
    taken = None if kind is None else kind.options
    listed = [k for k in types if taken is None or k in taken]  # those a query can set
    options: dict = {}
    for key, value in _query_items(spec, query, listed, known=types):
        try:
            options[key] = types[key](value)
        except ValueError as err:
            raise ValueError(f"dataset spec {spec!r}: option {f'{key}={value}'!r}: {err}") from err
    return options


def open_dataset(spec: str | DatasetSpec, **kw: Any) -> GazeDataset:
    """Open the dataset a spec (a :class:`DatasetSpec` or its string) names (the module docstring has the forms)."""
    spec = str(spec)
    found, rest, options = _read_spec(spec, kw)
    return found.opener(rest, options, spec)


def check_spec(spec: str | DatasetSpec) -> None:
    """Refuse (``ValueError``) what a spec shows wrong without opening it: its form, kind and options as
    :func:`open_dataset` reads them, then what its kind's ``check`` finds (an unknown synthetic world, a missing
    folder). Opening makes or reads the data (a synthetic world is rendered: minutes at real sizes), so a command
    that opens two datasets checks the second's spec before it opens the first."""
    spec = str(spec)
    found, rest, options = _read_spec(spec, {})
    if found.check is not None:
        found.check(rest, options, spec)


def canonical_spec(spec: str | DatasetSpec) -> tuple[str, str, tuple[tuple[str, Any], ...]]:
    """``spec`` as the registry reads it, without opening it: its kind's own name (for an alias, or the kind in
    other case), what follows ``<kind>:`` and its options as typed, sorted by name. Two specs that read alike name
    the same data; an option left out is not filled in with its default, so ``synthetic:eth`` and
    ``synthetic:eth?split=train`` do not. A spec :func:`open_dataset` would refuse is a ``ValueError``."""
    found, rest, options = _read_spec(str(spec), {})
    return found.name, rest, tuple(sorted(options.items()))


def _read_spec(spec: str, kw: dict[str, Any]) -> tuple[DatasetKind, str, dict[str, Any]]:
    """A spec's kind, what follows ``<kind>:`` and its options (the query's and ``kw``, which may not give one of them
    another value), each checked."""
    kind, rest, query = split_spec(spec)
    if kind not in _BY_NAME and kind in REGISTERED_ABOVE:
        raise ValueError(
            f"dataset spec {spec!r}: the {kind}: kind is registered by {REGISTERED_ABOVE[kind]}: import it first, or "
            "open the spec with alfa.gaze.pipeline.open_data, which knows every kind"
        )
    if kind not in _BY_NAME:
        raise ValueError(f"dataset spec {spec!r}: unknown kind {kind!r}; expected one of {', '.join(spec_forms())}")
    found = _BY_NAME[kind]
    typed = _parse_options(spec, query, found)
    both = sorted(k for k in set(typed) & set(kw) if typed[k] != kw[k])
    if both:  # one silently winning over the other would open other data than one of them says
        raise ValueError(
            f"dataset spec {spec!r}: {both[0]}={typed[both[0]]!r} in the spec and {both[0]}={kw[both[0]]!r} as a "
            "keyword: give it once"
        )
    options = {**typed, **kw}
    unknown = [] if found.options is None else sorted(set(options) - set(found.options))
    if unknown:  # another kind's option: once a TypeError from deep inside the opener
        raise ValueError(
            f"dataset spec {spec!r}: option(s) {', '.join(unknown)} do not apply to {found.what}; its options: "
            + ", ".join(found.options or ())
        )
    return found, rest, options


def split_persons(dataset: GazeDataset, val_fraction: float = 0.1, seed: int = 0) -> tuple[list[str], list[str]]:
    """Hold out about ``val_fraction`` of a (source) dataset's persons for validation.

    Persons are drawn by the dataset's ``person_group`` where it has one (Gaze360: whole
    recordings, since a subject can appear under several identities in one recording), so the two
    lists never share a physical subject. Deterministic in ``seed``; both lists keep dataset order.
    """
    if not 0.0 <= val_fraction < 1.0:
        raise ValueError(f"val_fraction must be in [0, 1), got {val_fraction}")
    persons = dataset.persons()
    group_of = getattr(dataset, "person_group", lambda p: p)
    groups = list(dict.fromkeys(group_of(p) for p in persons))
    n_val = round(val_fraction * len(groups))
    if val_fraction > 0 and len(groups) >= 2:
        n_val = min(max(n_val, 1), len(groups) - 1)
    generator = torch.Generator().manual_seed(seed)
    chosen = {groups[i] for i in torch.randperm(len(groups), generator=generator)[:n_val].tolist()}
    val = [p for p in persons if group_of(p) in chosen]
    train = [p for p in persons if group_of(p) not in chosen]
    return train, val


class PersonSubset(GazeDataset):
    """A view of ``dataset`` restricted to some persons, keeping dataset order (no copying)."""

    def __init__(self, dataset: GazeDataset, persons: Sequence[str]) -> None:
        known = set(dataset.persons())
        unknown = [p for p in persons if p not in known]
        if unknown:
            raise UnknownPersonError(f"{dataset.name}: no person(s) {unknown}")
        self.dataset = dataset
        self.name = dataset.name
        wanted = set(persons)
        self._persons = [p for p in dataset.persons() if p in wanted]
        self._indices = sorted(i for p in self._persons for i in dataset.person_indices(p))
        position = {parent: i for i, parent in enumerate(self._indices)}
        self._index = {p: [position[i] for i in dataset.person_indices(p)] for p in self._persons}

    def __len__(self) -> int:
        return len(self._indices)

    def __getitem__(self, i: int) -> dict:
        item = dict(self.dataset[self._indices[i]])
        item["index"] = i if i >= 0 else len(self) + i
        return item

    def labels(self, indices: Sequence[int]) -> Tensor:
        return self.dataset.labels([self._indices[i] for i in self.positions(indices)])

    def raw_images(self, indices: Sequence[int]) -> Tensor:
        # contiguous, as the items stacked were: a channels-last batch would take other kernels on the CPU
        return self.dataset.raw_images([self._indices[i] for i in self.positions(indices)]).contiguous()

    def persons(self) -> list[str]:
        return list(self._persons)

    def person_group(self, person: str) -> str:
        return getattr(self.dataset, "person_group", lambda p: p)(person)
