"""Writing files so that a crash never leaves half a file: the one atomic writer every module uses.

Every write goes to a temporary file beside its target (same folder, so the rename cannot cross file systems) and
is renamed over the target only when it is complete and on the disk (``fsync``: a power loss too leaves the old file
or the new); a reader sees the old file or the new one, never a mix. :func:`hold` keeps a second command out of a
folder one command is filling; :func:`locked` makes a second process wait for the first one's turn on a file or
folder that both may write. The lowest layer of the package: it imports nothing of ``alfa``.
"""

from __future__ import annotations

import contextlib
import contextvars
import datetime
import errno
import fcntl
import json
import os
import re
import shlex
import socket
import stat
import string
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
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
    "LOCK_FILE",
    "FolderHeldError",
    "Hold",
    "hold",
    "kind_of_file",
    "locked",
    "new_files",
    "not_a_file",
    "refuse_held_inside",
    "require_path",
    "share",
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
        raise ValueError(f"{what} {path} cannot be written: no permission to write in {probe}")
    if not (appended and path.exists()):  # a log appended to in place (/dev/null, say) makes no file beside it
        _try_writing_in(probe, path, what)
    return path


def _try_writing_in(folder: Path, path: Path, what: str) -> None:
    """Create and remove a file in ``folder``: ``os.access`` answers yes to root everywhere, also where the file
    system refuses every new file (``/sys``, a read-only mount), which only a real attempt finds out."""
    try:
        fd, probe = tempfile.mkstemp(prefix=".alfa-write-check-", dir=folder)
    except OSError as e:
        raise ValueError(f"{what} {path} cannot be written: {folder}: {e.strerror or e}") from None
    os.close(fd)
    with contextlib.suppress(OSError):
        os.unlink(probe)


LOCK_FILE = ".alfa-lock"
"""The file by which a command holds the folder it fills: JSON with its ``pid``, ``host``, ``command`` and
``started``."""


class FolderHeldError(OSError):
    """A folder another running command holds (or whose lock file cannot be judged): the message says which
    command holds it and what to do."""


@dataclass(frozen=True)
class Hold:
    """A folder held by this process: ``stale`` is the record of a dead holder's lock that was replaced (or
    ``{}`` for a lock file that could not be read), ``None`` if there was none."""

    folder: Path
    stale: dict[str, Any] | None = None

    def stale_note(self) -> str | None:
        """One line saying that a stale lock was replaced, or ``None``."""
        if self.stale is None:
            return None
        if not self.stale:
            return f"replaced an unreadable lock file {self.folder / LOCK_FILE}"
        note = (
            f"replaced a stale lock in {self.folder}: {_holder(self.stale)} is no longer running (it did not "
            "finish; its files there may be incomplete)"
        )
        left = leftover_temporary_files(self.folder)
        if left:  # not removed here: a command writing into a folder inside this one may be writing them now
            size = sum(_size(p) for p in left) / 2**20
            note += (
                f"; it left {len(left)} temporary file(s) of unfinished writes ({size:.1f} MiB), which nothing reads: "
                f"delete them with  find {shlex.quote(str(self.folder))} -regextype posix-extended -regex "
                f"{shlex.quote(TEMPORARY_PATH)} -delete"
            )
        return note


TEMPORARY_PATH = r".*/\.[^/]+\.[0-9a-f]{8}\.tmp(\.[^./]+)?"
"""The path of a file :func:`atomic_path` is writing (``.NAME.<8 hex>.tmp.SUFFIX``), as a regular expression that
Python and ``find -regextype posix-extended -regex`` read alike: what the stale-lock note counts is what its
command deletes."""


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:  # renamed or removed since it was listed (a writer in a folder inside finished it)
        return 0


def leftover_temporary_files(folder: str | os.PathLike) -> list[Path]:
    """The files under ``folder`` named as :func:`atomic_path` names a file being written: what a killed writer left."""
    found = []
    for root, _, names in os.walk(folder):
        found += [Path(root) / n for n in names if re.fullmatch(TEMPORARY_PATH, os.path.join(root, n))]
    return sorted(found)


