"""Writing files so that a crash never leaves half a file: the one atomic writer every module uses.

Every write goes to a temporary file beside its target (same folder, so the rename cannot cross file systems) and
is renamed over the target only when it is complete and on the disk (``fsync``: a power loss too leaves the old file
or the new); a reader sees the old file or the new one, never a mix. Keeping a second command out of a folder, and
processes taking turns on a file, are :mod:`alfa.locks`'s. The lowest layer of the package: it imports nothing of
``alfa``.
"""

from __future__ import annotations

import contextlib
import contextvars
import errno
import json
import os
import re
import stat
import string
import sys
import tempfile
import uuid
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

__all__ = [
    "atomic_path",
    "os_error_in",
    "naming",
    "write_text",
    "write_bytes",
    "write_json",
    "write_safetensors",
    "safe_filename",
    "PORTABLE_CHARS",
    "check_writable",
    "kind_of_file",
    "new_files",
    "not_a_file",
    "require_path",
    "settings_differences",
    "usable_cpus",
]


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary path beside ``path``; when the block ends without an error it replaces ``path``.

    For writers that take a path (``safetensors.torch.save_file``, ``torch.save``, ``Figure.savefig``). The
    temporary name keeps the target's suffix, so writers that choose a format by suffix still do. The parent folder
    is created. On an error the temporary file is removed and ``path`` is untouched. The file gets the permissions
    of any new file the user writes (``0o666`` less the umask), whatever mode the writer gave its own file
    (safetensors writes ``0o600``); its data is on the disk before it is renamed."""
    path = Path(path)
    if path.is_symlink():  # the file it names is replaced, not the link (which a person made on purpose)
        path = Path(os.path.realpath(path))
    if path.is_dir():  # said before the writer works, and naming the target, not the temporary file
        raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), str(path))
    if path.exists() and not path.is_file():  # a device or a pipe would be replaced by a file
        raise ValueError(f"{path} is not a regular file (a device, pipe or socket): name a file")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise naming(e, path.parent) from None
    tmp = _temporary_beside(path)
    try:
        yield tmp
        _sync(tmp)  # its data on the disk before its name (and before a mode that may not let it be read again)
        os.chmod(tmp, _new_file_mode())
        if Path(os.path.realpath(path)) in (_NEW_FILES.get() or ()):
            _put_new(tmp, path)
        else:
            os.replace(tmp, path)
        _sync(path.parent, folder=True)  # and the rename
    except Exception as e:
        # A writer that failed on the file system (disk full, no permission), also one that wraps the OS's error
        # in its own (safetensors' SafetensorError, an exporter's error): an OSError naming the target.
        found = os_error_in(e)
        if found is None:
            raise
        if found.filename is not None and Path(found.filename) == tmp:  # the user named the target, not this
            found = type(found)(found.errno, found.strerror, str(path))
        raise naming(found, path) from e
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()


_NO_SYNC = frozenset({errno.EBADF, errno.EINVAL, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EROFS})  # cannot, not lost


def _sync(path: Path, folder: bool = False) -> None:
    """Put ``path``'s data (a folder's: its entries, best effort) on the disk now; a disk's error (``EIO``) raises,
    and a file that cannot be opened or synced (its mode, its file system) is left as it is."""
    try:
        fd = os.open(path, os.O_RDONLY | (getattr(os, "O_DIRECTORY", 0) if folder else 0))
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError as e:
        if not folder and e.errno not in _NO_SYNC:
            raise
    finally:
        os.close(fd)


_NEW_FILES: contextvars.ContextVar[set[Path] | None] = contextvars.ContextVar("alfa_new_files", default=None)


@contextlib.contextmanager
def new_files(paths: Iterable[str | os.PathLike]) -> Iterator[None]:
    """While the block runs, :func:`atomic_path` writes each of ``paths`` (files that did not exist when a command
    started) only if it still does not exist: one another command wrote meanwhile is kept, and this one's result
    goes beside it, said in the error. A path is free once written (the command may rewrite its own file)."""
    token = _NEW_FILES.set({Path(os.path.realpath(p)) for p in paths})
    try:
        yield
    finally:
        _NEW_FILES.reset(token)


def _put_new(tmp: Path, path: Path) -> None:
    """``tmp`` as ``path``, which must not exist (else :class:`FileExistsError`, ``tmp`` kept beside it)."""
    try:
        os.link(tmp, path)
    except OSError as e:
        if e.errno != errno.EEXIST and e.errno not in (errno.EPERM, errno.EOPNOTSUPP, errno.ENOTSUP):
            raise
        if e.errno == errno.EEXIST or path.exists():  # (no hard links on this file system: checked, then renamed)
            kept = _name_beside(path, "", f".{uuid.uuid4().hex[:8]}")
            os.replace(tmp, kept)
            said = f"written by another command while this one ran: it is kept, and this command's result is {kept}"
            raise FileExistsError(errno.EEXIST, said, str(path)) from None
        os.replace(tmp, path)
    (_NEW_FILES.get() or set()).discard(Path(os.path.realpath(path)))


def _temporary_beside(path: Path) -> Path:
    """A new name beside ``path`` (:data:`TEMPORARY_PATH`'s form)."""
    # Unique per call: several processes may write the same target at once (benchmark pieces).
    return _name_beside(path, ".", f".{uuid.uuid4().hex[:8]}.tmp")


def _name_beside(path: Path, before: str, after: str) -> Path:
    """``before + stem + after + suffix`` beside ``path``, within the file system's 255 bytes a name: the target's
    own stem is shortened where a long name would not leave room (bytes as the file system counts them, whatever
    the name's encoding)."""
    suffix = path.suffix if len(os.fsencode(path.suffix)) <= 32 else ""
    room = 255 - len(os.fsencode(f"{before}{after}{suffix}"))
    whole = os.fsencode(path.stem)
    stem = os.fsdecode(whole[:room])
    for cut in range(min(room, len(whole)), max(min(room, len(whole)) - 4, -1), -1):
        try:  # cut between characters where the name is valid text (a name that is not keeps its bytes)
            stem = whole[:cut].decode(sys.getfilesystemencoding())
            break
        except UnicodeDecodeError:
            continue
    return path.with_name(f"{before}{stem}{after}{suffix}")


_KINDS = (
    (b"PK\x03\x04", "a zip archive as torch.save writes, whose pickle alfa never loads"),
    (b"\x80", "a pickle, which alfa never loads"),
    (b"\x89PNG", "a PNG image"),
    (b"\xff\xd8\xff", "a JPEG image"),
    (b"\x89HDF", "an HDF5 file"),
    (b"\x08", "perhaps an ONNX model"),
)


def require_path(value: Any, function: str, argument: str = "path") -> Path:
    """``value`` as a :class:`~pathlib.Path`, or, for neither a string nor an ``os.PathLike`` (``None``, an open
    file), a ``TypeError`` naming ``alfa.<function>`` and the argument (pathlib's own message names neither)."""
    if not isinstance(value, (str, os.PathLike)):
        raise TypeError(f"alfa.{function}: {argument} must be a str or os.PathLike (a file path), got {value!r}")
    return Path(value)


def kind_of_file(path: str | os.PathLike) -> str | None:
    """What a file that should have been safetensors looks like from its first bytes ("a JSON file", "a pickle, which
    alfa never loads", ...), for a message; ``None`` if it cannot be told."""
    try:
        with open(path, "rb") as f:
            head = f.read(16)
    except OSError:
        return None
    if head[8:9] == b"{":  # a safetensors file (an 8-byte header length, then its JSON): damaged, not another kind
        return None
    if head.lstrip()[:1] in (b"{", b"["):
        return "a JSON file"
    return next((kind for magic, kind in _KINDS if head.startswith(magic)), None)


def not_a_file(path: str | os.PathLike) -> str | None:
    """What stands at ``path`` where a regular file should (``"a folder"``, ``"a symbolic link that points back into
    itself"``, …), in words for a message; ``None`` where a regular file is there, or nothing is."""
    path = Path(path)
    try:
        mode = path.stat().st_mode
    except OSError as e:
        if e.errno == errno.ELOOP:
            return "a symbolic link that points back into itself"
        if path.is_symlink():
            return f"a symbolic link to {os.readlink(path)}, which does not exist"
        return None
    return "a folder" if stat.S_ISDIR(mode) else None if stat.S_ISREG(mode) else "a device, pipe or socket"


def _new_file_mode() -> int:
    """The permissions ``open(path, "w")`` gives a new file: ``0o666`` less the process's umask."""
    try:  # Linux shows the umask; setting it to read it back would race with files other threads create
        with open("/proc/self/status", encoding="ascii") as f:
            mask = next(int(line.split()[1], 8) for line in f if line.startswith("Umask:"))
    except (OSError, StopIteration, ValueError, IndexError):
        mask = os.umask(0o022)
        os.umask(mask)
    return 0o666 & ~mask


def usable_cpus() -> int:
    """The CPUs this process may run on (its affinity: fewer than the machine's under ``taskset`` or a container's
    cpuset), what a count of worker processes or threads is sized by; the machine's count where the system does
    not say (macOS, Windows), and at least 1."""
    if hasattr(os, "sched_getaffinity"):
        with contextlib.suppress(OSError):
            return max(1, len(os.sched_getaffinity(0)))
    return os.cpu_count() or 1


_RUST_IO_ERROR = re.compile(r"\(os error (\d+)\)")


def os_error_in(error: BaseException) -> OSError | None:
    """The operating system's error behind ``error``: itself if it is an ``OSError`` with an error number, one
    it was raised from (``raise ... from``, not any error being handled when it was raised), or one rebuilt from
    a Rust library's message (``"... (os error 28)"``: how safetensors reports a full disk); else ``None``."""
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, OSError) and current.errno is not None:
            return current
        match = _RUST_IO_ERROR.search(str(current))
        if match is not None:
            number = int(match.group(1))
            return OSError(number, os.strerror(number))
        current = current.__cause__
    return None


