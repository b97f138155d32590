"""Holding a folder and taking turns on a file: what keeps two processes from mixing their files.

:func:`hold` keeps a second command out of a folder one command is filling (a lock file there, :data:`LOCK_FILE`,
naming its holder; a dead holder's is stale and replaced); :func:`share` lets commands of one kind fill one folder
together while keeping a holder out; :func:`locked` makes a second process wait for the first one's turn on a file
or folder that both may write (the kernel's ``flock``). Above :mod:`alfa.fileio`, whose writer makes the lock whole.
"""

from __future__ import annotations

import contextlib
import datetime
import errno
import fcntl
import json
import os
import shlex
import socket
import stat
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .fileio import TEMPORARY_PATH, _temporary_beside, leftover_temporary_files, naming

__all__ = [
    "LOCK_FILE",
    "FolderHeldError",
    "Hold",
    "hold",
    "locked",
    "refuse_held_inside",
    "share",
]

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


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:  # renamed or removed since it was listed (a writer in a folder inside finished it)
        return 0


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
            with contextlib.suppress(OSError):  # a waiter that looks before the next holder writes finds no one's
                f.truncate(0)
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
