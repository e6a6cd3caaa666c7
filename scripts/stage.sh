#!/usr/bin/env bash
# Run one named stage and print a timing line for it: "== stage NAME: ok in 12 s".
# Each finished stage is also appended to the timings file (MM3_TIMINGS, default
# reports/timings.tsv: name, result, seconds, start time) that scripts/timings.sh prints as the
# timing table; .ci/run starts it empty, so the table shows one run.
# Usage: scripts/stage.sh NAME command [args...]
set -uo pipefail
name=$1; shift
timings=${MM3_TIMINGS:-$(cd "$(dirname "$0")/.." && pwd)/reports/timings.tsv}
start=$(date +%s)
echo "== stage $name: start ($(date -u +%H:%M:%S) UTC)"
"$@"; rc=$?
dur=$(( $(date +%s) - start ))
if [ $rc -eq 0 ]; then result=ok; echo "== stage $name: ok in $dur s"
else result="FAILED(rc=$rc)"; echo "== stage $name: FAILED (rc=$rc) after $dur s"; fi
mkdir -p "$(dirname "$timings")" \
  && printf '%s\t%s\t%s\t%s\n' "$name" "$result" "$dur" "$(date -u -d "@$start" +%H:%M:%S)" >> "$timings"
exit $rc
