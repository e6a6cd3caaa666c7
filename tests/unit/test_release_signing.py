"""Signed releases (issue 33): module_utils/release_signing.py against real keys made by openssl,
and against the upstream OpenSSF model-signing CLI in both directions.

The upstream CLI (model-signing 1.1.1) is installed from tools/model_signing/requirements.lock with
--require-hashes into .cache/model-signing-venv (a package registry is the only network this
needs; the venv is reused while the lock is unchanged). Every refusal names the fix, and each
case fails when its check is removed: the accepted twin of each case verifies.
"""
import base64
import datetime
import hashlib
import json
import os
import pathlib
import subprocess
import sys

import pytest

from helpers import ROOT, load_source

from ansible_collections.mm3.shared.plugins.module_utils import release_signing as rs  # noqa: E402
from ansible_collections.mm3.shared.plugins.module_utils.weights_common import parse_manifest  # noqa: E402

cli = load_source("mm3_model_signing_cli", os.path.join(ROOT, "tools", "model_signing", "cli.py"))
TODAY = datetime.date(2026, 12, 5)
RELEASE = {"repo": "MiniMaxAI/MiniMax-M3", "revision": "a" * 40, "profile": "cpu-lab",
           "images": ["mm3-lab/vllm-cpu@sha256:" + "b" * 64],
           "argv": ["vllm", "serve", "/models/MiniMax-M3", "--max-model-len", "4096"]}


def openssl(*args, data=None):
    return subprocess.run(["openssl"] + list(args), check=True, capture_output=True, input=data).stdout


@pytest.fixture(scope="module")
def keys(tmp_path_factory):
    """Key pairs as a security team makes them: openssl, P-256 and P-384, one unrelated, and keys
    model-signing cannot sign with (RSA, Ed25519, secp256k1)."""
    d = tmp_path_factory.mktemp("keys")
    out = {}
    for name, curve in (("site", "prime256v1"), ("successor", "secp384r1"), ("stranger", "prime256v1"),
                        ("k1", "secp256k1")):
        openssl("ecparam", "-name", curve, "-genkey", "-noout", "-out", str(d / (name + ".pem")))
        openssl("ec", "-in", str(d / (name + ".pem")), "-pubout", "-out", str(d / (name + ".pub")))
    openssl("genpkey", "-algorithm", "RSA", "-pkeyopt", "rsa_keygen_bits:2048", "-out", str(d / "rsa.pem"))
    openssl("pkey", "-in", str(d / "rsa.pem"), "-pubout", "-out", str(d / "rsa.pub"))
    openssl("genpkey", "-algorithm", "ED25519", "-out", str(d / "ed.pem"))
    openssl("pkey", "-in", str(d / "ed.pem"), "-pubout", "-out", str(d / "ed.pub"))
    for path in d.iterdir():
        out[path.name] = path
    return out


def trusted(keys, **validity):
    entries = [{"name": "site-2026", "public_key": keys["site.pub"].read_text()},
               {"name": "site-2027", "public_key": keys["successor.pub"].read_text()}]
    entries[0].update(validity)
    return rs.trusted_keys(entries)


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    """A weights directory (a sub-directory too) and its sha256sum manifest, as staging writes it.
    Like every hub repository it holds .gitattributes (the hub's LFS rules; the lab's repository has
    the same line), which upstream model-signing leaves out by default."""
    d = tmp_path_factory.mktemp("model") / "MiniMax-M3"
    (d / "sub").mkdir(parents=True)
    (d / ".gitattributes").write_text("*.safetensors filter=lfs diff=lfs merge=lfs -text\n")
    (d / "config.json").write_text('{"model_type": "minimax_m3"}\n')
    (d / "model-00001-of-00002.safetensors").write_bytes(os.urandom(70000))
    (d / "sub" / "tokenizer.json").write_text('{"version": "1.0"}\n')
    manifest = subprocess.run("find . -type f | sed 's|^./||' | sort | xargs sha256sum", shell=True, cwd=d,
                              check=True, capture_output=True, text=True).stdout
    return d, parse_manifest(manifest)


