"""Golden tests of playbooks/plan.yml: for every matrix entry the rendered docker run command
is compared with tests/golden/<profile>.cmd; for b200 it must also equal the seed's offline
command flag for flag. Real ansible-playbook runs on localhost, into a temporary plan dir.

Regenerate the goldens after a reviewed matrix change: UPDATE_GOLDEN=1 pytest tests/test_plan_golden.py
"""
import json
import os
import pathlib
import shlex
import subprocess

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
GOLDEN = ROOT / "tests" / "golden"
NINE = ["b200", "b300", "gb300", "gb200", "h200", "mi355x", "mi350x", "mi325x", "mi300x"]
VLLM = ["h200", "cpu-lab"]
CMD = pathlib.Path("etc/minimax-m3/docker-run.cmd")
UNIT = pathlib.Path("etc/systemd/system/minimax-m3.service")
CONFIG = pathlib.Path("etc/minimax-m3/engine.yaml")
SECRET = "plan-test-key-5d1e0b-never-in-a-plan"

# The seed's offline start command (shared/seeds/000_*.txt, "Weights, cache, and offline
# deployment"), verbatim.
SEED_OFFLINE = r"""
docker run --rm --name minimax-m3 \
--gpus all \
--shm-size 32g \
--ipc=host \
-p 127.0.0.1:30000:30000 \
-e HF_HUB_OFFLINE=1 \
-v /data/models/MiniMax-M3-MXFP8:/models/MiniMax-M3-MXFP8:ro \
lmsysorg/sglang@sha256:de63ac56df5d7b064451e21147eaab89634a02332d830ca8c01cb8c033b3a78f \
sglang serve \
--trust-remote-code \
--model-path /models/MiniMax-M3-MXFP8 \
--reasoning-parser auto \
--tool-call-parser auto \
--tp 8 \
--attention-backend fa4 \
--mm-attention-backend flashinfer_cudnn \
--moe-runner-backend deep_gemm \
--chunked-prefill-size 8192 \
--mem-fraction-static 0.65 \
--host 0.0.0.0 \
--port 30000
"""


def tokens(text):
    return shlex.split(text.replace("\\\n", " "))


