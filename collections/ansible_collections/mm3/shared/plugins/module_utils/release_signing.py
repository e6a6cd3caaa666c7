# -*- coding: utf-8 -*-
"""Signed releases in the OpenSSF model-signing format, offline, with key pairs (issue 33).

A release is one in-toto statement, model-signing's own (predicateType
https://model_signing/signature/v1.0), signed in a sigstore bundle v0.3 holding a DSSE envelope:

- subject: the weights directory, its sha256 the digest of every file's raw sha256 in the order
  the resources are listed (model-signing's "files" serialization);
- predicate.resources: every file's sha256 - exactly the weights manifest's entries, so the
  node's parallel verifier (weights_verify against the manifest) is the per-file check and signing
  or verifying adds no hashing;
- predicate.serialization: method files, sha256, no symlinks, the ignored paths;
- predicate.mm3_release: what the project adds (repository, revision, image digests, profile,
  engine argv and environment, the gateway's policy, and the evaluation set by its digest:
  document_digest). model-signing's verifier ignores the extra key, so the upstream
  `model_signing verify key` CLI accepts a bundle made here, and a bundle the CLI made (weights
  only, no mm3_release) is accepted here.

Keys are EC P-256/P-384/P-521 (what model-signing's key signer accepts), each hashed with SHA-256/
384/512; a key's id is model-signing's hint: the sha256 of its SubjectPublicKeyInfo PEM. Trust ends
at the inventory's public keys (release_keys, with validity) less release_revoked (key ids, key
names or release digests: the sha256 of the signed payload). Pure functions over bytes and dicts;
the modules and filters that read files call them.
"""

from __future__ import annotations

import base64
import binascii
import datetime
import hashlib
import json
import posixpath

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.utils import encode_dss_signature

from ansible_collections.mm3.shared.plugins.module_utils import docker_run as dr
from ansible_collections.mm3.shared.plugins.module_utils.validation import has_control, is_plain_name, is_sha256
from ansible_collections.mm3.shared.plugins.module_utils.weights_common import ManifestError, check_relpath, parse_manifest

BUNDLE_MEDIA_TYPE = "application/vnd.dev.sigstore.bundle.v0.3+json"
PAYLOAD_TYPE = "application/vnd.in-toto+json"
STATEMENT_TYPE = "https://in-toto.io/Statement/v1"
PREDICATE_TYPE = "https://model_signing/signature/v1.0"
RELEASE_KEY = "mm3_release"
# 3: the release part names the container's device and privilege options (container);
# 2: the gateway's policy (gateway_policy) and the evaluation set (eval_set); 1 had neither.
RELEASE_VERSION = 3
CURVE_HASH = {"secp256r1": hashes.SHA256, "secp384r1": hashes.SHA384, "secp521r1": hashes.SHA512}


class ReleaseError(ValueError):
    """A bundle, statement or key that cannot be trusted; the message names the fix."""


def pae(payload_type, payload):
    """DSSE's pre-authentication encoding: what the signature covers."""
    kind = payload_type.encode()
    return b"DSSEv1 %d %s %d %s" % (len(kind), kind, len(payload), payload)


def root_digest(resources):
    """model-signing's subject digest: sha256 over the raw digests in the listed order."""
    return hashlib.sha256(b"".join(binascii.unhexlify(r["digest"]) for r in resources)).hexdigest()


# The paths upstream model-signing leaves out of a model unless told otherwise, at its top only
# (model_signing/hashing.py, Config.set_ignored_paths(ignore_git_paths=True)), and names in the
# statement's serialization.ignore_paths. Every hub repository holds .gitattributes: a release
# leaves these out and names them the same way, so `model_signing verify key` with its defaults
# accepts a copy of a hub revision, and a revision upstream signed is accepted here. Their bytes
# stay bound: the weights manifest lists them, and a release signs the manifest's sha256.
GIT_PATHS = (".git", ".gitattributes", ".github", ".gitignore")


def _git_path(name):
    return name.split("/", 1)[0] in GIT_PATHS


def _sort_key(name):
    return tuple(name.split("/"))


