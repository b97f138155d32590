#!/usr/bin/env bash
# Set up what the main job needs (PyTorch and alfa[gaze]; scripts/test.sh adds the rest), then run it
# (extra arguments go to `alfa demo`).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh gaze
exec .venv/bin/alfa demo "$@"
