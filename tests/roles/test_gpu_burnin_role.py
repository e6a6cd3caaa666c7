"""The gpu_burnin role (the GPU burn-in gate) run by ansible-runner against the controller, one
inventory host per case, with the stand-in nvidia-smi (tests/standin/bin, named as such: no GPU
exists here) and, in place of dcgmi and all_reduce_perf (which need GPUs), commands that print the
real outputs recorded in tests/fixtures/burnin (each citing its public source). The role reads and
judges them with its filters, writes the node's record, refuses a node below its threshold naming
the number, keeps a passing record on a second run, and model_server's check (tasks_from: check)
refuses a node whose record failed. Two playbook runs, every case."""
import json
import os
import shutil

import pytest
from helpers import ROOT, hardware_matrix, run_playbook

STANDIN = os.path.join(ROOT, "tests", "standin")
FIXTURES = os.path.join(ROOT, "tests", "fixtures", "burnin")
FLOOR = hardware_matrix()["h200"]["gpu"]["burnin"]
# name: (dcgmi output or None, all_reduce_perf output, GPUs in the profile, DCGM level, GPUs in use[,
#        entry point, gpu_burnin_timeout_s, the dcgmi program])
CASES = {
    "healthy": (None, "allreduce-8xh200-pass.txt", 8, 2, ""),
    "degraded": (None, "allreduce-64xh100-8node-degraded.txt", 64, 2, ""),
    "dcgmfail": ("dcgmi-diag-r3-fail.txt", "allreduce-8xh200-pass.txt", 8, 3, ""),
    "busy": (None, "allreduce-8xh200-pass.txt", 8, 2, "48213, python3\n"),
    "badtimeout": (None, "allreduce-8xh200-pass.txt", 8, 2, "", "main", 10),
    "nodcgm": ("dcgmi-diag-r3-fail.txt", "allreduce-8xh200-pass.txt", 8, 2, "", "main", 3600, "/nonexistent/dcgmi"),
}
# prints a recorded output without its provenance header, and notes that it ran
PRINT = 'touch "$(dirname "$0")/ran"; grep -v "^#! " "$1"'
PLAY = """- hosts: all
  gather_facts: false
  environment:
    PATH: "{{ case.bin }}:/usr/local/bin:/usr/bin:/bin"
    STANDIN_ROOT: "{{ case.root }}"
  vars:
    case: "{{ cases[inventory_hostname] }}"
    serving_spec:
      profile: h200
      gpu: {vendor: nvidia, model: H200, count: "{{ case.count }}", burnin: "{{ floor }}"}
  tasks:
    - name: The gate, as prepare.yml and burnin.yml include it
      ansible.builtin.include_role:
        name: gpu_burnin
        tasks_from: "{{ case.entry }}"
      vars:
        gpu_burnin_dcgm: "{{ case.dcgm is not none }}"
        gpu_burnin_dcgm_level: "{{ case.level }}"
        gpu_burnin_dcgm_command: ["{{ case.dcgmi }}", -c, "{{ script }}", "{{ case.root }}/marker", "{{ case.dcgm }}"]
        gpu_burnin_allreduce_command: [sh, -c, "{{ script }}", "{{ case.root }}/marker", "{{ case.allreduce }}"]
        gpu_burnin_record_dir: "{{ case.root }}/record"
        gpu_burnin_timeout_s: "{{ case.timeout }}"
"""


def prepare(tmp, name, dcgm, allreduce, count, level, busy, entry="main", timeout=3600, dcgmi="sh"):
    root = tmp / name
    if not root.exists():
        shutil.copytree(os.path.join(STANDIN, "fixtures"), root / "usr/share/standin/gpu")
        (root / "etc/standin").mkdir(parents=True)
        (root / "etc/standin/gpu-fixture").write_text("h200-8-nvswitch\n")
        (root / "run/standin/nvidia").mkdir(parents=True)
        (root / "run/standin/nvidia/version").write_text(
            "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.95.05  Release Build  (dvs-builder)\n")
        (root / "bin").mkdir()
        os.symlink(os.path.join(STANDIN, "bin", "nvidia-smi"), root / "bin/nvidia-smi")
    if busy:
        (root / "etc/standin/compute-apps").write_text(busy)
    return {"root": str(root), "bin": str(root / "bin"), "count": count, "level": level, "entry": entry,
            "timeout": timeout, "dcgmi": dcgmi,
            "dcgm": os.path.join(FIXTURES, dcgm) if dcgm else None, "allreduce": os.path.join(FIXTURES, allreduce)}