def statement(name, entries, ignore_paths=(), release=None):
    """The release statement for `entries` [(relpath, sha256 hex)] (parse_manifest's output):
    resources sorted as model-signing sorts them (by path parts), less GIT_PATHS (named in
    ignore_paths, as model-signing does), `release` (a dict) under predicate.mm3_release when
    given."""
    resources = [{"name": path, "algorithm": "sha256", "digest": digest.lower()}
                 for path, digest in sorted(entries, key=lambda e: _sort_key(e[0])) if not _git_path(path)]
    predicate = {"serialization": {"method": "files", "hash_type": "sha256", "allow_symlinks": False,
                                   "ignore_paths": sorted(set(ignore_paths) | set(GIT_PATHS))},
                 "resources": resources}
    if release is not None:
        predicate[RELEASE_KEY] = dict(release, version=RELEASE_VERSION)
    return {"_type": STATEMENT_TYPE,
            "subject": [{"name": name, "digest": {"sha256": root_digest(resources)}}],
            "predicateType": PREDICATE_TYPE, "predicate": predicate}


def payload_bytes(document):
    """The bytes a statement is signed as (sorted keys, two-space indent: reviewable as text)."""
    return (json.dumps(document, indent=2, sort_keys=True) + "\n").encode()


def document_digest(document):
    """The sha256 of a document (a parsed YAML or JSON value) as canonical JSON: sorted keys, no
    spaces, UTF-8. What a release signs of a document it binds by digest (the evaluation set): its
    content, not its formatting, so a comment or a reordered key needs no new signature."""
    return hashlib.sha256(json.dumps(document, sort_keys=True, separators=(",", ":"), ensure_ascii=False,
                                     default=str).encode()).hexdigest()


def release_digest(payload):
    """A release's identity: the sha256 of its signed payload (what release_revoked may name)."""
    return hashlib.sha256(payload).hexdigest()


# --- keys ----------------------------------------------------------------------------------------

def _public_pem(public_key):
    return public_key.public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)


def key_id(public_key):
    """model-signing's key hint: sha256 of the SubjectPublicKeyInfo PEM (= sha256sum of the .pub
    file openssl writes)."""
    return hashlib.sha256(_public_pem(public_key)).hexdigest()


def load_public_key(pem, name="key"):
    """An EC public key of a curve model-signing signs with, or ReleaseError naming the fix."""
    text = pem.encode() if isinstance(pem, str) else pem
    try:
        key = serialization.load_pem_public_key(text)
    except (ValueError, TypeError) as error:
        raise ReleaseError("%s is not a PEM public key (%s): give the -----BEGIN PUBLIC KEY----- block "
                           "that `openssl ec -in key.pem -pubout` prints." % (name, error))
    if not isinstance(key, ec.EllipticCurvePublicKey) or key.curve.name not in CURVE_HASH:
        raise ReleaseError("%s is a %s key: model-signing signs with EC P-256, P-384 or P-521 keys "
                           "(openssl ecparam -name prime256v1 -genkey)." % (name, getattr(
                               getattr(key, "curve", None), "name", type(key).__name__)))
    return key


def load_private_key(pem, password=None):
    """The signing key (EC P-256/384/521), or ReleaseError."""
    try:
        key = serialization.load_pem_private_key(pem.encode() if isinstance(pem, str) else pem, password)
    except (ValueError, TypeError) as error:
        raise ReleaseError("the signing key is not a PEM private key or its password is wrong (%s)." % error)
    if not isinstance(key, ec.EllipticCurvePrivateKey) or key.curve.name not in CURVE_HASH:
        raise ReleaseError("the signing key must be EC P-256, P-384 or P-521 (model-signing's key signer).")
    return key


def _date(value, where):
    if value in (None, ""):
        return None
    if isinstance(value, datetime.datetime):
        return value.date()
    if isinstance(value, datetime.date):
        return value
    try:
        return datetime.date.fromisoformat(str(value))
    except ValueError:
        raise ReleaseError("%s is %r: give a date as YYYY-MM-DD." % (where, value))