@contextlib.contextmanager
def hold(folder: str | os.PathLike, what: str) -> Iterator[Hold]:
    """Hold ``folder`` (created if missing) while the block runs, ``what`` (the command) naming the holder in
    the lock file :data:`LOCK_FILE`; it is removed when the block ends, by an error or an interrupt too, and a
    folder the hold created is removed again if it is still empty.

    A lock whose process is still running on this host raises :class:`FolderHeldError`; one from a process that
    is gone (or a file that is not a lock) is stale and replaced, which the :class:`Hold` yielded says. A lock
    from another host is never judged from here: it raises too, naming the host. A symbolic link in the lock's
    place is never followed."""
    folder = Path(folder)
    _refuse_held_around(folder)
    created = [p for p in (folder, *folder.parents) if not p.exists()]
    folder.mkdir(parents=True, exist_ok=True)
    lock = folder / LOCK_FILE
    record = _record(what)
    try:
        stale, fd = _take(lock, record)
    except BaseException:
        _remove_empty(created)
        raise
    try:
        # After the lock is taken, as share() looks for locks after its marker is written: of a hold and a share
        # that start at once, at least one sees the other.
        _refuse_shared_around(folder, include_self=True)
        yield Hold(folder, stale)
    finally:
        # Only our own lock: a file put there since (by someone who judged ours stale) is not ours to remove.
        # Ours stays open until then, so that no new file can have its inode number.
        with contextlib.suppress(FileNotFoundError):
            if os.stat(lock, follow_symlinks=False).st_ino == os.fstat(fd).st_ino:
                lock.unlink()
        os.close(fd)
        _remove_empty(created)


@contextlib.contextmanager
def locked(path: str | os.PathLike, on_wait: Callable[[str], None] | None = None) -> Iterator[None]:
    """Hold an exclusive lock on ``path`` + ``.lock`` (a file beside ``path``, created with its folder if missing
    and left in place) while the block runs; another process (or another open of it in this one) waits for its turn.
    ``on_wait`` is called once, before waiting, when the lock is held elsewhere (to say why nothing happens), with
    the holder as the record it writes there says ("'python -m alfa …' (process N, started …)", else "another process").

    The lock is the kernel's (``flock``): it goes with the process, so a crashed holder never leaves it held."""
    path = Path(path)
    lock = path.with_name(path.name + ".lock")
    lock.parent.mkdir(parents=True, exist_ok=True)
    with open(lock, "a", encoding="utf-8") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            if on_wait is not None:  # a record of a dead process, or of this one, is a holder not yet written
                found = _live_record(lock)
                on_wait("another process" if found is None else _holder(found))
            fcntl.flock(f, fcntl.LOCK_EX)
        with contextlib.suppress(OSError):  # best effort, for a message: its command line, as ps shows it
            f.truncate(0)
            f.write(json.dumps(_record(shlex.join(sys.orig_argv))) + "\n")
            f.flush()
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _record(what: str) -> dict[str, Any]:
    """What a lock or a share's mark says of the command ``what`` in this process."""
    return {
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "command": what,
        "started": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }


def _take(lock: Path, record: dict[str, Any]) -> tuple[dict[str, Any] | None, int]:
    """Create ``lock`` holding ``record``, replacing a stale one; the stale record and the new file, open.

    The lock appears whole: its record is written to a file of another name first and then linked as ``lock``
    (which fails if one exists). Created empty and written after, it could be read in between, judged unreadable,
    removed, and taken by a second command too."""
    stale: dict[str, Any] | None = None
    for _ in range(5):  # each round either creates the lock, raises, or removes a stale one and tries again
        try:
            fd = _create_whole(lock, (json.dumps(record) + "\n").encode("utf-8"))
        except FileExistsError:
            found = _remove_if_stale(lock)
            if found is not None:
                stale = found
            continue
        return stale, fd
    raise FolderHeldError(f"{lock.parent} is being taken by other commands at this moment: try again")


def _create_whole(path: Path, data: bytes) -> int:
    """``path`` created with ``data`` in one step (``FileExistsError`` if it exists), opened for reading."""
    tmp = _temporary_beside(path)
    try:
        _write_new(tmp, data)
        try:
            os.link(tmp, path, follow_symlinks=False)
        except OSError as e:
            if e.errno not in (errno.EPERM, errno.EOPNOTSUPP, errno.ENOTSUP):
                raise
            # A file system without hard links: created, then written; a lock read empty in between is young, and
            # a young empty lock is judged held (_remove_if_stale).
            _write_new(path, data)
        return os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except FileExistsError:
        raise
    except OSError as e:
        raise naming(e, path) from None  # a full disk: which file could not be written
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()


