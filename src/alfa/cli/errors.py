"""One line for an error a command meets: what :func:`alfa.cli.main` prints instead of a traceback (kept apart
from the package's ``__init__`` so that command modules can use it without importing every command); and one line
for a warning (:func:`one_line_warnings`)."""

from __future__ import annotations

import contextlib
import errno
import os
import re
import sys
import warnings
from collections.abc import Iterator

__all__ = ["OS_ERROR_ADVICE", "error_line", "one_line_warnings"]

OS_ERROR_ADVICE = {
    errno.ENOSPC: "free some space or choose another place, then run the command again (what it finished is kept "
    "whole, nothing half-written is left)",
    errno.EDQUOT: "free some space or choose another place, then run the command again",
    # the process's limit on a file's size (ulimit -f), or the file system's own (FAT's 4 GiB)
    errno.EFBIG: "the file is over the largest this process may write (ulimit -f) or the file system holds: raise "
    "the limit (ulimit -f unlimited) or choose another place, then run the command again",
    errno.ELOOP: "a symbolic link there points back into itself: fix or remove the link",
    errno.EACCES: "choose a place you may use, or change its permissions",
    errno.EPERM: "choose a place you may use, or change its permissions",
    errno.EROFS: "choose a place that can be written",
    errno.ENOENT: "check the path",
    errno.ENOTDIR: "a part of the path is a file, not a folder: check the path",
    errno.EISDIR: "name a file, not a folder",
    errno.ENAMETOOLONG: "choose a shorter name",
    errno.EMFILE: "raise the limit (ulimit -n) or use fewer --workers",
    errno.EADDRINUSE: "choose another --port (0: any free one), or stop the program that uses it",
    errno.EADDRNOTAVAIL: "the address is not one of this machine's: check --host",
    errno.EIO: "check the disk, then run the command again",
    errno.EPIPE: "the program or connection it wrote to closed its end first",
}
"""What a person can do about the operating system's errors the commands meet, by error number."""


_TERMINAL_COLOUR = re.compile(r"\x1b\[[0-9;]*m")


def error_line(error: BaseException) -> str:
    """``error`` as one line: an error of the operating system as the path it concerns and what to do about it
    (:data:`OS_ERROR_ADVICE`), any other as its message, whose first line only if it has several."""
    if isinstance(error, OSError) and error.errno is not None:
        parts = [" -> ".join(str(p) for p in (error.filename, error.filename2) if p is not None)]
        parts += [error.strerror or os.strerror(error.errno), OS_ERROR_ADVICE.get(error.errno, "")]
        return ": ".join(p for p in parts if p)
    lines = _message_lines(error, type(error).__name__)
    worker = _WORKER_ERROR.match(lines[0])
    if worker and len(lines) > 1:  # a loader worker's error, re-raised with its traceback: its own last line
        _, found, message = lines[-1].partition(f"{worker.group(1)}: ")
        return (message if found else lines[-1]).strip()
    return _first_line(lines)


def _message_lines(message: object, name: str) -> list[str]:
    """The lines of an error's or a warning's message that say something, or ``[name]`` where none does."""
    text = _TERMINAL_COLOUR.sub("", str(message))  # a library's colour codes (torch.onnx's) are not text
    return [line for line in text.splitlines() if line.strip()] or [name]


def _first_line(lines: list[str]) -> str:
    """The first of a message's ``lines``, marked where more were left out."""
    return lines[0] + (" (...)" if len(lines) > 1 else "")


_WORKER_ERROR = re.compile(r"Caught (\w+) in DataLoader worker process \d+")
"""The first line of an error PyTorch re-raises from a DataLoader worker; the original's own line comes last."""


@contextlib.contextmanager
def one_line_warnings(name: str, keep_python_form: bool = False) -> Iterator[None]:
    """While a command runs, a warning Python shows is one line, ``<name>: warning: <message>`` (its first line),
    as the commands' own warnings and notes are, instead of Python's two (the warning's file and line, then the
    line of code that warned). Which warnings are shown is Python's filters' choice, as ever (a dataset's note of
    upscaled faces once, an error under ``-W error``); a warning recorded (``warnings.catch_warnings(record=True)``)
    is recorded as it was. Under Python's own warning options (``-W``, ``PYTHONWARNINGS``) a warning keeps Python's
    form, with the place it came from, and so it does with ``keep_python_form`` (``alfa export --verbose``, whose
    point is the exporter's own words, whole). Each line is said once per command: a warning raised again for every
    person of a run (``alfa.attach``'s note of a rank above a layer's size, once per calibrated person: Python shows
    it again wherever a ``catch_warnings`` block has reset its record) would otherwise repeat for hundreds of users."""
    if sys.warnoptions or keep_python_form:
        yield
        return
    said: set[str] = set()

    def one_line(
        message: Warning | str, category: type[Warning], filename: str, lineno: int, line: str | None = None
    ) -> str:
        text = f"{name}: warning: {_first_line(_message_lines(message, category.__name__))}\n"
        if text in said:
            return ""
        said.add(text)
        return text

    previous = warnings.formatwarning
    warnings.formatwarning = one_line
    try:
        yield
    finally:
        warnings.formatwarning = previous
