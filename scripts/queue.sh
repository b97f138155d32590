#!/usr/bin/env bash
# Run the benchmark pieces of one lane, one after the other, in the background of a long session.
#
#   bash scripts/queue.sh scripts/queues/calibration-a.txt &
#
# Each non-empty line of the lane file that does not start with '#' is the argument list of one
# `alfa bench --standard --out runs/bench-v2 ...` piece (the selection: --methods, --pairs, --seeds, ...).
# A piece whose records are all finished costs only its planning (the runner skips them); a source model
# or within-target model half-trained by an earlier session resumes from its last epoch. Two lanes use
# the two cores of the project's machine. Each piece logs to runs/logs/<lane>-<line>.log; the lane stops
# at the first piece that fails, saying which.
set -euo pipefail
lane_file=${1:?usage: bash scripts/queue.sh LANE_FILE}
if [[ ! -f $lane_file ]]; then
    echo "queue: no lane file $lane_file" >&2
    exit 2
fi
cd "$(dirname "$0")/.."
lane=$(basename "$lane_file" .txt)
mkdir -p runs/logs
n=0
while IFS= read -r line || [[ -n $line ]]; do
    n=$((n + 1))
    [[ -z ${line// /} || $line == \#* ]] && continue
    log=runs/logs/$lane-$n.log
    echo "$(date -u +%FT%TZ) $lane line $n: alfa bench --standard --out runs/bench-v2 $line (log: $log)"
    # shellcheck disable=SC2086  # the line is an argument list by design
    if ! eval ".venv/bin/alfa bench --standard --out runs/bench-v2 $line" >"$log" 2>&1; then
        echo "$(date -u +%FT%TZ) $lane line $n failed; see $log" >&2
        exit 1
    fi
done <"$lane_file"
echo "$(date -u +%FT%TZ) $lane: every piece done"
