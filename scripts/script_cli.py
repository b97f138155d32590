"""What the Python helper scripts of scripts/ share: a parser whose refusal is one line, and that one-line refusal.

Standard library only: a script imports it before alfa, so that run with another Python than the project's it can
still say so in one line. A script puts its own folder on ``sys.path`` before importing it: run as
``python scripts/NAME.py`` the folder is there already, but not when a test loads the script by its path.
"""

from __future__ import annotations

import argparse
import datetime
import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn


class Parser(argparse.ArgumentParser):
    """argparse's parser, except that a refused argument is one line, ``NAME: the error (see PROG --help)``
    (argparse prints its usage block first), and that an option is written whole, as alfa's are (no ``--rep`` for
    ``--replace``)."""

    def __init__(self, *args: Any, name: str, **kwargs: Any) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)
        self.name = name

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.name}: {message} (see {self.prog} --help)\n")


def refuse(name: str, message: str) -> NoReturn:
    """``NAME: message`` on stderr, and exit status 2."""
    print(f"{name}: {message}", file=sys.stderr)
    sys.exit(2)


def run_child(name: str, script: str, env: dict[str, str], what: str) -> dict:
    """Run ``script --child`` in a fresh process of this Python under ``env``: the JSON object of its last line. A
    child that fails is one line, its error's own (the last of its traceback), naming the child by ``what``."""
    done = subprocess.run([sys.executable, script, "--child"], env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        said = [line for line in done.stderr.splitlines() if line.strip()] or [f"exit status {done.returncode}"]
        refuse(name, f"the child process {what} failed: {said[-1].strip()}")
    try:
        return json.loads(done.stdout.strip().splitlines()[-1])
    except (IndexError, ValueError):
        refuse(name, f"the child process {what} printed no result: {done.stdout.strip()[-200:]!r}")


def stamped_output(name: str, given: Path | None, folder: Path, check_writable: Callable[..., Any]) -> tuple[Path, str]:
    """The file a measuring script writes (``given``, else ``folder/<UTC stamp>.txt``) and the stamp, refused in one
    line before any measurement where it exists or cannot be written (``check_writable``: alfa's, passed in by the
    caller, since this module imports nothing beyond the standard library)."""
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H%MZ")
    out = given or folder / f"{stamp}.txt"
    try:
        check_writable(out, what="--out")  # a folder, or a place under a file: said now, not after the work
    except ValueError as e:
        refuse(name, str(e))
    if out.exists():
        refuse(name, f"{out} exists; give another --out")
    return out, stamp
