#!/usr/bin/env bash
# Set everything up, then run the main job (extra arguments go to `alfa demo`).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/alfa demo "$@"
