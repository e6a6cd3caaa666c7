"""filter_plugins/nvidia_driver.py: the fabric each recorded machine is prepared for, and the role's
install list resolved against the RECORDED index of NVIDIA's CUDA repository
(tests/standin/fixtures/nvidia-cuda-repo.Packages) for branches 570 and 580, amd64 and arm64. The
index is never built from the role's variables: a name the real repository does not have fails."""
import os

import pytest
import yaml

from helpers import ROOT, load_source

hardware = load_source("mm3_hardware_filters_nd", os.path.join(ROOT, "filter_plugins", "hardware.py"))
nvd = load_source("mm3_nvidia_driver_filters", os.path.join(ROOT, "filter_plugins", "nvidia_driver.py"))
INDEX = os.path.join(ROOT, "tests", "standin", "fixtures", "nvidia-cuda-repo.Packages")
# Installed from the distribution's own archive, not NVIDIA's repository.
FROM_OS_ARCHIVE = {"infiniband-diags"}


def role_vars():
    with open(os.path.join(ROOT, "roles", "nvidia_driver", "vars", "main.yml")) as handle:
        return yaml.safe_load(handle)


def recorded_index():
    real, virtual = set(), set()
    with open(INDEX) as handle:
        for block in handle.read().split("\n\n"):
            fields = dict(line.split(": ", 1) for line in block.splitlines() if line and not line.startswith("#"))
            if not fields:
                continue
            real.add((fields["Package"], fields["Version"], fields["Architecture"]))
            for name in fields.get("Provides", "").split(", "):
                if name:
                    virtual.add((name, fields["Architecture"]))
    return real, virtual


def machine(name):
    with open(os.path.join(ROOT, "tests", "fixtures", "hardware", name + ".yml")) as handle:
        data = yaml.safe_load(handle)
    marked = [addr for addr, fields in data["vpd"].items() if "SW_MNG" in " ".join(fields.values())]
    return hardware.fabric(data["lspci"].splitlines(), marked)


def unresolved(rows, arch):
    real, _ = recorded_index()
    names = {(name, a) for name, _, a in real}
    missing = []
    for row in rows:
        if row["package"] in FROM_OS_ARCHIVE:
            continue
        if row["version"]:
            if (row["package"], row["version"], arch) not in real:
                missing.append("%s=%s (%s)" % (row["package"], row["version"], arch))
        elif (row["package"], arch) not in names:
            missing.append("%s (%s)" % (row["package"], arch))
    return missing


RELEASES = [("580", "580.95.05"), ("580", "580.82.07"), ("580", "580.65.06"), ("570", "570.133.20"),
            ("570", "570.172.08")]


@pytest.mark.parametrize("branch, version", RELEASES)
@pytest.mark.parametrize("arch", ["amd64", "arm64"])
@pytest.mark.parametrize("fabric", ["nvswitch", "nvlink5", "imex"])
def test_install_list_resolves_against_the_recorded_repository(branch, version, arch, fabric):
    data = role_vars()
    chosen = data["__nvidia_driver_fabric_pieces"]["none" if fabric == "imex" else fabric]["components"]
    chosen = chosen + data["__nvidia_driver_profile_components"].get(fabric, [])
    result = nvd.install_list(data["__nvidia_driver_components"], chosen, branch, version, arch)
    assert result["blockers"] == []
    assert unresolved(result["packages"], arch) == []


def test_branch_named_580_packages_would_not_resolve():
    """The protection: with the branch in every name (what the role did before), 580's fabric
    manager is only a virtual package in the real repository and cannot be pinned."""
    table = {key: dict(value, branch_named_below=None) if value.get("branch_named_below") else value
             for key, value in role_vars()["__nvidia_driver_components"].items()}
    table = {key: dict(value, package=value["package"] + "-580") if value.get("branch_named_below") is None
             and value.get("same_version") else value for key, value in table.items()}
    rows = nvd.install_list(table, ["fabricmanager", "nscq"], "580", "580.95.05", "amd64")["packages"]
    assert unresolved(rows, "amd64") == ["nvidia-fabricmanager-580=580.95.05-1 (amd64)",
                                         "libnvidia-nscq-580=580.95.05-1 (amd64)"]
    _, virtual = recorded_index()
    assert ("nvidia-fabricmanager-580", "amd64") in virtual


def test_a_revision_the_repository_does_not_publish_fails():
    table = dict(role_vars()["__nvidia_driver_components"])
    table["fabricmanager"] = dict(table["fabricmanager"], revision="-0ubuntu1")
    rows = nvd.install_list(table, ["fabricmanager"], "580", "580.95.05", "amd64")["packages"]
    assert unresolved(rows, "amd64") == ["nvidia-fabricmanager=580.95.05-0ubuntu1 (amd64)"]