def signed(keys, model, release=RELEASE, key="site.pem", document=None):
    d, entries = model
    document = document or rs.statement(d.name, entries, release=release)
    return json.dumps(rs.sign(document, keys[key].read_bytes()))


def test_a_signed_release_verifies_and_names_its_key_files_and_release(keys, model):
    result = rs.verify(signed(keys, model), trusted(keys), today=TODAY)
    assert result["key"] == "site-2026"
    assert result["key_id"] == hashlib.sha256(keys["site.pub"].read_bytes()).hexdigest()  # = sha256sum key.pub
    assert sorted(result["entries"]) == sorted(e for e in model[1] if e[0] != ".gitattributes")
    assert rs.manifest_differences(result["entries"], model[1], ignored=result["ignored"]) == []
    assert {k: v for k, v in result["release"].items() if k != "version"} == RELEASE
    result = rs.verify(signed(keys, model, key="successor.pem"), trusted(keys), today=TODAY)
    assert result["key"] == "site-2027"


def _edit(bundle_text, change):
    bundle = json.loads(bundle_text)
    change(bundle)
    return json.dumps(bundle)


def _payload_edit(change):
    def edit(bundle):
        document = json.loads(base64.b64decode(bundle["dsseEnvelope"]["payload"]))
        change(document)
        bundle["dsseEnvelope"]["payload"] = base64.b64encode(rs.payload_bytes(document)).decode()
    return edit


REFUSED = [
    ("a signed file's digest changed", _payload_edit(lambda d: d["predicate"]["resources"][0].update(digest="0" * 64)),
     "does not verify with key 'site-2026': the bundle was changed after signing"),
    ("the signed argv changed", _payload_edit(lambda d: d["predicate"]["mm3_release"]["argv"].append("--x")),
     "does not verify with key 'site-2026'"),
    ("a second signature", lambda b: b["dsseEnvelope"]["signatures"].append(b["dsseEnvelope"]["signatures"][0]),
     "holds 2 signatures: a release carries exactly one"),
    ("a certificate bundle", lambda b: b["verificationMaterial"].pop("publicKey"),
     "names no public key"),
    ("another bundle version", lambda b: b.update(mediaType="application/vnd.dev.sigstore.bundle+json;version=0.2"),
     "is not a sigstore bundle v0.3"),
    ("a payload that is not base64", lambda b: b["dsseEnvelope"].update(payload="not base64!"),
     "payload is not base64"),
    ("another payload type", lambda b: b["dsseEnvelope"].update(payloadType="text/plain"),
     "no DSSE envelope of an in-toto statement"),
]


@pytest.mark.parametrize("case,change,fragment", REFUSED, ids=[c[0] for c in REFUSED])
def test_a_changed_or_malformed_bundle_is_refused(keys, model, case, change, fragment):
    with pytest.raises(rs.ReleaseError, match=fragment.replace("(", r"\(").replace(")", r"\)")):
        rs.verify(_edit(signed(keys, model), change), trusted(keys), today=TODAY)


def test_an_inconsistent_statement_is_refused_even_when_signed(keys, model):
    d, entries = model
    document = rs.statement(d.name, entries)
    document["predicate"]["resources"].pop()  # the subject digest still counts the dropped file
    with pytest.raises(rs.ReleaseError, match="subject digest does not match its files"):
        rs.verify(signed(keys, model, document=document), trusted(keys), today=TODAY)
    for change, fragment in ((lambda p: p.update(predicateType="https://model_signing/Digests/v0.1"), "not model-signing v1.0"),
                             (lambda p: p["predicate"]["serialization"].update(allow_symlinks=True), "allows symlinks"),
                             (lambda p: p["predicate"]["resources"][0].update(name="../etc/passwd"), "not a relative"),
                             (lambda p: p["subject"].append(p["subject"][0]), "exactly one subject")):
        document = rs.statement(d.name, entries)
        change(document)
        with pytest.raises(rs.ReleaseError, match=fragment):
            rs.verify(signed(keys, model, document=document), trusted(keys), today=TODAY)


