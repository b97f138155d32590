"""The record a folder of per-person adapters (or corrections) keeps beside them, ``personalization.json``: what
was run, and for whom. ``alfa personalize`` and ``alfa calibrate`` write it (:func:`write_record`); resuming,
replacing and evaluating read it (:func:`read_record`). The one place that knows the file's name and format.

The record is a JSON object: ``version`` (:data:`RECORD_VERSION`), ``dataset``, ``method``, ``config`` (the
recipe, a mapping), ``persons`` (person -> their entry, a mapping) and, for personalization, ``method_config``
and ``written`` (the file names runs there wrote). A record from before ``version`` existed is version 1.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from alfa.fileio import write_json

__all__ = ["RECORD_FILE", "RECORD_VERSION", "read_record", "write_record"]

RECORD_FILE = "personalization.json"
"""The record a folder of per-person adapters (or corrections) keeps beside them: what was run, and for whom."""

RECORD_VERSION = 1
"""The record's format; a record without a ``version`` (every one written before it was added) is this one."""


def write_record(folder: str | Path, record: Mapping[str, Any]) -> Path:
    """Write ``record`` as ``folder``'s record, atomically (a crash leaves the old record or the new one)."""
    return write_json(Path(folder) / RECORD_FILE, {"version": RECORD_VERSION, **record})


def read_record(folder: str | Path, *, need_persons: bool = True) -> dict[str, Any] | None:
    """``folder``'s record, ``None`` where it has none. A record that does not read, is of another version, or whose
    ``persons``, ``config`` or ``written`` are not what alfa writes is a ``ValueError`` of one line naming the file;
    so is one without ``persons`` unless not ``need_persons`` (a reader that needs only the recipe)."""
    path = Path(folder) / RECORD_FILE
    if not path.exists():
        return None
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:  # ValueError: not UTF-8, not JSON
        raise _not_ours(path, str(e)) from None
    if not isinstance(record, dict):
        raise _not_ours(path, f"a JSON {type(record).__name__}, not an object")
    version = record.get("version", RECORD_VERSION)
    if type(version) is not int or version != RECORD_VERSION:
        raise ValueError(
            f"{path} is a personalization record of version {json.dumps(version)}, which this alfa does not read "
            f"(it reads version {RECORD_VERSION})"
        )
    if need_persons and "persons" not in record:
        raise _not_ours(path, "it lists no persons")
    persons = record.get("persons", {})
    if not isinstance(persons, dict) or not all(isinstance(entry, dict) for entry in persons.values()):
        raise _not_ours(path, "its persons are not a mapping of person to entry")
    if not isinstance(record.get("config", {}), dict):
        raise _not_ours(path, "its config is not a mapping")
    written = record.get("written", [])
    if not isinstance(written, list) or not all(isinstance(name, str) for name in written):
        raise _not_ours(path, "its written files are not a list of names")
    return record


def _not_ours(path: Path, why: str) -> ValueError:
    return ValueError(f"{path} is not a personalization record alfa wrote ({why})")
