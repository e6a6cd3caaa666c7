"""filter_plugins/hardware.py over the recorded machines of tests/fixtures/hardware (what real
HGX H200 / HGX B200 / GB200 / PCIe nodes print): the fabric each one has, and which GPU names
each profile's model accepts. The expectations are here, the machines there."""
import glob
import os

import pytest
import yaml

from helpers import ROOT, load_source

hardware = load_source("mm3_hardware_filters", os.path.join(ROOT, "filter_plugins", "hardware.py"))
FIXTURES = os.path.join(ROOT, "tests", "fixtures", "hardware")


def machine(name):
    with open(os.path.join(FIXTURES, name + ".yml")) as handle:
        return yaml.safe_load(handle)


def sw_mng(data):
    return [address for address, fields in data["vpd"].items() if "SW_MNG" in " ".join(fields.values())]


def names():
    with open(os.path.join(FIXTURES, "gpu-names.yml")) as handle:
        return [row["name"] for row in yaml.safe_load(handle)["names"]]


@pytest.mark.parametrize("name, kind, switches, bridges, gpus", [
    ("hgx-h200", "nvswitch", 4, 0, 8),
    ("hgx-b200", "nvlink5", 0, 2, 8),
    ("gb200-tray", "none", 0, 0, 4),
    ("pcie-h200-nvl", "none", 0, 0, 8),
])
def test_fabric_of_each_recorded_machine(name, kind, switches, bridges, gpus):
    data = machine(name)
    found = hardware.fabric(data["lspci"].splitlines(), sw_mng(data))
    assert (found["kind"], found["nvswitch_bridges"], found["sw_mng_bridges"], found["nvidia_gpus"]) == (
        kind, switches, bridges, gpus)
    assert str(gpus) in found["evidence"]


def test_b200_without_the_vpd_marker_is_no_fabric():
    """The ConnectX-7 bridges share 15b3:1021 with ordinary NICs: only the VPD tells them apart, so
    the same lspci without the marker must not be taken for NVLink 5 (nor for NVSwitch)."""
    data = machine("hgx-b200")
    found = hardware.fabric(data["lspci"].splitlines(), [])
    assert found["kind"] == "none"
    assert found["mellanox_functions"] == 4


def test_only_mellanox_functions_are_read_for_vpd():
    data = machine("hgx-b200")
    assert hardware.mellanox_functions(data["lspci"].splitlines()) == [
        "0000:1a:00.0", "0000:a0:00.0", "0000:a0:00.1", "0000:bd:00.0"]
    assert hardware.mellanox_functions(machine("hgx-h200")["lspci"].splitlines()) == []


def test_a_marker_on_a_function_lspci_does_not_list_is_refused():
    with pytest.raises(Exception, match="0000:ff:00.0"):
        hardware.fabric(machine("hgx-b200")["lspci"].splitlines(), ["0000:ff:00.0"])


def test_old_pci_ids_names_do_not_matter():
    """A host with an older pci.ids prints `Device [10de:22a3]` (Debian 12's pciutils does): the
    decision reads IDs and classes only."""
    lines = [line.replace("GH100 [H100 NVSwitch]", "Device").replace("GH100 [H200 SXM 141GB]", "Device")
             for line in machine("hgx-h200")["lspci"].splitlines()]
    assert hardware.fabric(lines, [])["kind"] == "nvswitch"


def test_lspci_without_domain_is_read_with_domain_0000():
    rows = hardware.parse_lspci(["1b:00.0 3D controller [0302]: NVIDIA Corporation GH100 [H200 SXM 141GB] "
                                 "[10de:2335] (rev a1)"])
    assert rows[0]["address"] == "0000:1b:00.0" and rows[0]["device"] == "2335"


# Which recorded names each profile's model accepts (B200 is not GB200, H200 not GH200 nor H200 NVL).
ACCEPTS = {
    "B200": {"NVIDIA B200"},
    "B300": {"NVIDIA B300 SXM6 AC"},
    "GB200": {"NVIDIA GB200", "HGX GB200"},
    "GB300": {"NVIDIA GB300"},
    "H200": {"NVIDIA H200"},
    "H100": {"NVIDIA H100 80GB HBM3"},
    "GH200": {"NVIDIA GH200 144G HBM3e"},
    "MI300X": {"AMD Instinct MI300X"},
    "MI355X": set(),
}


@pytest.mark.parametrize("model", sorted(ACCEPTS))
def test_each_model_accepts_exactly_its_recorded_names(model):
    assert {name for name in names() if hardware.gpu_matches(name, model)} == ACCEPTS[model]


def test_machine_names_match_their_own_profile_only():
    assert hardware.gpu_count(machine("hgx-b200")["nvidia_smi_names"], "B200") == 8
    assert hardware.gpu_count(machine("gb200-tray")["nvidia_smi_names"], "B200") == 0
    assert hardware.gpu_count(machine("gb200-tray")["nvidia_smi_names"] + ["HGX GB200"], "GB200") == 5
    assert hardware.gpu_count(machine("pcie-h200-nvl")["nvidia_smi_names"], "H200") == 0
    assert hardware.gpu_count(machine("hgx-h200")["nvidia_smi_names"], "H200") == 8


@pytest.mark.parametrize("name", ["", "NVIDIA", "NVIDIA B200X", "NVIDIA B200 PCIe", "NVIDIA B200 NVL"])
def test_near_names_are_not_b200(name):
    assert not hardware.gpu_matches(name, "B200")


