"""filter_plugins/gpu_burnin.py (the burn-in gate's reading and judging) against the real outputs
of nccl-tests' all_reduce_perf and DCGM's dcgmi diag recorded in tests/fixtures/burnin (each
file's `#! ` header names the machine and the public thread it was posted in), and the matrix's
per-GPU-type thresholds (roles/serving/vars/main.yml, gpu.burnin)."""
import os

import pytest
from ansible.errors import AnsibleFilterError

from helpers import ROOT, hardware_matrix, load_source

burnin = load_source("mm3_gpu_burnin_filters", os.path.join(ROOT, "filter_plugins", "gpu_burnin.py"))
FIXTURES = os.path.join(ROOT, "tests", "fixtures", "burnin")
MATRIX = hardware_matrix()
NVLINK4 = MATRIX["h200"]["gpu"]["burnin"]


def output(name):
    """A fixture as the tool printed it (its `#! ` provenance header left out)."""
    with open(os.path.join(FIXTURES, name)) as handle:
        return "".join(line for line in handle if not line.startswith("#! "))


def judge(allreduce=None, dcgm=None, gpus=8, floor=None, level=2):
    return burnin.verdict(burnin.allreduce(output(allreduce)) if allreduce else None,
                          burnin.dcgm(output(dcgm)) if dcgm else None, gpus,
                          burnin.threshold(floor if floor is not None else NVLINK4), level)


def test_a_healthy_8_gpu_h200_node_passes_its_all_reduce():
    read = burnin.allreduce(output("allreduce-8xh200-pass.txt"))
    assert (read["gpus"], read["peak_bytes"], read["peak_busbw"], read["avg_busbw"]) == (8, 8589934592, 476.96, 476.967)
    assert read["wrong"] == [] and read["out_of_bounds"] == 0
    assert judge("allreduce-8xh200-pass.txt") == {"status": "pass", "problems": []}


def test_a_degraded_fabric_is_refused_naming_the_number_and_the_threshold():
    """The 8-node H100 run of NVIDIA/nccl-tests#309 fell to 320 GB/s where 2 of its nodes reach 466."""
    healthy = burnin.allreduce(output("allreduce-16xh100-2node-pass.txt"))
    degraded = burnin.allreduce(output("allreduce-64xh100-8node-degraded.txt"))
    assert (healthy["gpus"], healthy["peak_busbw"]) == (16, 466.65)
    assert (degraded["gpus"], degraded["peak_busbw"]) == (64, 320.57)
    assert judge("allreduce-16xh100-2node-pass.txt", gpus=16)["status"] == "pass"
    result = judge("allreduce-64xh100-8node-degraded.txt", gpus=64)
    assert result["status"] == "fail"
    assert result["problems"] == [
        "all-reduce bus bandwidth 320.57 GB/s at 8589934592 bytes across 64 GPUs is below the 340 GB/s threshold (%s): "
        "check the NVLink state (nvidia-smi nvlink -s, nvidia-smi -q Fabric) and that no GPU is throttled "
        "(nvidia-smi -q -d PERFORMANCE)" % NVLINK4["source"]]


def test_a_run_on_fewer_gpus_than_the_profile_is_refused():
    result = judge("allreduce-8xh200-pass.txt", gpus=4)
    assert result["status"] == "fail"
    assert result["problems"] == ["all_reduce_perf ran on 8 GPUs, the profile has 4: every GPU must take part"]


def test_wrong_results_and_an_empty_run_are_refused():
    text = output("allreduce-8xh200-pass.txt")
    corrupt = text.replace("476.96      0    31516", "476.96      3    31516")
    assert corrupt != text
    result = burnin.verdict(burnin.allreduce(corrupt), None, 8, burnin.threshold(NVLINK4))
    assert result["status"] == "fail" and "wrong results at 8589934592 bytes" in result["problems"][0]
    empty = burnin.verdict(burnin.allreduce("docker: Error response from daemon: could not select device driver"),
                           None, 8, burnin.threshold(NVLINK4))
    assert empty["status"] == "fail" and "printed no result rows" in empty["problems"][0]


def test_dcgm_failures_name_the_test_the_gpus_and_dcgm_s_words():
    """NVIDIA/nccl-tests#264: GPU Memory fails on every GPU with cuInit 'system not yet initialized'."""
    read = burnin.dcgm(output("dcgmi-diag-r3-fail.txt"))
    assert read["version"] == "3.3.8" and read["ran"]
    assert [(t["name"], t["result"], t["gpus"]) for t in read["failed"]] == [("GPU Memory", "Fail", "all")]
    assert len(read["failed"][0]["messages"]) == 8
    assert read["failed"][0]["messages"][0].startswith(
        "GPU 0 Error using CUDA API cuInit Check DCGM and system logs for errors. Reset GPU. Restart DCGM.")
    assert "Unable to initialize CUDA library: 'system not yet initialized'" in read["failed"][0]["messages"][0]
    result = judge(dcgm="dcgmi-diag-r3-fail.txt", level=3)
    assert result["status"] == "fail"
    assert result["problems"][0].startswith("dcgmi diag -r 3: GPU Memory (Hardware) failed on every GPU: GPU 0 Error")
    assert result["problems"][0].endswith("(and 7 more messages)")


