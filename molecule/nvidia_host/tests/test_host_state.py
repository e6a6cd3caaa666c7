"""Host state after converge on the NVIDIA nodes of molecule/nvidia_host, read with testinfra over
`docker exec` (verify.yml runs this file first; playbook verifiers there check Ansible behaviour:
refusals, the rolling reboot). The h200 node is a recorded HGX H200 (four NVSwitch bridges), the
b200 node a recorded HGX B200 (no NVSwitch on PCI; ConnectX-7 bridge functions with SW_MNG in
their VPD): tests/fixtures/hardware.

Run: pytest molecule/nvidia_host/tests/test_host_state.py (the scenario's containers must exist).
"""
import re

import pytest

testinfra_hosts = ["docker://mm3-nvhost-h200", "docker://mm3-nvhost-b200"]

VERSION = "580.95.05-1"
# Branch 580 names as NVIDIA's repository publishes them (the -580 names are only virtual there).
PINNED = ["nvidia-kernel-open-dkms", "nvidia-driver", "nvidia-persistenced", "nvidia-fabricmanager",
          "libnvidia-nscq"]


def is_b200(host):
    return "b200" in host.backend.get_hostname()


def status(host, name):
    """dpkg's version and status abbreviation ("hi " = hold, installed), or None."""
    out = host.run("dpkg-query -W -f='${Version} ${db:Status-Abbrev}' %s", name)
    return out.stdout if out.rc == 0 else None


def test_cuda_source_is_the_internal_mirror_signed_by_its_key(host):
    text = host.file("/etc/apt/sources.list.d/nvidia-cuda.sources").content_string
    assert "URIs: http://mm3-nvhost-mirror:8080/cuda/debian12/x86_64/" in text
    assert "Signed-By: /etc/apt/keyrings/nvidia-cuda.asc" in text and "Suites: /" in text


@pytest.mark.parametrize("name", PINNED)
def test_driver_and_fabric_packages_are_pinned_and_held(host, name):
    assert status(host, name) == VERSION + " hi "


def test_nvlink5_pieces_only_where_the_vpd_says_so(host):
    """b200: NVLSM, libnvsdm, infiniband-diags held, ib_umad at boot; h200 (Hopper NVSwitch): none."""
    if is_b200(host):
        assert status(host, "libnvsdm") == VERSION + " hi "
        assert re.match(r"^2025\.06\.5-1 hi $", status(host, "nvlsm") or "")
        assert (status(host, "infiniband-diags") or "").endswith(" hi ")
        modules = host.file("/etc/modules-load.d/nvidia-fabric.conf").content_string
        assert re.search(r"^ib_umad$", modules, re.M)
    else:
        for name in ("nvlsm", "libnvsdm", "infiniband-diags"):
            assert status(host, name) is None, name
        assert not host.file("/etc/modules-load.d/nvidia-fabric.conf").exists
    assert status(host, "nvidia-imex") is None  # IMEX is for GB-series profiles
    assert host.package("pciutils").is_installed  # the role installs lspci for the detection


def test_kernel_headers_of_the_running_kernel_are_installed(dkms_line):
    kernel, built = dkms_line("nvidia")
    assert built == "nvidia/580.95.05, %s, x86_64: installed" % kernel


def test_the_pin_wins_over_other_versions_in_the_repository(host):
    policy = host.check_output("apt-cache policy nvidia-driver")
    assert re.search(r"Candidate:\s580\.95\.05-1", policy)
    assert re.search(r"\*\*\* 580\.95\.05-1 1001", policy)
    pin = host.file("/etc/apt/preferences.d/nvidia-driver.pref").content_string
    # One stanza per version: the named packages, then the family's apt regex (every sibling at
    # exactly that version); NVLSM and infiniband-diags are not pinned to the driver's version.
    pinned = PINNED + (["libnvsdm"] if is_b200(host) else []) + ["/nvidia|^libcuda|^libnv|^libxnvctrl|^cuda-drivers/"]
    assert pin == (
        "# Managed by Ansible (nvidia_driver): the driver, its family and the fabric pieces that must\n"
        "# carry exactly its version; anything else from the CUDA repository stays below the archive.\n"
        "Package: %s\nPin: version 580.95.05-1\nPin-Priority: 1001\n" % " ".join(pinned))


def test_nouveau_out_persistence_mode_and_the_new_module_loaded_after_one_reboot(host):
    blacklist = host.file("/etc/modprobe.d/blacklist-nouveau.conf").content_string
    assert re.search(r"^blacklist nouveau$", blacklist, re.M)
    assert re.search(r"^options nouveau modeset=0$", blacklist, re.M)
    dropin = host.file("/etc/systemd/system/nvidia-persistenced.service.d/persistence-mode.conf").content_string
    assert re.search(r"^ExecStart=$", dropin, re.M) and "--persistence-mode" in dropin
    assert host.file("/run/standin/nvidia/persistence-mode").content_string.strip() == "Enabled"
    # the user of the installed unit (Debian's packaging runs it as nvpd), not an assumed one
    assert re.search(r"^ExecStart=/usr/bin/nvidia-persistenced --user nvpd --group video --persistence-mode$",
                     dropin, re.M)
    assert host.file("/run/standin/nvidia/persistenced-user").content_string.strip() == "nvpd"
    assert "Open Kernel Module for x86_64  580.95.05 " in host.file("/run/standin/nvidia/version").content_string
    assert len(host.file("/run/standin/boot_id").content_string.strip()) == 36


@pytest.mark.parametrize("unit", ["nvidia-persistenced", "nvidia-fabricmanager"])
def test_persistence_and_fabric_manager_are_enabled_and_running(host, unit):
    service = host.service(unit)
    assert service.is_enabled and service.is_running
