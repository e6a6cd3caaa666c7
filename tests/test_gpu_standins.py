"""Tests of the GPU STAND-INS used by molecule/nvidia_host (tests/standin/).

No GPU and no NVIDIA/AMD package can exist on the build machines, so the scenario installs
stand-in packages whose tools replay recorded output. These tests keep the stand-ins honest:
nvidia-smi answers the preflight's queries like the real tool for every fixture, nvidia-ctk
edits daemon.json the way the real `nvidia-ctk runtime configure --runtime=docker` does, and the
stand-in mirror carries exactly the package names and versions the roles pin.
"""
import json
import os
import shutil
import subprocess

import pytest
import yaml

HERE = os.path.dirname(os.path.abspath(__file__))
STANDIN = os.path.join(HERE, "standin")
ROOT = os.path.dirname(HERE)
PINNED = "580.95.05"


@pytest.fixture
def smi_root(tmp_path):
    """A scratch tree laid out like a node with the stand-in driver installed and loaded."""
    shutil.copytree(os.path.join(STANDIN, "fixtures"), tmp_path / "usr/share/standin/gpu")
    (tmp_path / "etc/standin").mkdir(parents=True)
    (tmp_path / "run/standin/nvidia").mkdir(parents=True)
    (tmp_path / "run/standin/nvidia/version").write_text(
        "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  %s  Release Build  (dvs-builder)\n" % PINNED)
    return tmp_path


def smi(root, fixture, *args):
    (root / "etc/standin/gpu-fixture").write_text(fixture + "\n")
    env = dict(os.environ, STANDIN_ROOT=str(root))
    return subprocess.run([os.path.join(STANDIN, "bin/nvidia-smi"), *args], env=env,
                          capture_output=True, text=True, check=False)


@pytest.mark.parametrize("fixture,count,model,mig", [
    ("b200-8", 8, "NVIDIA B200", "Disabled"),
    ("b200-7gpus", 7, "NVIDIA B200", "Disabled"),
    ("h200-8-nvswitch", 8, "NVIDIA H200", "Disabled"),
    ("h200-mig-on", 8, "NVIDIA H200", "Enabled"),
])
def test_query_gpu_matches_the_preflight_query(smi_root, fixture, count, model, mig):
    out = smi(smi_root, fixture, "--query-gpu=name,driver_version,mig.mode.current", "--format=csv,noheader")
    assert out.returncode == 0, out.stdout
    rows = [line.split(", ") for line in out.stdout.splitlines()]
    assert rows == [[model, PINNED, mig]] * count


def test_list_and_fabric_state(smi_root):
    listed = smi(smi_root, "h200-8-nvswitch", "-L").stdout.splitlines()
    assert len(listed) == 8 and listed[0].startswith("GPU 0: NVIDIA H200 (UUID: GPU-")
    done = smi(smi_root, "h200-8-nvswitch", "-q").stdout
    assert done.count("        State                             : Completed") == 8
    pending = smi(smi_root, "h200-fabric-in-progress", "-q").stdout
    assert pending.count("State                             : In Progress") == 8


def test_no_loaded_module_fails_like_the_real_tool(smi_root):
    os.remove(smi_root / "run/standin/nvidia/version")
    out = smi(smi_root, "b200-8", "-L")
    assert out.returncode == 9
    assert "couldn't communicate with the NVIDIA driver" in out.stdout


def test_unknown_field_is_refused(smi_root):
    out = smi(smi_root, "b200-8", "--query-gpu=bogus", "--format=csv")
    assert out.returncode == 2 and 'Field "bogus" is not a valid field to query.' in out.stdout


def ctk(path, *extra):
    return subprocess.run(["python3", os.path.join(STANDIN, "bin/nvidia-ctk"), "runtime", "configure",
                           "--runtime=docker", "--config=%s" % path, *extra],
                          capture_output=True, text=True, check=True)


