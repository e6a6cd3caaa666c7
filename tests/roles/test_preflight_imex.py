"""preflight's IMEX domain check (roles/preflight/tasks/imex.yml, GB-series profiles) run by
ansible-runner against the controller, with recorded `nvidia-imex-ctl -N` output
(tests/fixtures/hardware/imex-ctl.yml) in place of the tool: the command is preflight's own
variable, so `cat` of the capture stands for the tool on a GB200 tray. Nothing is changed here.
One playbook run checks every case (a loop), to keep the suite's minutes.
"""
import json
import pathlib
import sys

import pytest
import yaml
from helpers import ROOT, run_playbook

CAPTURES = yaml.safe_load((pathlib.Path(ROOT) / "tests" / "fixtures" / "hardware" / "imex-ctl.yml").read_text())[
    "captures"]
# name: (capture, the node list nodes_config.cfg holds, expected status, phrases of the detail)
CASES = {
    "formed": ("gh200-2node-570.00", ["10.136.206.47", "10.136.206.48"], "pass",
               ["Domain State UP, 2 node(s) READY, 4 link(s) C"]),
    "formed-18-excerpt": ("gb200-18node-570.172-excerpt", ["172.31.48.81", "172.31.48.98", "172.31.56.47"], "pass",
                          ["Domain State UP, 3 node(s) READY, 9 link(s) C"]),
    "degraded": ("gh200-node1-unavailable-derived", ["10.136.206.47", "10.136.206.48"], "fail",
                 ["Domain State DEGRADED (need UP)", "node #1 10.136.206.48 is UNAVAILABLE (need READY)", "0->1:N"]),
    "no-domain": ("header-only-580.95.09", ["10.136.206.47"], "fail", ["no Domain State (no domain formed)"]),
    "node-missing": ("gh200-2node-570.00", ["10.136.206.47", "10.136.206.48", "10.136.206.49"], "fail",
                     ["nodes_config.cfg lists 10.136.206.49, which the domain does not show"]),
    "no-tool": (None, ["10.136.206.47"], "fail", ["nvidia-imex-ctl did not answer"]),
}
PLAY = """- hosts: localhost
  connection: local
  gather_facts: false
  vars:  # what preflight's main.yml sets before it includes the vendor checks (not extra vars: set_fact must win)
    __preflight_results: []
    __preflight_missing_status: fail
  tasks:
    - name: The IMEX check as gpu_nvidia.yml includes it, once per case
      ansible.builtin.include_role:
        name: preflight
        tasks_from: imex
      vars:
        preflight_imex_ctl_command: "{{ case.command }}"
        preflight_imex_nodes_file: "{{ case.nodes_file }}"
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
    tmp = tmp_path_factory.mktemp("imex")
    cases = []
    for name, (capture, listed, _, _) in CASES.items():
        (tmp / (name + ".txt")).write_text(CAPTURES[capture] if capture else "")
        (tmp / (name + ".cfg")).write_text("".join(line + "\n" for line in listed))
        command = ["cat", str(tmp / (name + ".txt"))] if capture else ["/nonexistent/nvidia-imex-ctl", "-N"]
        cases.append({"command": command, "nodes_file": str(tmp / (name + ".cfg"))})
    (tmp / "play.yml").write_text(PLAY)
    runner, text = run_playbook(str(tmp / "play.yml"), tmp, extravars={
        "serving_spec": {"gpu": {"fabric": "imex"}}, "cases": cases, "out": str(tmp / "results.json")})
    assert runner.rc == 0, text[-2000:]
    recorded = json.loads((tmp / "results.json").read_text())
    assert [r["check"] for r in recorded] == ["imex_domain"] * len(CASES)
    return dict(zip(CASES, recorded))


@pytest.mark.parametrize("name", CASES)
def test_each_domain_is_judged_as_its_capture_shows(results, name):
    _, _, status, phrases = CASES[name]
    assert results[name]["status"] == status, results[name]
    for phrase in phrases:
        assert phrase in results[name]["detail"], results[name]


def test_a_failure_names_the_fix(results):
    assert "journalctl -u nvidia-imex" in results["degraded"]["fix"]
    assert "/etc/nvidia-imex/nodes_config.cfg" not in results["degraded"]["fix"]  # the node's own file is named
    assert results["degraded"]["fix"].count(".cfg everywhere") == 1


# A fresh two-tray rack prepared one tray at a time (prepare.yml's default prepare_serial: 1): the
# real serving role resolves each tray's domain from its inventory group (serving_imex_domain), and
# preflight's IMEX check, run before and after each tray's "installation" as prepare.yml runs it,
# is pending on the first tray (its peer has no IMEX yet) and judges the whole domain on the last.
RACK_INVENTORY = """all:
  vars:
    ansible_connection: local
    ansible_python_interpreter: PYTHON
    serving_profile: gb200
    serving_allow_inferred: true
  children:
    nodes:
      hosts:
        tray1: {fabric: RACK}
        tray2: {fabric: RACK}
        tray3: {fabric: RACK}
        tray4: {fabric: OTHER}
    rack_a:
      hosts:
        tray1: {}
        tray2: {}
      vars:
        serving_imex_domain: rack_a
    rack_b:
      hosts:
        tray3: {}
        tray4: {}
      vars:
        serving_imex_domain: rack_b
