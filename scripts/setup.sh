#!/usr/bin/env bash
# Create ./.venv with PyTorch (CPU build 2.13.0 where it is on disk) and alfa plus its dev tools.
# Safe to re-run: it reinstalls only when pyproject.toml changed.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
    "$PYTHON" -m venv .venv
fi
stamp=.venv/.alfa-installed
want=$(sha256sum pyproject.toml | cut -d' ' -f1)
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
    echo "setting up .venv (PyTorch CPU, alfa, dev tools)..."
    .venv/bin/python -m pip install -q --disable-pip-version-check "torch==2.13.0"
    .venv/bin/python -m pip install -q --disable-pip-version-check -e ".[dev]"
    echo "$want" > "$stamp"
fi