def trusted_keys(release_keys):
    """[{name, id, key, not_before, not_after}] of the inventory's release_keys ([{name, public_key,
    not_before?, not_after?}]), or ReleaseError naming the first bad entry."""
    if not isinstance(release_keys, list):
        raise ReleaseError("release_keys is a %s: give a list of {name, public_key, not_before, not_after}."
                           % type(release_keys).__name__)
    result, names, ids = [], set(), set()
    for index, entry in enumerate(release_keys):
        where = "release_keys[%d]" % index
        if not isinstance(entry, dict):
            raise ReleaseError("%s is not a mapping with name and public_key." % where)
        unknown = sorted(set(entry) - {"name", "public_key", "not_before", "not_after"})
        if unknown:
            raise ReleaseError("%s has unknown settings %s; known: name, public_key, not_before, not_after."
                               % (where, ", ".join(unknown)))
        name = entry.get("name")
        if not is_plain_name(name):
            raise ReleaseError("%s.name %r is not a plain name (lowercase letters, digits, '.', '_', '-')."
                               % (where, name))
        if name in names:
            raise ReleaseError("release key name '%s' appears twice: give each key its own name." % name)
        key = load_public_key(entry.get("public_key") or "", "release key '%s'" % name)
        kid = key_id(key)
        if kid in ids:
            raise ReleaseError("release key '%s' is the same key as another entry: list each key once." % name)
        not_before = _date(entry.get("not_before"), where + ".not_before")
        not_after = _date(entry.get("not_after"), where + ".not_after")
        if not_before and not_after and not_after < not_before:
            raise ReleaseError("%s: not_after %s is before not_before %s." % (where, not_after, not_before))
        names.add(name)
        ids.add(kid)
        result.append({"name": name, "id": kid, "key": key, "not_before": not_before, "not_after": not_after})
    return result


def revocations(revoked):
    """release_revoked as the checks read it (key ids, key names, release digests; stripped,
    lowercase, sorted), or ReleaseError naming a non-list or an entry that is not such a string.
    The controller's verification and the node's trust file both read it through here, so a
    release the controller accepts always has a trust file for the node."""
    if not isinstance(revoked, (list, tuple)):
        raise ReleaseError("release_revoked is a %s: give a list of key ids, key names or release digests."
                           % type(revoked).__name__)
    bad = [item for item in revoked if not isinstance(item, str) or not item.strip() or has_control(item)]
    if bad:
        raise ReleaseError("release_revoked holds %r: give key ids, key names or release digests as strings."
                           % (bad[0],))
    return sorted({item.strip().lower() for item in revoked})


def trust_document(release_keys, revoked=()):
    """What a node trusts, as the file its unit's start check reads (role model_server writes it:
    <config_dir>/release-trust.json): {keys: [{name, public_key (PEM), not_before, not_after}],
    revoked: [...]}, from the inventory's release_keys (checked by trusted_keys, so a bad entry is
    ReleaseError here, never on a node) and release_revoked (revocations)."""
    return {"keys": [{"name": k["name"], "public_key": _public_pem(k["key"]).decode(),
                      "not_before": k["not_before"].isoformat() if k["not_before"] else None,
                      "not_after": k["not_after"].isoformat() if k["not_after"] else None}
                     for k in trusted_keys(release_keys)],
            "revoked": revocations(revoked)}


def read_trust(text):
    """(trusted_keys, revoked) of a trust_document's JSON text, or ReleaseError."""
    try:
        document = json.loads(text)
    except ValueError:
        raise ReleaseError("the trust file is not JSON: write it again with playbooks/release-trust.yml.")
    if not isinstance(document, dict) or not isinstance(document.get("keys"), list) \
            or not isinstance(document.get("revoked"), list):
        raise ReleaseError("the trust file holds no keys and revoked lists: write it again with "
                           "playbooks/release-trust.yml.")
    return trusted_keys(document["keys"]), revocations(document["revoked"])


# --- sign ----------------------------------------------------------------------------------------