def naming(error: OSError, path: str | os.PathLike) -> OSError:
    """``error`` with ``path`` as its file name where it names none (an error of ``os.write`` does not), of the
    same class (``FileNotFoundError`` stays one); ``error`` itself if it names a file already."""
    if error.filename is not None or error.errno is None:
        return error
    return type(error)(error.errno, error.strerror, str(path))


def write_bytes(path: str | os.PathLike, data: bytes) -> Path:
    """Write ``data`` to ``path`` atomically; returns the path."""
    with atomic_path(path) as tmp:
        tmp.write_bytes(data)
    return Path(path)


def write_safetensors(path: str | os.PathLike, tensors: dict[str, Any], metadata: dict[str, str] | None = None) -> Path:
    """Write ``tensors`` (torch tensors) as a safetensors file, atomically, with ``metadata`` in its header in sorted
    order; returns the path. The safetensors library writes the metadata in an order that changes from process to
    process, so the same tensors and metadata would make other bytes on every run (and a digest of the file
    would change with them)."""
    from safetensors.torch import save_file

    with atomic_path(path) as tmp:
        save_file(tensors, str(tmp), metadata=metadata)
        _sort_header_metadata(tmp)
    return Path(path)


def _sort_header_metadata(path: Path) -> None:
    """Rewrite the header of the safetensors file ``path`` with its ``__metadata__`` entries in sorted order, in
    place: the same JSON in another order has the same length, so no tensor moves (a shorter one is padded with
    spaces, which the format allows; one that came out longer is left as written)."""
    with open(path, "r+b") as f:
        length = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(length))
        if len(header.get("__metadata__") or {}) < 2:
            return
        header["__metadata__"] = dict(sorted(header["__metadata__"].items()))
        text = json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
        if len(text) <= length:
            f.seek(8)
            f.write(text + b" " * (length - len(text)))