def test_ctk_merges_the_runtime_and_keeps_other_keys(tmp_path):
    daemon = tmp_path / "daemon.json"
    # What docker_engine writes (to_nice_json, indent 4, trailing newline).
    daemon.write_text(json.dumps({"exec-opts": ["native.cgroupdriver=systemd"], "log-driver": "json-file"},
                                 indent=4, sort_keys=True) + "\n")
    ctk(daemon)
    text = daemon.read_text()
    cfg = json.loads(text)
    assert cfg == {"exec-opts": ["native.cgroupdriver=systemd"], "log-driver": "json-file",
                   "runtimes": {"nvidia": {"args": [], "path": "nvidia-container-runtime"}}}
    assert '\n    "exec-opts": [' in text  # 4-space indent, like Go's json.MarshalIndent(cfg, "", "    ")
    # docker_engine compares parsed keys, not text: its merge of its own keys is then a no-op.
    merged = dict(cfg, **{"exec-opts": ["native.cgroupdriver=systemd"]})
    assert merged == cfg
    ctk(daemon)
    assert daemon.read_text() == text


def test_ctk_creates_a_missing_file(tmp_path):
    daemon = tmp_path / "docker" / "daemon.json"
    out = ctk(daemon)
    assert "Config file does not exist; using empty config" in out.stderr
    assert json.loads(daemon.read_text()) == {"runtimes": {"nvidia": {"args": [], "path": "nvidia-container-runtime"}}}


@pytest.mark.skipif(not (shutil.which("dpkg-deb") and shutil.which("gpg")), reason="needs dpkg-deb and gpg")
def test_mirror_carries_the_recorded_index(tmp_path):
    """The stand-in CUDA repository's fabric packages are the recorded index's amd64 stanzas for the
    versions the lab uses (names, versions and Provides as NVIDIA publishes them), nothing else."""
    subprocess.run(["python3", os.path.join(STANDIN, "build_mirror.py"), STANDIN, str(tmp_path)], check=True)
    packages = (tmp_path / "cuda/debian12/x86_64/Packages").read_text()
    have = {(s.split("\n")[0][9:], s.split("Version: ")[1].split("\n")[0]) for s in packages.split("\n\n") if s}
    with open(os.path.join(STANDIN, "fixtures", "nvidia-cuda-repo.Packages")) as fh:
        recorded = {(b.split("Package: ")[1].split("\n")[0], b.split("Version: ")[1].split("\n")[0])
                    for b in fh.read().split("\n\n") if "Package: " in b and "Architecture: amd64" in b
                    and "X-Distribution" not in b}  # Ubuntu's driver packages are not in the debian12 repository
    wanted = {(name, version) for name, version in recorded
              if version.rsplit("-", 1)[0] in ("580.95.05", "570.133.20", "580.82.07") or name == "nvlsm"}
    driver = {(name, version + "-1") for name in ("nvidia-kernel-open-dkms", "nvidia-driver", "nvidia-persistenced")
              for version in ("580.95.05", "570.133.20")}
    assert have == wanted | driver
    assert ("nvidia-fabricmanager", "580.95.05-1") in have and ("nvidia-fabricmanager-580", "580.95.05-1") not in have
    assert "Provides: nvidia-fabricmanager-580" in packages
    for path in ("cuda/debian12/x86_64/InRelease", "libnvidia-container/stable/gpgkey",
                 "rocm/apt/7.0.2/dists/jammy/InRelease", "amdgpu/30.10.2/ubuntu/dists/jammy/InRelease"):
        assert (tmp_path / path).exists(), path
    assert "-----BEGIN PGP SIGNED MESSAGE-----" in (tmp_path / "cuda/debian12/x86_64/InRelease").read_text()
    # AMD's repositories are the recorded index's (amd-rocm-repo.Packages): paths, names, versions.
    amd = {}
    for path in ("amdgpu/30.10.2/ubuntu", "amdgpu/30.30/ubuntu", "rocm/apt/7.0.2", "rocm/apt/7.2"):
        text = (tmp_path / path / "dists/jammy/main/binary-amd64/Packages").read_text()
        amd[path] = {(s.split("\n")[0][9:], s.split("Version: ")[1].split("\n")[0]) for s in text.split("\n\n") if s}
    assert amd["amdgpu/30.30/ubuntu"] == {("amdgpu-dkms", "1:6.16.13.30300000-2278356.22.04")}
    assert amd["rocm/apt/7.2"] == {("rocm", "7.2.0.70200-43~22.04"), ("rocm-core", "7.2.0.70200-43~22.04"),
                                   ("rocm-smi-lib", "7.8.0.70200-43~22.04")}
    assert amd["amdgpu/30.10.2/ubuntu"] == {("amdgpu-dkms", "1:6.14.14.30100200-2226257.22.04")}
    assert not (tmp_path / "rocm/apt/7.2.0").exists()


