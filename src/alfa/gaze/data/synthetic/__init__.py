"""The synthetic multi-domain gaze benchmark (spec gaze-data §3): a procedural face renderer and four
named domains (sources ``eth`` and ``gaze360``, targets ``mpii`` and ``eyediap``).

    >>> from alfa.gaze.data.synthetic import make_domain
    >>> train = make_domain("eth")                  # 200 source persons p00..p199
    >>> held_out = make_domain("eth", split="val")  # different persons v00..v09
    >>> target = make_domain("mpii")                # 15 target persons p00..p14

See ``docs/synthetic.md``; ``python -m alfa.gaze.data.synthetic --help`` regenerates its figure and tables.
"""

import inspect
from typing import Any

from ..base import InMemoryGazeDataset
from ..registry import register_dataset
from . import calibrated, domains  # noqa: F401  (calibrated registers the v2 worlds)
from .domains import (
    ANATOMY,
    DOMAINS,
    SPLITS,
    DomainConfig,
    get_domain,
    list_domains,
    make_domain,
    render_person,
    sample_persons,
    sample_scenes,
)
from .render import FaceParams, gaze_labels, head_rotation, render_faces

__all__ = [
    "ANATOMY",
    "DOMAINS",
    "SPLITS",
    "DomainConfig",
    "FaceParams",
    "gaze_labels",
    "get_domain",
    "head_rotation",
    "list_domains",
    "make_domain",
    "check_synthetic",
    "open_synthetic",
    "render_faces",
    "render_person",
    "sample_persons",
    "sample_scenes",
]


def _counts(options: dict[str, Any], spec: str) -> dict[str, Any]:
    """The spec's options as :func:`make_domain` takes them: ``persons=`` is a count here (read as a list of
    names, a real dataset's form, by the registry)."""
    persons = options.get("persons")
    if isinstance(persons, list):
        if len(persons) != 1 or not persons[0].isdecimal():
            raise ValueError(
                f"dataset spec {spec!r}: option persons={','.join(persons)}: a synthetic world takes how many "
                "persons to make (a whole number); names of persons are for a real dataset's spec"
            )
        options = {**options, "persons": int(persons[0])}
    return options


def check_synthetic(rest: str, options: dict[str, Any], spec: str) -> None:
    """``synthetic:<domain>``'s spec, checked without rendering (:func:`alfa.gaze.data.registry.check_spec`); a
    refusal names the spec."""
    sizes = ("split", "persons", "images_per_person", "size")
    counts = {k: v for k, v in _counts(options, spec).items() if k in sizes}  # its refusal names the spec
    try:
        domains.check_domain(rest, **counts)
    except ValueError as e:
        raise ValueError(f"dataset spec {spec!r}: {e}") from None


@register_dataset(
    "synthetic",
    form="synthetic:<domain>",
    options=[p for p in inspect.signature(domains.make_domain).parameters if p != "name"],
    what="a synthetic world",
    check=check_synthetic,
)
def open_synthetic(rest: str, options: dict[str, Any], spec: str) -> InMemoryGazeDataset:
    """``synthetic:<domain>``: a generated world (:func:`make_domain`); a refusal names the spec."""
    counts = _counts(options, spec)
    try:  # make_domain is looked up here at call time, so a test may replace it on this package
        return make_domain(rest, **counts)
    except ValueError as e:
        raise ValueError(f"dataset spec {spec!r}: {e}") from None
