"""The ``alfa`` console command's entry point: :func:`alfa.cli.main`, imported inside it.

Importing the package takes a second or two (PyTorch); a Ctrl-C in that time would otherwise end in a traceback
before any of alfa's code could answer it. Here it is the one line ``interrupted`` and exit status 130, as a Ctrl-C
at any later moment of the command's work is (one after it, while Python shuts the process down, is no failure:
:func:`alfa.cli.interrupts.quiet_shutdown`).
"""

from __future__ import annotations

import sys


def main() -> int:
    """Run the ``alfa`` command (:func:`alfa.cli.main`); its exit status."""
    try:
        from alfa.cli import main as run
        from alfa.cli import quiet_shutdown
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    return quiet_shutdown(run())  # a Ctrl-C while Python then shuts the process down is no failure