def test_hardware_standin_is_the_recorded_machine(tmp_path):
    """build_hardware.py writes the recorded HGX B200: one config-space record per recorded lspci line
    (IDs and class as recorded) and a well-formed VPD (RV checksum zero) per ConnectX function, with
    SW_MNG on the two bridge functions only."""
    with open(os.path.join(ROOT, "tests", "fixtures", "hardware", "hgx-b200.yml")) as fh:
        machine = yaml.safe_load(fh)
    (tmp_path / "m.json").write_text(json.dumps(machine))
    subprocess.run(["python3", os.path.join(STANDIN, "build_hardware.py"), str(tmp_path / "m.json"),
                    str(tmp_path / "pci")], check=True)
    dump = (tmp_path / "pci" / "lspci.dump").read_text().splitlines()
    records = [line.split()[0] for line in dump if not line.startswith(("00:", "10:", "20:", "30:"))]
    assert records == [line.split()[0] for line in machine["lspci"].splitlines()]
    first = dump[1].split()[1:]
    assert first[:4] == ["b3", "15", "21", "10"] and first[10:12] == ["07", "02"]  # 15b3:1021, class 0207
    marked = []
    for address in machine["vpd"]:
        data = (tmp_path / "pci" / "devices" / address / "vpd").read_bytes()
        assert data[0] == 0x82 and data[-1] == 0x78
        rv = data.index(b"RV")
        assert sum(data[:rv + 4]) % 256 == 0, address
        if b"SMDL=SW_MNG" in data:
            marked.append(address)
    assert marked == ["0000:a0:00.0", "0000:a0:00.1"]


# Which recorded machine (tests/fixtures/hardware) each stand-in GPU table belongs to: molecule/
# nvidia_host's h200 node is the recorded HGX H200, its b200 node the recorded HGX B200.
TABLE_MACHINE = {"h200-8-nvswitch": "hgx-h200", "h200-fabric-in-progress": "hgx-h200", "h200-mig-on": "hgx-h200",
                 "b200-8": "hgx-b200", "b200-7gpus": "hgx-b200", "gb200-tray-4": "gb200-tray"}


@pytest.mark.parametrize("table, machine", sorted(TABLE_MACHINE.items()))
def test_gpu_tables_name_the_bus_ids_of_their_machines_gpus(table, machine):
    """nvidia-smi's pci.bus_id is lspci's address with an 8-digit domain, in capitals
    (0000:1b:00.0 -> 00000000:1B:00.0): a table whose GPUs sit elsewhere than its machine's 3D
    controllers is another machine (issue 36: they were the PCIe H200 NVL's)."""
    with open(os.path.join(ROOT, "tests", "fixtures", "hardware", machine + ".yml")) as handle:
        lspci = yaml.safe_load(handle)["lspci"].splitlines()
    gpus = ["0000" + line.split()[0].upper() for line in lspci if "3D controller [0302]" in line
            and "[10de:" in line]
    with open(os.path.join(STANDIN, "fixtures", table + ".csv")) as handle:
        rows = [line.split(", ") for line in handle.read().splitlines() if line and not line.startswith("#")]
    bus_ids = [row[3] for row in rows]
    assert bus_ids == gpus[:len(bus_ids)] and len(bus_ids) >= min(7, len(gpus))