def test_names_per_branch():
    table = role_vars()["__nvidia_driver_components"]
    assert nvd.package_name(table["fabricmanager"], "570") == "nvidia-fabricmanager-570"
    assert nvd.package_name(table["fabricmanager"], "580") == "nvidia-fabricmanager"
    assert nvd.package_name(table["nvlsm"], "570") == "nvlsm"


def test_libnvsdm_is_left_out_on_arm64_only():
    table = role_vars()["__nvidia_driver_components"]
    amd = nvd.install_list(table, ["fabricmanager", "nvsdm"], "580", "580.95.05", "amd64")["packages"]
    arm = nvd.install_list(table, ["fabricmanager", "nvsdm"], "580", "580.95.05", "arm64")["packages"]
    assert [row["package"] for row in amd] == ["nvidia-fabricmanager", "libnvsdm"]
    assert [row["package"] for row in arm] == ["nvidia-fabricmanager"]


def plan(name, profile_fabric, mode="auto", detected=None):
    data = role_vars()
    return hardware.fabric_plan(detected or machine(name), profile_fabric, mode, data["__nvidia_driver_fabric_pieces"],
                           data["__nvidia_driver_profile_components"])


def test_hgx_b200_gets_fabric_manager_nvlsm_and_ib_umad():
    result = plan("hgx-b200", "nvlink5")
    assert result == {"kind": "nvlink5", "components": ["fabricmanager", "nscq", "nvlsm", "nvsdm", "ibdiags"],
                      "modules": ["ib_umad"], "blocker": ""}


def test_hgx_h200_gets_fabric_manager_and_nscq():
    assert plan("hgx-h200", "nvswitch") == {"kind": "nvswitch", "components": ["fabricmanager", "nscq"],
                                            "modules": [], "blocker": ""}


def test_gb200_tray_gets_imex_only():
    assert plan("gb200-tray", "imex") == {"kind": "none", "components": ["imex"], "modules": [], "blocker": ""}


def test_pcie_box_gets_nothing_and_hardware_needs_fabric_manager_whatever_the_profile():
    assert plan("pcie-h200-nvl", None)["components"] == []
    assert plan("hgx-h200", None)["components"] == ["fabricmanager", "nscq"]


def test_a_node_that_is_not_its_profile_is_refused_with_numbers():
    result = plan("pcie-h200-nvl", "nvswitch")
    assert "0 NVSwitch bridge(s)" in result["blocker"] and "serving_profile" in result["blocker"]
    data = yaml.safe_load(open(os.path.join(ROOT, "tests", "fixtures", "hardware", "hgx-b200.yml")))
    unmarked = hardware.fabric(data["lspci"].splitlines(), [])
    result = plan(None, "nvlink5", detected=unmarked)
    assert "0 of 4 Mellanox function(s) with SW_MNG" in result["blocker"]
    assert "vfio" in result["blocker"]


def test_always_and_never():
    assert plan("pcie-h200-nvl", "nvlink5", mode="always")["components"][:2] == ["fabricmanager", "nscq"]
    assert plan("pcie-h200-nvl", "nvlink5", mode="always")["blocker"] == ""
    assert plan("hgx-b200", "nvlink5", mode="never") == {"kind": "none", "components": [], "modules": [],
                                                         "blocker": ""}
    with pytest.raises(Exception, match="auto, always or never"):
        plan("hgx-b200", "nvlink5", mode="sometimes")


def test_imex_node_list_is_one_address_per_line():
    assert nvd.imex_nodes(["172.27.58.70", " 172.27.58.71", "fd00::7"], ["a", "b", "c"]) == [
        "172.27.58.70", "172.27.58.71", "fd00::7"]


@pytest.mark.parametrize("addresses, hosts, problem", [
    ([], [], "no node address at all"),
    (["172.27.58.70", ""], ["tray1", "tray2"], "tray2: '' is not an IP address"),
    (["tray1.example"], ["tray1"], "tray1: 'tray1.example' is not an IP address"),
    (["10.0.0.1", "10.0.0.1"], ["tray1", "tray2"], "tray2: 10.0.0.1 is listed twice"),
])
def test_imex_node_list_refusals_name_the_node_and_the_fix(addresses, hosts, problem):
    with pytest.raises(Exception) as err:
        nvd.imex_nodes(addresses, hosts)
    assert problem in str(err.value) and "nvidia_driver_imex_nodes" in str(err.value)


