"""The staging host's hf client lock (roles/weights_stage/files/hf-client.lock, installed there
with --require-hashes): every package pinned with its hashes, the client the project's tests
drive (requirements.in), and, on every Python and machine a staging host may run, every
dependency that client declares (read from its own metadata in the controller's venv)."""
import importlib.metadata
import pathlib
import re

import pytest
from packaging.markers import Marker
from packaging.requirements import Requirement

ROOT = pathlib.Path(__file__).resolve().parents[2]
LOCK = ROOT / "roles" / "weights_stage" / "files" / "hf-client.lock"
# Ubuntu 22.04, Debian 12, Ubuntu 24.04, Debian 13; amd64 and arm64 (GB200/GB300 hosts)
PYTHONS = ["3.10.12", "3.11.2", "3.12.3", "3.13.5"]
MACHINES = ["x86_64", "aarch64"]


def entries():
    """(name, version, marker or None, hashes) per requirement of the lock."""
    text = LOCK.read_text()
    out = []
    for block in re.split(r"\n(?=\S)", text):
        if block.startswith("#") or not block.strip():
            continue
        head = block.split("\\", 1)[0].strip()
        req, _, marker = head.partition(";")
        name, _, version = req.strip().partition("==")
        out.append((name.lower(), version.strip(), Marker(marker) if marker.strip() else None,
                    re.findall(r"--hash=sha256:([0-9a-f]{64})", block)))
    return out


def env(python, machine):
    return {"python_full_version": python, "python_version": ".".join(python.split(".")[:2]),
            "platform_machine": machine, "sys_platform": "linux", "platform_system": "Linux",
            "os_name": "posix", "implementation_name": "cpython", "platform_python_implementation": "CPython",
            "extra": ""}


def test_every_package_is_pinned_with_hashes():
    found = entries()
    assert len(found) > 10
    for name, version, _, hashes in found:
        assert re.fullmatch(r"[0-9][0-9A-Za-z.+-]*", version), (name, version)
        assert hashes, "%s==%s has no hash" % (name, version)


def test_the_client_is_the_one_the_tests_drive():
    wanted = re.search(r"^huggingface_hub==(\S+)", (ROOT / "requirements.in").read_text(), re.M).group(1)
    assert [v for n, v, _, _ in entries() if n == "huggingface-hub"] == [wanted]


@pytest.mark.parametrize("python", PYTHONS)
@pytest.mark.parametrize("machine", MACHINES)
def test_every_dependency_is_in_the_lock_on_every_staging_host(python, machine):
    here = env(python, machine)
    pinned = {}
    for name, version, marker, _ in entries():
        if marker is None or marker.evaluate(here):
            assert name not in pinned, "two versions of %s for Python %s" % (name, python)
            pinned[name] = version
    needed = [Requirement(r) for r in importlib.metadata.requires("huggingface_hub") or []]
    missing = [str(r) for r in needed
               if (r.marker is None or r.marker.evaluate(here))
               and re.sub(r"[-_.]+", "-", r.name).lower() not in pinned]
    assert not missing, "Python %s on %s: %s" % (python, machine, missing)
