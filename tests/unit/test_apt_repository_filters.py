"""filter_plugins/apt_repository.py: a caller's repository entries resolved for one node, and
every value that could not work refused naming the caller's variable (the role runs it before
anything changes: tests/roles/test_apt_repository.py shows the same refusals through Ansible)."""
import os

import pytest

from helpers import ROOT, load_source

apt = load_source("mm3_apt_repository_filters", os.path.join(ROOT, "filter_plugins", "apt_repository.py"))

CUDA = "https://developer.download.nvidia.com/compute/cuda/repos/ubuntu2404/"
TOOLKIT = {"amd64": "https://nvidia.github.io/libnvidia-container/stable/deb/amd64/",
           "arm64": "https://nvidia.github.io/libnvidia-container/stable/deb/arm64/"}


def entry(**kw):
    base = {"name": "nvidia-cuda", "variable": "nvidia_driver_apt_repository", "url": CUDA + "x86_64/",
            "key_url": CUDA + "x86_64/3bf863cc.pub", "default_key_fingerprints": ["EB69" * 10]}
    base.update(kw)
    return base


def plan(*entries, arch="x86_64"):
    return apt.resolve(list(entries), arch, 30, "/etc/apt/keyrings")


def test_a_flat_repository_resolves_its_release_keyring_and_pinned_fingerprints():
    out = plan(entry())
    assert out["problems"] == [] and out["arch"] == "amd64"
    e = out["entries"][0]
    assert e["release_url"] == CUDA + "x86_64/Release" and e["suite"] == "/" and e["flat"]
    assert e["keyring"] == "/etc/apt/keyrings/nvidia-cuda.asc" and e["key_fingerprints"] == ["EB69" * 10]
    assert e["timeout"] == 30 and e["preferences_name"] == "nvidia-cuda"


def test_a_suite_repository_reads_its_release_under_dists():
    e = plan(entry(url="https://download.docker.com/linux/debian/", suite="bookworm", components=["stable"],
                   timeout=5))["entries"][0]
    assert e["release_url"] == "https://download.docker.com/linux/debian/dists/bookworm/Release"
    assert e["timeout"] == 5


@pytest.mark.parametrize("kernel,url", [("x86_64", TOOLKIT["amd64"]), ("aarch64", TOOLKIT["arm64"])])
def test_each_architecture_gets_its_own_path(kernel, url):
    e = plan(entry(name="nvidia-container-toolkit", url=TOOLKIT), arch=kernel)["entries"][0]
    assert e["url"] == url and e["release_url"] == url + "Release"


@pytest.mark.parametrize("changes,needle", [
    ({"url": {"amd64": CUDA}}, "nvidia_driver_apt_repository.url names no repository for this node's architecture arm64"),
    ({"url": CUDA + "x\nTrusted: yes"}, "needs an http(s) `url` with no spaces or line breaks"),
    ({"url": "ftp://mirror/"}, "needs an http(s) `url`"),
    ({"key_url": "", "signed_by": ""}, "needs either `key_url`"),
    ({"key_url": "https://x/ key"}, ".key_url must be an http(s) URL with no spaces"),
    ({"key_url": "", "signed_by": "keyrings/x.gpg"}, ".signed_by must be the absolute path"),
    ({"suite": "bookworm main"}, ".suite and .components must be single words"),
    ({"suite": "/", "components": ["main"]}, "is a flat repository's path, which has no components"),
    ({"name": "Nvidia CUDA"}, "is named \"Nvidia CUDA\", not a file name"),
    ({"preferences": [{"packages": ["cuda-drivers"], "pin": "version 580\nPin-Priority: 1001", "priority": 1001}]},
     "needs packages (words), one line of pin and an integer priority"),
    ({"preferences": [{"packages": "cuda-drivers", "pin": "version 580", "priority": 1001}]},
     "needs packages (words)"),
])
def test_each_value_that_cannot_work_is_refused_naming_the_variable(changes, needle):
    arch = "aarch64" if "no repository for this node's architecture" in needle else "x86_64"
    problems = plan(entry(**changes), arch=arch)["problems"]
    assert len(problems) == 1 and needle in problems[0], problems


def test_a_good_pin_passes():
    pin = {"packages": ["cuda-drivers", "nvidia-fabricmanager-580"], "pin": "version 580.95.05-1", "priority": 1001}
    assert plan(entry(preferences=[pin]))["problems"] == []


def test_debian_architecture_names():
    assert [apt.debian_architecture(a) for a in ("x86_64", "aarch64", "ppc64le")] == ["amd64", "arm64", "ppc64le"]
