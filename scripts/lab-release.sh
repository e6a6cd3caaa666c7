#!/usr/bin/env bash
# The lab's signed release (issue 33), used by scripts/lab.sh:
#
#   scripts/lab-release.sh sign       before the first site.yml, after the plan wrote node1's
#                                     release-part.json: generate the lab's release key (a real site
#                                     keeps it on a security workstation or an HSM), make the release
#                                     document from that part and the tiny model's manifest (the one
#                                     the inventory pins, lab/files/tiny-m3.manifest.sha256), sign it
#                                     (tools/release_sign.py), check it, and write
#                                     reports/lab/release/inventory.yml: node1's serving_release_keys
#                                     and serving_release_bundle, an inventory source both lab runs
#                                     add, so node1 only ever serves the signed release. The staging
#                                     host gets its own: the profile's release part (what staging
#                                     resolves) signed by the same key, which it checks against its
#                                     copy before export and keeps beside the weights.
#   scripts/lab-release.sh export     after site.yml: the staging copy and the release beside it,
#                                     copied off staging, verify with upstream model_signing.
#   scripts/lab-release.sh refusals   on the running, signed lab. On staging, the check before export
#                                     (weights_verify in check mode): the stranger's bundle, the key
#                                     revoked, other files signed. On the controller: serve.yml with a
#                                     revoked key, a release signed by a key not listed, an engine
#                                     flag, an image, a gateway policy, a container option and a
#                                     revision that are not the signed ones; each must be refused
#                                     naming the part. On node1, the unit's own start
#                                     checks (its ExecStartPre lines, run as the unit runs them): the
#                                     key revoked by playbooks/release-trust.yml, a bundle signed by
#                                     the stranger's key put in place of the release, a tampered
#                                     weights file, and drop-ins that swap the image, add an engine
#                                     flag, mount other weights or run the engine privileged; each
#                                     must be refused, and pass
#                                     again once undone. verify.yml with an evaluation set the release
#                                     does not name is refused before any request.
#                                     Node1's unit and engine container must be unchanged throughout.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
cd "$here"
dir=reports/lab/release
py=.venv/bin/python
inv=(-i inventories/lab/hosts.yml)
node=mm3-lab-node1
staging=mm3-lab-staging

case "${1:-}" in
  sign)
    rm -rf "$dir" && mkdir -p "$dir" && chmod 0700 "$dir"
    part=reports/lab/plan/nodes/$node/release-part.json
    revision=$($py -c 'import json,sys; print(json.load(open(sys.argv[1]))["revision"])' "$part")
    repo=$($py -c 'import json,sys; print(json.load(open(sys.argv[1]))["repo"])' "$part")
    # The manifest the inventory pins (what staging's weights run writes for the tiny model): the
    # release signs the files it lists; node1 verifies its copy against the same pin.
    pin=$(ansible-inventory "${inv[@]}" --host "$node" \
          | $py -c 'import json, sys; print(json.load(sys.stdin)["serving_weights_manifest_sha256"])')
    cp lab/files/tiny-m3.manifest.sha256 "$dir/manifest.sha256"
    [ "$(sha256sum < "$dir/manifest.sha256" | cut -d' ' -f1)" = "$pin" ] \
      || { echo "lab-release: lab/files/tiny-m3.manifest.sha256 does not hash to the pinned $pin" >&2; exit 1; }
    # The lab's signing key and a stranger's (the unknown-key case), EC P-256, private keys 0600.
    $py - "$dir" <<'PY'
import os, sys
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
for name in ("lab-release", "stranger"):
    key = ec.generate_private_key(ec.SECP256R1())
    path = os.path.join(sys.argv[1], name + ".pem")
    with open(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "wb") as handle:
        handle.write(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                       serialization.NoEncryption()))
    with open(os.path.join(sys.argv[1], name + ".pub"), "wb") as handle:
        handle.write(key.public_key().public_bytes(serialization.Encoding.PEM,
                                                   serialization.PublicFormat.SubjectPublicKeyInfo))