def write_text(path: str | os.PathLike, text: str) -> Path:
    """Write ``text`` (UTF-8) to ``path`` atomically; returns the path."""
    return write_bytes(path, text.encode("utf-8"))


def write_json(path: str | os.PathLike, data: Any, *, indent: int | None = 2, compact_list: str | None = None) -> Path:
    """Write ``data`` as JSON atomically, with a final newline. NaN and ±inf are written as ``null``
    (JSON has no such numbers, and a strict reader would reject the file).

    ``compact_list``: the key of a list in the top-level object written last, one compact item per line (a
    file of many large records: about 40 % smaller than indented, and a changed record is one changed line
    for git); the rest of the object is indented as usual."""
    data = finite_or_none(data)
    if compact_list is None:
        return write_text(path, json.dumps(data, indent=indent) + "\n")
    if not isinstance(data.get(compact_list), list):
        raise TypeError(f"write_json: {compact_list!r} must name a list of the object written")
    head = {k: v for k, v in data.items() if k != compact_list}
    items = ",\n".join(json.dumps(item, separators=(",", ":")) for item in data[compact_list])
    opening = json.dumps(head, indent=indent)[:-1].rstrip() + ("," if head else "")
    return write_text(path, f"{opening}\n{json.dumps(compact_list)}:[\n{items}\n]}}\n")


