# -*- coding: utf-8 -*-
"""What a node's hardware is, read from the tools' own output: which GPUs (by the exact product
name nvidia-smi / rocm-smi print) and which NVLink fabric (from lspci and PCI VPD, readable on a
first install before any NVIDIA module is loaded). Shared by `preflight` (refuse a node that is not
what its profile says) and `nvidia_driver` (install the fabric pieces the hardware needs,
fabric_plan).

Pure functions over recorded tool output; tests/unit/test_hardware_filters.py runs them against
the recorded machines in tests/fixtures/hardware/ (what real HGX H200 / HGX B200 / GB200 / PCIe
nodes print, each file citing its source).
"""
from __future__ import annotations

import re

from ansible.errors import AnsibleFilterError

# Words a vendor or platform puts before the model ("NVIDIA B200", "HGX GB200", "AMD Instinct MI300X").
_VENDOR_WORDS = {"NVIDIA", "HGX", "AMD", "INSTINCT"}
# Words that may follow the model without making it another product: memory size and type
# ("NVIDIA H100 80GB HBM3", "NVIDIA GH200 144G HBM3e"), the SXM/OAM module and its cooling
# ("NVIDIA B300 SXM6 AC"). A form factor that changes the fabric ("NVL", "PCIe") or a different
# chip ("GB200" for B200, "GH200" for H200) never matches; an unknown word does not either.
_SAME_PRODUCT = re.compile(r"^(\d+GB?|HBM\d+E?|SXM\d*|OAM|AC|LC)$")

# lspci -Dnn: "0000:05:00.0 Bridge [0680]: NVIDIA Corporation GH100 [H100 NVSwitch] [10de:22a3] (rev a1)"
_LSPCI = re.compile(r"^(?P<address>(?:[0-9a-fA-F]{4}:)?[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7])\s+"
                    r"(?P<class_name>.*?)\s\[(?P<class>[0-9a-fA-F]{4})\]:\s+(?P<name>.*?)\s*"
                    r"\[(?P<vendor>[0-9a-fA-F]{4}):(?P<device>[0-9a-fA-F]{4})\]")
NVIDIA = "10de"
MELLANOX = "15b3"
# PCI classes: 0680 "Bridge: other" is how Hopper's NVSwitch enumerates; 0302 3D controller and
# 0300 VGA are GPUs.
_NVSWITCH_CLASS = "0680"
_GPU_CLASSES = {"0302", "0300"}
# The VPD keyword NVIDIA's driver container greps for on a Blackwell HGX (NVLink 5): the
# ConnectX-7 functions that bridge to the NVSwitch trays carry it, ordinary CX-7 NICs do not.
SW_MNG = "SW_MNG"


def _tokens(name):
    return [word for word in str(name).split() if word.upper() not in _VENDOR_WORDS]


def gpu_matches(name, model):
    """True when the product name a tool printed is exactly the profile's GPU model: B200 is
    not GB200, H200 is not GH200 nor H200 NVL (another fabric), H100 80GB HBM3 is H100."""
    words = _tokens(name)
    if not words or not str(model).strip():
        return False
    return words[0].upper() == str(model).strip().upper() and all(
        _SAME_PRODUCT.match(word.upper()) for word in words[1:])


def gpu_count(names, model):
    """How many of the names (one per GPU) are the profile's model."""
    return sum(1 for name in names or [] if gpu_matches(name, model))


def parse_lspci(lines):
    """lspci -Dnn lines as dicts (address, class, vendor, device, name); other lines dropped."""
    found = []
    for line in lines or []:
        match = _LSPCI.match(str(line).strip())
        if match:
            row = match.groupdict()
            row["class"] = row["class"].lower()
            row["vendor"] = row["vendor"].lower()
            row["device"] = row["device"].lower()
            if len(row["address"]) == 7:
                row["address"] = "0000:" + row["address"]
            found.append(row)
    return found


def _mellanox(rows):
    return [row["address"] for row in rows if row["vendor"] == MELLANOX]


def mellanox_functions(lines):
    """PCI addresses of every Mellanox/NVIDIA-networking function (15b3): the only ones whose VPD
    is read (reading VPD of arbitrary devices can stall; a CX-7 answers at once)."""
    return _mellanox(parse_lspci(lines))


