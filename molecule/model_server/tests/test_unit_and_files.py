"""Host state of the model server node after converge and idempotence: the systemd unit (what it
runs, how it restarts, its journal limits), the engine config holding the API key, the weights
re-check installed beside its shared code, and the MSA gate's record. Read with testinfra over
`docker exec` (molecule/model_server/verify.yml runs this directory first; its plays check what
only Ansible shows: refusals and their messages, playbook outcomes).

Run: pytest molecule/model_server/tests (the scenario's node must exist: molecule converge).
"""
import json
import re
import shlex

import pytest

testinfra_hosts = ["docker://mm3-model-server-node"]


def test_the_unit_is_enabled_and_running(host, role):
    service = host.service(role["model_server_service_name"])
    assert service.is_enabled
    assert service.is_running


def test_the_unit_runs_docker(unit_text):
    assert "ExecStart=/usr/bin/docker run" in unit_text


def test_the_unit_runs_the_pinned_image(unit_text, image_id):
    assert image_id in unit_text


@pytest.mark.parametrize("part", [
    "-e HF_HUB_OFFLINE=1",  # the seed's offline form
    "--ipc=host",
    "--shm-size 32g",
    "--config /etc/model-server/engine.yaml",  # the key reaches the engine from a file
])
def test_the_unit_runs_the_seeds_offline_form(unit_text, part):
    assert part in unit_text


def test_the_unit_mounts_the_verified_revision_read_only(unit_text, node_vars):
    assert "-v %s:/models/tiny-m3:ro" % node_vars["lab_weights_dir"] in unit_text


def test_the_unit_publishes_the_api_on_loopback(unit_text, node_vars):
    assert "-p 127.0.0.1:%d:8000" % node_vars["serving_port"] in unit_text


def test_the_unit_restarts_on_failure(unit_text):
    assert "Restart=on-failure" in unit_text


def test_the_msa_gate_is_never_a_unit_step(unit_text):
    """The gate runs once per image from Ansible (tasks/msa_gate.yml), not in a loop under systemd."""
    assert "msa-gate" not in unit_text


def test_the_unit_mounts_the_jit_cache_the_gate_warmed(unit_text):
    assert "/var/cache/minimax-m3-jit" in unit_text


@pytest.mark.parametrize("line", ["LogRateLimitIntervalSec=30s", "LogRateLimitBurst=2000"])
def test_the_unit_rate_limits_what_the_engine_sends_to_the_journal(unit_text, line):
    assert re.search("^%s$" % line, unit_text, re.M)


def test_the_key_file_is_0600(host, config_file):
    assert host.file(config_file).mode == 0o600


def test_the_key_file_belongs_to_the_engines_user_alone(host, config_file):
    """The lab profile runs the engine as nobody (65534), which must read it; group root."""
    key_file = host.file(config_file)
    assert key_file.uid == 65534
    assert key_file.group == "root"


def test_the_key_file_holds_the_inventorys_key(host, config_file, node_vars):
    line = next(line for line in host.file(config_file).content_string.splitlines() if line.startswith("api-key:"))
    same = json.loads(line.split(":", 1)[1]) == node_vars["serving_api_key"]
    assert same  # not `==` in the assertion: pytest would print the key


def test_the_weights_recheck_is_installed_root_owned(host, role):
    check = host.file(role["model_server_libexec_dir"] + "/check_weights.py")
    assert (check.mode, check.user, check.group) == (0o755, "root", "root")


@pytest.mark.parametrize("name", ["__init__.py", "mm3/shared/plugins/module_utils/weights_common.py"])
def test_the_recheck_has_its_shared_code_beside_it(host, role, name):
    shared = host.file(role["model_server_libexec_dir"] + "/ansible_collections/" + name)
    assert (shared.mode, shared.user) == (0o644, "root")


def test_the_units_weights_recheck_passes_on_the_verified_weights(host, unit_text, role):
    """The first ExecStartPre, run by hand: it imports its shared code from the installed
    collection layout and finds the weights as verified."""
    joined = unit_text.replace("\\\n", " ")  # systemd's line continuations
    line = next(line for line in joined.splitlines() if line.startswith("ExecStartPre=" + role["model_server_python"]))
    argv = shlex.split(line[len("ExecStartPre="):])
    assert argv[1] == role["model_server_libexec_dir"] + "/check_weights.py"
    run = host.run(" ".join(["%s"] * len(argv)), *argv)
    assert run.rc == 0, run.stdout + run.stderr


def test_the_gate_passed_once_in_this_image(host, role, image_id):
    record = json.loads(host.file("%s/%s/.msa-gate.json" % (role["model_server_jit_cache_root"],
                                                             image_id.split(":")[1])).content_string)
    assert record["image_id"] == image_id
    assert "msa_available() = True" in record["output"]
    assert "--entrypoint" in record["command"] and "standin-engine" in record["command"]


def test_the_gate_warmed_the_cache_the_server_mounts(host, role, image_id):
    warm = host.file("%s/%s/standin-msa/warm" % (role["model_server_jit_cache_root"], image_id.split(":")[1]))
    assert warm.content_string == "compiled\n"


# The kernel caches (every profile) and the precompile step (tasks/cache.yml, tasks/precompile.yml):
# the stand-in's vLLM runs SGLang's DeepGEMM step (tasks/pin-standin.yml).
@pytest.fixture(scope="module")
def cache_dir(role, image_id):
    return "%s/%s" % (role["model_server_jit_cache_root"], image_id.split(":")[1])


def test_the_cache_belongs_to_the_engines_user(host, cache_dir):
    """The lab profile's engine runs as 65534:65534 on a read-only root: it writes only here."""
    cache = host.file(cache_dir)
    assert (cache.is_directory, cache.uid, cache.gid, cache.mode) == (True, 65534, 65534, 0o750)


@pytest.mark.parametrize("variable", ["VLLM_CACHE_ROOT=/var/cache/minimax-m3-jit/vllm",
                                      "TRITON_CACHE_DIR=/var/cache/minimax-m3-jit/triton",
                                      "SGLANG_DG_CACHE_DIR=/var/cache/minimax-m3-jit/deep_gemm"])
def test_the_unit_points_the_engines_caches_into_it(unit_text, cache_dir, variable):
    assert "-v %s:/var/cache/minimax-m3-jit" % cache_dir in unit_text
    assert "-e %s" % variable in unit_text


@pytest.fixture(scope="module")
def precompile_record(host, cache_dir):
    found = host.check_output("find %s -maxdepth 1 -name '.precompile-deep_gemm-*.json'", cache_dir).split()
    assert len(found) == 1, found
    return found[0]


def test_the_precompile_step_ran_once_for_this_image_and_gpu(host, precompile_record, image_id):
    record = json.loads(host.file(precompile_record).content_string)
    assert (record["step"], record["gpu"], record["image_id"]) == ("deep_gemm", "none", image_id)
    assert "DeepGEMM Kernels compilation finished successfully." in record["output"]
    assert record["command"][:5] == ["docker", "run", "--rm", "--name", "minimax-m3-precompile-deep_gemm"]
    assert "-p" not in record["command"]  # no port: the step's own server is never reachable


def test_the_precompiled_kernels_are_in_the_cache_the_server_mounts(host, cache_dir):
    """Written by the container's user where DeepGEMM caches them (<dir>/cache/kernel.<name>.<hash>)."""
    cubins = host.check_output("find %s/deep_gemm/cache -name kernel.cubin", cache_dir).split()
    assert len(cubins) == 3
    assert all(host.file(cubin).uid == 65534 for cubin in cubins)
