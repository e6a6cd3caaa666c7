#!/usr/bin/env bash
# Why a stage failed, in at most 40 lines, from its log (scripts/stage.sh keeps one per stage
# under reports/stages/): CI shows only the tail of its output, where two lanes' timing lines
# would otherwise hide the cause. Ansible and Molecule: the last task failure before a PLAY RECAP
# that counts failed=N (an ignored or rescued failure never counts there); pytest: the failed
# tests and their assertion lines; otherwise the last lines. Usage: scripts/why.sh LOG
set -uo pipefail
log=$1
clean() { sed -e 's/\x1b\[[0-9;]*[A-Za-z]//g' -e 's/^ *\(│\||\) \{0,1\}//' "$log"; }
out=$(clean | awk '
  /(fatal|failed): \[/ { block = ""; n = 25 }
  n > 0 { block = block $0 "\n"; n-- }
  /^PLAY RECAP/ { recap = 1; next }
  recap && /failed=[1-9]/ { found = block }
  recap && /^[[:space:]]*$/ { recap = 0 }
  END { printf "%s", found }')
if [ -z "$out" ]; then
  out=$(clean | grep -E '^(FAILED|ERROR) [^-]|^E  |^_{3,} .* _{3,}$' | tail -n 40)
fi
[ -n "$out" ] || out=$(clean | tail -n 20)
printf '%s\n' "$out" | cut -c1-300 | head -n 40