def test_a_key_not_in_release_keys_is_refused_naming_it(keys, model):
    bundle = signed(keys, model, key="stranger.pem")
    stranger = hashlib.sha256(keys["stranger.pub"].read_bytes()).hexdigest()
    with pytest.raises(rs.ReleaseError, match="signed with key %s, which is not in release_keys" % stranger):
        rs.verify(bundle, trusted(keys), today=TODAY)
    # A forged hint naming a listed key does not help: the signature is checked with that key.
    forged = _edit(bundle, lambda b: b["verificationMaterial"]["publicKey"].update(
        hint=hashlib.sha256(keys["site.pub"].read_bytes()).hexdigest()))
    with pytest.raises(rs.ReleaseError, match="does not verify with key 'site-2026'"):
        rs.verify(forged, trusted(keys), today=TODAY)
    with pytest.raises(rs.ReleaseError, match="no release key is configured"):
        rs.verify(bundle, [], today=TODAY)


def test_revocation_by_key_id_name_or_release_digest(keys, model):
    bundle = signed(keys, model)
    result = rs.verify(bundle, trusted(keys), today=TODAY)
    for revoked in ([result["key_id"]], ["site-2026"], [result["key_id"].upper()]):
        with pytest.raises(rs.ReleaseError, match="signed by key 'site-2026' .*which release_revoked revokes"):
            rs.verify(bundle, trusted(keys), revoked=revoked, today=TODAY)
    with pytest.raises(rs.ReleaseError, match="release %s is revoked" % result["release_digest"][:16]):
        rs.verify(bundle, trusted(keys), revoked=[result["release_digest"]], today=TODAY)
    # The successor's releases are untouched by the old key's revocation (rotation).
    assert rs.verify(signed(keys, model, key="successor.pem"), trusted(keys), revoked=["site-2026"],
                     today=TODAY)["key"] == "site-2027"


def test_validity_window_of_a_key(keys, model):
    bundle = signed(keys, model)
    with pytest.raises(rs.ReleaseError, match="release key 'site-2026' expired on 2026-12-01 .*its successor"):
        rs.verify(bundle, trusted(keys, not_after="2026-12-01"), today=TODAY)
    with pytest.raises(rs.ReleaseError, match="valid from 2027-01-01 only"):
        rs.verify(bundle, trusted(keys, not_before="2027-01-01"), today=TODAY)
    assert rs.verify(bundle, trusted(keys, not_before="2026-01-01", not_after="2026-12-05"), today=TODAY)


@pytest.mark.parametrize("entry,fragment", [
    ({"name": "rsa", "public_key": "rsa.pub"}, "is a RSAPublicKey key: model-signing signs with EC P-256"),
    ({"name": "ed", "public_key": "ed.pub"}, "model-signing signs with EC P-256, P-384 or P-521"),
    ({"name": "k1", "public_key": "k1.pub"}, "is a secp256k1 key"),
    ({"name": "priv", "public_key": "site.pem"}, "is not a PEM public key"),
    ({"name": "junk", "public_key": "-----BEGIN PUBLIC KEY-----\nAAAA\n-----END PUBLIC KEY-----\n"}, "not a PEM public key"),
    ({"name": "Site Key", "public_key": "site.pub"}, "is not a plain name"),
    ({"name": "site", "public_key": "site.pub", "expires": "2027-01-01"}, "unknown settings expires"),
    ({"name": "site", "public_key": "site.pub", "not_after": "next year"}, "give a date as YYYY-MM-DD"),
    ({"name": "site", "public_key": "site.pub", "not_before": "2027-01-01", "not_after": "2026-01-01"},
     "not_after 2026-01-01 is before not_before"),
], ids=lambda v: v if isinstance(v, str) else v["name"])
def test_a_key_in_the_wrong_format_is_refused(keys, entry, fragment):
    entry = dict(entry, public_key=keys[entry["public_key"]].read_text() if entry["public_key"] in keys
                 else entry["public_key"])
    with pytest.raises(rs.ReleaseError, match=fragment):
        rs.trusted_keys([entry])


def test_the_same_key_or_name_twice_is_refused(keys):
    pub = keys["site.pub"].read_text()
    with pytest.raises(rs.ReleaseError, match="same key as another entry"):
        rs.trusted_keys([{"name": "a", "public_key": pub}, {"name": "b", "public_key": pub}])
    with pytest.raises(rs.ReleaseError, match="appears twice"):
        rs.trusted_keys([{"name": "a", "public_key": pub}, {"name": "a", "public_key": keys["successor.pub"].read_text()}])


