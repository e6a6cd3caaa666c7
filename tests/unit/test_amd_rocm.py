"""roles/amd_rocm against the RECORDED index of AMD's repositories
(tests/standin/fixtures/amd-rocm-repo.Packages): each AMD row of the hardware matrix installs, by
default, a ROCm release at or above its floor whose repositories (rocm/apt/<release>,
amdgpu/<driver>/ubuntu) hold the packages the role installs; and filter_plugins/amd_rocm.py names
the amdgpu module's DKMS version the way `dkms status` prints it on real hosts."""
import os

import pytest
import yaml
from ansible.errors import AnsibleFilterError
from ansible.module_utils.compat.version import LooseVersion

from helpers import ROOT, load_source

amd = load_source("mm3_amd_rocm_filters", os.path.join(ROOT, "filter_plugins", "amd_rocm.py"))
INDEX = os.path.join(ROOT, "tests", "standin", "fixtures", "amd-rocm-repo.Packages")


def load(*parts):
    with open(os.path.join(ROOT, *parts)) as handle:
        return yaml.safe_load(handle)


def stanzas():
    with open(INDEX) as handle:
        for block in handle.read().split("\n\n"):
            fields = dict(line.split(": ", 1) for line in block.splitlines() if line and not line.startswith("#"))
            if fields:
                yield fields


def recorded():
    """{(repository path, suite): {package: version}} from the recorded index."""
    repos = {}
    for fields in stanzas():
        path, suite = fields["X-Repository"].split()
        repos.setdefault((path, suite), {})[fields["Package"]] = fields["Version"]
    return repos


def installed_with():
    """{rocm repository path: the amdgpu repository path the same recorded apt run used}."""
    return {fields["X-Repository"].split()[0]: fields["X-Installed-With"]
            for fields in stanzas() if "X-Installed-With" in fields}


AMD_ROWS = sorted(name for name, row in load("roles", "serving", "vars", "main.yml")["serving_matrix"].items()
                  if row["gpu"]["vendor"] == "amd")


def unresolved(release, driver, suite="jammy"):
    """The role's packages (and rocm's recorded dependencies) that the recorded repositories of this
    release do not hold."""
    repos = recorded()
    held = dict(repos.get(("amdgpu/%s/ubuntu" % driver, suite), {}), **repos.get(("rocm/apt/%s" % release, suite), {}))
    wanted = load("roles", "amd_rocm", "defaults", "main.yml")["amd_rocm_packages"] + ["rocm-core", "rocm-smi-lib"]
    missing = [name for name in wanted if name not in held]
    paired = installed_with().get("rocm/apt/%s" % release)
    if paired and paired != "amdgpu/%s/ubuntu" % driver:
        missing.append("amdgpu/%s/ubuntu (ROCm %s was installed with %s)" % (driver, release, paired))
    return missing


def test_every_amd_row_is_in_the_matrix():
    assert AMD_ROWS == ["mi300x", "mi325x", "mi350x", "mi355x"]


@pytest.mark.parametrize("row", AMD_ROWS)
def test_each_rows_default_release_meets_its_floor_and_resolves_in_amds_repositories(row):
    gpu = load("roles", "serving", "vars", "main.yml")["serving_matrix"][row]["gpu"]
    release = gpu["rocm_default"]
    assert LooseVersion(release) >= LooseVersion(gpu["rocm_floor"]), (row, release, gpu["rocm_floor"])
    driver = load("roles", "amd_rocm", "vars", "main.yml")["__amd_rocm_releases"][release]["amdgpu"]
    assert unresolved(release, driver) == []


def test_the_old_single_default_is_below_the_mi355x_floor():
    """The protection: one default for every row (7.0.2, what the role had) is refused on MI355X."""
    gpu = load("roles", "serving", "vars", "main.yml")["serving_matrix"]["mi355x"]["gpu"]
    assert LooseVersion("7.0.2") < LooseVersion(gpu["rocm_floor"])


def test_a_release_path_amd_does_not_publish_does_not_resolve():
    """ROCm 7.2.0's repository is rocm/apt/7.2 and its driver amdgpu/30.30: "7.2.0" or a driver
    paired wrongly (7.2 with 30.10.2) finds no packages."""
    assert unresolved("7.2", "30.30") == []
    assert unresolved("7.2.0", "30.30") == ["rocm", "rocm-core", "rocm-smi-lib"]
    assert unresolved("7.2", "30.10.2") == ["amdgpu/30.10.2/ubuntu (ROCm 7.2 was installed with amdgpu/30.30/ubuntu)"]


def test_every_recorded_release_pairs_with_its_recorded_driver():
    table = load("roles", "amd_rocm", "vars", "main.yml")["__amd_rocm_releases"]
    rocm_paths = {path.split("/")[-1] for path, _ in recorded() if path.startswith("rocm/apt/")}
    assert rocm_paths == {"7.0.2", "7.2"}
    for release in rocm_paths:
        assert unresolved(release, table[release]["amdgpu"]) == [], release


@pytest.mark.parametrize("package, dkms", [
    # ROCm/ROCm#6031: apt list "amdgpu-dkms ... 1:6.16.13.30300000-2278356.24.04" and dkms status
    # "amdgpu/6.16.13-2278356.24.04, 6.1.0-43-amd64, x86_64: installed" on the same host.
    ("1:6.16.13.30300000-2278356.24.04", "6.16.13-2278356.24.04"),
    # AMD's post-install docs: "amdgpu/6.14.14-2226257.24.04" for driver 30.10.2 (6.14.14.30100200-2226257).
    ("1:6.14.14.30100200-2226257.24.04", "6.14.14-2226257.24.04"),
    ("1:6.16.13.30300300-2327507.22.04", "6.16.13-2327507.22.04"),
])
def test_dkms_version_is_what_dkms_status_prints(package, dkms):
    assert amd.dkms_version(package) == dkms


@pytest.mark.parametrize("bad", ["", "6.16.13", "7.2.0.70200-43~22.04", "1:6.16.13.30300000-2278356.22.04\nX"])
def test_dkms_version_refuses_what_is_not_an_amdgpu_dkms_version(bad):
    with pytest.raises(AnsibleFilterError):
        amd.dkms_version(bad)
