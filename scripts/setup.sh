#!/usr/bin/env bash
# Create ./.venv with PyTorch 2.13.0 (a CPU build where pip finds one on disk through PIP_FIND_LINKS, else
# PyPI's default build) and alfa with the extras named by the first argument: "gaze" (the application and the
# alfa command: what the demo needs) or "dev" (everything: the study, Hugging Face, ONNX and the test tools; the
# default). Safe to re-run: it installs again only when
# pyproject.toml changed or the extras asked for are not there yet ("dev" holds "gaze").
#
#   bash scripts/setup.sh [gaze|dev]        PYTHON=python3.12 bash scripts/setup.sh   (default PYTHON: python3)
#
# The Python that makes .venv must be 3.10 or later and have its venv module with ensurepip (python3-venv on
# Debian and Ubuntu): checked before .venv is made, so that a failed start leaves no half-made .venv behind that
# later runs would take for a whole one. An existing .venv without pip or of an older Python is refused, not
# replaced (it may be someone's): remove it and run this again.
set -euo pipefail
usage="usage: bash scripts/setup.sh [gaze|dev]  (which extras of alfa to install; default dev)"
case "${1:-}" in
    -h | --help) echo "$usage"; exit 0 ;;
esac
if (($# > 1)); then
    echo "setup.sh: one argument at most (gaze or dev), got $#: $*" >&2
    exit 2
fi
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
extras=${1:-dev}
case "$extras" in
    gaze | dev) ;;
    *) echo "setup.sh: unknown extras '$extras' (gaze or dev)" >&2; exit 2 ;;
esac
# What a Python lacks of what .venv needs, as words after its name (nothing: it will do). Python 2 too runs it.
lacks() {
    "$1" -c '
import importlib.util, sys
if sys.version_info < (3, 10):
    print("is Python %d.%d; alfa needs 3.10 or later" % tuple(sys.version_info[:2]))
elif sys.argv[1] == "venv" and not (importlib.util.find_spec("venv") and importlib.util.find_spec("ensurepip")):
    print("has no venv module with ensurepip (on Debian and Ubuntu: apt install python3-venv)")
elif sys.argv[1] == "pip" and not importlib.util.find_spec("pip"):
    print("has no pip (was .venv made by a Python without ensurepip?)")
' "$2" 2>/dev/null || echo "does not run as Python 3.10 or later"
}
if [ ! -x .venv/bin/python ]; then
    if ! command -v "$PYTHON" >/dev/null; then
        echo "setup.sh: no $PYTHON here; install Python 3.10 or later with its venv module, or set PYTHON" >&2
        exit 2
    fi
    why=$(lacks "$PYTHON" venv)
    if [ -n "$why" ]; then
        echo "setup.sh: $PYTHON $why (set PYTHON to another)" >&2
        exit 2
    fi
    if [ -e .venv ] || [ -L .venv ]; then  # not made by this script, which always leaves bin/python: someone's
        echo "setup.sh: .venv is here but holds no bin/python; remove it (or move it away) and run this again" >&2
        exit 2
    fi
    if ! "$PYTHON" -m venv .venv; then
        rm -rf .venv  # only what this run made: there was none before
        echo "setup.sh: $PYTHON -m venv .venv failed (its message above); nothing kept" >&2
        exit 2
    fi
fi
stamp=.venv/.alfa-installed
project=$(sha256sum pyproject.toml | cut -d' ' -f1)
have=$(cat "$stamp" 2>/dev/null || true)
if [ "$have" != "$project dev" ] && [ "$have" != "$project $extras" ]; then
    why=$(lacks .venv/bin/python pip)  # asked only where pip is to run: a .venv made by another tool may lack it
    if [ -n "$why" ]; then
        echo "setup.sh: .venv/bin/python $why; remove .venv and run this again" >&2
        exit 2
    fi
    echo "setting up .venv (PyTorch 2.13.0, alfa[$extras])..."
    .venv/bin/python -m pip install -q --disable-pip-version-check "torch==2.13.0"
    .venv/bin/python -m pip install -q --disable-pip-version-check -e ".[$extras]"
    echo "$project $extras" > "$stamp"
fi
