#!/usr/bin/env bash
# The embedded lab: `make lab` (up) and `make lab-down` (down).
#   up    build the engine image, bring up the lab hosts and their stand-in services
#         (lab/up.yml), then run the normal playbooks/site.yml against inventories/lab with
#         the GPU-only steps skipped by tag, and print the verification summary.
#   drill the diagnosis drill on a running lab (lab/drill.yml)
#   down  remove every container, network and volume the lab created (label org.mm3.lab),
#         and nothing else (images stay as a cache).
#   rollout the release drill on a running lab: on the two-node lab (node2 running) the drill
#         through the fleet gateway with a counting client (lab/rollout-fleet.yml), on one node
#         the single-node drill (lab/rollout.yml; CI's, for its budget)
# LAB_NODES=2 adds node2 and a fleet gateway on staging (inventories/lab/node2.yml).
# LAB_EXPECT_NO_CHANGES=1 fails unless site.yml reports changed=0 on every host (CI runs the
# lab twice, the second time with it). After site.yml, the plan is compared with every lab
# node (plan.yml -e plan_hosts=nodes, check mode): it must say "no change" for each, i.e. the plan an operator reviews is what the nodes run.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
cd "$here"
stage=scripts/stage.sh
inv=(-i inventories/lab/hosts.yml)
[ "${LAB_NODES:-1}" -ge 2 ] && inv+=(-i inventories/lab/node2.yml)
mkdir -p reports/lab
# Whether the two-node lab runs (node2 is up): make lab-rollout then runs the fleet drill.
node2_running() {
  docker ps --filter name='^mm3-lab-node2$' --filter status=running --format '{{.Names}}' | grep . >/dev/null
}

# why LOG: the failed tasks' messages (a few lines each) and what each lab host's journald
# keeps, printed last, so the tail of a CI log shows the cause and not the timing summary.
why() {
  echo "== why it failed (from $1):"
  awk '/^(fatal|failed): \[/ {n=12} n > 0 {print; n--}' "$1" | cut -c1-400 | tail -n 40
  for host in $(docker ps --filter label=org.mm3.lab=true --format '{{.Names}}' | sort); do
    echo "== journald on $host: $(docker exec "$host" journalctl -b -u systemd-journald -o cat --no-pager 2>&1 \
      | grep -m1 -E 'Journal .* max' || echo '(no size line)')"
  done
}