def _bundle(payload, signature, public_key):
    return {"mediaType": BUNDLE_MEDIA_TYPE,
            "verificationMaterial": {"publicKey": {"hint": key_id(public_key)}, "tlogEntries": []},
            "dsseEnvelope": {"payload": base64.b64encode(payload).decode(), "payloadType": PAYLOAD_TYPE,
                             "signatures": [{"sig": base64.b64encode(signature).decode(), "keyid": ""}]}}


def sign(document, private_key_pem, password=None):
    """The sigstore bundle (a dict; json.dumps it) of `document` signed with the key."""
    key = load_private_key(private_key_pem, password)
    payload = payload_bytes(document)
    signature = key.sign(pae(PAYLOAD_TYPE, payload), ec.ECDSA(CURVE_HASH[key.curve.name]()))
    return _bundle(payload, signature, key.public_key())


def signing_input(document):
    """The bytes a key that never leaves its HSM signs (ECDSA with the curve's hash, e.g.
    pkcs11-tool --sign --mechanism ECDSA-SHA256): DSSE's encoding of the statement's payload."""
    return pae(PAYLOAD_TYPE, payload_bytes(document))


def assemble(document, signature, public_key_pem):
    """The sigstore bundle of `document` from a signature made elsewhere (an HSM) over
    signing_input(document): DER, or the raw r||s PKCS#11 returns (CKM_ECDSA). Refused
    (ReleaseError) unless it verifies with `public_key_pem`, so no bundle leaves here unchecked."""
    key = load_public_key(public_key_pem, "the signing key's public half")
    size = (key.curve.key_size + 7) // 8
    if len(signature) == 2 * size and signature[:1] != b"\x30":
        signature = encode_dss_signature(int.from_bytes(signature[:size], "big"),
                                         int.from_bytes(signature[size:], "big"))
    payload = payload_bytes(document)
    if not _signed_by(key, signature, payload):
        raise ReleaseError("the signature does not verify with that public key over this statement: sign "
                           "the bytes `release_sign.py signing-input` wrote for it, with the key's curve hash "
                           "(ECDSA-SHA256 for P-256).")
    return _bundle(payload, signature, key)


# --- verify --------------------------------------------------------------------------------------

def _b64(value, where):
    if not isinstance(value, str):
        raise ReleaseError("the bundle's %s is missing: it is not a model-signing bundle." % where)
    try:
        return base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        raise ReleaseError("the bundle's %s is not base64: the bundle is damaged; sign the release again." % where)


def envelope(bundle_text):
    """(payload bytes, signature bytes, key hint or None) of a bundle's text, or ReleaseError."""
    try:
        bundle = json.loads(bundle_text)
    except (TypeError, ValueError) as error:
        raise ReleaseError("the signature is not JSON (%s): give the .sig bundle that release signing or "
                           "`model_signing sign key` wrote." % error)
    if not isinstance(bundle, dict) or bundle.get("mediaType") != BUNDLE_MEDIA_TYPE:
        raise ReleaseError("the signature is not a sigstore bundle v0.3 (mediaType %r): sign with key pairs "
                           "(`model_signing sign key`), not certificates." % (
                               bundle.get("mediaType") if isinstance(bundle, dict) else None,))
    dsse = bundle.get("dsseEnvelope")
    if not isinstance(dsse, dict) or dsse.get("payloadType") != PAYLOAD_TYPE:
        raise ReleaseError("the bundle holds no DSSE envelope of an in-toto statement.")
    signatures = dsse.get("signatures")
    if not isinstance(signatures, list) or len(signatures) != 1 or not isinstance(signatures[0], dict):
        raise ReleaseError("the bundle holds %s signatures: a release carries exactly one."
                           % (len(signatures) if isinstance(signatures, list) else "no"))
    material = bundle.get("verificationMaterial")
    public = material.get("publicKey") if isinstance(material, dict) else None
    if not isinstance(public, dict):
        raise ReleaseError("the bundle names no public key (verificationMaterial.publicKey): it was not "
                           "signed with a key pair.")
    hint = public.get("hint")
    return _b64(dsse.get("payload"), "payload"), _b64(signatures[0].get("sig"), "signature"), hint


def _is_relpath(name):
    """A path the manifest reader accepts (relative, normalised): weights_common.check_relpath."""
    try:
        check_relpath(name)
    except ManifestError:
        return False
    return True


