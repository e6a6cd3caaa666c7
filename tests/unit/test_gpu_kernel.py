"""filter_plugins/gpu_kernel.py: the kernel packages DKMS needs, read against what apt can install.
The apt side is a RECORDED `apt-cache policy` of a Debian 12 machine (tests/fixtures/apt-cache), in
which a superseded kernel's headers are gone from the archive, as they are on real nodes."""
import os

import pytest
from ansible.errors import AnsibleFilterError

from helpers import ROOT, load_source

gk = load_source("mm3_gpu_kernel_filters", os.path.join(ROOT, "filter_plugins", "gpu_kernel.py"))

with open(os.path.join(ROOT, "tests", "fixtures", "apt-cache", "debian12-kernel-headers.policy")) as handle:
    RECORDED = handle.read()

CURRENT, SUPERSEDED = "6.1.0-57-amd64", "6.1.0-26-amd64"


def test_the_recorded_policy_reads_as_apt_printed_it():
    policy = gk.apt_policy(RECORDED)
    assert policy == {
        "linux-headers-6.1.0-57-amd64": {"installed": None, "candidate": "6.1.192-3"},
        "mail-transport-agent": {"installed": None, "candidate": None},
        "apt": {"installed": "2.6.1", "candidate": "2.6.2"},
    }


def test_a_superseded_running_kernel_does_not_stop_the_boot_kernel_install():
    """The node runs 6.1.0-26 and boots 6.1.0-57 next: the archive no longer has 6.1.0-26's headers
    (the recording), so they are skipped, and the boot kernel's are installed."""
    wanted = gk.packages(CURRENT, SUPERSEDED)
    assert wanted == {"required": ["linux-headers-" + CURRENT], "optional": ["linux-headers-" + SUPERSEDED]}
    plan = gk.install_plan(wanted, gk.apt_policy(RECORDED))
    assert plan == {"install": ["linux-headers-" + CURRENT], "missing": [],
                    "skipped": ["linux-headers-" + SUPERSEDED]}


def test_boot_kernel_headers_gone_from_the_archive_are_missing():
    plan = gk.install_plan(gk.packages(SUPERSEDED, SUPERSEDED), gk.apt_policy(RECORDED))
    assert plan == {"install": ["linux-headers-" + SUPERSEDED], "missing": ["linux-headers-" + SUPERSEDED],
                    "skipped": []}


def test_installed_headers_count_even_when_the_archive_dropped_them():
    policy = {"linux-headers-" + SUPERSEDED: {"installed": "6.1.112-1", "candidate": None}}
    assert gk.install_plan(gk.packages(SUPERSEDED, SUPERSEDED), policy)["missing"] == []


def test_a_virtual_name_with_no_candidate_is_not_installable():
    policy = gk.apt_policy(RECORDED)
    plan = gk.install_plan({"required": ["mail-transport-agent"], "optional": []}, policy)
    assert plan["missing"] == ["mail-transport-agent"]


def test_optional_prefixes_for_both_kernels_and_only_where_apt_has_them():
    """Ubuntu's linux-modules-extra-<kernel> (AMD's prerequisite): Debian has no such package (the
    recording), so it is skipped rather than stopping the install."""
    wanted = gk.packages(CURRENT, SUPERSEDED, ["linux-modules-extra-"])
    assert wanted["optional"] == ["linux-headers-" + SUPERSEDED, "linux-modules-extra-" + CURRENT,
                                  "linux-modules-extra-" + SUPERSEDED]
    plan = gk.install_plan(wanted, gk.apt_policy(RECORDED))
    assert plan["install"] == ["linux-headers-" + CURRENT]
    assert plan["skipped"] == wanted["optional"]
    ubuntu = {"linux-headers-6.8.0-90-generic": {"installed": None, "candidate": "6.8.0-90.91"},
              "linux-modules-extra-6.8.0-90-generic": {"installed": None, "candidate": "6.8.0-90.91"}}
    assert gk.install_plan(gk.packages("6.8.0-90-generic", "6.8.0-90-generic", ["linux-modules-extra-"]),
                           ubuntu) == {"install": ["linux-headers-6.8.0-90-generic",
                                                   "linux-modules-extra-6.8.0-90-generic"],
                                       "missing": [], "skipped": []}


def test_one_kernel_names_each_package_once():
    assert gk.packages(CURRENT, CURRENT) == {"required": ["linux-headers-" + CURRENT], "optional": []}


@pytest.mark.parametrize("boot, running, prefixes", [
    ("", CURRENT, []),
    (CURRENT, "6.1.0 -57", []),
    (CURRENT, "6.1.0-57\n", []),
    (CURRENT, None, []),
    (CURRENT, CURRENT, "linux-modules-extra-"),
    (CURRENT, CURRENT, ["linux-modules-extra"]),
    (CURRENT, CURRENT, ["Linux-modules-"]),
])
def test_bad_kernel_names_and_prefixes_are_refused(boot, running, prefixes):
    with pytest.raises(AnsibleFilterError):
        gk.packages(boot, running, prefixes)


def test_a_custom_kernel_release_is_named_and_reported_missing():
    """A custom build's release (upper case) names no package apt could hold: missing, named."""
    plan = gk.install_plan(gk.packages("6.9.1-Custom", "6.9.1-Custom"), gk.apt_policy(RECORDED))
    assert plan["missing"] == ["linux-headers-6.9.1-Custom"]
