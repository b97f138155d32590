"""Writing files so that a crash never leaves half a file: the one atomic writer every module uses.

Every write goes to a temporary file beside its target (same folder, so the rename cannot cross file
systems) and is renamed over the target only when it is complete; a reader sees the old file or the new
one, never a mix. The lowest layer of the package: it imports nothing of ``alfa``.
"""

from __future__ import annotations

import contextlib
import json
import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

__all__ = ["atomic_path", "write_text", "write_bytes", "write_json", "safe_filename", "check_writable"]


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary path beside ``path``; when the block ends without an error it replaces ``path``.

    For writers that take a path (``safetensors.torch.save_file``, ``torch.save``, ``Figure.savefig``).
    The temporary name keeps the target's suffix, so writers that choose a format by suffix still do.
    The parent folder is created. On an error the temporary file is removed and ``path`` is untouched.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    # Unique per call: several processes may write the same target at once (benchmark pieces).
    tmp = path.with_name(f".{path.stem}.{uuid.uuid4().hex[:8]}.tmp{path.suffix}")
    try:
        yield tmp
        os.replace(tmp, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()


def write_bytes(path: str | os.PathLike, data: bytes) -> Path:
    """Write ``data`` to ``path`` atomically; returns the path."""
    with atomic_path(path) as tmp:
        tmp.write_bytes(data)
    return Path(path)


def write_text(path: str | os.PathLike, text: str) -> Path:
    """Write ``text`` (UTF-8) to ``path`` atomically; returns the path."""
    return write_bytes(path, text.encode("utf-8"))


def write_json(path: str | os.PathLike, data: Any, *, indent: int | None = 2) -> Path:
    """Write ``data`` as JSON atomically, with a final newline. NaN and ±inf are written as ``null``
    (JSON has no such numbers, and a strict reader would reject the file)."""
    return write_text(path, json.dumps(_finite_or_none(data), indent=indent) + "\n")


def _finite_or_none(x: Any) -> Any:
    if isinstance(x, float) and (x != x or x in (float("inf"), float("-inf"))):
        return None
    if isinstance(x, dict):
        return {k: _finite_or_none(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_finite_or_none(v) for v in x]
    return x


_FILENAME_KEEP = frozenset("._=-")


def safe_filename(name: str) -> str:
    """``name`` as one path component: letters, digits and ``._=-`` kept, everything else (``/``, ``→``,
    ``[``, ``:``, ``?``, spaces) replaced by ``_``. Used for every folder or file named after a method
    label, a person or a dataset spec."""
    out = "".join(c if c.isalnum() or c in _FILENAME_KEEP else "_" for c in name)
    if out in ("", ".", ".."):
        raise ValueError(f"{name!r} does not make a usable file name")
    return out


def check_writable(path: str | os.PathLike, *, folder: bool = False, what: str = "output") -> Path:
    """Fail now, before any work, if ``path`` could not be written later: a file whose place is a folder (or
    under a file), a folder that is a file, or a place this process may not write. Creates nothing. Raises
    ``ValueError``."""
    path = Path(path)
    if folder and path.exists() and not path.is_dir():
        raise ValueError(f"{what} {path} is a file, not a folder")
    if not folder and path.is_dir():
        raise ValueError(f"{what} {path} is a folder, not a file")
    # the nearest existing ancestor decides: it must be a folder this process may write into
    probe = path if folder else path.parent
    while not probe.exists():
        probe = probe.parent
    if not probe.is_dir():
        raise ValueError(f"{what} {path} cannot be written: {probe} is a file")
    if path.exists() and not folder and not os.access(path, os.W_OK):
        raise ValueError(f"{what} {path} cannot be written (permission denied)")
    if not os.access(probe, os.W_OK | os.X_OK):
        raise ValueError(f"{what} {path} cannot be written: no permission to write in {probe}")
    return path