def run_plan(plan_dir, *extra):
    env = dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), ANSIBLE_NOCOLOR="1",
               PATH=str(ROOT / ".venv" / "bin") + os.pathsep + os.environ.get("PATH", ""))
    # `-i localhost,`: the matrix defaults, not the choices of the inventory ansible.cfg names
    args = ["ansible-playbook", "-i", "localhost,", str(ROOT / "playbooks" / "plan.yml"),
            "-e", "plan_dir=%s" % plan_dir]
    for item in extra:
        args += ["-e", json.dumps(item) if isinstance(item, dict) else item]
    proc = subprocess.run(args, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    return proc.returncode, proc.stdout + proc.stderr


def unit_exec(unit_text, key):
    """The argv of a systemd Exec line (continuations joined)."""
    joined = unit_text.replace("\\\n", " ")
    for line in joined.splitlines():
        if line.startswith(key + "="):
            return shlex.split(line[len(key) + 1:])
    return None


@pytest.fixture(scope="module")
def plan_all(tmp_path_factory):
    plan_dir = tmp_path_factory.mktemp("plan-sglang")
    rc, out = run_plan(plan_dir, "serving_profile=all")
    assert rc == 0, out[-4000:]
    return plan_dir, out


@pytest.fixture(scope="module")
def plan_vllm(tmp_path_factory):
    plan_dir = tmp_path_factory.mktemp("plan-vllm")
    rc, out = run_plan(plan_dir, "serving_profile=all", "serving_engine=vllm")
    assert rc == 0, out[-4000:]
    return plan_dir, out


def check_golden(rendered, golden):
    if os.environ.get("UPDATE_GOLDEN") == "1":
        golden.write_text(rendered.read_text())
    assert golden.exists(), "missing golden %s (UPDATE_GOLDEN=1 to create it)" % golden
    assert tokens(rendered.read_text()) == tokens(golden.read_text())


@pytest.mark.parametrize("profile", NINE)
def test_sglang_command_matches_golden(plan_all, profile):
    check_golden(plan_all[0] / profile / CMD, GOLDEN / ("%s.cmd" % profile))


@pytest.mark.parametrize("profile", VLLM)
def test_vllm_command_matches_golden(plan_vllm, profile):
    check_golden(plan_vllm[0] / profile / CMD, GOLDEN / ("%s-vllm.cmd" % profile))


# The least privilege every GPU engine container gets on top of the seed's command (issue 18,
# roles/serving/vars/main.yml serving_engines.*.container), written out here independently of
# the matrix: a hardening option dropped from the data or the renderer fails these tests.
GPU_HARDENING = ["--security-opt", "no-new-privileges", "--cap-drop", "ALL", "--pids-limit", "16384"]
LAB_HARDENING = ["--security-opt", "no-new-privileges", "--cap-drop", "ALL", "--pids-limit", "1024",
                 "--read-only", "--tmpfs", "/tmp:rw,nosuid,nodev,size=1g,mode=1777", "--user", "65534:65534"]


def without_hardening(cmd, hardening):
    """The command with the hardening options (right after --ipc=host) taken out."""
    at = cmd.index("--ipc=host") + 1
    assert cmd[at:at + len(hardening)] == hardening, cmd
    return cmd[:at] + cmd[at + len(hardening):]


def test_b200_golden_is_the_seed_offline_command_flag_for_flag_plus_least_privilege(plan_all):
    for cmd in (tokens((GOLDEN / "b200.cmd").read_text()), tokens((plan_all[0] / "b200" / CMD).read_text())):
        assert without_hardening(cmd, GPU_HARDENING) == tokens(SEED_OFFLINE)


@pytest.mark.parametrize("profile", NINE)
def test_every_gpu_engine_container_runs_with_least_privilege(plan_all, profile):
    cmd = tokens((plan_all[0] / profile / CMD).read_text())
    without_hardening(cmd, GPU_HARDENING)
    unit = (plan_all[0] / profile / UNIT).read_text().replace("\\\n", " ")
    gates = [shlex.split(line[len("ExecStartPre="):]) for line in unit.splitlines()
             if line.startswith("ExecStartPre=") and "-msa-gate" in line]
    assert len(gates) == (1 if profile in ("b200", "b300", "gb300", "gb200") else 0)
    for gate in gates:
        without_hardening(gate, GPU_HARDENING)  # the MSA gate runs as the server does


def test_lab_engine_runs_as_nobody_on_a_read_only_root(plan_vllm):
    cmd = tokens((plan_vllm[0] / "cpu-lab" / CMD).read_text())
    without_hardening(cmd, LAB_HARDENING)
    assert "HOME=/tmp" in cmd  # vLLM's ~/.cache lands on the tmpfs
    without_hardening(tokens((plan_vllm[0] / "h200" / CMD).read_text()), GPU_HARDENING)


@pytest.mark.parametrize("profile", NINE)
def test_unit_rate_limits_its_journal(plan_all, profile):
    unit = (plan_all[0] / profile / UNIT).read_text()
    assert "LogRateLimitIntervalSec=30s" in unit and "LogRateLimitBurst=2000" in unit


@pytest.mark.parametrize("profile", NINE)
def test_unit_runs_exactly_the_planned_command(plan_all, profile):
    unit = (plan_all[0] / profile / UNIT).read_text()
    cmd = tokens((plan_all[0] / profile / CMD).read_text())
    start = unit_exec(unit, "ExecStart")
    assert start[0] == "/usr/bin/docker" and start[1:] == cmd[1:]
    assert "Restart=on-failure" in unit
    assert "ExecStop=/usr/bin/docker stop --time 60 minimax-m3" in unit
    # only the plan's files, at their node paths: nothing else is written
    files = sorted(str(p.relative_to(plan_all[0] / profile))
                   for p in (plan_all[0] / profile).rglob("*") if p.is_file())
    assert files == sorted([str(CMD), str(UNIT)])


@pytest.mark.parametrize("profile", NINE)
def test_msa_gate_only_where_the_matrix_asks(plan_all, profile):
    unit = (plan_all[0] / profile / UNIT).read_text()
    gated = profile in ("b200", "b300", "gb300", "gb200")
    assert ("--name minimax-m3-msa-gate" in unit.replace("\\\n", " ").replace("    ", " ")) is gated


def test_plan_prints_status_and_blockers(plan_all):
    out = " ".join(plan_all[1].split()).replace("''", "'")
    assert "profile: b200 - 8 x NVIDIA B200" in out
    assert "GPUs: 8 x B200 (nvidia), TP 8" in out
    assert "more than 444 GB free" in out and "more than 854 GB free" in out
    assert "weights: MiniMaxAI/MiniMax-M3-MXFP8 @ c5454eb03678d8710e54a4e0fc681b9f3b4a3dba" in out
    assert "exposed: http://127.0.0.1:30000/health" in out
    assert "blockers: none" in out
    assert "image lmsysorg/sglang has no digest (tag family dev-cu13-minimax-m3)" in out
    assert "profile 'gb200' has status 'inferred'" in out


def test_keyed_plan_mounts_config_without_the_key(tmp_path):
    rc, out = run_plan(tmp_path, {"serving_profile": "b200", "serving_bind_address": "0.0.0.0",
                                  "serving_api_key": SECRET})
    assert rc == 0, out[-4000:]
    cmd = tokens((tmp_path / "b200" / CMD).read_text())
    assert cmd[cmd.index("-p") + 1] == "0.0.0.0:30000:30000"
    assert "/etc/minimax-m3/engine.yaml:/etc/model-server/engine.yaml:ro" in cmd
    assert cmd[-2:] == ["--config", "/etc/model-server/engine.yaml"]
    config = (tmp_path / "b200" / CONFIG)
    assert config.exists() and oct(config.stat().st_mode & 0o777) == "0o600"
    assert "api-key:" in config.read_text()
    assert SECRET not in out
    for path in (tmp_path / "b200").rglob("*"):
        if path.is_file():
            assert SECRET not in path.read_text(), path


def test_strict_plan_fails_only_with_blockers(tmp_path):
    rc, out = run_plan(tmp_path, "serving_profile=b300", "plan_strict=true")
    assert rc != 0 and "plan_strict: 1 profile(s) blocked: b300" in " ".join(out.split())
    assert (tmp_path / "b300" / CMD).exists()  # rendered all the same
    rc, out = run_plan(tmp_path, "serving_profile=b200", "plan_strict=true")
    assert rc == 0, out[-4000:]