def finite_or_none(x: Any) -> Any:
    """``x`` with every NaN and ±inf float, in nested dicts and lists, as ``None`` (JSON's ``null``)."""
    if isinstance(x, float) and (x != x or x in (float("inf"), float("-inf"))):
        return None
    if isinstance(x, dict):
        return {k: finite_or_none(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [finite_or_none(v) for v in x]
    return x


_FILENAME_KEEP = frozenset("._=-")

PORTABLE_CHARS = frozenset(string.ascii_letters + string.digits + "._-")
"""POSIX's portable file name characters: what a person's adapter file is named with
(:func:`alfa.gaze.evaluate.adapter_filename`) and what a user id ``alfa serve`` takes is made of (its
``USER_ID``), so that the id of every adapter file the service finds is one it accepts. ASCII: ``str.isalnum``
also takes ``é``, which no user id is."""


def read_kept_json(path: str | os.PathLike, kind: type = dict) -> Any:
    """A JSON file a run kept to resume from (a record, a state), which must hold a ``kind``; one that cannot be
    read as such is named, with what to do (``ValueError``), not a bare parser error or a ``TypeError`` later."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"{path}: damaged ({e}); delete it to redo what it kept") from None
    if not isinstance(data, kind):
        raise ValueError(
            f"{path}: damaged (a JSON {type(data).__name__}, not a {kind.__name__}); delete it to redo what it kept"
        )
    return data


_LONG = 60
"""The length past which a differing value is not printed: a list of persons, a checksum's record."""


def settings_differences(saved: Any, mine: Any, prefix: str = "", absent: str = "not set") -> list[str]:
    """What differs between the settings a file kept (``saved``) and this run's (``mine``), key by key down nested
    mappings by dotted names: ``["truncate_config.rank 64 vs 32", "seeds [0] vs [0, 1]"]``, the file's value first.
    A key one side lacks is ``absent`` there (where settings are left out at their defaults, say "its default"); a
    value too long to read in a line only ``differs``. Two values that are not both mappings are one entry, named
    ``prefix``. The one way alfa says why a folder holds another run."""
    if not (isinstance(saved, dict) and isinstance(mine, dict)):
        if saved == mine:
            return []
        said = [absent if v is _ABSENT else repr(v) for v in (saved, mine)]
        name = prefix.rstrip(".") or "the value"
        return [f"{name} differs" if max(map(len, said)) > _LONG else f"{name} {said[0]} vs {said[1]}"]
    found = []
    for key in sorted(set(saved) | set(mine), key=str):
        found += settings_differences(saved.get(key, _ABSENT), mine.get(key, _ABSENT), f"{prefix}{key}.", absent)
    return found


_ABSENT = object()  # a key absent on one side differs even from a None on the other


def safe_filename(name: str) -> str:
    """``name`` as one path component: letters, digits and ``._=-`` kept, everything else (``/``, ``→``,
    ``[``, ``:``, ``?``, spaces) replaced by ``_``. Used for every folder or file named after a method
    label, a person or a dataset spec."""
    out = "".join(c if c.isalnum() or c in _FILENAME_KEEP else "_" for c in name)
    if out in ("", ".", ".."):
        raise ValueError(f"{name!r} does not make a usable file name")
    return out


def check_writable(
    path: str | os.PathLike, *, folder: bool = False, what: str = "output", appended: bool = False
) -> Path:
    """Fail now, before any work, if ``path`` could not be written later: a file whose place is a folder (or
    under a file), a folder that is a file, a device or pipe that a file would replace (``appended``: a file written
    to in place, an access log, may be one), or a place this process may not write. Leaves nothing behind (the
    check writes and removes a probe file where the output will be made). Raises ``ValueError``."""
    path = Path(path)
    if folder and path.exists() and not path.is_dir():
        raise ValueError(f"{what} {path} is a file, not a folder")
    if not folder and path.is_dir():
        raise ValueError(f"{what} {path} is a folder, not a file")
    if not folder and not appended and path.exists() and not path.is_file():  # a log may go to /dev/null or a pipe
        raise ValueError(f"{what} {path} is not a regular file (a device, pipe or socket): name a file")
    # the nearest existing ancestor decides: it must be a folder this process may write into
    # a file output is written beside what a link at its place points to (atomic_path resolves it)
    probe = path if folder else Path(os.path.realpath(path)).parent if path.is_symlink() else path.parent
    while not probe.exists():
        probe = probe.parent
    if not probe.is_dir():
        raise ValueError(f"{what} {path} cannot be written: {probe} is a file")
    if path.exists() and not folder and not os.access(path, os.W_OK):
        raise ValueError(f"{what} {path} cannot be written (permission denied)")
    if not os.access(probe, os.W_OK | os.X_OK):
        if _read_only_mount(probe):  # no permission would send the user to chmod, which cannot help here
            raise ValueError(f"{what} {path} cannot be written: {probe} is on a read-only file system")
        raise ValueError(f"{what} {path} cannot be written: no permission to write in {probe}")
    if not (appended and path.exists()):  # a log appended to in place (/dev/null, say) makes no file beside it
        _try_writing_in(probe, path, what)
    return path


def _read_only_mount(folder: Path) -> bool:
    """Whether ``folder`` is on a file system mounted read-only (``False`` where the system cannot say)."""
    try:
        return bool(os.statvfs(folder).f_flag & os.ST_RDONLY)
    except (AttributeError, OSError):  # no statvfs (Windows)
        return False


def _try_writing_in(folder: Path, path: Path, what: str) -> None:
    """Create and remove a file in ``folder``: ``os.access`` answers yes to root everywhere, also where the file
    system refuses every new file (``/sys``, a read-only mount), which only a real attempt finds out."""
    try:
        fd, probe = tempfile.mkstemp(prefix=".alfa-write-check-", dir=folder)
    except OSError as e:
        # /proc says "No such file or directory" of a folder that is there: the words say which is meant
        said = "takes no new files" if e.errno == errno.ENOENT else "refuses a new file"
        raise ValueError(f"{what} {path} cannot be written: {folder} {said} ({e.strerror or e})") from None
    os.close(fd)
    with contextlib.suppress(OSError):
        os.unlink(probe)


TEMPORARY_PATH = r".*/\.[^/]+\.[0-9a-f]{8}\.tmp(\.[^./]+)?"
"""The path of a file :func:`atomic_path` is writing (``.NAME.<8 hex>.tmp.SUFFIX``), as a regular expression that
Python and ``find -regextype posix-extended -regex`` read alike: what the stale-lock note counts is what its
command deletes."""


def leftover_temporary_files(folder: str | os.PathLike) -> list[Path]:
    """The files under ``folder`` named as :func:`atomic_path` names a file being written: what a killed writer left."""
    found = []
    for root, _, names in os.walk(folder):
        found += [Path(root) / n for n in names if re.fullmatch(TEMPORARY_PATH, os.path.join(root, n))]
    return sorted(found)
