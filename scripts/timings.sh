#!/usr/bin/env bash
# Print the timing table of one run from the file scripts/stage.sh appends to (MM3_TIMINGS,
# default reports/timings.tsv), in start order: stage, result, seconds, minutes, start (UTC).
# Stages of parallel lanes overlap, so the wall time is given separately (WALL_S, if set).
# Usage: scripts/timings.sh [FILE]
set -euo pipefail
file=${1:-${MM3_TIMINGS:-$(cd "$(dirname "$0")/.." && pwd)/reports/timings.tsv}}
[ -s "$file" ] || { echo "timings: no stage recorded in $file"; exit 0; }
printf '%-28s %-14s %8s %7s  %s\n' stage result seconds min "start (UTC)"
# Set-up stages that every sub-make repeats are no-ops after the first (0 s, cached): counted,
# not listed.
sort -s -t$'\t' -k4,4 "$file" \
  | awk -F'\t' '$2 == "ok" && $3 == 0 {skipped++; next}
                 {printf "%-28s %-14s %8d %7.1f  %s\n", $1, $2, $3, $3 / 60, $4}
                 END {if (skipped) printf "(%d set-up stages found everything in place, 0 s each: not listed)\n", skipped}'
if [ -n "${WALL_S:-}" ]; then
  awk -v s="$WALL_S" 'BEGIN {printf "%-28s %-14s %8d %7.1f\n", "wall time (lanes overlap)", "", s, s / 60}'
fi