def test_a_release_leaves_out_the_git_paths_as_model_signing_does_and_nothing_else(keys, model):
    """The statement names .git, .gitattributes, .github and .gitignore in ignore_paths and lists no
    file under them; a manifest file they cover is no difference, while ignore_paths naming a
    weights file exempts nothing, and a git path the statement does sign is still compared."""
    d, entries = model
    result = rs.verify(signed(keys, model), trusted(keys), today=TODAY)
    assert result["ignored"] == sorted(rs.GIT_PATHS)
    assert sorted(dict(result["entries"])) == sorted(p for p, _ in entries if p != ".gitattributes")
    assert rs.manifest_differences(result["entries"], entries, ignored=result["ignored"]) == []
    assert rs.manifest_differences(result["entries"], entries + [(".github/workflows/x.yml", "2" * 64)],
                                   ignored=result["ignored"]) == []
    shard = "model-00001-of-00002.safetensors"
    without_shard = [e for e in result["entries"] if e[0] != shard]
    assert rs.manifest_differences(without_shard, entries, ignored=result["ignored"] + [shard]) == [
        "1 file(s) in the manifest but not signed: %s" % shard]
    # a statement made before (or by hand) that signs .gitattributes: compared like any file
    old = [(p, h) for p, h in entries]
    changed = [(p, "3" * 64 if p == ".gitattributes" else h) for p, h in entries]
    assert rs.manifest_differences(old, changed, ignored=list(rs.GIT_PATHS)) == [
        "1 file(s) with another sha256 than the signed one: .gitattributes"]


def test_the_signed_files_against_the_manifest_name_each_difference(model):
    entries = model[1]
    other = [(p, "0" * 64 if i == 0 else h) for i, (p, h) in enumerate(entries)][:-1] + [("extra.bin", "1" * 64)]
    text = "\n".join(rs.manifest_differences(entries, other))
    assert "1 file(s) signed but not in the manifest: %s" % entries[-1][0] in text
    assert "1 file(s) in the manifest but not signed: extra.bin" in text
    assert "1 file(s) with another sha256 than the signed one: %s" % entries[0][0] in text
    assert rs.release_differences(dict(RELEASE), dict(RELEASE, images=["x@sha256:" + "c" * 64])) == ["images"]


# --- the upstream CLI, both directions -----------------------------------------------------------

