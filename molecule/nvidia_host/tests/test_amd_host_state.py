"""Host state of the AMD node of molecule/nvidia_host after converge, read with testinfra over
`docker exec` (verify.yml runs this file with test_host_state.py). The node's profile is the
matrix's mi300x row, whose ROCm default (7.0.2, driver 30.10.2) amd_rocm installs without being
told a version; the stand-in repositories are built from the recorded index of AMD's
(tests/standin/fixtures/amd-rocm-repo.Packages).

Run: pytest molecule/nvidia_host/tests/test_amd_host_state.py (the scenario's containers must exist).
"""
import re

testinfra_hosts = ["docker://mm3-nvhost-mi300x"]

# As AMD's repositories publish them for jammy (the recorded index), not as the role names them.
HELD = {"amdgpu-dkms": "1:6.14.14.30100200-2226257.22.04", "rocm": "7.0.2.70002-56~22.04"}


def test_sources_point_at_the_mirror_of_the_rows_release_and_amds_pin_is_set(host):
    amdgpu = host.file("/etc/apt/sources.list.d/amd-amdgpu.sources").content_string
    rocm = host.file("/etc/apt/sources.list.d/amd-rocm.sources").content_string
    assert "URIs: http://mm3-nvhost-mirror:8080/amdgpu/30.10.2/ubuntu" in amdgpu
    assert "URIs: http://mm3-nvhost-mirror:8080/rocm/apt/7.0.2" in rocm
    assert "Suites: jammy" in amdgpu and "Suites: jammy" in rocm
    # As roles/amd_rocm/templates/amd-rocm.pref.j2 wrote it before roles/apt_repository: one
    # stanza per repository's origin host (both are the mirror here).
    stanza = "Package: *\nPin: origin mm3-nvhost-mirror\nPin-Priority: 600\n"
    assert host.file("/etc/apt/preferences.d/amd-rocm.pref").content_string == (
        "# Managed by Ansible (amd_rocm): packages from AMD's repositories (or their mirror) win over\n"
        "# the distribution's, as AMD's install guide sets it.\n" + stanza + "\n" + stanza)
    for name in ("amdgpu", "rocm"):
        assert host.file("/etc/apt/keyrings/amd-%s.asc" % name).exists
        assert "Signed-By: /etc/apt/keyrings/amd-%s.asc" % name in (amdgpu if name == "amdgpu" else rocm)


def test_amdgpu_and_rocm_are_the_recorded_versions_and_held(host):
    for name, version in HELD.items():
        out = host.check_output("dpkg-query -W -f='${Version} ${db:Status-Abbrev}' %s", name)
        assert out == version + " hi ", name


def test_device_groups_exist(host):
    assert host.group("video").exists and host.group("render").exists


def test_headers_installed_and_dkms_built_amdgpu_for_the_kernel(dkms_line):
    kernel, built = dkms_line("amdgpu")
    # The form of AMD's post-install docs: "amdgpu/6.14.14-2226257.24.04, 6.14.0-33-generic, x86_64: installed".
    assert built == "amdgpu/6.14.14-2226257.22.04, %s, x86_64: installed" % kernel


def test_after_one_reboot_the_loaded_amdgpu_is_the_installed_one_and_rocm_smi_sees_the_gpus(host):
    installed = host.check_output("standin-amdgpu-modinfo")
    assert re.match(r"^[0-9A-F]{23}$", installed)
    assert host.file("/run/standin/amdgpu/srcversion").content_string.strip() == installed
    assert len(host.file("/run/standin/boot_id").content_string.strip()) == 36
    cards = [line for line in host.check_output("rocm-smi --showproductname --csv").splitlines()
             if line.startswith("card")]
    assert len(cards) == 8
