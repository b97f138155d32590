#!/usr/bin/env bash
# Time the README's two commands, each on a fresh clone of this repository's HEAD (so that neither finds what the
# other set up), and keep the record the README's timings are quoted from: docs/data/fresh-clone/<UTC date and
# time>.txt (commit it by hand). Pause any long run on the machine first (its load stretches both); pip's download
# cache is whatever this machine has.
#
#   bash scripts/time_fresh_clone.sh            # both commands, about 7 minutes on 2 cores
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
stamp=$(date -u +%Y-%m-%dT%H%MZ)
record="docs/data/fresh-clone/$stamp.txt"
if [[ -e $record ]]; then
    echo "time_fresh_clone: $record exists" >&2
    exit 2
fi
work=$(mktemp -d)
cpu=$(grep -m1 "model name" /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')
lines=("commit $(git rev-parse HEAD)" "machine $cpu, $(nproc) CPUs" "started $(date -u +%FT%TZ)")
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
mkdir -p "$(dirname "$record")"
printf '%s\n' "${lines[@]}" >"$record"
cat "$record"
echo "kept in $record (logs in $work)"
exit $status