"""
RACK_PLAY = """- hosts: nodes
  gather_facts: false
  serial: 1
  vars:
    serving_collect_blockers: true
    __preflight_results: []
    __preflight_missing_status: fail
  roles:
    - role: serving
  tasks:
    - name: The tray's fabric state, as gpu_nvidia.yml reads it before the IMEX check
      ansible.builtin.include_role:
        name: preflight
        tasks_from: fabric_state
      vars:
        __preflight_tool_ok: true
        __preflight_fixable_fail: fail
        __preflight_fabric_label: tray
        __preflight_fabric_fix: switch trays
        preflight_fabric_query_command: [sh, -c, 'grep -v "^#" "$0"', "{{ fabric }}"]
    - name: First preflight (before the GPU stack), then the tray's IMEX "comes up", then the second preflight
      ansible.builtin.include_role:
        name: preflight
        tasks_from: imex
      vars:
        preflight_imex_ctl_command: [cat, "{{ capture }}"]
        preflight_imex_nodes_file: "{{ nodes_file }}"
      loop: [first, second]
    - name: Keep what each tray recorded, and its resolved domain
      ansible.builtin.copy:
        content: "{{ {'results': __preflight_results, 'imex': serving_spec.imex} | to_json }}"
        dest: "{{ out }}/{{ inventory_hostname }}.json"
        mode: "0600"
"""


@pytest.fixture(scope="module")
def rack(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("rack")
    recorded = pathlib.Path(ROOT) / "tests" / "fixtures" / "hardware" / "recorded"
    (tmp / "inventory.yml").write_text(RACK_INVENTORY.replace("PYTHON", sys.executable).replace(
        "RACK", str(recorded / "gb200-fabric-unhealthy" / "nvidia-smi-q-fabric.txt")).replace(
        "OTHER", str(recorded / "azure-fabric-insufficient-resources" / "nvidia-smi-q-fabric.txt")))
    (tmp / "play.yml").write_text(RACK_PLAY)
    (tmp / "capture.txt").write_text(CAPTURES["gh200-2node-570.00"])
    (tmp / "nodes_config.cfg").write_text("10.136.206.47\n10.136.206.48\n")
    runner, text = run_playbook(str(tmp / "play.yml"), tmp, inventory=str(tmp / "inventory.yml"), extravars={
        "capture": str(tmp / "capture.txt"), "nodes_file": str(tmp / "nodes_config.cfg"), "out": str(tmp)})
    assert runner.rc == 0, text[-3000:]
    return {host: json.loads((tmp / (host + ".json")).read_text()) for host in ("tray1", "tray2", "tray3", "tray4")}


def test_each_tray_s_domain_is_its_inventory_group(rack):
    for host in ("tray1", "tray2"):
        assert rack[host]["imex"] == {"group": "rack_a", "hosts": ["tray1", "tray2"]}
    assert rack["tray4"]["imex"] == {"group": "rack_b", "hosts": ["tray3", "tray4"]}


def test_the_first_tray_waits_for_its_peer_and_the_last_judges_the_whole_domain(rack):
    first = [r["status"] for r in rack["tray1"]["results"] if r["check"] == "imex_domain"]
    assert first == ["pending", "pending"], rack["tray1"]["results"]
    assert "domain rack_a is checked once its last tray is prepared; still to come in this run: tray2" \
        in [r for r in rack["tray1"]["results"] if r["check"] == "imex_domain"][-1]["detail"]
    last = [r for r in rack["tray2"]["results"] if r["check"] == "imex_domain"][-1]
    assert last["status"] == "pass" and "Domain State UP, 2 node(s) READY, 4 link(s) C" in last["detail"], last


def test_a_domain_whose_trays_are_in_two_nvlink_partitions_is_refused(rack):
    """rack_b's trays read different partitions (the recorded GB200 tray's clique 2 and Azure's
    clique 0): IMEX may say UP, the trays still cannot share memory over NVLink."""
    last = [r for r in rack["tray4"]["results"] if r["check"] == "imex_domain"][-1]
    assert last["status"] == "fail"
    assert ("the trays are in different NVLink partitions (ClusterUUID.CliqueId): "
            "tray3 dc6e40c4-d722-4357-9ba6-5291dd461278.2; tray4 00000000-0000-0000-0000-000000000000.0") \
        in last["detail"]
