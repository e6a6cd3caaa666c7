"""apt signing keys are trusted only at a pinned fingerprint (openpgp.py of the mm3.shared collection and
library/apt_signing_key.py).

The fixture is Docker's real release key (tests/fixtures/apt-keys/README.md says where it was
recorded from); its fingerprint is the one docs.docker.com publishes, computed here without gpg.
The refusals run the module's main() against a real loopback HTTP server.
"""

from __future__ import annotations

import base64
import json
import os

import pytest

from helpers import http_files, load_source  # tests/ is on sys.path (pytest.ini)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from ansible_collections.mm3.shared.plugins.module_utils import openpgp  # noqa: E402
module = load_source("apt_signing_key", os.path.join(ROOT, "library", "apt_signing_key.py"))

from ansible.module_utils.testing import patch_module_args  # noqa: E402

DOCKER_ASC = open(os.path.join(ROOT, "tests", "fixtures", "apt-keys", "docker.asc"), "rb").read()
DOCKER_FPR = "9DC858229FC7DD38854AE2D88D81803C0EBFCD88"  # docs.docker.com/engine/install/debian
NVIDIA_CUDA_FPR = "EB693B3035CD5710E231E123A4B469963BF863CC"


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
    assert openpgp.primary_fingerprints(DOCKER_ASC) == [DOCKER_FPR]


def test_binary_and_armored_forms_agree():
    assert openpgp.primary_fingerprints(binary(DOCKER_ASC)) == [DOCKER_FPR]


def test_subkeys_are_not_primary_keys():
    tags = [tag for tag, _ in openpgp.packets(binary(DOCKER_ASC))]
    assert tags.count(6) == 1 and tags.count(14) == 1


def test_an_extra_primary_key_is_seen():
    found = openpgp.primary_fingerprints(other_primary(DOCKER_ASC))
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
        openpgp.primary_fingerprints(data)


def test_decide_accepts_only_pinned_primary_keys():
    url = "http://mirror/gpg"
    assert module.decide(DOCKER_ASC, [DOCKER_FPR], url, "v") == ([DOCKER_FPR], None)
    found, refusal = module.decide(DOCKER_ASC, [NVIDIA_CUDA_FPR], url, "docker_engine_apt_repository.key_fingerprints")
    assert found == [DOCKER_FPR]
    assert "primary key(s) %s not pinned (pinned: %s)" % (DOCKER_FPR, NVIDIA_CUDA_FPR) in refusal
    assert "docker_engine_apt_repository.key_fingerprints" in refusal and "Nothing was written" in refusal
    # the pinned key plus one more: the extra key would be trusted too, so the file is refused
    found, refusal = module.decide(other_primary(DOCKER_ASC), [DOCKER_FPR], url, "v")
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
