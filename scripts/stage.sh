#!/usr/bin/env bash
# Run one named stage and print a timing line for it: "== stage NAME: ok in 12 s".
# Usage: scripts/stage.sh NAME command [args...]
set -uo pipefail
name=$1; shift
start=$(date +%s)
echo "== stage $name: start ($(date -u +%H:%M:%S) UTC)"
"$@"; rc=$?
dur=$(( $(date +%s) - start ))
if [ $rc -eq 0 ]; then echo "== stage $name: ok in $dur s"; else echo "== stage $name: FAILED (rc=$rc) after $dur s"; fi
exit $rc
