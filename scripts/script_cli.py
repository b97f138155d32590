"""What the Python helper scripts of scripts/ share: a parser whose refusal is one line, and that one-line refusal.

Standard library only: a script imports it before alfa, so that run with another Python than the project's it can
still say so in one line. A script puts its own folder on ``sys.path`` before importing it: run as
``python scripts/NAME.py`` the folder is there already, but not when a test loads the script by its path.
"""

from __future__ import annotations

import argparse
import sys
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
