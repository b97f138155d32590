#!/usr/bin/env bash
# Run the benchmark pieces of one lane, one after the other, in the background of a long session.
#
#   bash scripts/queue.sh scripts/queues/calibration-a.txt &
#   bash scripts/queue.sh scripts/queues/calibration-a.txt 6 &    # from line 6 of the file on
#
# Each line of the lane file that is neither blank nor a comment ('#', after any indentation) is the argument
# list of one `alfa bench --standard --out runs/bench-v2 ...` piece, split on whitespace (no quoting): its
# selection, which must name --seeds and --pairs, so that no line can run the whole preset by mistake. A piece
# whose records are all finished costs only its planning (the runner skips them); a source model or
# within-target model half-trained by an earlier session resumes from its last epoch. Planning a finished piece
# still renders its worlds (minutes on 2 cores): restart a lane known to be done up to some line from that line.
# The lane file is read once, at the start, so editing it while the lane runs changes nothing. Each piece appends to
# runs/logs/<lane>-<line>.log; the lane stops at the first piece that fails, saying which. Every line is checked
# before the first runs.
set -uo pipefail
if [[ $# -lt 1 || $# -gt 2 ]]; then
    echo "usage: bash scripts/queue.sh LANE_FILE [FROM_LINE]" >&2
    exit 2
fi
from_line=${2:-1}
if [[ ! $from_line =~ ^[1-9][0-9]*$ ]]; then
    echo "queue: FROM_LINE must be a line number (1 or more), got '$from_line'" >&2
    exit 2
fi
if [[ ! -f $1 ]]; then
    echo "queue: no lane file $1" >&2
    exit 2
fi
lane_file=$(realpath -- "$1")
lane=$(basename "$lane_file" .txt)
mapfile -t lines <"$lane_file"
lines=("${lines[@]%$'\r'}")  # a lane file saved with Windows line ends: no '\r' glued to a line's last argument
if ((from_line > ${#lines[@]})); then
    echo "queue: $1 has ${#lines[@]} lines; nothing from line $from_line on" >&2
    exit 2
fi
# Every line to run is checked before any runs (a bad line found when its turn came stopped the lane hours late):
# it names its selection, and nothing the lane sets itself (a second --out would send its records elsewhere). The
# numbers of the lines to run are kept for the loop that runs them.
to_run=()
for i in "${!lines[@]}"; do
    n=$((i + 1))
    ((n < from_line)) && continue
    line=${lines[$i]}
    [[ $line =~ ^[[:space:]]*(#|$) ]] && continue
    to_run+=("$n")
    read -ra args <<<"$line"
    if [[ (" ${args[*]} " != *" --seeds "* && " ${args[*]} " != *" --seeds="*) ||
        (" ${args[*]} " != *" --pairs "* && " ${args[*]} " != *" --pairs="*) ]]; then
        echo "queue: $lane line $n names no --seeds or no --pairs; refusing to run the lane: $line" >&2
        exit 2
    fi
    for flag in --out --cache-dir --report --smoke --quick --standard --first-standard --full; do
        if [[ " ${args[*]} " == *" $flag "* || " ${args[*]} " == *" $flag="* ]]; then
            echo "queue: $lane line $n names $flag, which the lane sets itself; refusing to run the lane: $line" >&2
            exit 2
        fi
    done
done
if ((${#to_run[@]} == 0)); then  # said before anything is made: a lane of comments runs nothing
    echo "queue: $1 has no piece to run from line $from_line on (only blank lines and comments)" >&2
    exit 2
fi
cd "$(dirname "$0")/.." || exit 2
mkdir -p runs/logs runs/bench-v2
# A machine without the run's folder (a new one) starts from the records kept in docs/data/bench-v2, so that
# finished records are skipped, not made again; its models' caches are rebuilt as pieces need them (the runner
# refuses a rebuilt source model that differs from the recorded one, and, before it trains, one whose record
# names another CPU: alfa bench --rebuild-elsewhere). Two lanes starting at once: one copy wins.
if [[ ! -f runs/bench-v2/results.json && -f docs/data/bench-v2/results.json ]]; then
    tmp=$(mktemp runs/bench-v2/.results.json.XXXXXX)
    cp docs/data/bench-v2/results.json "$tmp" && chmod 644 "$tmp"
    if [[ -d docs/data/bench-v2/figure_data && ! -d runs/bench-v2/figure_data ]]; then
        # copied beside, then renamed: a kill mid-copy leaves no partial folder that later starts would take as whole
        kept=$(mktemp -d runs/bench-v2/.figure_data.XXXXXX) && chmod 755 "$kept"
        cp -r docs/data/bench-v2/figure_data/. "$kept"/ && mv -T "$kept" runs/bench-v2/figure_data 2>/dev/null
        rm -rf "$kept"
    fi
    mv -n "$tmp" runs/bench-v2/results.json # leaves $tmp where another lane's copy came first (exit 0 either way)
    if [[ -e $tmp ]]; then rm -f "$tmp"; else echo "queue: runs/bench-v2 started from the records kept in docs/data/bench-v2"; fi
fi
for n in "${to_run[@]}"; do
    read -ra args <<<"${lines[$((n - 1))]}"
    log=runs/logs/$lane-$n.log
    echo "$(date -u +%FT%TZ) $lane line $n: alfa bench --standard --out runs/bench-v2 ${args[*]} (log: $log)"
    if ! .venv/bin/alfa bench --standard --out runs/bench-v2 "${args[@]}" </dev/null >>"$log" 2>&1; then
        echo "$(date -u +%FT%TZ) $lane line $n failed; see $log" >&2
        exit 1
    fi
done
echo "$(date -u +%FT%TZ) $lane: every piece done"