def ubuntu_driver_rows(distro, version, revisions=None):
    with open(os.path.join(ROOT, "roles", "nvidia_driver", "vars", distro + ".yml")) as handle:
        data = yaml.safe_load(handle)
    revision = nvd.revision(version, revisions or data["__nvidia_driver_revisions"])
    return [{"package": name.replace("{{ nvidia_driver_branch }}", version.split(".")[0]), "version": version + revision}
            for name in data["__nvidia_driver_packages"]]


@pytest.mark.parametrize("distro", ["Ubuntu-22.04", "Ubuntu-24.04"])
@pytest.mark.parametrize("version", ["580.95.05", "580.105.08", "580.159.04"])
def test_ubuntu_driver_packages_resolve_against_the_recorded_repository(distro, version):
    """NVIDIA's Ubuntu repositories give the driver packages -0ubuntu1 up to 580.105.08 and -1ubuntu1
    from 580.126.09 (the recorded stanzas with X-Distribution: ubuntu)."""
    assert unresolved(ubuntu_driver_rows(distro, version), "amd64") == []


def test_the_fabric_packages_revision_on_ubuntu_driver_packages_does_not_resolve():
    """The protection: -1 for the driver packages too (what the Ubuntu vars pinned before) is a
    version NVIDIA's Ubuntu repository does not publish."""
    rows = ubuntu_driver_rows("Ubuntu-24.04", "580.95.05", [{"from": "0", "revision": "-1"}])
    assert unresolved(rows, "amd64")[0] == "nvidia-driver-580-open=580.95.05-1 (amd64)"


@pytest.mark.parametrize("version, expected", [("580.95.05", "-0ubuntu1"), ("580.105.08", "-0ubuntu1"),
                                               ("580.126.09", "-1ubuntu1"), ("580.159.04", "-1ubuntu1"),
                                               ("570.133.20", "-0ubuntu1")])
def test_revision_by_version(version, expected):
    table = [{"from": "0", "revision": "-0ubuntu1"}, {"from": "580.126.09", "revision": "-1ubuntu1"}]
    assert nvd.revision(version, table) == expected


def test_no_revision_known_is_refused():
    with pytest.raises(Exception, match="no driver package revision"):
        nvd.revision("550.1", [{"from": "580", "revision": "-1"}])


UNITS = os.path.join(ROOT, "tests", "standin", "fixtures", "nvidia-persistenced")


def recorded_unit(name):
    with open(os.path.join(UNITS, name)) as handle:
        return handle.read()


@pytest.mark.parametrize("unit, expected", [
    # Debian's packaging runs the daemon as nvpd (its postinst adds that user): the old drop-in's
    # --user nvidia-persistenced named a user that does not exist there, so the daemon never started.
    ("debian.service", "/usr/bin/nvidia-persistenced --user nvpd --group video --persistence-mode"),
    ("ubuntu-archive.service", "/usr/bin/nvidia-persistenced --user nvidia-persistenced --verbose --persistence-mode"),
    ("nvidia-ubuntu-packaging.service", "/usr/bin/nvidia-persistenced --verbose --persistence-mode"),
])
def test_persistence_daemon_keeps_the_installed_units_command(unit, expected):
    assert nvd.persistenced_exec(recorded_unit(unit), "unused") == expected


def test_persistence_daemon_fallback_only_without_a_unit():
    assert nvd.persistenced_exec("", "/usr/bin/nvidia-persistenced --persistence-mode") == \
        "/usr/bin/nvidia-persistenced --persistence-mode"
    # a drop-in that resets ExecStart= and sets its own: the last one counts, as systemd reads it
    text = recorded_unit("debian.service") + "\n[Service]\nExecStart=\nExecStart=-/usr/bin/nvidia-persistenced --user x\n"
    assert nvd.persistenced_exec(text, "unused") == "/usr/bin/nvidia-persistenced --user x --persistence-mode"


@pytest.mark.parametrize("text", [
    "[Service]\nExecStart=/bin/sh -c 'nvidia-persistenced'\n",
    "[Service]\nExecStart=\n",
    "[Unit]\nExecStart=/usr/bin/nvidia-persistenced\n",
    "[Service]\nExecStart=/usr/bin/nvidia-persistenced --user \"a b\"\n",
])
def test_persistence_daemon_unit_that_cannot_be_carried_is_refused(text):
    with pytest.raises(Exception, match="cannot read the persistence daemon's command"):
        nvd.persistenced_exec(text, "unused")