case "${1:-up}" in
  up)
    # The second run of a CI job (LAB_EXPECT_NO_CHANGES=1) gates site.yml, not the lab's own
    # stand-ins: when every lab host is already up, lab/up.yml is not run again (about 60 s).
    running=$(docker ps --filter label=org.mm3.lab=true --filter status=running --format '{{.Names}}' | sort | tr '\n' ' ')
    want="mm3-lab-node1 mm3-lab-staging "
    [ "${LAB_NODES:-1}" -lt 2 ] || want="mm3-lab-node1 mm3-lab-node2 mm3-lab-staging "
    if [ "${LAB_EXPECT_NO_CHANGES:-0}" = 1 ] && [ "$running" = "$want" ] \
       && [ -f inventories/lab/group_vars/all/lab_network.yml ]; then
      echo "lab: the lab hosts are up ($running); lab/up.yml is not run again for this changed=0 run"
    else
      $stage lab-engine-image scripts/vllm-cpu-image.sh
      $stage lab-hosts ansible-playbook "${inv[@]}" -e "lab_nodes=${LAB_NODES:-1}" lab/up.yml
    fi
    # Node1 serves only its signed release (issue 33): before the first site.yml, the plan writes
    # node1's release part (what its unit will run) and scripts/lab-release.sh signs it with the
    # pinned manifest; both runs deploy it (the second must change nothing, and then tampered
    # releases are refused, on the controller and on node1).
    release_inv=reports/lab/release/inventory.yml
    if [ "${LAB_EXPECT_NO_CHANGES:-0}" = 1 ]; then
      [ -f "$release_inv" ] || { echo "lab: no signed release ($release_inv): run make lab once first" >&2; exit 1; }
    else
      part_log=reports/lab/plan-part-$(date -u +%Y%m%dT%H%M%SZ).log
      $stage lab-release-part ansible-playbook "${inv[@]}" playbooks/plan.yml -e plan_hosts=mm3-lab-node1 \
        -e plan_dir="$here/reports/lab/plan" > "$part_log" 2>&1 \
        || { tail -40 "$part_log"; echo "lab: plan.yml (node1's release part) failed, see $part_log" >&2; exit 1; }
      $stage lab-release-sign scripts/lab-release.sh sign
    fi
    inv+=(-i "$release_inv")
    log=reports/lab/site-$(date -u +%Y%m%dT%H%M%SZ).log
    echo "lab: running playbooks/site.yml against the lab (log: $log)"
    set +e
    $stage lab-site ansible-playbook "${inv[@]}" playbooks/site.yml --skip-tags gpu 2>&1 | tee "$log"
    rc=${PIPESTATUS[0]}
    set -e
    echo
    [ -f reports/verify/summary.txt ] && { echo "== verification summary (reports/verify/)"; cat reports/verify/summary.txt; }
    ls reports/provenance/ 2>/dev/null | sed 's#^#== provenance record: reports/provenance/#' || true
    # What Docker applied to the engine container (model_server refuses less than its spec).
    for node in $(docker ps --filter label=org.mm3.lab=true --format '{{.Names}}' | grep -- '-node' | sort); do
      echo "== engine container on $node: $(docker exec "$node" docker inspect --format \
        'user={{.Config.User}} read-only-root={{.HostConfig.ReadonlyRootfs}} tmpfs={{json .HostConfig.Tmpfs}} cap-drop={{json .HostConfig.CapDrop}} security-opt={{json .HostConfig.SecurityOpt}} pids-limit={{.HostConfig.PidsLimit}} logs={{json .HostConfig.LogConfig}}' \
        minimax-m3 2>&1)"
    done
    [ $rc -eq 0 ] || { why "$log"; echo "lab: site.yml failed (rc=$rc), see $log" >&2; exit $rc; }
    recap=$(sed -n '/^PLAY RECAP/,/^$/p' "$log" | grep -E 'changed=' || true)
    echo "== site.yml recap"; echo "$recap"
    # Reports written on the controller (localhost) change every run; the lab hosts must not.
    if [ "${LAB_EXPECT_NO_CHANGES:-0}" = 1 ] && echo "$recap" | grep -v "^localhost" | grep -vE "changed=0 " >/dev/null; then
      echo "lab: expected changed=0 on every host for this run" >&2
      exit 1
    fi
    # The plan against every node must say "no change" and name node1's key. The second run
    # (LAB_EXPECT_NO_CHANGES=1) changed nothing on the lab hosts, with the same inventory: its
    # plan is the first run's, so it is not run again.
    if [ "${LAB_EXPECT_NO_CHANGES:-0}" = 1 ]; then
      echo "== plan: the first run's (reports/lab/plan/); this run changed nothing on the lab hosts"
    else
      plan_log=reports/lab/plan-$(date -u +%Y%m%dT%H%M%SZ).log
      $stage lab-plan ansible-playbook "${inv[@]}" playbooks/plan.yml -e plan_hosts=nodes \
        -e plan_dir="$here/reports/lab/plan" > "$plan_log" 2>&1 || { tail -40 "$plan_log"; why "$plan_log"; echo "lab: plan.yml failed, see $plan_log" >&2; exit 1; }
      nodes=$(ansible "${inv[@]}" nodes --list-hosts | tail -n +2 | awk '{print $1}')
      for node in $nodes; do
        line=$(grep -oE "${node}: (no change|would change[^(]*)" "$plan_log" | head -n1)
        echo "== plan against $node: ${line#*: }"
        [ "${line#*: }" = "no change" ] || { echo "lab: the plan differs from what $node runs, see $plan_log" >&2; exit 1; }
      done
      grep -q "signed by key lab-release)" "$plan_log" \
        || { echo "lab: mm3-lab-node1 does not run the signed release, see $plan_log" >&2; exit 1; }
      echo "== plan against mm3-lab-node1: the release signed by key lab-release"
    fi
    # The firewall from outside a node, and the secrets search against the real engine's logs
    # (lab/checks.yml; it plants a canary so the search can fail). Not in the second run either:
    # the lab hosts are what the first run's checks found; its time goes to the release refusals.
    if [ "${LAB_EXPECT_NO_CHANGES:-0}" = 1 ]; then
      echo "== checks: the first run's (reports/lab/checks.txt); this run changed nothing on the lab hosts"
    else
      checks_log=reports/lab/checks-$(date -u +%Y%m%dT%H%M%SZ).log
      $stage lab-checks ansible-playbook "${inv[@]}" lab/checks.yml > "$checks_log" 2>&1 \
        || { why "$checks_log"; echo "lab: lab/checks.yml failed, see $checks_log" >&2; exit 1; }
      cat reports/lab/checks.txt
    fi
    # What each node runs now (playbooks/status.yml): the release its history records, health,
    # and the verification just made on it. A node without a release or not answering fails.
    status_log=reports/lab/status-$(date -u +%Y%m%dT%H%M%SZ).log
    $stage lab-status ansible-playbook "${inv[@]}" playbooks/status.yml > "$status_log" 2>&1 \
      || { why "$status_log"; echo "lab: playbooks/status.yml failed, see $status_log" >&2; exit 1; }
    python3 - reports/status/status.json <<'PY'