def check_statement(document):
    """The statement as model-signing v1.0 writes it, with a consistent root digest; returns its
    resources as [(name, digest)], or ReleaseError."""
    if not isinstance(document, dict) or document.get("_type") != STATEMENT_TYPE:
        raise ReleaseError("the signed payload is not an in-toto v1 statement.")
    if document.get("predicateType") != PREDICATE_TYPE:
        raise ReleaseError("the statement's predicateType is %r, not model-signing v1.0 (%s): sign it again "
                           "with a current model_signing or with release signing." % (
                               document.get("predicateType"), PREDICATE_TYPE))
    subjects = document.get("subject")
    if not isinstance(subjects, list) or len(subjects) != 1 or not isinstance(subjects[0], dict):
        raise ReleaseError("the statement must name exactly one subject (the weights directory).")
    digest = subjects[0].get("digest")
    digest = digest.get("sha256") if isinstance(digest, dict) else None
    predicate = document.get("predicate")
    if not isinstance(predicate, dict):
        raise ReleaseError("the statement has no predicate.")
    serialization_ = predicate.get("serialization") or {}
    if serialization_.get("method") != "files" or serialization_.get("hash_type") != "sha256":
        raise ReleaseError("the statement hashes %s with %s: release verification reads model-signing's "
                           "'files' serialization with sha256 (the default of `model_signing sign`)."
                           % (serialization_.get("method"), serialization_.get("hash_type")))
    ignored = serialization_.get("ignore_paths", [])
    if not isinstance(ignored, list) or not all(isinstance(p, str) and not has_control(p) for p in ignored):
        raise ReleaseError("the statement's ignore_paths is not a list of paths: sign the release again.")
    if serialization_.get("allow_symlinks") is not False:
        raise ReleaseError("the statement allows symlinks: a release's weights are regular files only; sign "
                           "without --allow_symlinks.")
    resources = predicate.get("resources")
    if not isinstance(resources, list) or not resources:
        raise ReleaseError("the statement lists no files.")
    entries, seen = [], set()
    for item in resources:
        name = item.get("name") if isinstance(item, dict) else None
        value = item.get("digest") if isinstance(item, dict) else None
        if not isinstance(name, str) or has_control(name) or not _is_relpath(name):
            raise ReleaseError("the statement lists a file %r that is not a relative, normalised path." % (name,))
        if item.get("algorithm") != "sha256" or not is_sha256(value):
            raise ReleaseError("the statement's entry for %s is not a sha256 digest." % name)
        if name in seen:
            raise ReleaseError("the statement lists %s twice." % name)
        seen.add(name)
        entries.append((name, value))
    if digest != root_digest(resources):
        raise ReleaseError("the statement's subject digest does not match its files: the statement is "
                           "inconsistent; sign the release again.")
    return entries


def _signed_by(public_key, signature, payload):
    """Whether `signature` is `public_key`'s over the DSSE encoding of `payload`."""
    try:
        public_key.verify(signature, pae(PAYLOAD_TYPE, payload), ec.ECDSA(CURVE_HASH[public_key.curve.name]()))
    except InvalidSignature:
        return False
    return True


def standing(key, digest, revoked=(), today=None):
    """Whether a release signed by `key` (a trusted_keys entry), whose payload hashes to `digest`,
    may still be deployed on `today` (a date or YYYY-MM-DD; empty: the local date): ReleaseError
    naming a revoked key or release, or a key outside its validity. verify() asks it of every
    bundle; the rollback check asks it of a kept release, whose key and digest the release history
    recorded when it was deployed."""
    revoked = {str(item).strip().lower() for item in revoked or []}
    today = (datetime.date.fromisoformat(today) if isinstance(today, str) and today else today) or datetime.date.today()
    if key["id"] in revoked or key["name"] in revoked:
        raise ReleaseError("the release is signed by key '%s' (%s), which release_revoked revokes: sign the "
                           "release with a current key." % (key["name"], key["id"][:16]))
    if digest in revoked:
        raise ReleaseError("release %s is revoked (release_revoked): deploy another release." % str(digest)[:16])
    if key["not_before"] and today < key["not_before"]:
        raise ReleaseError("release key '%s' is valid from %s only (today %s)." % (key["name"], key["not_before"], today))
    if key["not_after"] and today > key["not_after"]:
        raise ReleaseError("release key '%s' expired on %s (today %s): sign the release with its successor "
                           "and list the successor in release_keys." % (key["name"], key["not_after"], today))


