#!/usr/bin/python3
"""ExecStartPre of the model server unit when the release is signed (issue 33): refuse to start
the engine unless the release bundle on this node verifies, offline, against the keys the node
trusts (role model_server writes <config_dir>/release-trust.json from release_keys and
release_revoked; playbooks/release-trust.yml alone pushes a revocation), is the release the unit
was rendered for, and signs exactly the weights manifest on this node.

No hashing and no network: the signature is checked over the bundle's payload, and the signed
files are compared with the manifest; check_weights.py (the next ExecStartPre) binds the bytes
on disk to that manifest through the verified marker. The key's validity dates are read against
this node's own clock. The checks are release_signing's, the same code the controller verifies
with, imported by the same name from the collection layout the role installs beside this file.

usage: check_release.py --bundle B --trust T --digest SHA256 --manifest M
"""
import argparse
import hashlib
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
# installed beside this file (role model_server, filter model_server_helper_files)
from ansible_collections.mm3.shared.plugins.module_utils import release_signing as rs  # noqa: E402
from ansible_collections.mm3.shared.plugins.module_utils.weights_common import (  # noqa: E402
    ManifestError, parse_manifest)


def problems(bundle_text, trust_text, digest, manifest_bytes, today=None):
    """Why this node must not start the release (one line naming the fix), or None."""
    try:
        keys, revoked = rs.read_trust(trust_text)
        checked = rs.verify(bundle_text, keys, revoked=revoked, today=today)
    except (rs.ReleaseError, ValueError) as error:
        return "the signed release is refused: %s" % error
    if checked["release_digest"] != digest:
        return ("the release bundle is release %s, not the release %s this unit was rendered for: re-run "
                "playbooks/serve.yml (or rollback.yml) so the bundle and the unit are one release again."
                % (checked["release_digest"][:16], digest[:16]))
    signed = checked["release"] if isinstance(checked["release"], dict) else {}
    manifest_sha256 = hashlib.sha256(manifest_bytes).hexdigest()
    if signed.get("manifest_sha256") != manifest_sha256:
        return ("the weights manifest on this node (sha256 %s) is not the signed one (%s): re-run "
                "playbooks/weights.yml for the signed revision." % (manifest_sha256[:16],
                                                                   str(signed.get("manifest_sha256"))[:16]))
    try:
        entries = parse_manifest(manifest_bytes.decode("utf-8"))
    except (ManifestError, UnicodeDecodeError) as error:
        return "the weights manifest on this node cannot be read: %s" % error
    differ = rs.manifest_differences(checked["entries"], entries)
    if differ:
        return "the weights manifest on this node is not the signed one: %s" % "; ".join(differ)
    return None


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for name in ("--bundle", "--trust", "--digest", "--manifest"):
        ap.add_argument(name, required=True)
    a = ap.parse_args(argv)
    texts = {}
    for what, path, mode in (("bundle", a.bundle, "r"), ("trust", a.trust, "r"), ("manifest", a.manifest, "rb")):
        try:
            with open(path, mode) as handle:
                texts[what] = handle.read()
        except (OSError, UnicodeDecodeError) as exc:
            print("minimax-m3: refusing to start: cannot read the release %s %s: %s. Re-run playbooks/serve.yml."
                  % (what, path, exc), file=sys.stderr)
            return 1
    problem = problems(texts["bundle"], texts["trust"], a.digest, texts["manifest"])
    if problem:
        print("minimax-m3: refusing to start: %s" % problem, file=sys.stderr)
        return 1
    print("minimax-m3: signed release %s verified on this node (%s)" % (a.digest[:16], a.bundle))
    return 0


if __name__ == "__main__":
    sys.exit(main())
