"""What a Ctrl-C (SIGINT) does to a command of ``alfa``, from its start to the end of its process.

While the command works, Ctrl-C raises ``KeyboardInterrupt`` as ever, and :func:`alfa.cli.main` says
``interrupted`` (exit status 130) after closing the progress bars left open (:func:`close_progress_bars`), so
that the line starts a line of its own and no bar is drawn again after it; where every file the command writes was
already written whole (it was printing its last lines), the line says so (:func:`interrupted_line`). Each Ctrl-C
is also noted (:class:`Interrupts`): a library may swallow one and fail of it, which the command then reports as
the interruption it was.

Once the command's work is done, everything it writes is written: a Ctrl-C then (while its folders are let go,
and while Python shuts the process down: waiting for threads, running the atexit callbacks of torch and the
others, freeing the modules, a second or more with torch loaded) is no failure. It is said in one line,
:data:`AFTER_THE_WORK`, where it can be, and the command's exit status stands: without this it was
"interrupted" and 130 (while the folders were let go), "Exception ignored in atexit callback" with a
traceback (in torch's callbacks), or the process killed by the signal without a word (once Python has put the
default action back, for the last part of its shutdown). Only where Python's own handler is in place, in the
main thread: an application embedding alfa keeps its own, and a process started with SIGINT ignored (a
background job of a shell) keeps ignoring it.

A SIGTERM (``kill``, a job scheduler's time limit, a service manager) or a SIGHUP (the terminal it ran in closed)
stops a command as a Ctrl-C does (:class:`Terminated`): its folders are let go (no stale lock is left for the next
run to replace), what it had finished is kept, and it says ``terminated (SIGTERM)`` and exits 143 (SIGHUP: 129),
the status a process killed by the signal gets. A second one ends the process at once, as the signal's default
action. Each only where that default is in place, in the main thread (``nohup`` makes SIGHUP ignored, and it stays
so).
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import os
import signal
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from types import FrameType

__all__ = [
    "AFTER_THE_WORK",
    "Interrupts",
    "Stamps",
    "STOPPING_SIGNALS",
    "Terminated",
    "close_progress_bars",
    "interrupted_line",
    "output_stamps",
    "quiet_shutdown",
    "watching",
]

AFTER_THE_WORK = "interrupted after the command finished: everything it writes is written"
"""The line a Ctrl-C (or SIGTERM, SIGHUP) that comes after a command's work is done gets (on stderr)."""

STOPPING_SIGNALS = (signal.SIGTERM, signal.SIGHUP)
"""The signals that stop a command as a Ctrl-C does, instead of killing it where it stands."""


class Terminated(KeyboardInterrupt):
    """A SIGTERM or SIGHUP (``signal``), raised in the main thread: a command stops as on a Ctrl-C (what catches
    a Ctrl-C catches it), then says ``terminated (SIGTERM)`` and exits ``128 + signal``, a shell's status for a
    process the signal killed (``alfa serve`` stops serving and exits 0)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signal = signal.Signals(signum)


class Interrupts:
    """The Ctrl-Cs (and SIGTERMs, SIGHUPs) a command got: how many (``count``), how many came while it worked
    (``early``) and how many after its work was done (``late``, which raise nothing: :meth:`work_done` says when);
    ``terminated``: the signal of the first SIGTERM or SIGHUP among them, ``None`` if none."""

    def __init__(self) -> None:
        self.count = 0
        self.terminated: signal.Signals | None = None
        self._done_at: int | None = None
        self._handled = 0

    def handled(self) -> None:
        """The command dealt with the Ctrl-Cs noted so far itself (``alfa serve`` stops serving on one): an error
        after them is the command's own, said as such, not taken for one a library swallowed."""
        self._handled = self.count - self.late

    def work_done(self) -> None:
        """The command has written all it writes: a Ctrl-C from now on is noted, not raised."""
        if self._done_at is None:
            self._done_at = self.count

    @property
    def done(self) -> bool:
        return self._done_at is not None

    @property
    def late(self) -> int:
        return 0 if self._done_at is None else self.count - self._done_at

    @property
    def early(self) -> int:
        """The Ctrl-Cs that came while the command worked (each raised, or swallowed by a library), less those it
        :meth:`handled` itself."""
        return self.count - self.late - self._handled


def _python_handles_sigint() -> bool:
    return threading.current_thread() is threading.main_thread() and (
        signal.getsignal(signal.SIGINT) is signal.default_int_handler
    )


def _kills(signum: signal.Signals) -> bool:
    return threading.current_thread() is threading.main_thread() and signal.getsignal(signum) == signal.SIG_DFL


