#!/usr/bin/env bash
# Create ./.venv with PyTorch 2.13.0 (a CPU build where pip finds one on disk through PIP_FIND_LINKS, else
# PyPI's default build) and alfa with the extras named by the first argument: "gaze" (the application and the
# alfa command: what the demo needs) or "dev" (everything: the study, Hugging Face, ONNX and the test tools; the
# default). Safe to re-run: it installs again only when
# pyproject.toml changed or the extras asked for are not there yet ("dev" holds "gaze").
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
extras=${1:-dev}
case "$extras" in
    gaze | dev) ;;
    *) echo "setup.sh: unknown extras '$extras' (gaze or dev)" >&2; exit 2 ;;
esac
if [ ! -x .venv/bin/python ]; then
    "$PYTHON" -m venv .venv
fi
stamp=.venv/.alfa-installed
project=$(sha256sum pyproject.toml | cut -d' ' -f1)
have=$(cat "$stamp" 2>/dev/null || true)
if [ "$have" != "$project dev" ] && [ "$have" != "$project $extras" ]; then
    echo "setting up .venv (PyTorch 2.13.0, alfa[$extras])..."
    .venv/bin/python -m pip install -q --disable-pip-version-check "torch==2.13.0"
    .venv/bin/python -m pip install -q --disable-pip-version-check -e ".[$extras]"
    echo "$project $extras" > "$stamp"
fi