def _write_new(path: Path, data: bytes) -> None:
    """``path`` created (``FileExistsError`` if it exists; a link in its place is not followed) with ``data``."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)


def _remove_if_stale(lock: Path) -> dict[str, Any] | None:
    """Remove ``lock`` if its holder is gone (its record, ``{}`` if unreadable); raise if it is alive; ``None``
    if the file changed or vanished meanwhile (the caller tries again)."""
    try:
        fd = os.open(lock, os.O_RDONLY | os.O_NOFOLLOW)
    except FileNotFoundError:
        return None
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise FolderHeldError(
                f"{lock} is a symbolic link, not a lock alfa wrote: remove it if no command is writing to {lock.parent}"
            ) from None
        raise
    status = os.fstat(fd)
    if not stat.S_ISREG(status.st_mode):
        os.close(fd)
        raise FolderHeldError(
            f"{lock} is not a lock alfa wrote (a folder?): remove it if no command is writing to {lock.parent}"
        )
    with os.fdopen(fd, encoding="utf-8", errors="replace") as f:
        if status.st_size == 0 and time.time() - status.st_mtime < _YOUNG_SECONDS:
            raise FolderHeldError(f"{lock.parent} is being taken by another command at this moment: try again")
        # Two commands that both find a stale lock take turns here, so that the second sees that the first
        # has replaced it (the path no longer names this file) instead of removing the first one's new lock.
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            if os.stat(lock, follow_symlinks=False).st_ino != os.fstat(f.fileno()).st_ino:
                return None
        except FileNotFoundError:
            return None
        try:
            found = json.loads(f.read())
            pid, host = int(found["pid"]), str(found["host"])
        except (ValueError, KeyError, TypeError):
            found, pid, host = {}, None, None
        if pid is not None:
            if host != socket.gethostname():
                raise FolderHeldError(
                    f"{lock.parent} is held by {_holder(found)} on host {host}, which cannot be checked from "
                    f"here: wait for it, or remove {lock} if it no longer runs there"
                )
            if _running(pid, found):
                raise _still_running(f"{lock.parent} is held", found, lock)
        lock.unlink()
        return found


_YOUNG_SECONDS = 10.0  # an empty lock younger than this is being written by its command, not left by a dead one


def _live_record(lock: Path) -> dict[str, Any] | None:
    """The record of the command holding ``lock`` if it may still be running (here, or on another host, which
    cannot be judged from here); ``None`` for no lock, a dead holder's, or one that is not alfa's."""
    try:
        found = json.loads(lock.read_text(encoding="utf-8", errors="replace"))
        pid, host = int(found["pid"]), str(found["host"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if host == socket.gethostname() and (pid == os.getpid() or not _running(pid, found)):
        return None
    return found


def refuse_held_inside(folder: str | os.PathLike, *, shares_of: Path | None = None) -> None:
    """Raise :class:`FolderHeldError` if a running command holds ``folder`` or a folder inside it, or fills one with
    others of its kind (:func:`share`): what is about to be written or removed there is its. Shares of the folder
    ``shares_of`` (a sharer's own) are no obstacle."""
    for root, folders, names in os.walk(folder):
        if LOCK_FILE in names and (found := _live_record(Path(root) / LOCK_FILE)) is not None:
            raise _still_running(f"{root} is held", found, Path(root) / LOCK_FILE)
        if SHARE_FOLDER in folders:
            folders.remove(SHARE_FOLDER)
            if shares_of is None or Path(root).resolve() != shares_of:
                _refuse_live_share(Path(root), f"{root} is filled")


SHARE_FOLDER = ".alfa-shared"
"""The folder, inside one that commands of one kind fill together (:func:`share`), holding a file per such command
running: named by its process number, with the record a lock holds."""


@contextlib.contextmanager
def share(folder: str | os.PathLike, what: str) -> Iterator[None]:
    """Fill ``folder`` (created if missing) together with other commands of one kind (a benchmark's pieces write
    one folder at once) while the block runs, ``what`` naming this one. A command that holds its folder
    (:func:`hold`) is refused in it or in a folder inside it meanwhile; this refuses a folder another command holds
    or fills, one inside such a folder, and one with such a folder inside it, but not one others fill with it.

    Its mark, a file in :data:`SHARE_FOLDER`, goes at the end (by an error or an interrupt too), and so do marks
    of commands no longer running."""
    folder = Path(folder)
    created = [p for p in (folder, *folder.parents) if not p.exists()]
    folder.mkdir(parents=True, exist_ok=True)
    marks = folder / SHARE_FOLDER
    created.insert(0, marks)
    mark = marks / str(os.getpid())
    try:
        marks.mkdir(exist_ok=True)
        _remove_stale_shares(marks)
        mark.unlink(missing_ok=True)  # a dead command's, whose number this process now has
        os.close(_create_whole(mark, (json.dumps(_record(what)) + "\n").encode("utf-8")))
        # After the mark is written, as hold() looks for marks after its lock is taken (see there).
        refuse_held_inside(folder, shares_of=folder.resolve())
        _refuse_held_around(folder)
        _refuse_shared_around(folder, include_self=False)
        yield
    finally:
        mark.unlink(missing_ok=True)
        _remove_empty(created)


def _remove_stale_shares(marks: Path) -> None:
    for mark in marks.iterdir():
        if _live_record(mark) is None and mark.name != str(os.getpid()):
            mark.unlink(missing_ok=True)


def _refuse_shared_around(folder: Path, *, include_self: bool) -> None:
    """A folder (or one inside it) that running commands fill together is theirs, not one command's to hold."""
    folder = folder.resolve()
    for around in (folder, *folder.parents) if include_self else folder.parents:
        if (around / SHARE_FOLDER).is_dir():
            _refuse_live_share(
                around, f"{folder} is filled" if around == folder else f"{folder} is inside {around}, filled"
            )


def _refuse_live_share(folder: Path, held: str) -> None:
    try:
        marks = sorted((folder / SHARE_FOLDER).iterdir())
    except OSError:
        return
    for mark in marks:
        if (found := _live_record(mark)) is not None:
            raise _still_running(held, found, mark)


def _refuse_held_around(folder: Path) -> None:
    """A folder inside one another running command holds is that command's to fill (alfa crate gaze's stages)."""
    for parent in folder.resolve().parents:
        if (found := _live_record(parent / LOCK_FILE)) is not None:
            raise _still_running(f"{folder} is inside {parent}, held", found, parent / LOCK_FILE)


def _running(pid: int, record: dict[str, Any]) -> bool:
    """Whether the lock's holder ``pid`` (on this host) still runs: that process lives, and is not a later one
    given its number."""
    return _alive(pid) and not _started_after(pid, record.get("started"))


def _still_running(held: str, record: dict[str, Any], lock: Path) -> FolderHeldError:
    """The error for a folder a running command holds; ``held`` says which ("X is held", "X is inside Y, held")."""
    return FolderHeldError(
        f"{held} by {_holder(record)}, still running: wait for it to finish, or write elsewhere (if no such command "
        f"runs, remove {lock})"
    )


def _holder(record: dict[str, Any]) -> str:
    return f"{record.get('command', 'a command')!r} (process {record.get('pid')}, started {record.get('started')})"


def _started_after(pid: int, started: Any) -> bool:
    """Whether process ``pid`` began well after ``started`` (a lock's ISO time): then it is not the lock's holder but
    a later process given the same number. ``False`` where it cannot be told (no /proc, an unreadable time)."""
    try:
        since = datetime.datetime.fromisoformat(str(started)).timestamp()
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
            ticks = int(f.read().rpartition(")")[2].split()[19])  # field 22, after the name in parentheses
        with open("/proc/stat", encoding="ascii") as f:
            boot = next(int(line.split()[1]) for line in f if line.startswith("btime "))
    except (OSError, ValueError, IndexError, StopIteration):
        return False
    # A minute's margin: the holder began before it wrote its lock, whatever the clock did since boot.
    return boot + ticks / os.sysconf("SC_CLK_TCK") > since + 60


def _alive(pid: int) -> bool:
    if pid <= 0:  # 0 and negatives name process groups to kill(), never one holder
        return False
    try:
        os.kill(pid, 0)
    except PermissionError:  # it exists, under another user
        return True
    except (ProcessLookupError, OverflowError):
        return False
    return True


def _remove_empty(created: list[Path]) -> None:
    for path in created:  # deepest first
        try:
            path.rmdir()
        except OSError:
            return