def verify(bundle_text, keys, revoked=(), today=None):
    """Verify a bundle against trusted_keys(...) less `revoked` (key ids, key names, release
    digests) on `today`: {statement, entries, release, ignored, key, key_id, release_digest}, or
    ReleaseError naming what failed and the fix. Nothing here touches the weights: compare `entries`
    with the verified manifest (manifest_differences, given `ignored`)."""
    payload, signature, hint = envelope(bundle_text)
    if not keys:
        raise ReleaseError("no release key is configured: list the public keys that may sign releases in "
                           "release_keys.")
    candidates = [k for k in keys if k["id"] == hint] if hint else list(keys)
    if not candidates:
        raise ReleaseError("the release is signed with key %s, which is not in release_keys: add that public "
                           "key (after review), or sign with a listed key." % (hint,))
    key = next((k for k in candidates if _signed_by(k["key"], signature, payload)), None)
    if key is None:
        raise ReleaseError("the release's signature does not verify with %s: the bundle was changed after "
                           "signing or signed by another key; sign it again." % (
                               "key '%s'" % candidates[0]["name"] if hint else "any key in release_keys"))
    digest = release_digest(payload)
    standing(key, digest, revoked, today)
    try:
        statement_ = json.loads(payload)
    except ValueError:
        raise ReleaseError("the signed payload is not JSON.")
    entries = check_statement(statement_)
    return {"statement": statement_, "entries": entries, "release": statement_["predicate"].get(RELEASE_KEY),
            "ignored": list(statement_["predicate"]["serialization"].get("ignore_paths", [])),
            "key": key["name"], "key_id": key["id"], "release_digest": digest}


def manifest_differences(entries, manifest_entries, limit=5, ignored=()):
    """What differs between the signed files and the weights manifest's ([(path, sha256)] each):
    [] when they are the same set of files with the same digests. `ignored`: the statement's
    ignore_paths (verify's "ignored"); a manifest file it leaves out is no difference when it is one
    of GIT_PATHS (as model-signing leaves them out), never otherwise: ignore_paths cannot exempt a
    weights file."""
    skip = {str(p).strip("/") for p in ignored} & set(GIT_PATHS)
    signed = dict(entries)
    listed = {n: d for n, d in manifest_entries if n in signed or n.split("/", 1)[0] not in skip}
    problems = []
    for label, names in (("signed but not in the manifest", sorted(set(signed) - set(listed))),
                         ("in the manifest but not signed", sorted(set(listed) - set(signed))),
                         ("with another sha256 than the signed one",
                          sorted(n for n in set(signed) & set(listed) if signed[n] != listed[n].lower()))):
        if names:
            problems.append("%d file(s) %s: %s%s" % (len(names), label, ", ".join(names[:limit]),
                                                     " ..." if len(names) > limit else ""))
    return problems


def weights_problem(bundle_text, trust_text, digest, manifest_bytes, today=None, where="on this host"):
    """The check of a signed release against the weights a host holds, offline, before their bytes
    are trusted (weights_verify on staging and on a node, before a marker or `current`; the node's
    start check, before the engine): the bundle verifies against the trust document the host keeps
    (trust_document's text: keys less revocations, on `today`), is release `digest`, and signs
    exactly `manifest_bytes` (its sha256 is the signed manifest_sha256 and its files are the
    signed files). (verify's result, None) when all hold, else (verify's result or None, one line
    naming what differs and the fix). No hashing of the weights: the verifier binds them to the
    manifest."""
    try:
        keys, revoked = read_trust(trust_text)
        checked = verify(bundle_text, keys, revoked=revoked, today=today)
    except (ReleaseError, ValueError) as error:
        return None, "the signed release is refused: %s" % error
    if checked["release_digest"] != digest:
        return checked, ("the release bundle is release %s, not the release %s that was planned: re-run "
                         "playbooks/serve.yml (or rollback.yml) so the bundle and the unit are one release again."
                         % (checked["release_digest"][:16], str(digest)[:16]))
    return checked, manifest_problem(checked, manifest_bytes, where)