def fabric(lines, sw_mng=None):
    """The NVLink fabric the hardware has, from `lspci -Dnn` lines and the addresses of the
    Mellanox functions whose VPD holds SW_MNG:

    - nvlink5: ConnectX-7 bridge functions marked SW_MNG (HGX B200/B300; the switches are not PCI
      devices there);
    - nvswitch: NVIDIA bridges of class 0680 (HGX H100/H200 NVSwitch);
    - none: neither (a PCIe box, or a GB200/GB300 tray whose NVLink is managed by IMEX).
    """
    rows = parse_lspci(lines)
    marked = sorted(set(str(address) for address in sw_mng or []))
    mellanox = _mellanox(rows)
    unknown = [address for address in marked if address not in mellanox]
    if unknown:
        raise AnsibleFilterError("hardware.fabric: SW_MNG reported for %s, which lspci does not list as a "
                                 "Mellanox function" % ", ".join(unknown))
    switches = [row["address"] for row in rows if row["vendor"] == NVIDIA and row["class"] == _NVSWITCH_CLASS]
    gpus = [row for row in rows if row["vendor"] == NVIDIA and row["class"] in _GPU_CLASSES]
    kind = "nvlink5" if marked else ("nvswitch" if switches else "none")
    return {
        "kind": kind,
        "nvswitch_bridges": len(switches),
        "sw_mng_bridges": len(marked),
        "mellanox_functions": len(mellanox),
        "nvidia_gpus": len(gpus),
        "evidence": "%d NVIDIA GPU function(s), %d NVSwitch bridge(s) (10de class 0680), %d of %d Mellanox "
                    "function(s) with SW_MNG in their VPD" % (len(gpus), len(switches), len(marked), len(mellanox)),
    }


# What each profile fabric expects the hardware to show (filter_plugins/hardware.py fabric()):
# a GB200/GB300 tray shows neither switches nor bridges, its NVLink domain is IMEX's.
PROFILE_EXPECTS = {"nvswitch": "nvswitch", "nvlink5": "nvlink5", "imex": "none"}
HOW_TO_SEE = {
    "nvswitch": "NVIDIA bridges of class 0680 (lspci -Dnn -d 10de: | grep 0680)",
    "nvlink5": "ConnectX-7 bridge functions with SW_MNG in their VPD (grep -l SW_MNG "
               "/sys/bus/pci/devices/*/vpd); they must stay bound on the host, never to vfio",
    "none": "no NVSwitch bridge and no SW_MNG bridge function",
}


def fabric_plan(detected, profile_fabric, mode, pieces, profile_components=None):
    """The fabric this node is prepared for, its components and modules, and a blocker when the
    hardware contradicts the profile.

    detected: hardware.fabric() of the node; profile_fabric: serving_spec.gpu.fabric (nvswitch,
    nvlink5, imex or None); mode: nvidia_driver_fabricmanager (auto: the hardware decides and must
    agree with the profile; always: the profile's fabric whatever was detected; never: none);
    pieces: {kind: {components, modules}}; profile_components: {profile fabric: [components]}
    added whatever the hardware (IMEX on a GB tray)."""
    if mode not in ("auto", "always", "never"):
        raise AnsibleFilterError("nvidia_driver_fabricmanager must be auto, always or never, not %r" % (mode,))
    found = detected.get("kind", "none")
    expected = expected_fabric(profile_fabric)
    blocker = ""
    if mode == "never":
        kind = "none"
    elif mode == "always":
        kind = expected if expected in ("nvswitch", "nvlink5") else found
    else:
        kind = found
        if expected is not None and expected != found:
            blocker = (
                "the profile's fabric is %s, which shows as %s, but this node shows %s (%s). Fix: choose the "
                "serving_profile that matches this node; if the hardware is right, check that %s; "
                "nvidia_driver_fabricmanager: always installs the profile's pieces without looking."
                % (profile_fabric, HOW_TO_SEE[expected], HOW_TO_SEE.get(found, found),
                   detected.get("evidence", "nothing detected"), HOW_TO_SEE[expected]))
    chosen = pieces.get(kind, {"components": [], "modules": []})
    extra = (profile_components or {}).get(profile_fabric, []) if mode != "never" else []
    components = list(chosen.get("components", []))
    components += [name for name in extra if name not in components]
    return {"kind": kind, "components": components, "modules": list(chosen.get("modules", [])),
            "blocker": blocker}


