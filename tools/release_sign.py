#!/usr/bin/env python3
"""Make, sign and check a release document offline (issue 33), in the OpenSSF model-signing format.

  statement  the release document for review: the weights manifest's files (model-signing v1.0
             resources) and, with --release, the project's part (predicate.mm3_release: image
             digests, profile, engine argv, ...) from a JSON file
  sign       sign a reviewed statement with an EC key (P-256/384/521 PEM; the password, if any,
             read from a file, never argv): writes the sigstore bundle
  signing-input  (a key in an HSM) the bytes to sign, for the HSM's own tool: ECDSA with the
             curve's hash (pkcs11-tool --sign --mechanism ECDSA-SHA256), or, with --hash, their
             digest for an HSM that signs a digest (CKM_ECDSA: pkcs11-tool --mechanism ECDSA;
             SoftHSM 2 offers only that)
  assemble   (a key in an HSM) the bundle from that signature (DER or PKCS#11's raw r||s) and the
             key's public half; refused unless the signature verifies
  verify     check a bundle against release keys (a YAML/JSON list of {name, public_key,
             not_before, not_after}), revocations, and the weights manifest: prints the key, the
             release digest and the release part; exit 1 naming what failed

The bundle verifies with the upstream CLI too: `model_signing verify key WEIGHTS_DIR --signature
release.sig --public_key site.pub`. Run it where the key is (a security workstation); nothing
here reaches a network.

usage:
  tools/release_sign.py statement --manifest M.sha256 --name NAME [--release part.json] > release.json
  tools/release_sign.py sign --statement release.json --key site.pem [--password-file F] > release.sig
  tools/release_sign.py signing-input --statement release.json [--hash sha256] > release.pae
  tools/release_sign.py assemble --statement release.json --signature release.der --public-key site.pub > release.sig
  tools/release_sign.py verify --bundle release.sig --keys release_keys.yml --manifest M.sha256 \\
      [--revoked ID ...]
"""

import argparse
import hashlib
import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "collections"))

import yaml  # noqa: E402

from ansible_collections.mm3.shared.plugins.module_utils import release_signing as rs  # noqa: E402
from ansible_collections.mm3.shared.plugins.module_utils.weights_common import (  # noqa: E402
    ManifestError, parse_manifest)


def _read(path, mode="r"):
    with open(path, mode) as handle:
        return handle.read()


def cmd_statement(args):
    manifest = _read(args.manifest, "rb")
    entries = parse_manifest(manifest.decode())
    release = json.loads(_read(args.release)) if args.release else None
    if release is not None and not isinstance(release, dict):
        raise rs.ReleaseError("%s is not a JSON object." % args.release)
    pinned = (release or {}).get("manifest_sha256")
    if pinned and pinned != hashlib.sha256(manifest).hexdigest():
        raise rs.ReleaseError("%s pins manifest %s, but %s hashes to %s: give the manifest the plan pinned."
                              % (args.release, pinned, args.manifest, hashlib.sha256(manifest).hexdigest()))
    sys.stdout.write(rs.payload_bytes(rs.statement(args.name, entries, release=release)).decode())


def cmd_sign(args):
    password = _read(args.password_file, "rb").rstrip(b"\n") if args.password_file else None
    document = json.loads(_read(args.statement))
    rs.check_statement(document)  # never sign what verification would refuse
    sys.stdout.write(json.dumps(rs.sign(document, _read(args.key, "rb"), password), indent=1) + "\n")


def cmd_signing_input(args):
    document = json.loads(_read(args.statement))
    rs.check_statement(document)  # never sign what verification would refuse
    data = rs.signing_input(document)
    sys.stdout.buffer.write(hashlib.new(args.hash, data).digest() if args.hash else data)


def cmd_assemble(args):
    document = json.loads(_read(args.statement))
    rs.check_statement(document)
    bundle = rs.assemble(document, _read(args.signature, "rb"), _read(args.public_key, "rb"))
    sys.stdout.write(json.dumps(bundle, indent=1) + "\n")


def cmd_verify(args):
    keys = rs.trusted_keys(yaml.safe_load(_read(args.keys)))
    result = rs.verify(_read(args.bundle), keys, revoked=args.revoked)
    problem = rs.manifest_problem(result, _read(args.manifest, "rb"), "given", weights_only=True)
    if problem:
        raise rs.ReleaseError(problem)
    print(json.dumps({"key": result["key"], "key_id": result["key_id"], "release_digest": result["release_digest"],
                      "files": len(result["entries"]), "release": result["release"]}, indent=1))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("statement")
    p.add_argument("--manifest", required=True)
    p.add_argument("--name", required=True)
    p.add_argument("--release")
    p.set_defaults(run=cmd_statement)
    p = sub.add_parser("sign")
    p.add_argument("--statement", required=True)
    p.add_argument("--key", required=True)
    p.add_argument("--password-file")
    p.set_defaults(run=cmd_sign)
    p = sub.add_parser("signing-input")
    p.add_argument("--statement", required=True)
    p.add_argument("--hash", choices=("sha256", "sha384", "sha512"),
                   help="write the digest an HSM signing CKM_ECDSA signs (the curve's: sha256 for P-256)")
    p.set_defaults(run=cmd_signing_input)
    p = sub.add_parser("assemble")
    p.add_argument("--statement", required=True)
    p.add_argument("--signature", required=True)
    p.add_argument("--public-key", required=True)
    p.set_defaults(run=cmd_assemble)
    p = sub.add_parser("verify")
    p.add_argument("--bundle", required=True)
    p.add_argument("--keys", required=True)
    p.add_argument("--manifest", required=True)
    p.add_argument("--revoked", nargs="*", default=[])
    p.set_defaults(run=cmd_verify)
    args = parser.parse_args(argv)
    try:
        args.run(args)
    except (rs.ReleaseError, ManifestError, OSError, ValueError) as error:
        sys.stderr.write("release_sign %s: refused: %s\n" % (args.command, error))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
