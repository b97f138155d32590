"""What a figure shows, as data, saved beside its PNG: what the check of the generated pages compares.

A PNG's bytes depend on the matplotlib, freetype and zlib that drew it (antialiasing, font hinting, text
layout, compression), so a figure redrawn from the same data on another machine can differ in every byte
while showing the same thing, and a change of one plotted value is buried in that noise.
:func:`plotted_data` reads back from a matplotlib figure what it plots: per axes the titles, axis labels
and scales, explicitly set limits and ticks, legend texts, the data of every line, scatter, band and bar,
every image's values (as a digest), every text, and the figure's own texts. Numbers are rounded to
:data:`SIGNIFICANT_DIGITS` significant digits, so that float noise in the last bits does not count.
What the matplotlib version or the style decides is left out: automatic ticks and limits, colours taken
from the colour cycle, line widths, fonts, positions of the layout.

:func:`save_figure` is the one way the study saves a figure a generated page owns: the PNG, and beside it
its plotted data as JSON, both written atomically (``error_vs_heads.png`` next to
``error_vs_heads.plotted.json``; :func:`plotted_path`).
"""

from __future__ import annotations

import contextlib
import contextvars
import hashlib
import json
import math
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from alfa.fileio import atomic_path, write_text

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

__all__ = [
    "SIGNIFICANT_DIGITS",
    "IMAGE_LEVELS",
    "PLOTTED_SUFFIX",
    "plotted_data",
    "plotted_json",
    "plotted_path",
    "save_figure",
    "plotted_data_only",
]

SIGNIFICANT_DIGITS = 6
"""Significant digits kept of every plotted number: far finer than a figure can show, far coarser than the
last bits in which two machines' arithmetic may differ."""

IMAGE_LEVELS = 10_000
"""An image's values are compared as steps of 1/IMAGE_LEVELS of its largest magnitude: a colour map has 256
colours, so no visible change is lost, and noise far below a step rarely moves a value across one."""

PLOTTED_SUFFIX = ".plotted.json"


def plotted_path(figure: str | os.PathLike) -> Path:
    """Where the plotted data of the figure file ``figure`` lies: ``x.png`` -> ``x.plotted.json``."""
    return Path(figure).with_suffix(PLOTTED_SUFFIX)


_DRAWING = contextvars.ContextVar("alfa_plotted_drawing", default=True)


@contextlib.contextmanager
def plotted_data_only() -> Iterator[None]:
    """Within it, :func:`save_figure` writes each figure's plotted data and an empty file where its PNG
    goes, without rendering its pixels: all that a check compares (the PNG's bytes are not), at a fraction of
    the cost (rendering a page's figures takes seconds). The figure is still drawn without rendering, so one
    that cannot be drawn (a text that does not parse) fails as it would when saved."""
    token = _DRAWING.set(False)
    try:
        yield
    finally:
        _DRAWING.reset(token)


def save_figure(fig: Figure, path: str | os.PathLike, *, dpi: int) -> Path:
    """Write ``fig`` to ``path`` (its format from the suffix) and its :func:`plotted_data` to
    :func:`plotted_path`, each atomically, then close it; returns ``path``. Under :func:`plotted_data_only`
    the file at ``path`` is left empty."""
    import matplotlib.pyplot as plt

    path = Path(path)
    try:
        text = plotted_json(fig)
        with atomic_path(path) as tmp:  # the temporary name keeps the suffix: matplotlib picks the format by it
            if _DRAWING.get():
                fig.savefig(tmp, dpi=dpi)
            else:  # laid out as for drawing (texts parsed, artists drawn), no pixels: a figure that would not
                fig.draw_without_rendering()  # draw still fails here
                Path(tmp).write_bytes(b"")
        write_text(plotted_path(path), text)
    finally:
        plt.close(fig)
    return path


def plotted_json(fig: Figure) -> str:
    """:func:`plotted_data` as the text of its file: keys sorted, one point or value per line."""
    text = json.dumps(plotted_data(fig), indent=1, sort_keys=True, ensure_ascii=False)
    # a list of plain numbers (a point, a range) on one line, so that a file reads one point per line
    text = re.sub(r"\[\s+([^\[\]{}\"]*?)\s+\]", lambda m: "[" + re.sub(r"\s+", " ", m.group(1)) + "]", text)
    return text + "\n"