def test_every_fixture_cites_a_source():
    for path in glob.glob(os.path.join(FIXTURES, "*.yml")):
        with open(path) as handle:
            text = handle.read()
        assert "github.com" in text or "NVIDIA/" in text or "pci.ids" in text, path


def imex(name):
    with open(os.path.join(FIXTURES, "imex-ctl.yml")) as handle:
        return hardware.imex_domain(yaml.safe_load(handle)["captures"][name])


@pytest.mark.parametrize("name, nodes, links", [
    ("gh200-2node-570.00", ["10.136.206.47", "10.136.206.48"], 4),
    ("gb200-18node-570.172-excerpt", ["172.31.48.81", "172.31.48.98", "172.31.56.47"], 9),
])
def test_a_formed_imex_domain_is_ready(name, nodes, links):
    domain = imex(name)
    assert domain["state"] == "UP" and domain["links"] == links and domain["broken"] == []
    assert [n["address"] for n in domain["nodes"]] == nodes and {n["status"] for n in domain["nodes"]} == {"READY"}
    assert hardware.imex_problems(domain, nodes) == []


def test_the_570_172_node_lines_carry_the_imex_version():
    assert {n["version"] for n in imex("gb200-18node-570.172-excerpt")["nodes"]} == {"570.172"}
    assert {n["version"] for n in imex("gh200-2node-570.00")["nodes"]} == {None}


def test_an_unreachable_node_and_a_degraded_domain_are_named():
    problems = hardware.imex_problems(imex("gh200-node1-unavailable-derived"), ["10.136.206.47", "10.136.206.48"])
    assert problems == ["Domain State DEGRADED (need UP)",
                        "node #1 10.136.206.48 is UNAVAILABLE (need READY)",
                        "links not C (Connected): 0->1:N, 1->0:N, 1->1:N"]


def test_no_domain_yet_is_not_ready():
    assert hardware.imex_problems(imex("header-only-580.95.09")) == [
        "nvidia-imex-ctl -N printed no Domain State (no domain formed)"]


def test_a_configured_node_the_domain_does_not_show_is_named():
    """nodes_config.cfg must be the same on every node (a mismatch is !M! in the table): an address
    the node was configured with but the domain lacks is reported, comments and blank lines aside."""
    problems = hardware.imex_problems(imex("gh200-2node-570.00"), ["# domain", "10.136.206.47", "", "10.136.206.49"])
    assert problems == ["nodes_config.cfg lists 10.136.206.49, which the domain does not show"]


RECORDED = os.path.join(ROOT, "tests", "fixtures", "hardware", "recorded")


def _recorded_fabric(name):
    with open(os.path.join(RECORDED, name, "nvidia-smi-q-fabric.txt")) as handle:
        return handle.read()


@pytest.mark.parametrize("name, block, problems", [
    ("azure-fabric-insufficient-resources",
     {"state": "Completed", "status": "Insufficient Resources", "clique": "0",
      "cluster": "00000000-0000-0000-0000-000000000000", "health": None},
     ["fabric Status Insufficient Resources on GPU 0 (need Success)"]),
    ("gb200-fabric-unhealthy",
     {"state": "Completed", "status": "Success", "clique": "2",
      "cluster": "dc6e40c4-d722-4357-9ba6-5291dd461278", "health": "Unhealthy"},
     ["fabric Health Summary Unhealthy on GPU 0 (need Healthy)"]),
    ("hgx-b200-fabric-in-progress",
     {"state": "In Progress", "status": "N/A", "clique": "N/A", "cluster": "N/A", "health": "N/A"},
     ["fabric State In Progress on GPU 0 (need Completed)"]),
])
def test_recorded_fabric_blocks_that_cannot_serve_are_named(name, block, problems):
    """Real Fabric blocks (public threads, tests/fixtures/hardware/recorded): State Completed alone
    is not ready; Status and the Health Summary count too."""
    blocks = hardware.fabric_blocks(_recorded_fabric(name))
    assert blocks == [block]
    assert hardware.fabric_problems(blocks) == problems


def test_a_healthy_nvswitch_node_has_no_fabric_problem():
    text = "\n".join("    Fabric\n        State : Completed\n        Status : Success\n        CliqueId : 0\n"
                     "        Health\n            Summary : Healthy\n            Bandwidth : Full" for _ in range(8))
    assert len(hardware.fabric_blocks(text)) == 8
    assert hardware.fabric_problems(hardware.fabric_blocks(text)) == []


def test_trays_of_one_domain_must_share_one_nvlink_partition():
    """A tray's partition is its GPUs' ClusterUUID.CliqueId: the recorded GB200 tray of
    dra-driver-nvidia-gpu#626 (clique 2) and Azure's block (clique 0, all-zero cluster) are two
    partitions; the same tray twice is one."""
    rack = _recorded_fabric("gb200-fabric-unhealthy")
    other = _recorded_fabric("azure-fabric-insufficient-resources")
    assert hardware.clique_problems({"tray1": rack, "tray2": rack}) == []
    assert hardware.clique_problems({"tray1": rack, "tray2": other}) == [
        "the trays are in different NVLink partitions (ClusterUUID.CliqueId): "
        "tray1 dc6e40c4-d722-4357-9ba6-5291dd461278.2; tray2 00000000-0000-0000-0000-000000000000.0; "
        "a domain group holds the trays of one partition"]
    assert hardware.clique_problems({"tray1": rack, "tray2": ""}) == []   # a tray outside this run
    assert hardware.clique_problems({"tray1": _recorded_fabric("hgx-b200-fabric-in-progress"), "tray2": rack}) == []
