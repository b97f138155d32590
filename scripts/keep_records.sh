#!/usr/bin/env bash
# Keep what the long benchmark run has recorded so far: copy runs/bench-v2's results (read under the run's lock,
# so a lane writing a record is never copied half-done; written one record per line) and its figure data into
# docs/data/bench-v2, then regenerate every page from the committed data. Commit the result by hand.
#
#   bash scripts/keep_records.sh        (no arguments; any other than --help is refused before anything is copied)
set -euo pipefail
case "${1:-}" in
    -h | --help)
        echo "usage: bash scripts/keep_records.sh  (copies runs/bench-v2's records into docs/data/bench-v2, then" \
            "regenerates the pages; no arguments)"
        exit 0
        ;;
esac
if (($# > 0)); then
    echo "keep_records: takes no arguments, got: $* (see --help)" >&2
    exit 2
fi
cd "$(dirname "$0")/.."
if [[ ! -x .venv/bin/python ]]; then
    echo "keep_records: no .venv here (make it first: bash scripts/setup.sh)" >&2
    exit 2
fi
if [[ ! -f runs/bench-v2/results.json ]]; then
    echo "keep_records: no runs/bench-v2/results.json here (run a lane first: bash scripts/queue.sh LANE)" >&2
    exit 2
fi
.venv/bin/python - <<'PY'
import sys

from alfa.study.bench.results import export_results

try:
    export_results("runs/bench-v2", "docs/data/bench-v2", keep_kept=True)
except (OSError, ValueError) as e:  # one line, no traceback; nothing was replaced
    sys.exit(f"keep_records: {e}")
PY
.venv/bin/alfa pages --write