def plotted_data(fig: Figure) -> dict[str, Any]:
    """What ``fig`` plots, as JSON-able data: ``axes`` (one entry per axes, in the figure's order; see the
    module docstring for what each holds), the figure's ``texts`` (its suptitle among them) and the texts
    of its ``legends``. Independent of the dpi, the backend and whether the figure was drawn."""
    return {
        "axes": [_axes(ax) for ax in fig.axes],
        "texts": sorted(t.get_text() for t in fig.texts if t.get_text()),
        "legends": [_legend(leg) for leg in fig.legends],
    }


# ----------------------------------------------------------------------------- numbers


def _number(x: Any) -> float | str | None:
    x = float(x)
    if math.isnan(x):
        return None
    if math.isinf(x):
        return "inf" if x > 0 else "-inf"
    return float(f"{x:.{SIGNIFICANT_DIGITS}g}") + 0.0  # + 0.0: -0.0 and 0.0 are the same value shown


def _numbers(values: Any) -> Any:
    """``values`` (a number or an array of any shape, masked entries as NaN) as nested lists of rounded
    numbers."""
    a = np.ma.asarray(values, dtype=np.float64).filled(np.nan)
    if a.ndim == 0:
        return _number(a)
    return [_numbers(row) for row in a] if a.ndim > 1 else [_number(v) for v in a]


def _digest(values: Any) -> dict[str, Any]:
    """An array too large to list: its shape, range and mean, and a hash of its values in steps of
    1/:data:`IMAGE_LEVELS` of its largest magnitude (NaN and ±inf kept apart)."""
    a = np.ma.asarray(values, dtype=np.float64).filled(np.nan)
    finite = np.isfinite(a)
    scale = float(np.abs(a[finite]).max()) if finite.any() else 0.0
    steps = np.zeros(a.shape, dtype="<i8")
    if scale > 0:
        steps[finite] = np.rint(a[finite] / scale * IMAGE_LEVELS).astype("<i8")
    steps[np.isnan(a)] = np.iinfo(np.int64).min
    steps[a == np.inf] = np.iinfo(np.int64).max
    steps[a == -np.inf] = np.iinfo(np.int64).min + 1
    return {
        "shape": list(a.shape),
        "min": _number(a[finite].min()) if finite.any() else None,
        "max": _number(a[finite].max()) if finite.any() else None,
        "mean": _number(a[finite].mean()) if finite.any() else None,
        "sha256": hashlib.sha256(steps.tobytes()).hexdigest(),
    }


def _points(path: Any, transform: Any = None) -> list[list[Any]]:
    """The distinct vertices of a path (in data coordinates when ``transform`` maps them there), sorted:
    how matplotlib orders or repeats the vertices of a band or a bar is not data, their places are."""
    vertices, codes = np.asarray(path.vertices, dtype=np.float64), path.codes
    if codes is not None:
        vertices = vertices[(codes != path.CLOSEPOLY) & (codes != path.STOP)]
    if transform is not None:
        vertices = transform.transform(vertices)
    distinct = {tuple(p) for p in _numbers(vertices)} if len(vertices) else set()
    return [list(p) for p in sorted(distinct, key=_order)]


def _order(item: Any) -> str:
    return json.dumps(item, sort_keys=True)


# ----------------------------------------------------------------------------- artists


def _label(artist: Any, owners: dict[int, str]) -> str | None:
    """The artist's legend label; labels matplotlib makes up start with ``_`` (``_child3``, ``_nolegend_``)
    and are no label. An artist of a container (an error bar's line) takes the container's label."""
    label = artist.get_label()
    if isinstance(label, str) and label and not label.startswith("_"):
        return label
    return owners.get(id(artist))


def _container_labels(ax: Axes) -> dict[int, str]:
    owners: dict[int, str] = {}

    def walk(items: Any, label: str) -> None:
        for item in items:
            if isinstance(item, (tuple, list)):
                walk(item, label)
            elif item is not None:
                owners[id(item)] = label

    for container in ax.containers:
        label = container.get_label()
        if isinstance(label, str) and label and not label.startswith("_"):
            walk(container, label)
    return owners


def _collection(collection: Any, owners: dict[int, str]) -> dict[str, Any]:
    from matplotlib.collections import PathCollection, QuadMesh

    entry: dict[str, Any] = {"label": _label(collection, owners)}
    if isinstance(collection, PathCollection):  # a scatter: its points and their sizes
        entry["offsets"] = _numbers(collection.get_offsets())
        entry["sizes"] = _numbers(collection.get_sizes())
    elif isinstance(collection, QuadMesh):  # a mesh: its grid
        entry["coordinates"] = _digest(collection.get_coordinates())
    else:  # bands (fill_between), error bars, line collections: their outlines
        entry["paths"] = sorted((_points(p) for p in collection.get_paths()), key=_order)
    values = collection.get_array()
    if values is not None:  # colour-mapped values are data; colours picked by the style are not
        entry["values"] = _digest(values) if np.size(values) > 64 else _numbers(values)
    return entry