def test_a_second_caller_waits_for_the_first_install_and_does_not_clear_it(tmp_path):
    """CI's lanes both asked for the CLI at once: the second `venv --clear` emptied the venv under
    the first one's pip. Here this test is the first caller: it holds <venv>.lock, a second
    process asks; while the turn is held that process touches nothing, and once the first has
    finished (the stamp written) and let go, it takes the venv as it is."""
    import fcntl
    import time

    venv = tmp_path / "venv"
    with open(str(venv) + ".lock", "w") as turn:
        fcntl.flock(turn, fcntl.LOCK_EX)
        second = subprocess.Popen(
            [sys.executable, "-c", "import sys; sys.path.insert(0, %r); from cli import model_signing_cli; "
             "print(model_signing_cli(%r))" % (os.path.dirname(cli.LOCK), str(venv))],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            time.sleep(1.5)
            waited = second.poll() is None and not venv.exists()
            if waited:
                (venv / "bin").mkdir(parents=True)
                (venv / "kept").write_text("the first caller's install\n")
                pathlib.Path(cli.stamp_path(str(venv))).write_text("")
            fcntl.flock(turn, fcntl.LOCK_UN)
            out, err = second.communicate(timeout=60) if waited else ("", "")
        finally:
            second.kill()
            second.wait()
    assert waited, "the second caller did not wait for its turn"
    assert second.returncode == 0, err
    assert out.strip() == str(venv / "bin" / "model_signing")
    assert (venv / "kept").exists()


@pytest.fixture(scope="module")
def upstream():
    """model_signing's CLI, from the hashed lock (pip --require-hashes), cached per lock."""
    return cli.model_signing_cli()


def run_cli(cli, *args):
    done = subprocess.run([cli] + list(args), capture_output=True, text=True)
    return done.returncode, (done.stdout + done.stderr).strip()


def test_a_release_signed_here_verifies_with_upstream_model_signing(upstream, keys, model, tmp_path):
    d, entries = model
    sig = tmp_path / "release.sig"
    sig.write_text(signed(keys, model))
    rc, out = run_cli(upstream, "verify", "key", str(d), "--signature", str(sig), "--public_key", str(keys["site.pub"]))
    assert rc == 0 and "Verification succeeded" in out, out
    # ... and upstream refuses it once a file changed (it checks every file itself).
    target = d / "sub" / "tokenizer.json"
    original = target.read_bytes()
    try:
        target.write_bytes(original + b" ")
        rc, out = run_cli(upstream, "verify", "key", str(d), "--signature", str(sig), "--public_key",
                          str(keys["site.pub"]))
        assert rc == 1 and "Hash mismatch for 'sub/tokenizer.json'" in out, out
    finally:
        target.write_bytes(original)
    rc, out = run_cli(upstream, "verify", "key", str(d), "--signature", str(sig), "--public_key",
                      str(keys["stranger.pub"]))
    assert rc == 1 and "Key mismatch" in out, out


def test_a_model_signed_by_upstream_model_signing_verifies_here(upstream, keys, model, tmp_path):
    d, entries = model
    sig = tmp_path / "upstream.sig"
    rc, out = run_cli(upstream, "sign", "key", str(d), "--private_key", str(keys["successor.pem"]),
                      "--signature", str(sig))
    assert rc == 0, out
    result = rs.verify(sig.read_text(), trusted(keys), today=TODAY)
    assert result["key"] == "site-2027" and result["release"] is None
    # upstream left .gitattributes out and named it in ignore_paths: no difference for that file only
    assert ".gitattributes" in result["ignored"] and ".gitattributes" not in dict(result["entries"])
    assert rs.manifest_differences(result["entries"], entries, ignored=result["ignored"]) == []
    assert rs.manifest_differences(result["entries"], entries) == [
        "1 file(s) in the manifest but not signed: .gitattributes"]
    with pytest.raises(rs.ReleaseError, match="not in release_keys"):
        rs.verify(sig.read_text(), rs.trusted_keys([{"name": "other", "public_key": keys["stranger.pub"].read_text()}]),
                  today=TODAY)


def test_the_operator_tool_makes_signs_and_checks_a_release(upstream, keys, model, tmp_path):
    """tools/release_sign.py, as a security team runs it: the statement for review, signing with a
    password-protected key (the password from a 0600 file, never argv), and the check against the
    release keys and the weights manifest."""
    d, entries = model
    tool = [sys.executable, os.path.join(ROOT, "tools", "release_sign.py")]
    manifest = tmp_path / "weights.manifest.sha256"
    manifest.write_text("".join("%s  %s\n" % (h, p) for p, h in entries))
    part = tmp_path / "release-part.json"
    part.write_text(json.dumps(dict(RELEASE, manifest_sha256="0" * 64)))
    password = tmp_path / "password"
    password.write_text("correct horse battery staple\n")
    password.chmod(0o600)
    locked = tmp_path / "locked.pem"
    openssl("ec", "-in", str(keys["site.pem"]), "-aes256", "-passout", "file:%s" % password, "-out", str(locked))
    release_keys = tmp_path / "release_keys.yml"
    release_keys.write_text(json.dumps([{"name": "site-2026", "public_key": keys["site.pub"].read_text()}]))

    def run(*args):
        done = subprocess.run(tool + list(args), capture_output=True, text=True)
        return done.returncode, done.stdout, done.stderr

    # The release part the plan wrote pins the manifest: another manifest is refused.
    rc, _, err = run("statement", "--manifest", str(manifest), "--name", d.name, "--release", str(part))
    assert rc == 1 and "pins manifest %s, but" % ("0" * 64) in err, err
    part.write_text(json.dumps(dict(RELEASE, manifest_sha256=hashlib.sha256(manifest.read_bytes()).hexdigest())))
    rc, statement_text, err = run("statement", "--manifest", str(manifest), "--name", d.name, "--release", str(part))
    assert rc == 0, err
    (tmp_path / "release.json").write_text(statement_text)
    rc, bundle, err = run("sign", "--statement", str(tmp_path / "release.json"), "--key", str(locked),
                          "--password-file", str(password))
    assert rc == 0, err
    (tmp_path / "release.sig").write_text(bundle)
    rc, out, err = run("verify", "--bundle", str(tmp_path / "release.sig"), "--keys", str(release_keys),
                       "--manifest", str(manifest))
    assert rc == 0, err
    checked = json.loads(out)
    # every file but .gitattributes, which a release leaves out as model-signing does (GIT_PATHS)
    assert checked["key"] == "site-2026" and checked["files"] == len(entries) - 1
    assert checked["release"]["images"] == RELEASE["images"]
    rc, out = run_cli(upstream, "verify", "key", str(d), "--signature", str(tmp_path / "release.sig"),
                      "--public_key", str(keys["site.pub"]))
    assert rc == 0, out
    # A manifest of other weights (a weights file, or .gitattributes, which the statement leaves out
    # but the release binds through the manifest's sha256), a revoked key, a wrong password:
    # refused, naming why.
    original = manifest.read_text()
    for changed, fragment in ((1, "hashes to"), (0, "hashes to")):
        manifest.write_text("".join("%s  %s\n" % ("0" * 64 if i == changed else h, p) for i, (p, h) in enumerate(entries)))
        rc, _, err = run("verify", "--bundle", str(tmp_path / "release.sig"), "--keys", str(release_keys),
                         "--manifest", str(manifest))
        assert rc == 1 and fragment in err and "not to the signed" in err, err
    # without a release part (weights only, as upstream signs), the signed files are compared, and
    # .gitattributes, which neither signs, is left to the manifest pin (as upstream leaves it)
    weights_only = tmp_path / "weights-only.sig"
    weights_only.write_text(json.dumps(rs.sign(rs.statement(d.name, entries), keys["site.pem"].read_bytes())))
    rc, _, err = run("verify", "--bundle", str(weights_only), "--keys", str(release_keys), "--manifest", str(manifest))
    assert rc == 0, err
    manifest.write_text("".join("%s  %s\n" % ("0" * 64 if p == "config.json" else h, p) for p, h in entries))
    rc, _, err = run("verify", "--bundle", str(weights_only), "--keys", str(release_keys), "--manifest", str(manifest))
    assert rc == 1 and "1 file(s) with another sha256 than the signed one: config.json" in err, err
    manifest.write_text(original)
    rc, _, err = run("verify", "--bundle", str(tmp_path / "release.sig"), "--keys", str(release_keys),
                     "--manifest", str(manifest), "--revoked", "site-2026")
    assert rc == 1 and "which release_revoked revokes" in err, err
    password.write_text("wrong\n")
    rc, _, err = run("sign", "--statement", str(tmp_path / "release.json"), "--key", str(locked),
                     "--password-file", str(password))
    assert rc == 1 and "its password is wrong" in err, err


# --- a key in an HSM (PKCS#11) ---------------------------------------------------------------------

SOFTHSM = "/usr/lib/softhsm/libsofthsm2.so"


def test_a_release_signed_in_an_hsm_verifies_here_and_upstream(upstream, model, tmp_path):
    """The key never leaves the token: SoftHSM 2 (Debian's softhsm2, a real PKCS#11 module standing
    in for a site's HSM) makes an EC P-256 key pair, OpenSC's pkcs11-tool signs the bytes
    `release_sign.py signing-input --hash sha256` wrote (CKM_ECDSA, raw r||s as PKCS#11 returns it), and
    `release_sign.py assemble` makes the bundle: it verifies here and with upstream model_signing.
    A signature over another statement, or checked against another key, is refused."""
    d, entries = model
    tool = [sys.executable, os.path.join(ROOT, "tools", "release_sign.py")]
    (tmp_path / "tokens").mkdir()
    conf = tmp_path / "softhsm2.conf"
    conf.write_text("directories.tokendir = %s\nobjectstore.backend = file\nlog.level = ERROR\n" % (tmp_path / "tokens"))
    env = dict(os.environ, SOFTHSM2_CONF=str(conf))
    pkcs11 = ["pkcs11-tool", "--module", SOFTHSM, "--token-label", "mm3-release", "--login", "--pin", "1234"]

    def run(argv, **kw):
        done = subprocess.run(argv, capture_output=True, env=env, **kw)
        assert done.returncode == 0, (argv, done.stdout, done.stderr)
        return done.stdout

    run(["softhsm2-util", "--init-token", "--free", "--label", "mm3-release", "--so-pin", "5678", "--pin", "1234"])
    run(pkcs11 + ["--keypairgen", "--key-type", "EC:prime256v1", "--label", "site-hsm", "--id", "01"])
    run(pkcs11 + ["--read-object", "--type", "pubkey", "--id", "01", "--output-file", str(tmp_path / "pub.der")])
    openssl("pkey", "-pubin", "-inform", "DER", "-in", str(tmp_path / "pub.der"), "-out", str(tmp_path / "hsm.pub"))
    manifest = tmp_path / "weights.manifest.sha256"
    manifest.write_text("".join("%s  %s\n" % (h, p) for p, h in entries))
    statement_text = run(tool + ["statement", "--manifest", str(manifest), "--name", d.name], text=True)
    (tmp_path / "release.json").write_text(statement_text)
    pae = run(tool + ["signing-input", "--statement", str(tmp_path / "release.json")])
    assert pae == rs.pae(rs.PAYLOAD_TYPE, statement_text.encode())  # DSSE's encoding of what was reviewed
    # SoftHSM 2 signs a digest (CKM_ECDSA), as many HSMs do: the tool writes the sha256 of the bytes.
    digest = run(tool + ["signing-input", "--statement", str(tmp_path / "release.json"), "--hash", "sha256"])
    assert digest == hashlib.sha256(pae).digest()
    (tmp_path / "release.digest").write_bytes(digest)
    run(pkcs11 + ["--sign", "--id", "01", "--mechanism", "ECDSA", "--input-file", str(tmp_path / "release.digest"),
                  "--output-file", str(tmp_path / "release.raw")])
    assert len((tmp_path / "release.raw").read_bytes()) == 64  # r||s, not DER: assemble converts it
    bundle = run(tool + ["assemble", "--statement", str(tmp_path / "release.json"), "--signature",
                         str(tmp_path / "release.raw"), "--public-key", str(tmp_path / "hsm.pub")], text=True)
    (tmp_path / "release.sig").write_text(bundle)
    keys = [{"name": "site-hsm", "public_key": (tmp_path / "hsm.pub").read_text()}]
    result = rs.verify(bundle, rs.trusted_keys(keys), today=TODAY)
    assert result["key"] == "site-hsm" and rs.manifest_differences(result["entries"], entries, ignored=result["ignored"]) == []
    rc, out = run_cli(upstream, "verify", "key", str(d), "--signature", str(tmp_path / "release.sig"),
                      "--public_key", str(tmp_path / "hsm.pub"))
    assert rc == 0, out
    # The HSM's signature over another statement, or the right one checked against another key.
    other = json.loads(statement_text)
    other["predicate"]["resources"][0]["digest"] = "0" * 64
    other["subject"][0]["digest"]["sha256"] = rs.root_digest(other["predicate"]["resources"])
    (tmp_path / "other.json").write_text(json.dumps(other))
    for statement, public in (("other.json", "hsm.pub"), ("release.json", "stranger.pub")):
        if public == "stranger.pub":
            openssl("ecparam", "-name", "prime256v1", "-genkey", "-noout", "-out", str(tmp_path / "stranger.pem"))
            openssl("ec", "-in", str(tmp_path / "stranger.pem"), "-pubout", "-out", str(tmp_path / public))
        done = subprocess.run(tool + ["assemble", "--statement", str(tmp_path / statement), "--signature",
                                      str(tmp_path / "release.raw"), "--public-key", str(tmp_path / public)],
                              capture_output=True, text=True)
        assert done.returncode == 1 and "the signature does not verify with that public key" in done.stderr, done.stderr
