"""``python -m alfa``: the ``alfa`` command, e.g. under ``torchrun --nproc-per-node N -m alfa pretrain …``."""

import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main())