PY
    $py tools/release_sign.py statement --manifest "$dir/manifest.sha256" --name "$repo" --release "$part" \
      > "$dir/release.json"
    for key in lab-release stranger; do
      $py tools/release_sign.py sign --statement "$dir/release.json" --key "$dir/$key.pem" > "$dir/$key.sig"
    done
    # The staging host's release: the profile as group_vars/all sets it (plan/<profile>/, what
    # staging resolves), signed by the same key. Staging checks it against the manifest it wrote
    # before marking its copy verified, and keeps it beside the weights (<dir>.sig).
    profile_part=$(ls reports/lab/plan/*/release-part.json | grep -v "/nodes/")
    [ "$(wc -l <<<"$profile_part")" = 1 ] || { echo "lab-release: not one profile part: $profile_part" >&2; exit 1; }
    $py tools/release_sign.py statement --manifest "$dir/manifest.sha256" --name "$repo" --release "$profile_part" \
      > "$dir/release-staging.json"
    $py tools/release_sign.py sign --statement "$dir/release-staging.json" --key "$dir/lab-release.pem" \
      > "$dir/staging.sig"
    $py - "$dir" "$node" "$staging" <<'PY'
import os, sys, yaml
d = sys.argv[1]
keys = [{"name": "lab-release", "public_key": open(os.path.join(d, "lab-release.pub")).read()}]
with open(os.path.join(d, "keys.yml"), "w") as handle:
    yaml.safe_dump(keys, handle)
# Host variables of node1 (what it runs is its own: hosts.yml gives it its own engine core), as an
# inventory source scripts/lab.sh adds with -i; the stranger's is the unknown-key case.
for sig, out in (("lab-release", "inventory.yml"), ("stranger", "inventory-stranger.yml")):
    node = {"serving_release_keys": keys, "serving_release_bundle": open(os.path.join(d, sig + ".sig")).read()}
    hosts = {"nodes": {"hosts": {sys.argv[2]: node}}}
    if sig == "lab-release":  # the staging host's own release (the profile's), beside node1's
        hosts["staging"] = {"hosts": {sys.argv[3]: {
            "serving_release_keys": keys, "serving_release_bundle": open(os.path.join(d, "staging.sig")).read()}}}
    with open(os.path.join(d, out), "w") as handle:
        yaml.safe_dump(hosts, handle)
PY
    $py tools/release_sign.py verify --bundle "$dir/lab-release.sig" --keys "$dir/keys.yml" \
      --manifest "$dir/manifest.sha256" > "$dir/verified.json"
    $py tools/release_sign.py verify --bundle "$dir/staging.sig" --keys "$dir/keys.yml" \
      --manifest "$dir/manifest.sha256" > "$dir/verified-staging.json"
    echo "lab-release: signed $repo@${revision:0:12} with key lab-release:" \
      "$($py -c 'import json,sys; d=json.load(open(sys.argv[1])); print("release", d["release_digest"][:16], "over", d["files"], "files")' "$dir/verified.json")"
    ;;
  export)
    # An export carried by hand, checked as its receiver would: the staging copy of the revision
    # and the release kept beside it (<dir>.sig), copied off the staging host, verify with the
    # upstream OpenSSF tool (model_signing verify key, tools/model_signing) and the lab's public
    # key; the .sig is the staging release lab-release.sh sign made. The hub client's .cache/ in
    # the copy is not part of the model (weights_verify ignores it too).
    wdir=$($py -c 'import json, sys; print(json.load(open(sys.argv[1]))["weights_dir"])' \
           "reports/provenance/$staging.json")
    out=$dir/export
    rm -rf "$out" && mkdir -p "$out"
    docker cp -q "$staging:$wdir" "$out/weights"
    docker cp -q "$staging:$wdir.sig" "$out/weights.sig"
    cmp -s "$out/weights.sig" "$dir/staging.sig" \
      || { echo "lab-release: staging keeps another bundle than its release beside $wdir" >&2; exit 1; }
    cli=$($py -c 'import sys; sys.path.insert(0, "tools/model_signing"); from cli import model_signing_cli; print(model_signing_cli())')
    "$cli" verify key "$out/weights" --signature "$out/weights.sig" --public_key "$dir/lab-release.pub" \
      --ignore-paths "$out/weights/.cache" > "$dir/export-verify.log" 2>&1 \
      || { cat "$dir/export-verify.log" >&2; echo "lab-release: model_signing verify refuses the staging export" >&2; exit 1; }
    echo "lab-release: the staging export ($(find "$out/weights" -type f -not -path '*/.cache/*' | wc -l) files and $wdir.sig)" \
      "verifies with upstream model_signing: $(tail -n1 "$dir/export-verify.log")"
    rm -rf "$out"
    ;;
  refusals)
    unit_before=$(docker exec "$node" sha256sum /etc/systemd/system/minimax-m3.service)
    engine_before=$(docker exec "$node" docker inspect --format '{{.Id}} {{.State.StartedAt}}' minimax-m3)
    fail=0
    # refused WHAT WHERE LOG FRAGMENT COMMAND...: COMMAND must fail, its output (kept in LOG) naming
    # FRAGMENT.
    refused() {
      local what=$1 where=$2 log=$3 fragment=$4
      shift 4
      if "$@" > "$log" 2>&1; then
        echo "lab-release: $what was not refused on $where (see $log)" >&2; fail=1
      elif ! grep -qF -- "$fragment" "$log"; then
        echo "lab-release: $what was refused on $where without '$fragment' (see $log)" >&2; fail=1
      else
        echo "lab-release: $what refused on $where: ...$fragment..."
      fi
    }
    # case | extra -e (JSON) | inventory source | what the refusal must say
    while IFS='|' read -r case extra source fragment; do
      refused "$case" "$node" "$dir/refusal-${case// /-}.log" "$fragment" \
        ansible-playbook "${inv[@]}" -i "$dir/$source" playbooks/serve.yml --limit "$node" -e "$extra"
    done <<'CASES'
revoked key|{"serving_release_revoked": ["lab-release"]}|inventory.yml|which release_revoked revokes
unknown key|{}|inventory-stranger.yml|which is not in release_keys
edited engine flag|{"serving_max_output_tokens": 300}|inventory.yml|in: argv.
swapped image|{"serving_image": {"repository": "127.0.0.1:5000/mm3-lab/vllm-cpu", "digest": "sha256:0000000000000000000000000000000000000000000000000000000000000000"}}|inventory.yml|in: images.
another gateway policy|{"gateway_metrics_networks": ["10.99.0.0/16"]}|inventory.yml|in: gateway_policy.
another container|{"serving_profile_overrides": {"engines": {"vllm": {"env": {"VLLM_CPU_OMP_THREADS_BIND": "0"}, "container": {"pids_limit": 768}}}}}|inventory.yml|in: container.
another revision|{"serving_weights_revision": "{{ lab_rollout_revision }}", "serving_weights_manifest_sha256": "{{ lab_rollout_manifest_sha256 }}"}|inventory.yml|in: revision, manifest_sha256.
CASES
    # The revoked key as status.yml reports it (it reads only): the line names the key.
    ansible-playbook "${inv[@]}" -i "$dir/inventory.yml" playbooks/status.yml --limit "$node,localhost" \
      -e '{"serving_release_revoked": ["lab-release"]}' -e status_report_dir="$here/$dir/status-revoked" \
      > "$dir/status-revoked.log" 2>&1 || true
    if grep -q "signed release REFUSED: the release is signed by key 'lab-release'.*release_revoked revokes" \
         "$dir/status-revoked/status.json" 2>/dev/null; then
      echo "lab-release: status.yml with the key revoked: $(grep -o 'signed release REFUSED[^;]*' "$dir/status-revoked/status.json" | head -n1 | cut -c1-160)"
    else
      echo "lab-release: status.yml does not name the revoked key (see $dir/status-revoked.log)" >&2; fail=1
    fi
    # ... and as diagnose.yml reports it: the node is diagnosed (not skipped), release_refused first.
    ansible-playbook "${inv[@]}" -i "$dir/inventory.yml" playbooks/diagnose.yml --limit "$node" \
      -e '{"serving_release_revoked": ["lab-release"], "diagnose_bundle": false}' \
      -e diagnose_report_dir="$here/$dir/diagnose-revoked" > "$dir/diagnose-revoked.log" 2>&1 || true
    report=$dir/diagnose-revoked/$node/diagnosis.json
    if python3 -c 'import json, sys; f = json.load(open(sys.argv[1]))["findings"]
sys.exit(not (f and f[0]["id"] == "release_refused" and "key '"'"'lab-release'"'"'" in f[0]["evidence"][0]["line"]))' \
         "$report" 2>/dev/null; then
      echo "lab-release: diagnose.yml with the key revoked: release_refused first, naming key 'lab-release'"
    else
      echo "lab-release: diagnose.yml does not lead with release_refused naming the key (see $dir/diagnose-revoked.log, $report)" >&2; fail=1
    fi
    # The evaluation set judges the release only if it is the one the release names: verify.yml
    # with the real model's set (another digest) is refused on node1 before any request.
    log=$dir/refusal-eval-set.log
    if ansible-playbook "${inv[@]}" -i "$dir/inventory.yml" playbooks/verify.yml --limit "$node" \
         -e serving_verify_eval_set_file="$here/evals/minimax-m3.yml" > "$log" 2>&1; then
      echo "lab-release: verify.yml ran another evaluation set on $node, not refused (see $log)" >&2; fail=1
    elif ! grep -q "is not the one the signed release [0-9a-f]* (key 'lab-release') names (lab-tiny-m3" "$log" \
         || grep -q "serving_verify checks against" "$log"; then
      echo "lab-release: verify.yml with another evaluation set was not refused as it should be (see $log)" >&2; fail=1
    else
      echo "lab-release: another evaluation set refused on $node: ...$(grep -o "is not the one the signed release [0-9a-f]* (key 'lab-release') names ([^)]*)" "$log" | head -n1)..."
    fi
    # On staging: the check before export (weights_verify, as weights_stage runs it, in check mode
    # so the marker stays) refuses a bundle signed by the stranger's key, the lab key revoked in
    # the trust it is given, and a release that signs other files under the pinned manifest's
    # sha256 (a signer's mistake only the host holding the manifest can see); the marker stays.
    wdir=$($py -c 'import json, sys; print(json.load(open(sys.argv[1]))["weights_dir"])' \
           "reports/provenance/$staging.json")
    marker_before=$(docker exec "$staging" sha256sum "$wdir.verified.json")
    while IFS='|' read -r case fragment; do
      args=$dir/staging-${case// /-}.json
      $py - "$dir" "$wdir" "$case" > "$args" <<'PY'
import hashlib, json, os, sys
sys.path.insert(0, "collections")
import yaml
from ansible_collections.mm3.shared.plugins.module_utils import release_signing as rs
from ansible_collections.mm3.shared.plugins.module_utils.weights_common import parse_manifest
d, wdir, case = sys.argv[1:]
manifest = open(os.path.join(d, "manifest.sha256"), "rb").read()
keys = yaml.safe_load(open(os.path.join(d, "keys.yml")))
bundle = open(os.path.join(d, "staging.sig")).read()
revoked = ["lab-release"] if case == "key revoked" else []
if case == "unknown key":
    bundle = open(os.path.join(d, "stranger.sig")).read()
if case == "other files signed":
    # the staging release's own part (its manifest_sha256 is the pin), over the manifest's files
    # with README.md's digest changed, signed by the lab key
    signed = json.loads(rs.envelope(bundle)[0])
    entries = [(p, "0" * 64 if p == "README.md" else h) for p, h in parse_manifest(manifest.decode())]
    part = {k: v for k, v in signed["predicate"]["mm3_release"].items() if k != "version"}
    document = rs.statement(signed["subject"][0]["name"], entries, release=part)
    bundle = json.dumps(rs.sign(document, open(os.path.join(d, "lab-release.pem"), "rb").read()))
digest = rs.release_digest(rs.envelope(bundle)[0]) if case == "other files signed" \
    else json.load(open(os.path.join(d, "verified-staging.json")))["release_digest"]
print(json.dumps({"path": wdir, "manifest": wdir + ".manifest.sha256", "marker": wdir + ".verified.json",
                  "manifest_sha256": hashlib.sha256(manifest).hexdigest(),
                  "release_bundle": bundle, "release_trust": json.dumps(rs.trust_document(keys, revoked)),
                  "release_digest": digest}))
PY
      refused "$case" "$staging before export" "$dir/staging-${case// /-}.log" "$fragment" \
        ansible "${inv[@]}" "$staging" -m weights_verify -a "$(cat "$args")" --check
    done <<'CASES'
unknown key|which is not in release_keys
key revoked|which release_revoked revokes
other files signed|1 file(s) with another sha256 than the signed one: README.md
CASES
    [ "$(docker exec "$staging" sha256sum "$wdir.verified.json")" = "$marker_before" ] \
      || { echo "lab-release: staging's marker changed during the refusals" >&2; fail=1; }
    # On node1: the unit's own start checks, run as the unit runs them (its ExecStartPre lines),
    # while the engine keeps serving. Each tampering must be refused, and the check pass once undone.
    # (the argv systemd parsed from the unit: systemctl show prints each as "argv[]=... ;")
    pre=$(docker exec "$node" systemctl show minimax-m3.service -p ExecStartPre --value)
    release_check=$(sed -n 's/.*argv\[\]=\([^;]*check_release\.py[^;]*\) ;.*/\1/p' <<<"$pre")
    weights_check=$(sed -n 's/.*argv\[\]=\([^;]*check_weights\.py[^;]*\) ;.*/\1/p' <<<"$pre")
    [ -n "$release_check" ] || { echo "lab-release: node1's unit has no release check (ExecStartPre check_release.py)" >&2; fail=1; }
    # node_case NAME CHECK FRAGMENT: CHECK must be refused on node1 naming FRAGMENT.
    node_case() {
      local out
      if out=$(docker exec "$node" sh -c "$2" 2>&1); then
        echo "lab-release: node1 started with $1 (not refused): $out" >&2; fail=1
      elif ! grep -qF -- "$3" <<<"$out"; then
        echo "lab-release: node1 refused $1 without '$3': $out" >&2; fail=1
      else
        echo "lab-release: $1 refused on $node at start: ${out:0:220}"
      fi
    }
    node_passes() {
      docker exec "$node" sh -c "$2" >/dev/null 2>&1 \
        || { echo "lab-release: node1's start check still refuses after undoing $1" >&2; fail=1; }
    }
    # The key revoked: playbooks/release-trust.yml pushes the revocation (no restart), the next
    # start is refused; pushing the trust without it lets the release start again.
    ansible-playbook "${inv[@]}" -i "$dir/inventory.yml" playbooks/release-trust.yml --limit "$node" \
      -e '{"serving_release_revoked": ["lab-release"]}' > "$dir/trust-revoked.log" 2>&1 \
      || { echo "lab-release: release-trust.yml failed (see $dir/trust-revoked.log)" >&2; fail=1; }
    node_case "the key revoked by release-trust.yml" "$release_check" "signed by key 'lab-release'"
    ansible-playbook "${inv[@]}" -i "$dir/inventory.yml" playbooks/release-trust.yml --limit "$node" \
      > "$dir/trust-restored.log" 2>&1 \
      || { echo "lab-release: release-trust.yml failed (see $dir/trust-restored.log)" >&2; fail=1; }
    node_passes "the revocation" "$release_check"
    # A release signed by the stranger's key in place of the lab's bundle.
    bundle=/etc/minimax-m3/release.sigstore.json
    docker exec "$node" cp -p "$bundle" "$bundle.lab-keep"
    docker exec -i "$node" sh -c "cat > $bundle" < "$dir/stranger.sig"
    node_case "a bundle signed by a key not listed" "$release_check" "which is not in release_keys"
    docker exec "$node" mv "$bundle.lab-keep" "$bundle"
    node_passes "the stranger's bundle" "$release_check"
    # A weights file changed on the node (one byte appended).
    wdir=$(sed -n 's/.* --dir \([^ ]*\) .*/\1/p' <<<"$weights_check")
    docker exec "$node" sh -c "cp -p $wdir/README.md /tmp/lab-README.md && printf x >> $wdir/README.md"
    node_case "a tampered weights file" "$weights_check" "README.md"
    docker exec "$node" sh -c "cp -p /tmp/lab-README.md $wdir/README.md && rm /tmp/lab-README.md"
    node_passes "the tampered file" "$weights_check"
    # What the unit runs, changed by a drop-in (systemd reloaded, the engine not restarted): the
    # release check reads ExecStart as systemd holds it, so the image swapped for another digest,
    # an engine flag added and another directory mounted at the weights' path are each refused
    # naming the part, and pass once the drop-in is gone.
    # dropin_case NAME FRAGMENT OLD NEW: the unit's ExecStart line with every OLD replaced by NEW
    # (OLD empty: NEW appended).
    dropin_case() {
      docker exec -i "$node" python3 - "$3" "$4" <<'PY'
import os, sys
old, new = sys.argv[1], sys.argv[2]
text = open("/etc/systemd/system/minimax-m3.service").read().replace("\\\n", " ")
line = next(l for l in text.splitlines() if l.startswith("ExecStart="))
assert not old or old in line, "%r is not in the unit's ExecStart" % old
line = line.replace(old, new) if old else line + " " + new
os.makedirs("/etc/systemd/system/minimax-m3.service.d", exist_ok=True)
with open("/etc/systemd/system/minimax-m3.service.d/lab-tamper.conf", "w") as handle:
    handle.write("[Service]\nExecStart=\n" + line + "\n")
PY
      docker exec "$node" systemctl daemon-reload
      node_case "$1" "$release_check" "$2"
      docker exec "$node" sh -c 'rm /etc/systemd/system/minimax-m3.service.d/lab-tamper.conf &&
        rmdir --ignore-fail-on-non-empty /etc/systemd/system/minimax-m3.service.d && systemctl daemon-reload'
      node_passes "$1" "$release_check"
    }
    digest=$(ansible-inventory "${inv[@]}" --host "$node" \
             | $py -c 'import json, sys; print(json.load(sys.stdin)["serving_image"]["digest"].split(":")[1])')
    dropin_case "a drop-in that swaps the image" "images: the unit runs" "$digest" "$(printf '0%.0s' $(seq 64))"
    dropin_case "a drop-in that adds an engine flag" "argv: it adds '--max-model-len 2048'" "" "--max-model-len 2048"
    dropin_case "a drop-in that mounts other weights" "mounts: -v /tmp:" "$wdir:" "/tmp:"
    dropin_case "a drop-in that runs the engine privileged" "container: the unit adds --privileged" \
      "--read-only" "--privileged --read-only"
    [ "$(docker exec "$node" sha256sum /etc/systemd/system/minimax-m3.service)" = "$unit_before" ] \
      || { echo "lab-release: a refused release changed the unit on $node" >&2; fail=1; }
    [ "$(docker exec "$node" docker inspect --format '{{.Id}} {{.State.StartedAt}}' minimax-m3)" = "$engine_before" ] \
      || { echo "lab-release: a refused release restarted the engine on $node" >&2; fail=1; }
    exit $fail
    ;;
  *)
    echo "usage: $0 sign|export|refusals" >&2; exit 2 ;;
esac