def expected_fabric(profile_fabric):
    """What a profile's fabric shows as on the hardware (None: the profile does not say)."""
    return PROFILE_EXPECTS.get(profile_fabric) if profile_fabric else None


def fabric_states(text):
    """Each GPU's fabric State from `nvidia-smi -q` text (its "Fabric" block: State, Status,
    CliqueId, ...; NVSwitch and NVLink 5 nodes print one per GPU, others none). Preflight needs
    every one Completed; diagnose reports them."""
    return [state.strip() for state in re.findall(r"Fabric\s*\n\s*State\s*:\s*([^\n]+)", str(text or ""))]


_FABRIC_BLOCK = re.compile(r"^(\s*)Fabric\s*\n((?:\1\s+\S[^\n]*\n?)+)", re.M)


def fabric_blocks(text):
    """Each GPU's Fabric block of `nvidia-smi -q` text: [{state, status, clique, cluster, health}]
    (a field the block does not print is None; health is its Health Summary). NVML's values
    (tests/fixtures/hardware/recorded/FABRIC-VALUES.md): State Not Supported / Not Started /
    In Progress / Completed; Status, once Completed, an NVML return code (Success, Insufficient
    Resources, ...); Health Summary Not Supported / Healthy / Unhealthy / Limited Capacity."""
    blocks = []
    for _, body in _FABRIC_BLOCK.findall(str(text or "")):
        fields = dict((k.strip(), v.strip()) for k, v in re.findall(r"^\s*([A-Za-z][^:\n]*?)\s*:\s*([^\n]*)$", body, re.M))
        blocks.append({"state": fields.get("State"), "status": fields.get("Status"), "clique": fields.get("CliqueId"),
                       "cluster": fields.get("ClusterUUID"), "health": fields.get("Summary")})
    return blocks


def fabric_problems(blocks):
    """What keeps a node's NVLink fabric (fabric_blocks) from serving, as sentences naming the GPUs
    by their order in nvidia-smi: a State other than Completed, a Status other than Success once
    Completed (NVML's error, e.g. Insufficient Resources), a Health Summary Unhealthy or Limited
    Capacity. [] when every GPU is ready or none prints a fabric."""
    problems = []

    def gpus(select):
        return ", ".join("GPU %d" % i for i, b in enumerate(blocks) if select(b))

    for state in sorted({b["state"] for b in blocks if b["state"] != "Completed"}, key=str):
        problems.append("fabric State %s on %s (need Completed)" % (state, gpus(lambda b, s=state: b["state"] == s)))
    for status in sorted({b["status"] for b in blocks if b["state"] == "Completed" and b["status"] != "Success"}, key=str):
        problems.append("fabric Status %s on %s (need Success)"
                        % (status, gpus(lambda b, s=status: b["state"] == "Completed" and b["status"] == s)))
    for health in sorted({b["health"] for b in blocks if b["health"] in ("Unhealthy", "Limited Capacity")}):
        problems.append("fabric Health Summary %s on %s (need Healthy)" % (health, gpus(lambda b, h=health: b["health"] == h)))
    return problems


def clique_problems(readings):
    """Whether the trays of one IMEX domain share one NVLink partition: readings {tray: its
    `nvidia-smi -q` text}. Every GPU whose fabric is Completed names its partition as ClusterUUID
    and CliqueId (NVIDIA's GPU feature discovery labels it nvidia.com/gpu.clique = <ClusterUUID>.<CliqueId>);
    trays in different partitions cannot share memory over NVLink whatever IMEX says. [] when they
    agree (or no tray printed a partition); else one sentence naming each tray's partitions."""
    seen = {}
    for tray in sorted(readings or {}):
        cliques = sorted({"%s.%s" % (b["cluster"], b["clique"]) for b in fabric_blocks(readings[tray])
                          if b["state"] == "Completed" and b["cluster"] not in (None, "N/A")})
        if cliques:
            seen[tray] = cliques
    if len({c for cliques in seen.values() for c in cliques}) <= 1:
        return []
    return ["the trays are in different NVLink partitions (ClusterUUID.CliqueId): %s; a domain group holds the "
            "trays of one partition" % "; ".join("%s %s" % (tray, ", ".join(c)) for tray, c in seen.items())]