def _patch(patch: Any, owners: dict[int, str]) -> dict[str, Any]:
    from matplotlib.patches import Rectangle

    entry: dict[str, Any] = {"label": _label(patch, owners)}
    if isinstance(patch, Rectangle):  # a bar
        entry["rectangle"] = _numbers([patch.get_x(), patch.get_y(), patch.get_width(), patch.get_height()])
    else:
        entry["points"] = _points(patch.get_path(), patch.get_patch_transform())
    return entry


def _image(image: Any) -> dict[str, Any]:
    values = image.get_array()
    entry: dict[str, Any] = {"values": _digest(values), "extent": _numbers(image.get_extent())}
    if np.ndim(values) == 2:  # colour-mapped; an RGB(A) image shows its values as they are
        entry["cmap"] = image.get_cmap().name
        entry["clim"] = _numbers(image.get_clim())
    return entry


def _legend(legend: Any) -> dict[str, Any]:
    title = legend.get_title().get_text()
    return {"texts": [t.get_text() for t in legend.get_texts()], **({"title": title} if title else {})}


def _ticks(axis: Any) -> dict[str, Any] | None:
    """The ticks a figure set itself (``set_xticks``, ``set_xticklabels``) or that name its categories (bars
    over strings); automatic ones are the version's choice and left out."""
    from matplotlib.category import StrCategoryLocator
    from matplotlib.ticker import FixedFormatter, FixedLocator

    locator, formatter = axis.get_major_locator(), axis.get_major_formatter()
    if isinstance(locator, StrCategoryLocator):
        at = list(locator())
        return {"at": _numbers(at), "labels": [formatter(x) for x in at]}
    if not isinstance(locator, FixedLocator):
        return None
    ticks: dict[str, Any] = {"at": _numbers(locator.locs)}
    if isinstance(formatter, FixedFormatter):
        ticks["labels"] = list(formatter.seq)
    return ticks


def _axes(ax: Axes) -> dict[str, Any]:
    colorbar = getattr(ax, "_colorbar", None)  # matplotlib ≥ 3.6 marks a colour bar's axes so
    if colorbar is not None:  # a colour bar shows its scale: the map and the range, not its drawn strip
        label = ax.get_ylabel() if colorbar.orientation == "vertical" else ax.get_xlabel()
        scale = _numbers([colorbar.norm.vmin, colorbar.norm.vmax])
        return {"colorbar": {"cmap": colorbar.cmap.name, "clim": scale, "label": label}}
    owners = _container_labels(ax)
    entry: dict[str, Any] = {
        "titles": {loc: ax.get_title(loc) for loc in ("left", "center", "right") if ax.get_title(loc)},
        "xlabel": ax.get_xlabel(),
        "ylabel": ax.get_ylabel(),
        "xscale": ax.get_xscale(),
        "yscale": ax.get_yscale(),
        "axis_on": bool(ax.axison),
        "lines": sorted(
            ({"label": _label(line, owners), "xy": _numbers(line.get_xydata())} for line in ax.lines), key=_order
        ),
        "collections": sorted((_collection(c, owners) for c in ax.collections), key=_order),
        "patches": sorted((_patch(p, owners) for p in ax.patches), key=_order),
        "images": [_image(im) for im in ax.images],  # in drawing order: an image over another is what shows
        "texts": sorted(
            ({"text": t.get_text(), "at": _numbers(t.get_position())} for t in ax.texts if t.get_text()), key=_order
        ),
    }
    spec = ax.get_subplotspec()
    if spec is not None:  # its place in the figure's grid (a colour bar beside it nests it in a smaller one)
        spec = spec.get_topmost_subplotspec()
        entry["panel"] = [spec.rowspan.start, spec.colspan.start]
    if not ax.get_autoscalex_on():
        entry["xlim"] = _numbers(ax.get_xlim())
    if not ax.get_autoscaley_on():
        entry["ylim"] = _numbers(ax.get_ylim())
    for name, axis in (("xticks", ax.xaxis), ("yticks", ax.yaxis)):
        ticks = _ticks(axis)
        if ticks is not None:
            entry[name] = ticks
    legend = ax.get_legend()
    if legend is not None:
        entry["legend"] = _legend(legend)
    return entry