def test_a_deployment_failure_is_a_failure():
    """The H200 how-to's dcgmi diag -r 1: persistence mode off fails the Deployment checks."""
    read = burnin.dcgm(output("dcgmi-diag-r1-fail.txt"))
    assert [t["name"] for t in read["failed"]] == ["Persistence Mode"]
    assert read["failed"][0]["messages"][0].startswith(
        "Persistence mode for GPU 0 is currently disabled. The DCGM diagnostic requires peristence mode to be enabled.")
    result = judge(dcgm="dcgmi-diag-r1-fail.txt", level=1)
    assert result["status"] == "fail" and "Persistence Mode (Deployment) failed on the node" in result["problems"][0]


def test_dcgm_that_did_not_run_is_a_failure():
    result = burnin.verdict(None, burnin.dcgm("Error: unable to establish a connection to the specified host: "
                                              "localhost\nError: Unable to connect to host engine. Host engine "
                                              "connection invalid/disconnected."), 8, burnin.threshold(NVLINK4), 2)
    assert result["status"] == "fail" and "did not complete" in result["problems"][0]


def test_the_threshold_comes_from_the_matrix_or_a_typed_site_override():
    assert burnin.threshold(NVLINK4)["min_busbw"] == 340
    assert burnin.threshold(NVLINK4, 400) == {"min_busbw": 400, "reference": None,
                                              "source": "gpu_burnin_allreduce_min_busbw_gbps (site)"}
    assert burnin.threshold(NVLINK4, "450.5")["min_busbw"] == 450.5
    for bad in ("fast", True, -1, float("nan"), [400]):
        with pytest.raises(AnsibleFilterError, match="gpu_burnin_allreduce_min_busbw_gbps must be a number"):
            burnin.threshold(NVLINK4, bad)
    unknown = burnin.verdict(burnin.allreduce(output("allreduce-8xh200-pass.txt")), None, 8, burnin.threshold(None))
    assert unknown["status"] == "fail" and "no all-reduce threshold" in unknown["problems"][0]


@pytest.mark.parametrize("profile", sorted(p for p, e in MATRIX.items() if e["gpu"]["vendor"] == "nvidia"))
def test_every_nvidia_profile_of_the_matrix_has_a_sourced_threshold(profile):
    floor = MATRIX[profile]["gpu"].get("burnin")
    assert floor, "%s has no gpu.burnin: the burn-in gate would refuse every node of it" % profile
    assert isinstance(floor["min_busbw_gbps"], (int, float)) and floor["min_busbw_gbps"] > 0
    assert "nccl-tests#212" in floor["source"]


@pytest.mark.parametrize("args, phrase", [
    ((7, True, "", ["sh"], 3600, "nvidia"), "gpu_burnin_dcgm_level must be 1, 2, 3 or 4"),
    (("2", True, "nccl-tests:latest", [], 3600, "nvidia"), "gpu_burnin_allreduce_image is 'nccl-tests:latest'"),
    ((2, True, "", [], 3600, "nvidia"), "pinned by digest"),
    ((2, False, "", ["all_reduce_perf", "-g\n8"], 3600, "nvidia"), "holds a control character"),
    ((2, False, "", "all_reduce_perf -g 8", 3600, "nvidia"), "must be a list of non-empty strings"),
    ((2, False, "", [], 10, "nvidia"), "gpu_burnin_timeout_s must be a whole number of seconds from 60"),
    ((2, False, "", [], 3600, "amd"), "gpu_burnin tests NVIDIA GPUs"),
])
def test_settings_that_cannot_work_are_refused_naming_the_variable(args, phrase):
    problems = burnin.input_problems(*args)
    assert any(phrase in p for p in problems), problems


def test_good_settings_pass():
    digest = "registry.local/nccl-tests@sha256:" + "a" * 64
    assert burnin.input_problems(2, True, digest, [], 3600, "nvidia") == []
    assert burnin.input_problems("4", True, "", ["sh", "-c", "all_reduce_perf -g 8"], "600", "nvidia") == []


def test_a_level_whose_tests_beyond_deployment_did_not_run_is_no_pass():
    """Asked for -r 2, a table that holds only the Deployment checks tested no hardware (DCGM skips
    its plugins when they are not allowed, NVIDIA/DCGM#55): the recorded -r 1 table, judged as -r 2."""
    read = burnin.dcgm(output("dcgmi-diag-r1-fail.txt"))
    assert read["ran_beyond_deployment"] == []
    assert not any("beyond the deployment" in p for p in judge(dcgm="dcgmi-diag-r1-fail.txt", level=1)["problems"])
    assert any("dcgmi diag -r 2 ran no test beyond the deployment checks" in p
               for p in judge(dcgm="dcgmi-diag-r1-fail.txt", level=2)["problems"])


def test_a_test_stopped_by_its_timeout_is_named():
    result = burnin.verdict(burnin.allreduce(output("allreduce-8xh200-pass.txt")), None, 8, burnin.threshold(NVLINK4),
                            timeout_s=600, timed_out=["all_reduce_perf"])
    assert result["status"] == "fail"
    assert result["problems"][0].startswith("a test was stopped after gpu_burnin_timeout_s (600 s): all_reduce_perf;")
