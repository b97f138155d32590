"""``python -m alfa``: the ``alfa`` command, e.g. under ``torchrun --nproc-per-node N -m alfa pretrain …``."""

import sys

if __name__ == "__main__":
    try:
        from .cli import main, quiet_shutdown
    except KeyboardInterrupt:  # the command's modules take a moment to import; a Ctrl-C then is one line too
        print("interrupted", file=sys.stderr)
        sys.exit(130)
    sys.exit(quiet_shutdown(main()))  # a Ctrl-C while Python then shuts the process down is no failure