import json, sys
nodes = json.load(open(sys.argv[1]))
for n in nodes:
    print("== status:", n["line"])
bad = [n["node"] for n in nodes if not n["release"] or n["health_status"] != 200 or "(this release)" not in n["verification"]]
sys.exit("lab: no release recorded, no health or no verification of this release on: %s" % ", ".join(bad) if bad else 0)
PY
    grep -q "signed by key lab-release (release " reports/status/status.json \
      || { echo "lab: status.yml does not name node1's signed release, see $status_log" >&2; exit 1; }
    # Who approved what runs where: each host's provenance record names the release its bundle
    # verifies as (lab-release.sh sign wrote verified*.json) and the key that signed it: node1's
    # own, and the staging host's (the profile's).
    python3 - reports/provenance reports/lab/release/verified.json reports/lab/release/verified-staging.json <<'PY'
import json, os, sys
prov = sys.argv[1]
for host, path in (("mm3-lab-node1", sys.argv[2]), ("mm3-lab-staging", sys.argv[3])):
    verified = json.load(open(path))
    release = json.load(open(os.path.join(prov, host + ".json"))).get("release") or {}
    if (release.get("digest"), release.get("key"), release.get("key_id")) != (
            verified["release_digest"], verified["key"], verified["key_id"]):
        sys.exit("lab: %s's provenance does not name its signed release %s (key %s): %s"
                 % (host, verified["release_digest"][:16], verified["key"], release))
    print("== provenance: %s holds release %s, approved by key %s" % (host, release["digest"][:16], release["key"]))