# `nvidia-imex-ctl -N` (IMEX guide, command service): "Node #0   - 172.31.48.81    - READY   - Version: 570.172",
# a connectivity matrix of one-letter states (C = Connected; I, N, R, D, A, !V!, !M! are not), then
# "Domain State: UP". tests/fixtures/hardware/imex-ctl.yml holds real captures.
_IMEX_NODE = re.compile(r"^\s*Node #(\d+)\s+-\s+(\S+)\s+-\s+(\S+)(?:\s+-\s+Version:\s*(\S+))?", re.M)
_IMEX_ROW = re.compile(r"^\s*(\d+)((?:\s+(?:[A-Z]|![A-Z]!))+)\s*$", re.M)


def imex_domain(text):
    """The IMEX domain as `nvidia-imex-ctl -N` prints it: {state (None: no "Domain State" line),
    nodes: [{index, address, status, version}], links: number of matrix cells, broken: the cells
    that are not C, as "from->to:state"}. A domain is ready when its state is UP, every node
    READY and every link C (the IMEX guide's and AWS's criterion)."""
    text = str(text or "")
    nodes = [{"index": int(i), "address": a, "status": s, "version": v or None}
             for i, a, s, v in _IMEX_NODE.findall(text)]
    order = [node["index"] for node in nodes]
    links, broken = 0, []
    for row, cells in _IMEX_ROW.findall(text.split("Nodes From", 1)[-1] if "Nodes From" in text else ""):
        for column, cell in enumerate(cells.split()):
            links += 1
            if cell != "C":
                target = order[column] if column < len(order) else column
                broken.append("%s->%s:%s" % (row, target, cell))
    state = re.search(r"^\s*Domain State:\s*(\S+)", text, re.M)
    return {"state": state.group(1) if state else None, "nodes": nodes, "links": links, "broken": broken}


def imex_problems(domain, expected=None):
    """What keeps an IMEX domain (imex_domain's result) from serving, as sentences; [] when it is
    ready: Domain State UP, every node READY, every link C and, given the node list the node was
    configured with (nodes_config.cfg lines), every one of those addresses in the domain."""
    problems = []
    if domain.get("state") is None:
        problems.append("nvidia-imex-ctl -N printed no Domain State (no domain formed)")
    elif domain["state"] != "UP":
        problems.append("Domain State %s (need UP)" % domain["state"])
    problems += ["node #%s %s is %s (need READY)" % (n["index"], n["address"], n["status"])
                 for n in domain.get("nodes", []) if n["status"] != "READY"]
    if domain.get("broken"):
        problems.append("links not C (Connected): %s" % ", ".join(domain["broken"][:8]))
    listed = [line.strip() for line in (expected or []) if line.strip() and not line.strip().startswith("#")]
    shown = {n["address"] for n in domain.get("nodes", [])}
    missing = [address for address in listed if address not in shown]
    if missing:
        problems.append("nodes_config.cfg lists %s, which the domain does not show" % ", ".join(missing))
    return problems


class FilterModule(object):
    def filters(self):
        return {
            "hardware_fabric_states": fabric_states,
            "hardware_fabric_blocks": fabric_blocks,
            "hardware_fabric_problems": fabric_problems,
            "hardware_clique_problems": clique_problems,
            "hardware_imex_domain": imex_domain,
            "hardware_imex_problems": imex_problems,
            "hardware_gpu_count": gpu_count,
            "hardware_mellanox_functions": mellanox_functions,
            "hardware_fabric": fabric,
            "hardware_fabric_plan": fabric_plan,
            "hardware_expected_fabric": expected_fabric,
        }
