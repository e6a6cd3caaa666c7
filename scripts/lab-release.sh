#!/usr/bin/env bash
# The lab's signed release (issue 33), used by scripts/lab.sh:
#
#   scripts/lab-release.sh sign       after the first lab run: generate the lab's release key (a
#                                     real site keeps it on a security workstation or an HSM), make
#                                     the release document from the plan's release-part.json and the
#                                     manifest node1 verified, sign it (tools/release_sign.py), check
#                                     it, and write reports/lab/release/inventory.yml: node1's
#                                     serving_release_keys and serving_release_bundle, an inventory
#                                     source the second lab run adds (it must still report changed=0
#                                     and plan "no change" against node1's signed release).
#   scripts/lab-release.sh refusals   on the running, signed lab: serve.yml with a revoked key, a
#                                     release signed by a key not listed, an engine flag, an image and
#                                     a revision that are not the signed ones; each must be refused on
#                                     node1 naming the part, with its unit and engine container unchanged.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
cd "$here"
dir=reports/lab/release
py=.venv/bin/python
inv=(-i inventories/lab/hosts.yml)
node=mm3-lab-node1

case "${1:-}" in
  sign)
    rm -rf "$dir" && mkdir -p "$dir" && chmod 0700 "$dir"
    part=reports/lab/plan/nodes/$node/release-part.json
    revision=$($py -c 'import json,sys; print(json.load(open(sys.argv[1]))["revision"])' "$part")
    repo=$($py -c 'import json,sys; print(json.load(open(sys.argv[1]))["repo"])' "$part")
    docker exec "$node" cat "/data/models/$repo/$revision.manifest.sha256" > "$dir/manifest.sha256"
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
    $py - "$dir" "$node" <<'PY'
import os, sys, yaml
d = sys.argv[1]
keys = [{"name": "lab-release", "public_key": open(os.path.join(d, "lab-release.pub")).read()}]
with open(os.path.join(d, "keys.yml"), "w") as handle:
    yaml.safe_dump(keys, handle)
# Host variables of node1 (what it runs is its own: hosts.yml gives it its own engine core), as an
# inventory source scripts/lab.sh adds with -i; the stranger's is the unknown-key case.
for sig, out in (("lab-release", "inventory.yml"), ("stranger", "inventory-stranger.yml")):
    node = {"serving_release_keys": keys, "serving_release_bundle": open(os.path.join(d, sig + ".sig")).read()}
    with open(os.path.join(d, out), "w") as handle:
        yaml.safe_dump({"nodes": {"hosts": {sys.argv[2]: node}}}, handle)
PY
    $py tools/release_sign.py verify --bundle "$dir/lab-release.sig" --keys "$dir/keys.yml" \
      --manifest "$dir/manifest.sha256" > "$dir/verified.json"
    echo "lab-release: signed $repo@${revision:0:12} with key lab-release:" \
      "$($py -c 'import json,sys; d=json.load(open(sys.argv[1])); print("release", d["release_digest"][:16], "over", d["files"], "files")' "$dir/verified.json")"
    ;;
  refusals)
    unit_before=$(docker exec "$node" sha256sum /etc/systemd/system/minimax-m3.service)
    engine_before=$(docker exec "$node" docker inspect --format '{{.Id}} {{.State.StartedAt}}' minimax-m3)
    fail=0
    # case | extra -e (JSON) | inventory source | what the refusal must say
    while IFS='|' read -r case extra source fragment; do
      log=$dir/refusal-${case// /-}.log
      if ansible-playbook "${inv[@]}" -i "$dir/$source" playbooks/serve.yml --limit "$node" -e "$extra" \
           > "$log" 2>&1; then
        echo "lab-release: $case was served, not refused (see $log)" >&2; fail=1
      elif ! grep -qF -- "$fragment" "$log"; then
        echo "lab-release: $case was refused without '$fragment' (see $log)" >&2; fail=1
      else
        echo "lab-release: $case refused on $node: ...$fragment..."
      fi
    done <<'CASES'
revoked key|{"serving_release_revoked": ["lab-release"]}|inventory.yml|which release_revoked revokes
unknown key|{}|inventory-stranger.yml|which is not in release_keys
edited engine flag|{"serving_max_output_tokens": 300}|inventory.yml|in: argv.
swapped image|{"serving_image": {"repository": "127.0.0.1:5000/mm3-lab/vllm-cpu", "digest": "sha256:0000000000000000000000000000000000000000000000000000000000000000"}}|inventory.yml|in: images.
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
    [ "$(docker exec "$node" sha256sum /etc/systemd/system/minimax-m3.service)" = "$unit_before" ] \
      || { echo "lab-release: a refused release changed the unit on $node" >&2; fail=1; }
    [ "$(docker exec "$node" docker inspect --format '{{.Id}} {{.State.StartedAt}}' minimax-m3)" = "$engine_before" ] \
      || { echo "lab-release: a refused release restarted the engine on $node" >&2; fail=1; }
    exit $fail
    ;;
  *)
    echo "usage: $0 sign|refusals" >&2; exit 2 ;;
esac
