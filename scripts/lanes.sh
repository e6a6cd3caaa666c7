#!/usr/bin/env bash
# Run independent lanes of stages at the same time and wait for all of them. Each lane's output
# is streamed with its name in front of every line ("[engine] == stage ..."), so an interleaved
# log still reads lane by lane (grep '^\[engine\]'). A failed lane does not stop the others
# (each cleans up after itself, e.g. Molecule's destroy); the result is failure if any failed.
# The lanes share two cores: they pair stages that mostly wait (apt, image transfers, engine
# start-up) with stages that compute. Usage: scripts/lanes.sh NAME 'COMMAND' [NAME 'COMMAND']...
set -uo pipefail
[ $# -ge 2 ] && [ $(($# % 2)) -eq 0 ] || { echo "usage: $0 NAME 'COMMAND' [NAME 'COMMAND']..." >&2; exit 2; }
pids=() names=()
trap 'kill "${pids[@]}" 2>/dev/null; exit 130' INT TERM
while [ $# -ge 2 ]; do
  name=$1 cmd=$2; shift 2
  ( bash -c "$cmd" 2>&1 | sed -u "s/^/[$name] /"; exit "${PIPESTATUS[0]}" ) &
  pids+=("$!") names+=("$name")
done
rc=0
for i in "${!pids[@]}"; do
  if wait "${pids[$i]}"; then echo "== lane ${names[$i]}: ok"
  else echo "== lane ${names[$i]}: FAILED"; rc=1; fi
done
exit $rc
