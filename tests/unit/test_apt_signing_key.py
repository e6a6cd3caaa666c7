"""apt signing keys are trusted only at a pinned fingerprint (openpgp.py of the mm3.shared collection and
library/apt_signing_key.py).

The fixture is Docker's real release key (tests/fixtures/apt-keys/README.md says where it was
recorded from); its fingerprint is the one docs.docker.com publishes, computed here without gpg.
The refusals run the module's main() against a real loopback HTTP server.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import shutil
import subprocess

import pytest

from helpers import http_files, load_source  # tests/ is on sys.path (pytest.ini)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from ansible_collections.mm3.shared.plugins.module_utils import openpgp  # noqa: E402
module = load_source("apt_signing_key", os.path.join(ROOT, "library", "apt_signing_key.py"))

from ansible.module_utils.testing import patch_module_args  # noqa: E402

DOCKER_ASC = open(os.path.join(ROOT, "tests", "fixtures", "apt-keys", "docker.asc"), "rb").read()
DOCKER_FPR = "9DC858229FC7DD38854AE2D88D81803C0EBFCD88"  # docs.docker.com/engine/install/debian
NVIDIA_CUDA_FPR = "EB693B3035CD5710E231E123A4B469963BF863CC"


def fingerprints(data):
    return openpgp.checked_key(data)[1]


def binary(asc):
    return openpgp.dearmor(asc)


def other_primary(asc):
    """Docker's key file with its signing subkey (tag 14) re-tagged as a second primary key
    (tag 6): a real key packet with a fingerprint nobody pinned, as a mirror adding a key of its
    own would serve it."""
    data = binary(asc)
    extra = [body for tag, body in openpgp.packets(data) if tag == 14][0]
    return data + bytes([0xC0 | 6, 0xFF]) + len(extra).to_bytes(4, "big") + extra


def test_docker_key_fingerprint_is_the_published_one():
    assert fingerprints(DOCKER_ASC) == [DOCKER_FPR]


def test_binary_and_armored_forms_agree():
    assert fingerprints(binary(DOCKER_ASC)) == [DOCKER_FPR]


def test_subkeys_are_not_primary_keys():
    tags = [tag for tag, _ in openpgp.packets(binary(DOCKER_ASC))]
    assert tags.count(6) == 1 and tags.count(14) == 1


def test_an_extra_primary_key_is_seen():
    found = fingerprints(other_primary(DOCKER_ASC))
    assert found[0] == DOCKER_FPR and len(found) == 2 and found[1] != DOCKER_FPR


@pytest.mark.parametrize("text,expected", [
    ("9DC8 5822 9FC7 DD38 854A  E2D8 8D81 803C 0EBF CD88", DOCKER_FPR),
    ("0x9dc858229fc7dd38854ae2d88d81803c0ebfcd88", DOCKER_FPR),
])
def test_fingerprints_are_normalised(text, expected):
    assert openpgp.normalise_fingerprint(text) == expected


@pytest.mark.parametrize("text", ["0EBFCD88", "8D81803C0EBFCD88", "x" * 40, ""])
def test_short_ids_and_garbage_are_not_pins(text):
    with pytest.raises(openpgp.KeyFileError):
        openpgp.normalise_fingerprint(text)


@pytest.mark.parametrize("data,needle", [
    (b"<html>404 Not Found</html>", "is not a packet header"),
    (DOCKER_ASC.replace(b"mQINBFit2ioB", b"mQINBFit2ioC"), "armor checksum does not match"),
    (binary(DOCKER_ASC)[:300], "runs past the end"),
    (b"-----BEGIN PGP PUBLIC KEY BLOCK-----\n\nmQIN\n", "without a complete PUBLIC KEY BLOCK"),
])
def test_what_is_not_a_key_file_is_refused(data, needle):
    with pytest.raises(openpgp.KeyFileError, match=needle):
        fingerprints(data)


def test_decide_accepts_only_pinned_primary_keys():
    url = "http://mirror/gpg"
    # the keyring is the checked packets armored again: for Docker's file, the very bytes it serves
    assert module.decide(DOCKER_ASC, [DOCKER_FPR], url, "v") == ([DOCKER_FPR], None, DOCKER_ASC)
    assert module.decide(binary(DOCKER_ASC), [DOCKER_FPR], url, "v")[2] == DOCKER_ASC
    found, refusal, keyring = module.decide(DOCKER_ASC, [NVIDIA_CUDA_FPR], url,
                                            "docker_engine_apt_repository.key_fingerprints")
    assert keyring is None
    assert found == [DOCKER_FPR]
    assert "primary key(s) %s not pinned (pinned: %s)" % (DOCKER_FPR, NVIDIA_CUDA_FPR) in refusal
    assert "docker_engine_apt_repository.key_fingerprints" in refusal and "Nothing was written" in refusal
    # the pinned key plus one more: the extra key would be trusted too, so the file is refused
    found, refusal, _ = module.decide(other_primary(DOCKER_ASC), [DOCKER_FPR], url, "v")
    assert len(found) == 2 and "not pinned" in refusal and found[1] in refusal


@pytest.fixture
def key_server():
    """A real HTTP server on loopback serving whatever bytes the test puts in `served`."""
    served = {}
    with http_files(served) as base:
        yield served, base


def run_module(args, capsys):
    with patch_module_args(args):
        with pytest.raises(SystemExit):
            module.main()
    return json.loads(capsys.readouterr().out)


def test_main_installs_a_pinned_key_once(key_server, tmp_path, capsys):
    served, base = key_server
    served["/gpg"] = DOCKER_ASC
    dest = tmp_path / "docker.asc"
    args = {"url": base + "/gpg", "dest": str(dest), "fingerprints": ["9DC8 5822 9FC7 DD38 854A E2D8 8D81 803C 0EBF CD88"]}
    first = run_module(args, capsys)
    assert first["changed"] and first["fingerprints"] == [DOCKER_FPR] and dest.read_bytes() == DOCKER_ASC
    assert oct(dest.stat().st_mode & 0o777) == "0o644"
    assert run_module(args, capsys)["changed"] is False


@pytest.mark.parametrize("body,needle", [
    (other_primary(DOCKER_ASC), "not pinned"),
    (base64.b64encode(b"not a key"), "does not serve an OpenPGP public key"),
])
def test_main_leaves_the_keyring_alone_on_a_refusal(key_server, tmp_path, capsys, body, needle):
    served, base = key_server
    served["/gpg"] = body
    dest = tmp_path / "docker.asc"
    dest.write_bytes(DOCKER_ASC)
    result = run_module({"url": base + "/gpg", "dest": str(dest), "fingerprints": [DOCKER_FPR]}, capsys)
    assert result["failed"] and needle in result["msg"], result
    assert dest.read_bytes() == DOCKER_ASC


def test_main_refuses_a_missing_key_and_an_empty_pin(key_server, tmp_path, capsys):
    _, base = key_server
    missing = run_module({"url": base + "/none", "dest": str(tmp_path / "k"), "fingerprints": [DOCKER_FPR]}, capsys)
    assert missing["failed"] and "HTTP 404" in missing["msg"]
    empty = run_module({"url": base + "/none", "dest": str(tmp_path / "k"), "fingerprints": [], "name": "x.key_fingerprints"},
                       capsys)
    assert empty["failed"] and "x.key_fingerprints is empty" in empty["msg"]
    assert not (tmp_path / "k").exists()


# --- Bytes beside the pinned key -------------------------------------------------------------
# apt reads a Signed-By .asc more loosely than a strict armor parser: a second block whose BEGIN
# line has a trailing blank, or another label, is still a key to apt. A reviewer's file of Docker's
# key plus such a block was accepted here and apt then trusted the second key (reproduced below
# with the real apt). Every byte of a key file must now belong to the checked key.

@pytest.fixture(scope="module")
def attacker(tmp_path_factory):
    """A test key made here with the real gpg ("mm3 test attacker key", never a vendor's), and a
    GNUPGHOME that holds its secret half, to sign with."""
    assert shutil.which("gpg"), "gpg is missing: scripts/bootstrap.sh installs it (apt-get install gpg)"
    home = tmp_path_factory.mktemp("gnupg")
    home.chmod(0o700)
    env = dict(os.environ, GNUPGHOME=str(home))
    subprocess.run(["gpg", "--batch", "--quiet", "--passphrase", "", "--quick-gen-key",
                    "mm3 test attacker key <attacker@test.invalid>", "ed25519", "sign", "never"],
                   env=env, check=True, capture_output=True)
    armored = subprocess.run(["gpg", "--armor", "--export"], env=env, check=True, capture_output=True).stdout
    return env, armored


def relabel(armored, label):
    return armored.replace(b"PUBLIC KEY BLOCK-----", label + b"-----")


BESIDE = {
    "BEGIN line with a trailing blank": lambda a: a.replace(b"BLOCK-----\n", b"BLOCK----- \n", 1),
    "BEGIN line with a trailing tab": lambda a: a.replace(b"BLOCK-----\n", b"BLOCK-----\t\n", 1),
    "labelled ARMORED FILE": lambda a: relabel(a, b"ARMORED FILE"),
    "labelled MESSAGE": lambda a: relabel(a, b"MESSAGE"),
    "labelled SIGNATURE": lambda a: relabel(a, b"SIGNATURE"),
    "END line with a trailing blank": lambda a: a.replace(b"BLOCK-----\n", b"BLOCK----- \n", 2).replace(
        b"BLOCK----- \n", b"BLOCK-----\n", 1),
    "text after the END line": lambda a: b"Comment: see below\n" + a,
}


@pytest.mark.parametrize("form", BESIDE)
def test_a_block_apt_would_read_beside_the_pinned_key_is_refused(attacker, form):
    data = DOCKER_ASC + BESIDE[form](attacker[1])
    found, refusal, keyring = module.decide(data, [DOCKER_FPR], "http://mirror/gpg", "v")
    assert keyring is None and refusal, refusal
    # read as a key (then refused as not pinned) or refused as bytes that are no key of the file
    assert ("nothing else" in refusal and "fetch the vendor's key file" in refusal) or (
        "not pinned" in refusal and found == [DOCKER_FPR, found[-1]]), refusal


@pytest.mark.parametrize("data,needle", [
    (binary(DOCKER_ASC) + bytes([0xC0 | 11, 3]) + b"b\x00x", r"packet type\(s\) 11"),  # a literal data packet
    (bytes([0xC0 | 13, 1]) + b"x" + binary(DOCKER_ASC), "starts with a packet of type 13"),
    (binary(DOCKER_ASC) + b"\n", "is not a packet header"),
    (DOCKER_ASC + b"trailing words\n", "outside its PUBLIC KEY BLOCKs"),
])
def test_packets_no_public_key_file_holds_are_refused(data, needle):
    with pytest.raises(openpgp.KeyFileError, match=needle):
        openpgp.checked_key(data)


def apt_update(tmp_path, keyring, signer_env):
    """The real apt-get update of a file: repository signed by the key in signer_env, trusting
    `keyring` (Signed-By), in a private state directory: (output, trusted?)."""
    repo = tmp_path / "repo" / "dists" / "x"
    (repo / "main" / "binary-amd64").mkdir(parents=True)
    (repo / "main" / "binary-amd64" / "Packages").write_bytes(b"")
    (repo / "Release").write_text(
        "Suite: x\nCodename: x\nComponents: main\nArchitectures: amd64\nDate: Fri, 04 Dec 2026 00:00:00 UTC\n"
        "SHA256:\n %s 0 main/binary-amd64/Packages\n" % hashlib.sha256(b"").hexdigest())
    subprocess.run(["gpg", "--batch", "--yes", "--clearsign", "-o", str(repo / "InRelease"), str(repo / "Release")],
                   env=signer_env, check=True, capture_output=True)
    for d in ("lists/partial", "cache/archives/partial"):
        (tmp_path / d).mkdir(parents=True)
    (tmp_path / "sources.list").write_text("deb [signed-by=%s] file:%s x main\n" % (keyring, tmp_path / "repo"))
    done = subprocess.run(
        ["apt-get", "-o", "Dir::Etc::sourcelist=%s" % (tmp_path / "sources.list"), "-o", "Dir::Etc::sourceparts=-",
         "-o", "Dir::State::Lists=%s" % (tmp_path / "lists"), "-o", "Dir::Cache=%s" % (tmp_path / "cache"),
         "-o", "APT::Sandbox::User=root", "update"], capture_output=True, text=True)
    out = done.stdout + done.stderr
    return out, "InRelease" in out and "GPG error" not in out and "is not signed" not in out


def test_real_apt_trusts_only_what_the_module_wrote(attacker, key_server, tmp_path, capsys):
    """The attack against the real apt: Docker's key plus the attacker's block under a BEGIN line
    with a trailing blank. apt given those bytes as served trusts the attacker's signature; the
    module refuses the file, and with Docker's key alone the keyring it writes makes apt refuse
    the attacker's repository."""
    if not shutil.which("apt-get") or os.geteuid() != 0:
        pytest.skip("needs apt-get as root")
    env, armored = attacker
    served, base = key_server
    hostile = DOCKER_ASC + BESIDE["BEGIN line with a trailing blank"](armored)
    raw = tmp_path / "as-served.asc"
    raw.write_bytes(hostile)
    out, trusted = apt_update(tmp_path / "raw", raw, env)
    assert trusted, "apt no longer reads the hostile block, so this test shows nothing: " + out
    served["/gpg"] = hostile
    dest = tmp_path / "docker.asc"
    result = run_module({"url": base + "/gpg", "dest": str(dest), "fingerprints": [DOCKER_FPR]}, capsys)
    assert result["failed"] and not dest.exists(), result
    served["/gpg"] = DOCKER_ASC
    assert run_module({"url": base + "/gpg", "dest": str(dest), "fingerprints": [DOCKER_FPR]}, capsys)["changed"]
    out, trusted = apt_update(tmp_path / "written", dest, env)
    assert not trusted and "NO_PUBKEY" in out, out


def test_the_keyring_is_the_checked_packets_not_the_served_bytes(key_server, tmp_path, capsys):
    """Served binary with armor-irrelevant differences, written as the checked key armored again."""
    served, base = key_server
    served["/gpg"] = b"\n\n" + DOCKER_ASC.replace(b"\n", b"\r\n") + b"\n\n"
    dest = tmp_path / "docker.asc"
    args = {"url": base + "/gpg", "dest": str(dest), "fingerprints": [DOCKER_FPR]}
    assert run_module(args, capsys)["changed"] and dest.read_bytes() == DOCKER_ASC
    served["/gpg"] = binary(DOCKER_ASC)
    assert run_module(args, capsys)["changed"] is False and dest.read_bytes() == DOCKER_ASC
