#!/usr/bin/env bash
# Run one named stage and print a timing line for it: "== stage NAME: ok in 12 s".
# Each finished stage is also appended to the timings file (MM3_TIMINGS, default
# reports/timings.tsv: name, result, seconds, start time) that scripts/timings.sh prints as the
# timing table; .ci/run starts it empty, so the table shows one run.
# The stage's output is also kept in reports/stages/NAME.log; when it fails, scripts/why.sh puts
# the cause in reports/why/NAME.txt, which .ci/run prints last (CI shows only the tail).
# Usage: scripts/stage.sh NAME command [args...]
set -uo pipefail
name=$1; shift
here=$(cd "$(dirname "$0")/.." && pwd)
timings=${MM3_TIMINGS:-$here/reports/timings.tsv}
log=$here/reports/stages/$name.log
mkdir -p "$here/reports/stages" && rm -f "$here/reports/why/$name.txt"
start=$(date +%s)
echo "== stage $name: start ($(date -u +%H:%M:%S) UTC)"
"$@" 2>&1 | tee "$log"; rc=${PIPESTATUS[0]}
dur=$(( $(date +%s) - start ))
if [ $rc -eq 0 ]; then result=ok; echo "== stage $name: ok in $dur s"
else
  result="FAILED(rc=$rc)"; echo "== stage $name: FAILED (rc=$rc) after $dur s"
  mkdir -p "$here/reports/why" && "$here/scripts/why.sh" "$log" > "$here/reports/why/$name.txt"
fi
mkdir -p "$(dirname "$timings")" \
  && printf '%s\t%s\t%s\t%s\n' "$name" "$result" "$dur" "$(date -u -d "@$start" +%H:%M:%S)" >> "$timings"
exit $rc
