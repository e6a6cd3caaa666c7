"""preflight's fabric check (roles/preflight/tasks/fabric.yml, NVSwitch and NVLink 5 nodes) run
by ansible-runner against the controller, with the stand-in nvidia-smi (tests/standin/bin,
named as such: no GPU exists here) replaying the 8 x H200 NVSwitch fixtures, fabric State
Completed or In Progress. A fabric manager that just started reports In Progress while it trains
the links (issue 36): preflight reads again until nothing is In Progress or
preflight_fabric_wait_s have passed, and judges the last reading. One playbook run, every case.
"""
import json
import os
import shutil

import pytest
from helpers import ROOT, run_playbook

STANDIN = os.path.join(ROOT, "tests", "standin")
# name: (fixture per read, preflight_fabric_wait_s, expected status, phrases of the detail)
CASES = {
    "completed": (["h200-8-nvswitch"], 30, "pass", ["fabric state per GPU: Completed (need Completed)"]),
    "settles": (["h200-fabric-in-progress", "h200-8-nvswitch"], 30, "pass", ["Completed (need Completed)"]),
    "stuck": (["h200-fabric-in-progress"], 6, "fail",
              ["fabric state per GPU: In Progress (need Completed) after waiting up to 6 s"]),
    # real Fabric blocks (tests/fixtures/hardware/recorded): State Completed is not enough
    "insufficient": (["recorded:azure-fabric-insufficient-resources"], 6, "fail",
                     ["fabric state per GPU: Completed (need Completed); "
                      "fabric Status Insufficient Resources on GPU 0 (need Success)"]),
    "unhealthy": (["recorded:gb200-fabric-unhealthy"], 6, "fail",
                  ["fabric Health Summary Unhealthy on GPU 0 (need Healthy)"]),
}
# GB-series trays: gpu_nvidia.yml's own include of fabric_state.yml (no fabric on PCI, no fabric
# manager), with the real GB200 tray's blocks (AWS p6e-gb200, 4 GPUs, Completed/Success, CliqueId 2)
# and the GB200 tray of kubernetes-sigs/dra-driver-nvidia-gpu#626 (Completed/Success, Unhealthy).
TRAY_CASES = {
    "tray-ready": (["gb200-tray-4"], 30, "pass", ["GB-series tray (NVLink through the rack's switch trays); "
                                                  "fabric state per GPU: Completed (need Completed)"]),
    "tray-unhealthy": (["recorded:gb200-fabric-unhealthy"], 6, "fail",
                       ["fabric Health Summary Unhealthy on GPU 0 (need Healthy)"]),
}
TRAY_LABEL = "GB-series tray (NVLink through the rack's switch trays)"
RECORDED = os.path.join(ROOT, "tests", "fixtures", "hardware", "recorded")
# Each read replays the next fixture of the case (the last one from then on).
READ = """n=$(cat "$1/reads" 2>/dev/null || echo 0); echo $((n + 1)) > "$1/reads"
fixture=$(sed -n "$((n + 1))p" "$1/fixtures"); [ -n "$fixture" ] || fixture=$(tail -n 1 "$1/fixtures")
echo "$fixture" > "$1/etc/standin/gpu-fixture"
STANDIN_ROOT=$1 exec "$2" -q
"""
PLAY = """- hosts: localhost
  connection: local
  gather_facts: false
  vars:  # what gpu_nvidia.yml has set when it includes the fabric checks (not extra vars: set_fact must win)
    __preflight_results: []
    __preflight_missing_status: fail
    __preflight_fixable_fail: fail
    __preflight_tool_ok: true
    __preflight_driver: 580.95.05
    preflight_fabric: {kind: nvswitch, evidence: "stand-in"}
  tasks:
    - name: The fabric check as gpu_nvidia.yml includes it, once per case
      ansible.builtin.include_role:
        name: preflight
        tasks_from: "{{ case.entry }}"
      vars:
        preflight_fabric_query_command: "{{ case.command }}"
        preflight_fabric_wait_s: "{{ case.wait }}"
        # what gpu_nvidia.yml passes when it includes fabric_state.yml for a GB-series tray
        __preflight_fabric_label: "{{ tray_label }}"
        __preflight_fabric_fix: "{{ tray_fix }}"
      loop: "{{ cases }}"
      loop_control:
        loop_var: case
    - name: Keep what it recorded
      ansible.builtin.copy:
        content: "{{ __preflight_results | to_json }}"
        dest: "{{ out }}"
        mode: "0600"
"""


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("fabric")
    (tmp / "read.sh").write_text(READ)
    cases = []
    for name, (fixtures, wait, _, _) in list(CASES.items()) + list(TRAY_CASES.items()):
        root = tmp / name
        shutil.copytree(os.path.join(STANDIN, "fixtures"), root / "usr/share/standin/gpu")
        (root / "etc/standin").mkdir(parents=True)
        (root / "run/standin/nvidia").mkdir(parents=True)
        (root / "run/standin/nvidia/version").write_text(
            "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.95.05  Release Build  (dvs-builder)\n")
        (root / "fixtures").write_text("".join(f + "\n" for f in fixtures))
        command = ["sh", str(tmp / "read.sh"), str(root), os.path.join(STANDIN, "bin", "nvidia-smi")]
        if fixtures[0].startswith("recorded:"):
            command = ["sh", "-c", 'echo 1 > "$0/reads"; grep -v "^#" "$1"', str(root),
                       os.path.join(RECORDED, fixtures[0].split(":", 1)[1], "nvidia-smi-q-fabric.txt")]
        cases.append({"command": command, "wait": wait, "entry": "fabric_state" if name in TRAY_CASES else "fabric"})
    (tmp / "play.yml").write_text(PLAY)
    runner, text = run_playbook(str(tmp / "play.yml"), tmp, extravars={
        "serving_spec": {"gpu": {"fabric": "nvswitch"}}, "cases": cases, "out": str(tmp / "results.json"),
        "tray_label": TRAY_LABEL, "tray_fix": "check the rack's switch trays"})
    assert runner.rc == 0, text[-2000:]
    recorded = [r for r in json.loads((tmp / "results.json").read_text()) if r["check"] == "fabric_state"]
    reads = {name: int((tmp / name / "reads").read_text()) for name in CASES}
    return dict(zip(list(CASES) + list(TRAY_CASES), recorded)), reads