def play(tmp, cases, run):
    (tmp / "play.yml").write_text(PLAY)
    (tmp / (run + ".ini")).write_text("".join(name + "\n" for name in cases))
    runner, text = run_playbook(str(tmp / "play.yml"), tmp / run, inventory=str(tmp / (run + ".ini")), extravars={
        "cases": cases, "floor": FLOOR, "script": PRINT, "ansible_connection": "local",
        "ansible_python_interpreter": shutil.which("python3")})
    failed = {}
    for event in runner.events:
        data = event.get("event_data", {})
        if event.get("event") == "runner_on_failed":
            failed[data["host"]] = data["res"].get("msg", "")
    return runner, failed


def record(tmp, name):
    path = tmp / name / "record" / "burnin.json"
    return json.loads(path.read_text()) if path.exists() else None


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("burnin")
    first = play(tmp, {name: prepare(tmp, name, *case) for name, case in CASES.items()}, "first")
    ran_first = {name: (tmp / name / "ran").exists() for name in CASES}
    records = {name: record(tmp, name) for name in CASES}
    for name in CASES:
        if (tmp / name / "ran").exists():
            (tmp / name / "ran").unlink()
    # Second run: the healthy node again, now with the degraded output (a passing record on the
    # same GPUs and driver is kept, nothing runs); the degraded node through model_server's check.
    second = play(tmp, {
        "healthy": prepare(tmp, "healthy", None, "allreduce-64xh100-8node-degraded.txt", 8, 2, ""),
        "degraded": prepare(tmp, "degraded", None, "allreduce-64xh100-8node-degraded.txt", 64, 2, "", entry="check"),
    }, "second")
    return {"first": first, "ran_first": ran_first, "records": records, "second": second,
            "healthy_after": record(tmp, "healthy"), "ran_second": (tmp / "healthy" / "ran").exists()}


def test_a_healthy_node_passes_and_keeps_its_numbers(runs):
    _, failed = runs["first"]
    assert "healthy" not in failed
    kept = runs["records"]["healthy"]
    assert kept["status"] == "pass" and kept["problems"] == []
    assert kept["allreduce"]["peak_busbw_gbps"] == 476.96 and kept["allreduce"]["gpus"] == 8
    assert kept["allreduce"]["min_busbw_gbps"] == 340
    assert kept["key"]["profile"] == "h200" and len(kept["key"]["gpus"]) == 8
    assert kept["key"]["gpus"][0].endswith(", 580.95.05")


def test_a_node_below_its_threshold_fails_naming_the_number_and_is_recorded_failed(runs):
    _, failed = runs["first"]
    assert "all-reduce bus bandwidth 320.57 GB/s at 8589934592 bytes across 64 GPUs is below the 340 GB/s" \
        in failed["degraded"]
    assert runs["records"]["degraded"]["status"] == "fail"


def test_a_dcgm_failure_fails_the_node_naming_the_test(runs):
    _, failed = runs["first"]
    assert "dcgmi diag -r 3: GPU Memory (Hardware) failed on every GPU" in failed["dcgmfail"]
    assert runs["records"]["dcgmfail"]["dcgm"]["failed"] == ["GPU Memory"]


def test_busy_gpus_and_bad_settings_are_refused_before_any_test_runs(runs):
    _, failed = runs["first"]
    assert "are in use by 48213, python3" in failed["busy"]
    assert "gpu_burnin_timeout_s must be a whole number of seconds from 60 to 86400, not 10" in failed["badtimeout"]
    assert "/nonexistent/dcgmi is not on nodcgm: install NVIDIA's DCGM" in failed["nodcgm"]
    for name in ("busy", "badtimeout", "nodcgm"):
        assert not runs["ran_first"][name] and runs["records"][name] is None
    assert runs["ran_first"]["healthy"]


def test_a_passing_record_is_kept_and_a_failed_one_stops_the_model_server(runs):
    runner, failed = runs["second"]
    assert "healthy" not in failed and not runs["ran_second"]
    assert runner.stats["changed"].get("healthy", 0) == 0   # idempotent: nothing tested, nothing written
    assert runs["healthy_after"] == runs["records"]["healthy"]
    assert "degraded failed its GPU burn-in" in failed["degraded"]
    assert "320.57 GB/s" in failed["degraded"]
