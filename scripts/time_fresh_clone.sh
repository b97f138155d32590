#!/usr/bin/env bash
# Time the README's two commands, each on a fresh clone of this repository's HEAD (so that neither finds what the
# other set up), and keep the record the README's timings are quoted from: docs/data/fresh-clone/<UTC date and
# time>.txt (commit it by hand). Pause any long run on the machine first (its load stretches both): the record says
# which alfa processes were stopped or running, the load average before and after, the CPU's family and model, and
# the size of pip's download cache (whatever this machine has), so that the README need quote nothing it lacks.
#
#   bash scripts/time_fresh_clone.sh            # both commands (how long: its records in docs/data/fresh-clone)
#
# It takes no arguments (any other than --help is refused before anything is cloned), and never replaces a record.
set -uo pipefail
case "${1:-}" in
    -h | --help)
        echo "usage: bash scripts/time_fresh_clone.sh  (no arguments; times ./scripts/test.sh and ./scripts/demo.sh" \
            "each on a fresh clone of HEAD, and keeps docs/data/fresh-clone/<UTC stamp>.txt)"
        exit 0
        ;;
esac
if (($# > 0)); then
    echo "time_fresh_clone: takes no arguments, got: $* (see --help)" >&2
    exit 2
fi
cd "$(dirname "$0")/.." || exit 2
stamp=$(date -u +%Y-%m-%dT%H%MZ)
record="docs/data/fresh-clone/$stamp.txt"
if [[ -e $record ]]; then
    echo "time_fresh_clone: $record exists" >&2
    exit 2
fi
work=$(mktemp -d)
cpuinfo() { grep -m1 "^$1[[:space:]]*:" /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//'; }
cpu="$(cpuinfo "model name"), $(nproc) CPUs (family $(cpuinfo "cpu family"), model $(cpuinfo model))"
load() { cut -d' ' -f1-3 /proc/loadavg; }
# the other alfa processes (a benchmark's lanes): how many were stopped (paused, state T) and how many ran
others() {
    ps -eo pid=,stat=,args= | awk -v me=$$ '$1 != me && $3 ~ /python/ && $0 ~ /alfa / {n[substr($2, 1, 1) == "T" ? "stopped" : "running"]++}
        END {printf "%d stopped, %d running", n["stopped"], n["running"]}'
}
pip_cache=${PIP_CACHE_DIR:-$HOME/.cache/pip}
cache_size=$( (du -sh "$pip_cache" 2>/dev/null || echo "none") | cut -f1)
lines=("commit $(git rev-parse HEAD)" "machine $cpu" "started $(date -u +%FT%TZ)")
before="other alfa processes at the start: $(others); load average $(load); pip's download cache $pip_cache: $cache_size"
status=0
for command in test demo; do
    git clone -q . "$work/$command" || exit 2
    start=$(date +%s)
    (cd "$work/$command" && "./scripts/$command.sh") >"$work/$command.log" 2>&1
    rc=$?
    seconds=$(($(date +%s) - start))
    ((rc == 0)) || status=1
    lines+=("./scripts/$command.sh: exit status $rc, $seconds s in all ($((seconds / 60)) min $((seconds % 60)) s)")
    # the suite's own summary line, and the demo's own wall time
    summary=$(grep -E '^[0-9]+ passed|^total wall time' "$work/$command.log" | tail -1)
    lines+=("  ${summary:-its summary line not found (see its log)}")
done
lines+=("$before" "other alfa processes at the end: $(others); load average $(load)")
mkdir -p "$(dirname "$record")" || exit 2
# written beside, then renamed without replacing: a record made meanwhile (another run of the same minute) is kept
kept=$(mktemp "$record.XXXXXX") || exit 2
if ! { printf '%s\n' "${lines[@]}" >"$kept" && chmod 644 "$kept"; }; then
    rm -f "$kept"
    printf '%s\n' "${lines[@]}"
    echo "time_fresh_clone: could not write $kept (its error above); this run's lines above only (logs in $work)" >&2
    exit 2
fi
mv -n "$kept" "$record"
if [[ -e $kept ]]; then
    rm -f "$kept"
    printf '%s\n' "${lines[@]}"
    echo "time_fresh_clone: $record appeared meanwhile; kept it, this run's lines above only (logs in $work)" >&2
    exit 2
fi
cat "$record"
echo "kept in $record (logs in $work)"
exit $status