def manifest_problem(checked, manifest_bytes, where="on this host", weights_only=False):
    """Why the weights manifest `manifest_bytes` is not the one a verified bundle (verify's result)
    signs, one line naming the fix, or None: a release binds the whole manifest by its sha256 (the
    files the statement leaves out, GIT_PATHS, included), and the signed files must be exactly its
    files (manifest_differences). weights_only: a bundle with no mm3_release part (upstream's) has
    no manifest sha256 to compare; without it, such a bundle is refused here."""
    release = checked["release"]
    if not (weights_only and release is None):
        signed = (release if isinstance(release, dict) else {}).get("manifest_sha256")
        manifest_sha256 = hashlib.sha256(manifest_bytes).hexdigest()
        if signed != manifest_sha256:
            return ("the weights manifest %s hashes to %s, not to the signed %s: it is not the signed one; re-run "
                    "playbooks/weights.yml for the signed revision." % (where, manifest_sha256[:16], str(signed)[:16]))
    try:
        entries = parse_manifest(manifest_bytes.decode("utf-8"))
    except (ManifestError, UnicodeDecodeError) as error:
        return "the weights manifest %s cannot be read: %s" % (where, error)
    differ = manifest_differences(checked["entries"], entries, ignored=checked["ignored"])
    if differ:
        return "the weights manifest %s is not the signed one: %s" % (where, "; ".join(differ))
    return None


def release_differences(signed, planned):
    """The parts of the planned release ({part: value}) that differ from the signed one
    (statement's mm3_release): [part, ...] in the order given, each part a top-level key."""
    signed = signed or {}
    return [part for part, value in planned.items() if signed.get(part) != value]


def image_names(ref):
    """The names under which a node may run the signed image `ref`: the reference itself, and for
    repository@sha256:<hex> the tag image_carry gives it after `docker load` (which keeps no repo
    digest), repository:pinned-<hex> (docker_run.pinned_tag, serving's image_local_tag)."""
    ref = str(ref or "")
    repository, _, digest = ref.rpartition("@")
    names = [ref]
    if repository and digest.startswith("sha256:"):
        names.append(dr.pinned_tag(repository, digest))
    return names


def _first_difference(runs, signed):
    """Where the engine argv the unit runs first leaves the signed one, naming the flag it follows."""
    for index, (ours, theirs) in enumerate(zip(runs, signed)):
        if ours != theirs:
            where = " (after %s)" % runs[index - 1] if index and runs[index - 1].startswith("-") else ""
            return "token %d%s is %r where the signed release has %r" % (index + 1, where, ours, theirs)
    if len(runs) > len(signed):
        return "it adds %r after the signed argv" % " ".join(runs[len(signed):])[:120]
    return "it lacks %r at the end of the signed argv" % " ".join(signed[len(runs):])[:120]


def mount_differences(parsed, weights_dir, container_dir):
    """Where the unit's mounts (docker_run.mounts of parse_run's result) do not give the engine the
    verified weights: [] when the directory check_weights verified (`weights_dir`) is mounted
    read-only at `container_dir` (where the signed argv reads the model) and nothing else is
    mounted there or inside it; else one line per problem, naming the mount."""
    weights_dir = posixpath.normpath(str(weights_dir))
    container_dir = posixpath.normpath(str(container_dir))
    out, found = [], False
    for mount in dr.mounts(parsed):
        target = mount["target"]
        if target is None:
            out.append("%s %s brings another container's mounts, which may cover the weights"
                       % (mount["option"], mount["value"]))
            continue
        if target != container_dir and not target.startswith(container_dir.rstrip("/") + "/"):
            continue
        source = posixpath.normpath(mount["source"]) if mount["source"] else None
        if target == container_dir and not found and mount["type"] == "bind" and source == weights_dir \
                and mount["readonly"]:
            found = True
            continue
        out.append("%s %s mounts %s at %s%s, where the engine reads the verified weights (%s read-only)" % (
            mount["option"], mount["value"], mount["source"] or "a %s" % mount["type"], target,
            " writable" if target == container_dir and source == weights_dir else "", weights_dir))
    if not found and not out:
        out.append("nothing is mounted at %s: the verified weights %s must be, read-only" % (container_dir, weights_dir))
    return out


