#!/usr/bin/env bash
# A few minutes on a GPU machine: one epoch of pre-training on synthetic faces (224×224 by default, bf16),
# truncation and one epoch of recovery, Alfa personalization of one target world; prints the device, images/s
# of each training stage, seconds per personalized person, and images/s of the loader, the step and both.
# Everything lands in $OUT (default runs/device-check); nothing is downloaded. Run again into the same $OUT, a stage an
# earlier run finished is loaded, not trained, and is said to be that run's instead of timed. On a machine without CUDA it
# runs on the CPU (set SIZE, PERSONS small there). Usage: scripts/device_check.sh   or   SIZE=64 PERSONS=8 DEVICE=cpu scripts/device_check.sh
# Without .venv or an installed alfa (a GPU image with its own PyTorch) it runs src/ with $PYTHON (default python3).
# $PYTHON must be the interpreter alfa runs under (the script's own probes import alfa); it needs the gaze extra's
# packages, which it checks first (docs/real-data.md says how to bring kornia to a bare image).
# It takes no arguments (settings are the environment variables above); any other than --help is refused before
# anything runs.
set -euo pipefail
case "${1:-}" in
    -h | --help)
        echo "usage: [SIZE=224] [PERSONS=60] [IMAGES=100] [DEVICE=auto] [PRECISION=bf16] [OUT=runs/device-check]" \
            "[WORKERS=0,4,8] bash scripts/device_check.sh  (no arguments; minutes on a GPU, far longer on a CPU at" \
            "the default sizes)"
        exit 0
        ;;
esac
if (($# > 0)); then
    echo "device_check.sh: takes no arguments (settings go in the environment: SIZE=64 PERSONS=8 ...), got: $*" >&2
    exit 2
fi
cd "$(dirname "$0")/.."
if [ -x .venv/bin/alfa ]; then  # the project's own environment (scripts/setup.sh), else whatever is on PATH
    ALFA=${ALFA:-.venv/bin/alfa}
    PYTHON=${PYTHON:-.venv/bin/python}
fi
PYTHON=${PYTHON:-python3}
if [ -z "${ALFA:-}" ] && ! command -v alfa >/dev/null; then
    # A GPU image with its own PyTorch and no install of alfa: run alfa from src/ with that python.
    export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
    run_alfa() { "$PYTHON" -m alfa "$@"; }
else
    ALFA=${ALFA:-alfa}
    run_alfa() { "$ALFA" "$@"; }
fi
DEVICE=${DEVICE:-auto}
SIZE=${SIZE:-224}
PERSONS=${PERSONS:-60}
IMAGES=${IMAGES:-100}
PRECISION=${PRECISION:-bf16}
OUT=${OUT:-runs/device-check}
mkdir -p "$OUT"
# The gaze extra's packages (personalization needs kornia, the throughput fixtures h5py): say so before minutes of
# pre-training, not after.
missing=$("$PYTHON" -c "
import importlib.util
print(' '.join(m for m in ('torch', 'alfa', 'numpy', 'safetensors', 'tqdm', 'PIL', 'h5py', 'kornia') if not importlib.util.find_spec(m)))")
if [ -n "$missing" ]; then
    echo "device_check.sh: $PYTHON cannot import: $missing (alfa's gaze extra; docs/real-data.md)" >&2
    exit 2
fi
"$PYTHON" - <<PY
import torch
name = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no CUDA device (CPU)"
print(f"device: {name}; torch {torch.__version__}; requested --device $DEVICE")
PY
started=$(date +%s)  # a stage whose model is older was finished by an earlier run into $OUT (resumed, not timed)
src="synthetic:eth?size=$SIZE&persons=$PERSONS&images_per_person=$IMAGES"
val="synthetic:eth?split=val&size=$SIZE&persons=4&images_per_person=20"
common=(--device "$DEVICE" --precision "$PRECISION" --batch-size 120 --epochs 1 --quiet)
run_alfa pretrain --data "$src" --val-data "$val" --out "$OUT/pretrain" "${common[@]}"
run_alfa truncate --checkpoint "$OUT/pretrain/model.safetensors" --data "$src" --val-data "$val" \
    --out "$OUT/recovered" "${common[@]}"
run_alfa personalize --checkpoint "$OUT/recovered/model.safetensors" --device "$DEVICE" --recipe paper \
    --data "synthetic:mpii?size=$SIZE&persons=8&images_per_person=20" --out "$OUT/adapters" --replace --quiet
"$PYTHON" - "$OUT" "$started" <<'PY'
import os, sys
from alfa.checkpoint import read_checkpoint
out, started = sys.argv[1], int(sys.argv[2])
for stage in ("pretrain", "recovered"):
    path = f"{out}/{stage}/model.safetensors"
    if os.path.getmtime(path) < started:  # its speeds are an earlier run's, perhaps on another machine
        print(f"{stage}: finished by an earlier run into {out}, not timed by this one (remove {out}/{stage} to time it)")
        continue
    _, saved = read_checkpoint(path, header_only=True)
    extra = saved["extra"]
    history = extra.get("history") or extra.get("result", {}).get("recovery_history", [])
    n = extra["data"]["images"]
    for epoch in history:
        print(f"{stage}: epoch of {n} images in {epoch['seconds']:.1f} s = {n / epoch['seconds']:,.0f} images/s "
              "(source images incl. held-out ones; validation included)")
PY
# Is the training step loader-bound on this machine? (fixture data in both real layouts, 224×224)
run_alfa throughput --fixture mpiifacegaze,eth-xgaze-h5 --image-size "$SIZE" --batch-size 120 --batches 10 \
    --rounds 3 --workers "${WORKERS:-0,4,8}" --device "$DEVICE" --precision "$PRECISION"