@pytest.mark.parametrize("name", list(CASES) + list(TRAY_CASES))
def test_each_fabric_is_judged_by_its_last_reading(results, name):
    recorded, _ = results
    _, _, status, phrases = {**CASES, **TRAY_CASES}[name]
    assert recorded[name]["status"] == status, recorded[name]
    for phrase in phrases:
        assert phrase in recorded[name]["detail"], recorded[name]


def test_it_reads_again_only_while_in_progress_and_for_a_bounded_time(results):
    _, reads = results
    assert reads["completed"] == 1
    assert reads["settles"] == 2
    assert 2 <= reads["stuck"] <= 3      # 6 s at one read every 5 s, then judged


def test_a_fabric_left_in_progress_names_the_wait_and_the_reboot(results):
    recorded, _ = results
    assert "preflight_fabric_wait_s" in recorded["stuck"]["fix"] and "reboot" in recorded["stuck"]["fix"]


def test_a_gb_series_tray_gets_the_fabric_state_check_without_fabric_manager():
    """gpu_nvidia.yml includes fabric_state.yml for profile fabric imex (a tray shows no fabric on PCI
    and runs no fabric manager), with the label and fix the tray cases above are judged with."""
    import yaml
    with open(os.path.join(ROOT, "roles", "preflight", "tasks", "gpu_nvidia.yml")) as handle:
        tasks = yaml.safe_load(handle)
    tray = [t for t in tasks if t.get("ansible.builtin.include_tasks") == "fabric_state.yml"]
    assert len(tray) == 1 and tray[0]["when"] == "serving_spec.gpu.fabric | default(none) == 'imex'"
    assert tray[0]["vars"]["__preflight_fabric_label"] == TRAY_LABEL
