#!/usr/bin/env bash
# Time the README's two commands, each on a fresh clone of this repository's HEAD (so that neither finds what the
# other set up), and keep the record the README's timings are quoted from: docs/data/fresh-clone/<UTC date and
# time>.txt (commit it by hand). Pause any long run on the machine first (its load stretches both); pip's download
# cache is whatever this machine has.
#
#   bash scripts/time_fresh_clone.sh            # both commands, 7 to 8 minutes on 2 cores (its records so far)
#
# It takes no arguments (any other than --help is refused before anything is cloned), and never replaces a record.
set -uo pipefail
case "${1:-}" in
    -h | --help)
        echo "usage: bash scripts/time_fresh_clone.sh  (no arguments; times ./scripts/test.sh and ./scripts/demo.sh" \
            "each on a fresh clone of HEAD, 7 to 8 minutes, and keeps docs/data/fresh-clone/<UTC stamp>.txt)"
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
