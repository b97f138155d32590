"""The results file of a benchmark folder: ``results.json``, its format, and the folder's layout.

One JSON object: ``format``/``version`` (checked on reading; :mod:`alfa.study.bench.schema`), the ``preset``
and the protocol part of the configuration (``config``: every run writing to the folder must agree on it),
the ``records`` (one per method, pair and seed, keyed by ``id`` with a ``config_hash``; their fields are
:class:`~alfa.study.bench.record.Record`'s, checked on reading), the source models' ``sources`` entries, the
``runs`` that wrote the file, the ``sanity`` summary and the ``layout`` of the report's tables (the rows
of every ablation, computed from the configuration, so the report needs no configuration object).
Figure data lie next to it in :data:`FIGURE_DIR`.

The file is rewritten atomically under a file lock after every change, so several pieces of one benchmark
may share a folder and an interrupted run loses at most the record in progress.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from alfa.adapters.groups import is_number
from alfa.fileio import settings_differences, write_bytes, write_json
from alfa.locks import locked

from .ablations import REGISTRY
from .config import BenchConfig
from .measures import sanity_summary
from .methods import PAIRS, SANITY_METHODS, table_methods
from .record import Record, as_records
from .schema import FORMAT, VERSION, comparable_protocol
from .variants import main_variants

__all__ = [
    "RESULTS_FILE",
    "FORMAT",
    "VERSION",
    "FIGURE_DIR",
    "RANK_SLICES_FILE",
    "UPDATES_FILE",
    "export_results",
    "layout",
    "load_results",
    "results_file",
    "ResultsStore",
]

RESULTS_FILE = "results.json"
FIGURE_DIR = "figure_data"
RANK_SLICES_FILE = "rank_slices.safetensors"
UPDATES_FILE = "updates.safetensors"


def _empty_results(config: BenchConfig) -> dict[str, Any]:
    return {
        "format": FORMAT,
        "version": VERSION,
        "preset": config.preset,
        "config": config.protocol_dict(),
        "records": [],
        "sources": {},
        "runs": [],
        "sanity": {},
        "figures": {},
        "layout": layout(config),
    }


def layout(config: BenchConfig) -> dict[str, Any]:
    """The rows of every table the report draws (labels and ablated values), from the protocol alone."""
    main = main_variants(config)  # every ablation's reference rows, made once (it reads their labels alone)
    return {
        "pairs": list(PAIRS),
        "main": list(table_methods()),
        "sanity": list(SANITY_METHODS),
        "ablations": {
            name: [{"label": v.label, "value": v.value} for v in ablation.variants(config, main)]
            for name, ablation in REGISTRY.items()
        },
    }


def results_file(path: str | os.PathLike) -> Path:
    """The ``results.json`` that ``path`` names (the file, or the folder holding one), read nothing of; a
    ``FileNotFoundError`` where there is none."""
    path = Path(path)
    if path.is_dir():
        path = path / RESULTS_FILE
    if not path.is_file():
        raise FileNotFoundError(f"no benchmark results at {path}")
    return path


def load_results(path: str | os.PathLike) -> dict[str, Any]:
    """Read a ``results.json`` (a file, or the folder holding one); a clear error if it is not one."""
    path = results_file(path)
    try:
        data = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"{path}: not valid JSON ({e})") from e
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise ValueError(f"{path}: not an alfa benchmark results file (no format {FORMAT!r})")
    if data.get("version") != VERSION:
        raise ValueError(f"{path}: results format version {data.get('version')}, this alfa reads {VERSION}")
    if not isinstance(data.get("records"), list):
        raise ValueError(f"{path}: 'records' must be a list")
    for key in ("config", "sources", "sanity"):
        if key in data and not isinstance(data[key], dict):
            raise ValueError(f"{path}: {key!r} must be a JSON object, not {type(data[key]).__name__}")
    if "runs" in data and not isinstance(data["runs"], list):
        raise ValueError(f"{path}: 'runs' must be a list")
    _check_runs(path, data.get("runs", []), data.get("sources", {}))
    for i, r in enumerate(data["records"]):
        if not isinstance(r, dict):
            raise ValueError(f"{path}: record {i} is not a JSON object")
        try:
            Record.from_dict(r)
        except (ValueError, TypeError) as e:
            raise ValueError(f"{path}: record {i}: {e}") from e
    return data


_NUMBER, _TEXT = ("a number", (int, float)), ("text or null", (str, type(None)))
_NUMBER_OR_NULL = ("a number or null", (int, float, type(None)))
_RUN_KINDS: dict[str, tuple[str, tuple[type, ...]]] = {
    "command": _TEXT,
    "started": _TEXT,
    "cpu": _TEXT,
    "cpu_capability": _TEXT,
    "torch": _TEXT,
    "wall_s": _NUMBER,
    "cpu_s": _NUMBER,
    "load_average_start": _NUMBER_OR_NULL,  # null: a system that keeps no load average (Windows)
    "load_average_end": _NUMBER_OR_NULL,
    "records_run": ("a whole number", (int,)),
    "cpus": ("a whole number or null", (int, type(None))),
    "selection": ("a JSON object", (dict,)),
    "finished": ("true or false", (bool,)),
}
"""The entries of a run in the log of runs that the report reads, and what each must be."""


def _check_runs(path: Path, runs: list[Any], sources: dict[str, Any]) -> None:
    """The log of runs and the sources' entries as the report reads them: refused by name when the file is read,
    not met as a traceback in the middle of a page."""
    for i, run in enumerate(runs):
        if not isinstance(run, dict):
            raise ValueError(f"{path}: run {i} is not a JSON object")
        for key, (what, kinds) in _RUN_KINDS.items():
            value = run.get(key)
            if key in run and (not isinstance(value, kinds) or (isinstance(value, bool) and bool not in kinds)):
                raise ValueError(f"{path}: run {i}: {key!r} must be {what}, not {type(value).__name__}")
    for key, source in sources.items():
        if not isinstance(source, dict):
            raise ValueError(f"{path}: source {key!r} is not a JSON object")
        seconds = source.get("recorded_train_seconds")
        if not (seconds is None or is_number(seconds)):
            name = type(seconds).__name__
            raise ValueError(f"{path}: source {key!r}: 'recorded_train_seconds' must be a number or null, not {name}")


def export_results(results: str | os.PathLike, dest: str | os.PathLike, keep_kept: bool = False) -> Path:
    """Copy a benchmark's ``results.json`` (rewritten one record per line, whichever version wrote it) and its
    figure data (the small tensors the report's figures are drawn from; never adapters, models or caches) into
    ``dest``, the copy committed with the page. The file is checked first and read under the folder's lock, so a
    running benchmark is never copied half-written. ``keep_kept``: refuse (``ValueError``) to replace a copy
    holding records the run does not have (a run started afresh, not from the kept records, would drop them).
    Returns the copied folder."""
    src = results_file(results)
    folder = src.parent
    dest = Path(dest)
    if dest.resolve() == folder.resolve():
        if src.name == RESULTS_FILE:
            return dest
        raise ValueError(f"{dest} is where {src} lies: its copy would replace {dest / RESULTS_FILE}; copy it elsewhere")
    with locked(src):
        # the file named, not the folder's results.json: another file there put another run's records on the page
        data = load_results(src)  # a clear error if it is not a results file
        if keep_kept and (dest / RESULTS_FILE).is_file():
            lost = {r["id"] for r in load_results(dest)["records"]} - {r["id"] for r in data["records"]}
            if lost:
                raise ValueError(
                    f"{src} lacks {len(lost)} of the records kept in {dest} (e.g. {min(lost)}); "
                    f"not replacing them: start the run from the kept records (copy {dest / RESULTS_FILE} there)"
                )
        _write(dest / RESULTS_FILE, data)
        for name in (RANK_SLICES_FILE, UPDATES_FILE):
            if (folder / FIGURE_DIR / name).is_file():
                write_bytes(dest / FIGURE_DIR / name, (folder / FIGURE_DIR / name).read_bytes())
    return dest


def _write(path: Path, data: dict[str, Any]) -> Path:
    # one record per line: the file grows by thousands of records, and a changed record is one changed line
    return write_json(path, data, compact_list="records")


class ResultsStore:
    """``results.json`` of one benchmark folder: read, merged and rewritten atomically under a lock."""

    def __init__(self, out: Path, config: BenchConfig, create: bool = True) -> None:
        self.path = out / RESULTS_FILE
        self.config = config
        if not create and not self.path.is_file():
            self.empty = _empty_results(config)
            return
        with locked(self.path):
            if self.path.is_file():
                data = load_results(self.path)
                self._check_protocol(data)
                if data.get("layout") != layout(config):
                    data["layout"] = layout(config)
                    _write(self.path, data)
            else:
                _write(self.path, _empty_results(config))

    def _check_protocol(self, data: dict[str, Any]) -> None:
        here = comparable_protocol(self.config.protocol_dict())
        stored = comparable_protocol(data.get("config", {}))
        if stored != here:
            differing = ", ".join(settings_differences(stored, here, absent="its default"))  # left out at it
            raise ValueError(
                f"{self.path} was made with another benchmark configuration (preset {data.get('preset')!r}; the "
                f"folder's vs this run's: {differing}); use another --out folder"
            )

    def read(self) -> dict[str, Any]:
        if not self.path.is_file() and hasattr(self, "empty"):
            return self.empty
        return load_results(self.path)

    def update(self, change: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
        """Re-read the file, apply ``change`` to it, recompute the sanity summary and write it atomically."""
        with locked(self.path):
            data = load_results(self.path)
            self._check_protocol(data)
            change(data)
            data["sanity"] = sanity_summary(data["records"])
            _write(self.path, data)
        return data

    def done(self) -> dict[str, str]:
        """Finished records: id -> config hash."""
        return {r.id: r.config_hash for r in as_records(self.read()["records"])}

    def add_record(self, record: Record) -> None:
        """Write ``record`` (its JSON form), in place of a stored record of the same id."""

        def change(data: dict[str, Any]) -> None:
            data["records"] = [r for r in data["records"] if r["id"] != record.id] + [record.to_dict()]

        self.update(change)