PY
    # An export carried by hand: the staging copy with the release kept beside it (<dir>.sig)
    # verifies with the upstream OpenSSF tool (model_signing verify key, tools/model_signing);
    # the changed=0 run leaves the copy as the first found it.
    if [ "${LAB_EXPECT_NO_CHANGES:-0}" != 1 ]; then
      $stage lab-export-verify scripts/lab-release.sh export
    fi
    if [ "${LAB_EXPECT_NO_CHANGES:-0}" = 1 ]; then
      $stage lab-release-refusals scripts/lab-release.sh refusals
    fi
    ;;
  drill)
    # The drill on a running lab (lab/drill.yml): kill the engine container, MM3EngineDown fires
    # in Prometheus and resolves after systemd restarts it; then diagnose the healthy first node,
    # a removed weights marker and an unknown engine flag, each named with its fix; the support
    # bundles hold no secret. It restores the node and restarts the engine at the end.
    # node1 runs its signed release (up): the drill resolves what it runs with that release
    [ -f reports/lab/release/inventory.yml ] && inv+=(-i reports/lab/release/inventory.yml)
    drill_log=reports/lab/drill-$(date -u +%Y%m%dT%H%M%SZ).log
    $stage lab-drill-run ansible-playbook "${inv[@]}" lab/drill.yml > "$drill_log" 2>&1 \
      || { why "$drill_log"; echo "lab: lab/drill.yml failed, see $drill_log" >&2; exit 1; }
    python3 -c 'import json, sys; d = json.load(open(sys.argv[1])); print("== alert drill on %s: %s fired %.1f s after the engine container was killed, resolved %.1f s after it (%s)" % (d["node"], d["alert"], d["fired_after_s"], d["resolved_after_s"], ", ".join(d["unit"])))' reports/lab/alert-drill.json
    for case in healthy marker-removed wrong-flag; do
      for txt in reports/lab/diagnose/$case/*/diagnosis.txt; do
        echo "== diagnose drill, $case: $txt"; sed 's/^/   /' "$txt"
      done
    done
    ;;
  rollout)
    # The release drill on a running lab, chosen by what runs: the two-node lab gets the fleet
    # drill below (rollout-fleet), one node the single-node drill (lab/rollout.yml): a tuning
    # change rolled out, a release whose checks cannot pass rolled back automatically, then
    # rollback.yml to the first release with the weights unchanged; reports/rollout/summary.json.
    if node2_running; then
      exec "$0" rollout-fleet
    fi
    rollout_log=reports/lab/rollout-$(date -u +%Y%m%dT%H%M%SZ).log
    $stage lab-rollout-run ansible-playbook "${inv[@]}" lab/rollout.yml > "$rollout_log" 2>&1 \
      || { why "$rollout_log"; echo "lab: lab/rollout.yml failed, see $rollout_log" >&2; exit 1; }
    python3 - reports/rollout/summary.json <<'PY'
import json, sys
good, bad, back = json.load(open(sys.argv[1]))
g, b = good["nodes"][0], bad["nodes"][0]
print("== release drill, good rollout: %s %s -> %s in %s s (%s)" % (g["node"], g["from"], g["to"], g["seconds"], ", ".join(g["changes"])))
print("== release drill, bad rollout: %s %s, restored %s in %s s: %s" % (b["node"], b["result"], b["restored"], b["seconds"], b["failed"]))
print("== release drill, rollback.yml: %s back on %s (%s) in %s, weights changed by %d bytes" % (back["node"], back["restored"], back["result"], back["seconds"], back["weights_bytes_changed"]))
PY
    ;;
  rollout-fleet)
    # The release drill on the running two-node lab (lab/rollout-fleet.yml; make lab-rollout on a
    # LAB_NODES=2 lab; not in CI's budget): revision 2 rolled out through the fleet gateway while
    # a background client counts failed requests, a release whose checks cannot pass rolled back
    # automatically on node1 (node2 untouched), then rollback.yml to revision 1 with the weights
    # unchanged, no failed request in any step; reports/rollout/summary.json. Once per lab: a
    # second run is refused (revision 2 is then on every host): make lab-down, then make lab.
    node2_running || {
      echo "lab: the fleet drill runs on the two-node lab (node2 and a fleet gateway on staging): run LAB_NODES=2 make lab first" >&2
      exit 2
    }
    [ "${LAB_NODES:-1}" -ge 2 ] || inv+=(-i inventories/lab/node2.yml)
    rollout_log=reports/lab/rollout-fleet-$(date -u +%Y%m%dT%H%M%SZ).log
    $stage lab-rollout-fleet-run ansible-playbook "${inv[@]}" lab/rollout-fleet.yml > "$rollout_log" 2>&1 \
      || { why "$rollout_log"; echo "lab: lab/rollout-fleet.yml failed, see $rollout_log" >&2; exit 1; }
    python3 - reports/rollout/summary.json <<'PY'
import json, sys
refused, good, bad, back = json.load(open(sys.argv[1]))
for line in refused["refusals"]:
    print("== release drill, refused: %s" % line)
def secs(delta):
    h, m, s = str(delta).split(":")
    return round(int(h) * 3600 + int(m) * 60 + float(s), 1)
def client(step):
    c = step["client"]
    return "client %d requests through the fleet gateway, %d failed" % (c["requests"], c["failed"])
for n in good["nodes"]:
    print("== release drill, good rollout: %s %s -> %s in %s s (%s)" % (n["node"], n["from"], n["to"], n["seconds"], ", ".join(n["changes"])))
added = {k: good["weights_after"][k]["bytes"] - good["weights_before"][k]["bytes"] for k in good["weights_after"]}
print("== release drill, good rollout: %s s in all, %s; weights added (bytes): %s" % (secs(good["seconds"]), client(good), added))
for n in bad["nodes"]:
    if n["result"] == "rolled back":
        print("== release drill, bad rollout: %s rolled back, restored %s in %s s: %s" % (n["node"], n["restored"], n["seconds"], n["failed"]))
    else:
        print("== release drill, bad rollout: %s %s" % (n["node"], n["result"]))
print("== release drill, bad rollout: %s" % client(bad))
for n in back["nodes"]:
    print("== release drill, rollback.yml: %s %s -> %s (revision %s) in %s s" % (n["node"], n["from"], n["to"], n["revision"], n["seconds"]))
print("== release drill, rollback.yml: %s s in all, %s; weights unchanged on every node: %s" % (secs(back["seconds"]), client(back), back["weights_unchanged"]))
PY
    ;;
  down)
    ids=$(docker ps -aq --filter label=org.mm3.lab=true)
    [ -z "$ids" ] || docker rm -f -v $ids >/dev/null
    nets=$(docker network ls -q --filter label=org.mm3.lab=true)
    [ -z "$nets" ] || docker network rm $nets >/dev/null
    vols=$(docker volume ls -q --filter label=org.mm3.lab=true)
    [ -z "$vols" ] || docker volume rm $vols >/dev/null
    rm -f inventories/lab/group_vars/all/lab_image.yml inventories/lab/group_vars/all/lab_network.yml
    echo "lab: removed $(echo $ids | wc -w) containers, $(echo $nets | wc -w) networks (and their anonymous volumes)"
    ;;
  *) echo "usage: $0 up|drill|rollout|down" >&2; exit 2 ;;
esac