@contextlib.contextmanager
def watching(interrupts: Interrupts) -> Iterator[Interrupts]:
    """Note every Ctrl-C, SIGTERM and SIGHUP in ``interrupts`` while the block runs: one raises
    ``KeyboardInterrupt`` (the others :class:`Terminated`, and a second one of them then kills) until
    ``interrupts.work_done()``, none after. Each only where Python's own handling is in place (its Ctrl-C handler,
    the signal's default action), in the main thread; it is put back at the end."""
    handled: dict[signal.Signals, object] = {}  # each signal handled here, and its handler before
    if _python_handles_sigint():

        def noted(signum: int, frame: FrameType | None) -> None:
            interrupts.count += 1
            if not interrupts.done:
                signal.default_int_handler(signum, frame)

        handled[signal.SIGINT] = signal.signal(signal.SIGINT, noted)
    owner = os.getpid()

    def terminate(signum: int, frame: FrameType | None) -> None:
        signal.signal(signum, signal.SIG_DFL)  # a second one is not waited for
        if os.getpid() != owner:  # a child forked meanwhile (a DataLoader's worker): killed, as it always was
            os.kill(os.getpid(), signum)
            return
        interrupts.count += 1
        interrupts.terminated = interrupts.terminated or signal.Signals(signum)
        if not interrupts.done:
            raise Terminated(signum)

    for signum in filter(_kills, STOPPING_SIGNALS):
        handled[signum] = signal.signal(signum, terminate)
    try:
        yield interrupts
    finally:
        # Both put back before either signal is taken: one between the two would meet one handler of ours and
        # one put back (a Terminated raised out of here with our Ctrl-C handler left in place).
        blocked = signal.pthread_sigmask(signal.SIG_BLOCK, handled)
        try:
            for signum, previous in handled.items():
                signal.signal(signum, previous)
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, blocked)


Stamps = dict[str, tuple[int, int] | None]


def _written_files(args: argparse.Namespace) -> dict[str, Path] | None:
    """The files the command writes, each whole at once, by how a message names them (``--out m.onnx``, and what it
    writes beside one); ``None`` where it writes a folder, or a file it adds to (an access log), whose end a Ctrl-C
    may cut short however far the command got."""
    given = {name: getattr(args, name, None) for name in getattr(args, "outputs", {})}
    given = {name: value for name, value in given.items() if value is not None}
    if not given or any(args.outputs[name] or name not in args.replaceable for name in given):
        return None
    files = {f"--{name.replace('_', '-')} {value}": Path(value) for name, value in given.items()}
    for name, (suffix, _) in getattr(args, "sidecars", {}).items():
        if name in given:
            try:
                beside = Path(given[name]).with_suffix(suffix)
            except ValueError:  # a name with no stem: nothing is said of it
                return None
            files[str(beside)] = beside
    return files


def _stamp(path: Path) -> tuple[int, int] | None:
    try:
        status = path.stat()
    except OSError:
        return None
    return status.st_ino, status.st_mtime_ns


def output_stamps(args: argparse.Namespace) -> Stamps | None:
    """What stands at each file the command writes as it starts (:func:`interrupted_line` tells which it wrote
    since: a file written atomically is a new one)."""
    files = _written_files(args)
    return None if files is None else {said: _stamp(path) for said, path in files.items()}


def interrupted_line(args: argparse.Namespace, stamps: Stamps | None, terminated: signal.Signals | None = None) -> str:
    """``interrupted`` (by a ``terminated`` signal: ``terminated (SIGTERM)``), and, where the command had written
    every file it writes before the Ctrl-C came (it was printing its last lines: alfa export after its two "wrote"
    lines), that they are written whole: a rerun finds them there, and replaces them only when asked."""
    stopped = f"terminated ({terminated.name})" if terminated else "interrupted"
    files = _written_files(args)
    if stamps is None or files is None:
        return stopped
    written = [said for said, path in files.items() if (now := _stamp(path)) is not None and now != stamps.get(said)]
    if len(written) < len(files):
        return stopped
    return f"{stopped} after it had written {' and '.join(written)}, whole"


def close_progress_bars() -> None:
    """Close every progress bar still open (tqdm's), innermost first: what is printed next starts a line of its
    own, and no bar is drawn again after it (a bar an interrupted loop left open is otherwise closed, and drawn
    once more, when Python frees that loop, after the line)."""
    if "tqdm" not in sys.modules:
        return
    from tqdm.std import tqdm

    for bar in sorted(list(tqdm._instances), key=lambda bar: abs(getattr(bar, "pos", 0)), reverse=True):
        with contextlib.suppress(Exception):  # a bar that cannot close (its stream gone) leaves the others to close
            bar.close()


def quiet_shutdown(status: int) -> int:
    """Make the rest of the process, after a command that ended with ``status``, take a Ctrl-C for what it is
    then: the command is over (and, with status 0, everything it writes is written). Called by the entry points
    (``alfa``, ``python -m alfa``) as Python is about to shut the process down; returns ``status``.

    While Python waits for the threads still running, a first Ctrl-C is said in one line (with status 0,
    :data:`AFTER_THE_WORK`) and the shutdown goes on; a second ends the process at once, with ``status``. From
    the atexit callbacks on, SIGINT is ignored: Python keeps an ignored signal ignored to the end (a handler of
    its own it replaces by the default action, which would kill the process without a word). The price: a callback
    that hangs there (a child process that never ends) is not stopped by Ctrl-C; Ctrl-\\ (SIGQUIT) or kill stops
    it."""
    if not _python_handles_sigint():
        return status
    presses = [0]

    def finishing(signum: int, frame: FrameType | None) -> None:
        presses[0] += 1
        if presses[0] > 1:  # a thread that does not end: a second Ctrl-C does not wait for it
            with contextlib.suppress(OSError, ValueError):
                sys.stdout.flush()
            os._exit(status)
        if status == 0:
            with contextlib.suppress(OSError, ValueError):
                sys.stderr.write(AFTER_THE_WORK + "\n")
                sys.stderr.flush()

    signal.signal(signal.SIGINT, finishing)
    # Registered last, so run first of the atexit callbacks (they run in reverse order).
    atexit.register(signal.signal, signal.SIGINT, signal.SIG_IGN)
    return status
