#!/bin/bash
# The lab's secrets search on one host (lab/checks.yml copies it there with a 0600 list of
# "name<TAB>secret" lines): every place a secret could leak to, searched for every secret.
# Prints "FOUND <name> in <source>" per hit (never the secret itself) and "searched <source>"
# per source read. The places where a secret must live (the gateway's PEM, rsync's secrets
# file, the hf token file, the engine config of a keyed engine) are not searched.
set -uo pipefail
list=$1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
collect() {  # collect NAME COMMAND...: the command's output is one source
  local name=$1; shift
  "$@" >"$tmp/$name" 2>/dev/null || true
  echo "searched $name ($(wc -c <"$tmp/$name") bytes)"
}
collect journal journalctl --no-pager -o verbose
collect processes ps -eo args
collect units sh -c 'cat /etc/systemd/system/*.service /etc/systemd/system/*/*.conf 2>/dev/null'
collect haproxy sh -c 'cat /etc/haproxy/haproxy.cfg /etc/haproxy/mm3/clients.map /etc/haproxy/mm3/policy.lua 2>/dev/null'
collect rsyncd_conf sh -c 'cat /etc/rsyncd.conf 2>/dev/null'
collect logs_dir sh -c 'cat /var/log/*.log /var/log/rsync* 2>/dev/null'
if command -v docker >/dev/null && docker inspect minimax-m3 >/dev/null 2>&1; then
  collect docker_logs docker logs minimax-m3
  collect docker_inspect docker inspect minimax-m3
fi
while IFS=$'\t' read -r name secret; do
  [ -n "$secret" ] || continue
  for source in "$tmp"/*; do
    grep -qF -- "$secret" "$source" && echo "FOUND $name in $(basename "$source")"
  done
done <"$list"
exit 0