def run_differences(signed, exec_argv, entrypoint=(), config_path=None, extra_env=(), weights=None):
    """Where the unit's `docker run` (exec_argv: ExecStart as systemd parsed it) does not run the
    signed release (`signed`: its mm3_release part): one line per part that differs, naming it
    ('images: ...', 'env: ...', 'argv: ...'); [] when the unit runs the signed image (its reference
    or image_carry's tag for it), exactly the signed environment, and the signed engine argv in the
    form the unit gives it (docker_run.server_invocation with the image's ENTRYPOINT `entrypoint`,
    serving_spec.entrypoint). config_path: the `--config PATH` the unit appends when the engine
    reads its API key from a file; extra_env: names of the variables the unit sets beyond the
    signed ones (the JIT caches', serving_spec.jit_cache.env); weights: (the verified weights
    directory, the container path the engine reads it at), whose mount is checked
    (mount_differences: 'mounts: ...'). The options that give or take devices and privileges must
    be the signed container options (docker_run.container_differences: 'container: ...'); Docker's
    other options (the other mounts, the network, the name) are not part of a release."""
    signed = signed if isinstance(signed, dict) else {}
    try:
        parsed = dr.parse_run(exec_argv)
    except dr.RunError as error:
        return ["argv: %s" % error]
    out = []
    images = signed.get("images") if isinstance(signed.get("images"), list) else []
    ref = str(images[0]) if len(images) == 1 else ""
    if parsed["image"] not in image_names(ref):
        out.append("images: the unit runs %s, the signed release %s" % (parsed["image"], ref or "none"))
    unit_env = dr.option_values(parsed, "-e", "--env")
    signed_env = [str(item) for item in signed.get("env") or []]
    names = [item.split("=", 1)[0] for item in unit_env]
    problems = ["%s is set %d times" % (name, names.count(name)) for name in sorted(set(names)) if names.count(name) > 1]
    problems += ["--env-file %s is not signed" % path for path in dr.option_values(parsed, "--env-file")]
    problems += ["%s is not signed" % item for item in unit_env
                 if item not in signed_env and item.split("=", 1)[0] not in set(extra_env)]
    problems += ["the signed %s is missing" % item for item in signed_env if item not in unit_env]
    if problems:
        out.append("env: " + "; ".join(problems))
    if weights:
        problems = mount_differences(parsed, weights[0], weights[1])
        if problems:
            out.append("mounts: " + "; ".join(problems))
    if isinstance(signed.get("container"), list):  # signed since RELEASE_VERSION 3
        problems = dr.container_differences(parsed, signed["container"])
        if problems:
            out.append("container: the unit " + "; ".join(problems))
    expected = dr.server_invocation(parsed["image"], [str(t) for t in signed.get("argv") or []], entrypoint)
    want_entrypoint, want = (expected[1], expected[3:]) if expected[:1] == ["--entrypoint"] else (None, expected[1:])
    entrypoints = dr.option_values(parsed, "--entrypoint")
    runs = list(parsed["args"])
    if config_path:
        if runs[-2:] == ["--config", str(config_path)]:
            runs = runs[:-2]
        else:
            out.append("argv: the unit does not end with --config %s (the engine's key file)" % config_path)
    if (entrypoints[-1] if entrypoints else None) != want_entrypoint:
        out.append("argv: the unit's entrypoint is %s, the signed release's %s"
                   % (entrypoints[-1] if entrypoints else "the image's", want_entrypoint or "the image's"))
    elif runs != want:
        out.append("argv: " + _first_difference(runs, want))
    return out
