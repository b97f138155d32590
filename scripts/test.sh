#!/usr/bin/env bash
# Set everything up, then lint and run the test suite (extra arguments go to pytest).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh dev
.venv/bin/ruff check src tests
.venv/bin/ruff format --check src tests
exec .venv/bin/python -m pytest "$@"
