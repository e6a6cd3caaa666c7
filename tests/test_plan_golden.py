"""Golden tests of playbooks/plan.yml: for every matrix entry the rendered docker run command
is compared with tests/golden/<profile>.cmd (SGLang) and <profile>-vllm.cmd (vLLM), pinned the
way a deployment is (tests/conftest.py: the matrix's digest, else a stand-in one); for b200 it
must also equal the seed's offline command flag for flag (plus the named least-privilege and
JIT-cache additions). The profiles come from the hardware matrix (roles/serving/vars/main.yml):
a new entry is tested here at once and fails until its golden exists, and a golden that no
entry renders fails too. Real plan runs through ansible-runner on localhost (the session's one
run, fixture `plans` in tests/conftest.py); every rendered unit passes `systemd-analyze verify`;
a blocked profile exits non-zero and gets no unit.

Regenerate the goldens after a reviewed matrix change: UPDATE_GOLDEN=1 pytest tests/test_plan_golden.py
"""
import json
import os
import pathlib
import shlex
import shutil
import subprocess

import pytest
import yaml
from helpers import failures, matrix_profiles, run_playbook

from ansible_collections.mm3.shared.plugins.module_utils import release_signing as rs  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parents[1]
GOLDEN = ROOT / "tests" / "golden"
SGLANG = matrix_profiles("sglang")
VLLM = matrix_profiles("vllm")
MSA = matrix_profiles("sglang", msa_warmup=True)
CMD = pathlib.Path("etc/minimax-m3/docker-run.cmd")
UNIT = pathlib.Path("etc/systemd/system/minimax-m3.service")
CONFIG = pathlib.Path("etc/minimax-m3/engine.yaml")

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


def run_plan(plan_dir, extravars=None):
    """(rc, collapsed stdout, runner) of playbooks/plan.yml; `-i localhost,`: the matrix
    defaults, not the choices of the inventory ansible.cfg names."""
    runner, out = run_playbook("playbooks/plan.yml", plan_dir.parent / (plan_dir.name + "-runner"),
                               extravars=dict(extravars or {}, plan_dir=str(plan_dir)))
    return runner.rc, out, runner


def unit_exec(unit_text, key):
    """The argv of a systemd Exec line (continuations joined)."""
    joined = unit_text.replace("\\\n", " ")
    for line in joined.splitlines():
        if line.startswith(key + "="):
            return shlex.split(line[len(key) + 1:])
    return None


def golden_cmd(profile, engine):
    """tests/golden/<profile>.cmd for SGLang (the seed's engine), <profile>-<engine>.cmd otherwise."""
    return GOLDEN / ("%s.cmd" % profile if engine == "sglang" else "%s-%s.cmd" % (profile, engine))


def check_golden(rendered, golden):
    if os.environ.get("UPDATE_GOLDEN") == "1":
        golden.write_text(rendered.read_text())
    assert golden.exists(), "missing golden %s (UPDATE_GOLDEN=1 to create it)" % golden
    assert tokens(rendered.read_text()) == tokens(golden.read_text())


@pytest.mark.parametrize("profile", SGLANG)
def test_sglang_command_matches_golden(plans, profile):
    check_golden(plans["pinned"].dir / profile / CMD, golden_cmd(profile, "sglang"))


@pytest.mark.parametrize("profile", VLLM)
def test_vllm_command_matches_golden(plans, profile):
    check_golden(plans["pinned-vllm"].dir / profile / CMD, golden_cmd(profile, "vllm"))


def test_every_golden_is_the_command_of_a_matrix_profile():
    """A golden that no entry renders (a renamed or removed profile, an engine an entry lost)
    fails here; a missing one fails its profile's test above."""
    expected = {golden_cmd(p, "sglang").name for p in SGLANG} | {golden_cmd(p, "vllm").name for p in VLLM}
    assert {p.name for p in GOLDEN.glob("*.cmd")} == expected


# The tag families the matrix names for unpinned images, written out here: a lab plan
# (serving_allow_unpinned_image) runs `repository:tag_family`, and names the JIT cache IMAGE-ID
# until the node knows the image it holds (roles/model_server/vars/main.yml).
UNPINNED = {"h200": "lmsysorg/sglang:dev-cu12-minimax-m3", "b300": "lmsysorg/sglang:dev-cu13-minimax-m3"}


@pytest.mark.parametrize("profile", sorted(UNPINNED))
def test_an_unpinned_image_runs_its_tag_family(plans, profile):
    cmd = tokens((plans["unpinned"].dir / profile / CMD).read_text())
    golden = tokens(golden_cmd(profile, "sglang").read_text())
    pin = plans["pinned"].inputs[profile]["serving_image"]["digest"]
    expected = [UNPINNED[profile] if t == "lmsysorg/sglang@" + pin else
                t.replace("/jit/" + pin.split(":")[1] + ":", "/jit/IMAGE-ID:") for t in golden]
    assert expected != golden and cmd == expected


# The least privilege every GPU engine container gets on top of the seed's command (issue 18,
# roles/serving/vars/main.yml serving_engines.*.container), written out here independently of
# the matrix: a hardening option dropped from the data or the renderer fails these tests.
GPU_HARDENING = ["--security-opt", "no-new-privileges", "--cap-drop", "ALL", "--pids-limit", "16384"]
LAB_HARDENING = ["--security-opt", "no-new-privileges", "--cap-drop", "ALL", "--pids-limit", "1024",
                 "--read-only", "--tmpfs", "/tmp:rw,nosuid,nodev,size=1g,mode=1777", "--user", "65534:65534"]
# The seed's remedy for the MSA race, "the same image and cache" (issue 11): the JIT cache of the
# pinned digest, mounted read-write, and the kernels' cache variables pointed into it; with
# DeepGEMM's (SGLANG_DG_CACHE_DIR) and SGLang's cache root (SGLANG_CACHE_DIR), so that a restart
# finds the kernels the last start compiled (issue 34).
SEED_HEX = "de63ac56df5d7b064451e21147eaab89634a02332d830ca8c01cb8c033b3a78f"
B200_JIT_CACHE = [
    "-v", "/var/cache/minimax-m3/jit/%s:/var/cache/minimax-m3-jit" % SEED_HEX,
    "-e", "FLASHINFER_WORKSPACE_BASE=/var/cache/minimax-m3-jit",
    "-e", "MINFER_FMHA_CACHE_DIR=/var/cache/minimax-m3-jit/minfer/fmha_sm100",
    "-e", "SGLANG_CACHE_DIR=/var/cache/minimax-m3-jit/sglang",
    "-e", "SGLANG_DG_CACHE_DIR=/var/cache/minimax-m3-jit/deep_gemm",
    "-e", "SGLANG_JIT_CACHE_DIR=/var/cache/minimax-m3-jit/sglang/jit",
    "-e", "TORCHINDUCTOR_CACHE_DIR=/var/cache/minimax-m3-jit/inductor",
    "-e", "TRITON_CACHE_DIR=/var/cache/minimax-m3-jit/triton",
    "-e", "TVM_FFI_CACHE_DIR=/var/cache/minimax-m3-jit/tvm-ffi",
    "-e", "XDG_CACHE_HOME=/var/cache/minimax-m3-jit"]


def without_hardening(cmd, hardening):
    """The command with the hardening options (right after --ipc=host) taken out."""
    at = cmd.index("--ipc=host") + 1
    assert cmd[at:at + len(hardening)] == hardening, cmd
    return cmd[:at] + cmd[at + len(hardening):]


def without_jit_cache(cmd, cache):
    """The command with the JIT cache mount and variables (before the image) taken out."""
    at = cmd.index(cache[0], cmd.index("-v") + 2)
    assert cmd[at:at + len(cache)] == cache, cmd
    return cmd[:at] + cmd[at + len(cache):]


def without_metrics(cmd):
    """The command without SGLang's --enable-metrics (the monitoring role scrapes /metrics),
    which comes once, after the profile's flags and before --host."""
    at = cmd.index("--host") - 1
    assert cmd[at] == "--enable-metrics" and cmd.count("--enable-metrics") == 1, cmd
    return cmd[:at] + cmd[at + 1:]


def without_output_cap(cmd):
    """The command without SGLang's output cap (serving_max_output_tokens, issue 32), which comes
    right after the seed's HF_HUB_OFFLINE=1."""
    at = cmd.index("HF_HUB_OFFLINE=1") + 1
    assert cmd[at:at + 2] == ["-e", "SGLANG_MAX_NEW_TOKENS_LIMIT=32768"], cmd
    return cmd[:at] + cmd[at + 2:]


def test_b200_golden_is_the_seed_offline_command_plus_named_additions(plans):
    # The seed mounts its one copy; a node mounts the pinned revision's own directory
    # (<root>/<org>/<name>/<revision>) at the same place in the container.
    seed = [("/data/models/MiniMaxAI/MiniMax-M3-MXFP8/%s:/models/MiniMax-M3-MXFP8:ro" % ("b" * 40))
            if t == "/data/models/MiniMax-M3-MXFP8:/models/MiniMax-M3-MXFP8:ro" else t
            for t in tokens(SEED_OFFLINE)]
    for cmd in (tokens((GOLDEN / "b200.cmd").read_text()), tokens((plans["pinned"].dir / "b200" / CMD).read_text())):
        assert without_output_cap(without_metrics(without_jit_cache(without_hardening(cmd, GPU_HARDENING),
                                                                    B200_JIT_CACHE))) == seed


@pytest.mark.parametrize("profile", SGLANG)
def test_every_gpu_engine_container_runs_with_least_privilege(plans, profile):
    without_hardening(tokens((plans["pinned"].dir / profile / CMD).read_text()), GPU_HARDENING)


@pytest.mark.parametrize("profile", SGLANG)
def test_msa_entries_share_the_jit_cache_and_never_gate_in_the_unit(plans, profile):
    """The gate runs once per image from Ansible (model_server tasks/msa_gate.yml), never as an
    ExecStartPre that systemd would loop on; every profile mounts the image's kernel cache (issue
    34: restarts keep what a start compiled), and MSA entries share it with the gate."""
    unit = (plans["pinned"].dir / profile / UNIT).read_text()
    assert "msa-gate" not in unit.replace("msa_gate.yml", "")
    cmd = tokens((plans["pinned"].dir / profile / CMD).read_text())
    mounts = [cmd[i + 1] for i, token in enumerate(cmd) if token == "-v"]
    cached = [m for m in mounts if m.endswith(":/var/cache/minimax-m3-jit")]
    assert len(cached) == 1, mounts
    assert "# Kernel caches of this image, kept across restarts: " + cached[0].split(":")[0] in unit
    if profile in MSA:
        assert "SGLANG_JIT_CACHE_DIR=/var/cache/minimax-m3-jit/sglang/jit" in cmd
        assert "# JIT cache shared with it: " + cached[0].split(":")[0] in unit


def test_lab_engine_runs_as_nobody_on_a_read_only_root(plans):
    cmd = tokens((plans["pinned-vllm"].dir / "cpu-lab" / CMD).read_text())
    without_hardening(cmd, LAB_HARDENING)
    assert "HOME=/tmp" in cmd  # vLLM's ~/.cache lands on the tmpfs
    without_hardening(tokens((plans["pinned-vllm"].dir / "h200" / CMD).read_text()), GPU_HARDENING)


@pytest.mark.parametrize("profile", VLLM)
def test_vllm_passes_arguments_to_the_images_entrypoint(plans, profile):
    """vllm/vllm-openai runs ENTRYPOINT ["vllm", "serve"]: after the image come the model
    (positional) and the flags, never a second `vllm serve` (issue 11)."""
    cmd = tokens((plans["pinned-vllm"].dir / profile / CMD).read_text())
    image = next(i for i, token in enumerate(cmd) if token.startswith(("vllm/vllm-openai", "mm3-lab/vllm-cpu")))
    assert cmd[image + 1].startswith("/models/") and cmd[image + 2] == "--served-model-name"
    assert "serve" not in cmd and "--model" not in cmd and "--entrypoint" not in cmd


@pytest.mark.parametrize("profile", SGLANG)
def test_unit_rate_limits_its_journal(plans, profile):
    unit = (plans["pinned"].dir / profile / UNIT).read_text()
    assert "LogRateLimitIntervalSec=30s" in unit and "LogRateLimitBurst=2000" in unit


@pytest.mark.parametrize("profile", SGLANG)
def test_unit_runs_exactly_the_planned_command(plans, profile):
    plan_dir = plans["pinned"].dir / profile
    unit = (plan_dir / UNIT).read_text()
    cmd = tokens((plan_dir / CMD).read_text())
    start = unit_exec(unit, "ExecStart")
    assert start[0] == "/usr/bin/docker" and start[1:] == cmd[1:]
    assert "Restart=on-failure" in unit
    assert "ExecStop=/usr/bin/docker stop --time 60 minimax-m3" in unit
    # only the plan's files, at their node paths, and the Kubernetes objects beside them
    # (tests/test_k8s_manifests.py reads them): nothing else is written
    files = sorted(str(p.relative_to(plan_dir)) for p in plan_dir.rglob("*") if p.is_file())
    assert files == sorted([str(CMD), str(UNIT), "k8s/minimax-m3.yaml", "release-part.json"])
    # The release part to sign is what the unit runs: the engine argv after the image, the image.
    part = json.loads((plan_dir / "release-part.json").read_text())
    image = next(i for i, token in enumerate(cmd) if token in part["images"])
    assert cmd[image + 1:] == part["argv"] and part["profile"] == profile and part["revision"] == "b" * 40
    # ... and the evaluation set verify.yml would judge it by: role serving_verify's default set,
    # bound by the digest of its content (a release signs its expected results)
    shipped = yaml.safe_load((ROOT / "evals" / "minimax-m3.yml").read_text())
    assert part["eval_set"] == {"name": "minimax-m3-core", "version": 1, "pass_threshold": 0.85,
                                "cases": len(shipped["cases"]), "sha256": rs.document_digest(shipped)}, part["eval_set"]
    # without a manifest pin the unit could not start (its ExecStartPre re-check compares with the
    # pin): no unit, the blocker says so; the Kubernetes objects are refused for it too
    unpinned = plans["defaults"].dir / "b200"
    assert sorted(str(p.relative_to(unpinned)) for p in unpinned.rglob("*") if p.is_file()) == sorted(
        ["BLOCKED", "k8s/BLOCKED"])
    assert "serving_weights_manifest_sha256 is not pinned" in (unpinned / "BLOCKED").read_text()


def test_unit_header_lines_stay_apart(plans):
    """Every header comment line is its own line (a Jinja block used to swallow a newline)."""
    header = [line for line in (plans["pinned"].dir / "b200" / UNIT).read_text().splitlines() if line.startswith("#")]
    assert any(line.startswith("# Image lmsysorg/sglang@sha256:") for line in header)
    assert any(line.startswith("# API on 127.0.0.1:30000") for line in header)
    assert all(line.count("# ") == 1 for line in header[:6]), header


def systemd_verify(tmp_path, units):
    """`systemd-analyze verify` of copies of `units` in which the docker client's path points
    at a stand-in executable, next to a STAND-IN docker.service, so the check does not depend
    on Docker being installed on the test machine. Returns the failures."""
    stub = tmp_path / "docker"
    stub.write_text("#!/bin/sh\nexit 0\n")
    stub.chmod(0o755)
    docker_unit = tmp_path / "docker.service"
    docker_unit.write_text("[Unit]\nDescription=STAND-IN docker.service\n[Service]\nExecStart=%s\n" % stub)
    failed = []
    for index, unit in enumerate(units):
        copy = tmp_path / ("minimax-m3-%d.service" % index)
        copy.write_text(unit.read_text().replace("/usr/bin/docker", str(stub)))
        proc = subprocess.run(["systemd-analyze", "verify", str(docker_unit), str(copy)],
                              capture_output=True, text=True, timeout=120)
        if proc.returncode != 0 or proc.stderr.strip():
            failed.append((str(unit), proc.stdout + proc.stderr))
    return failed


needs_systemd_analyze = pytest.mark.skipif(not shutil.which("systemd-analyze"),
                                           reason="systemd-analyze is not installed")


@needs_systemd_analyze
def test_systemd_analyze_verifies_every_unit_of_every_profile(plans, tmp_path):
    units = sorted(plans["pinned"].dir.glob("*/" + str(UNIT))) + sorted(plans["pinned-vllm"].dir.glob("*/" + str(UNIT)))
    assert len(units) == len(SGLANG) + len(VLLM), units
    assert systemd_verify(tmp_path, units) == []


@needs_systemd_analyze
def test_systemd_analyze_catches_an_injected_line(plans, tmp_path):
    """The check above can fail: a unit with a line injected through a newline is refused."""
    bad = tmp_path / "bad.service"
    bad.write_text((plans["pinned"].dir / "b200" / UNIT).read_text().replace(
        "Description=MiniMax-M3", "Description=x\n[Service]\nExecStartPre=/nonexistent/evil\nX=MiniMax-M3"))
    assert systemd_verify(tmp_path, [bad])


def test_plan_prints_requirements_sources_and_blockers(plans):
    out = " ".join(plans["defaults"].out.split()).replace("''", "'")
    assert "profile: b200 - 8 x NVIDIA B200" in out
    # every requirement with its source: the seed's, a vendor's (hosts.md) or the project's default
    assert "8 x B200 (nvidia), TP 8 [the seed's hardware matrix" in out
    assert ("NVIDIA driver >= 570.133.20 [the matrix's gpu.driver_floor / gpu.rocm_floor: NVIDIA's and AMD's "
            "published minimums") in out and "not the seed's (it publishes none)" in out
    assert "fabric nvlink5 [the matrix's gpu.fabric" in out
    # disk as preflight computes it: weights + image (40) + margin (50)
    assert ("disk 534.0 GB free on the filesystem of /data/models/MiniMaxAI/MiniMax-M3-MXFP8 = weights 444 GB"
            in out)
    assert "disk 944.0 GB free on the filesystem of /data/models/MiniMaxAI/MiniMax-M3 = weights 854 GB" in out
    # a revision change keeps the old revision until the new one serves: one more copy of the weights
    assert "978.0 GB to change revision (the old one serves until the new one does)" in out
    assert ("in /data/models/MiniMaxAI/MiniMax-M3-MXFP8/c5454eb03678d8710e54a4e0fc681b9f3b4a3dba "
            "(current/serving/previous links beside it)") in out
    assert "RAM >= 256 GB [project default preflight_ram_min_gb (the seed publishes no host-memory figure" in out
    assert "/dev/shm >= 32 GB [the seed: --ipc=host and --shm-size 32g" in out
    assert "port 30000/tcp free on 127.0.0.1 [serving_port" in out
    assert "ROCm >= 7.2" in out
    assert "weights: MiniMaxAI/MiniMax-M3-MXFP8 @ c5454eb03678d8710e54a4e0fc681b9f3b4a3dba" in out
    assert "manifest sha256 NOT PINNED: the first staging run prints it for review" in out
    assert "exposed: http://127.0.0.1:30000/health" in out
    assert "--attention-backend fa4 [seed]" in out and "--attention-backend fa4 [cookbook]" in out
    assert "flags from the seed's offline quickstart" in out
    # every flag and variable the engine gets, with its source: the project's own too
    assert "--enable-metrics [project: /metrics for monitoring" in out
    assert "--model-path /models/MiniMax-M3-MXFP8 [project: the verified weights" in out
    assert "--host 0.0.0.0 --port 30000 [seed:" in out
    assert "HF_HUB_OFFLINE=1 [seed: the offline start" in out
    assert "TRITON_CACHE_DIR=/var/cache/minimax-m3-jit/triton [project: the kernel cache" in out
    assert "container: --security-opt no-new-privileges --cap-drop ALL --pids-limit 16384" in out
    # b200 as shipped: the unit could not start without the manifest pin, so the plan says so
    assert ("serving_weights_manifest_sha256 is not pinned for MiniMaxAI/MiniMax-M3-MXFP8@"
            "c5454eb03678d8710e54a4e0fc681b9f3b4a3dba: the unit's ExecStartPre re-check refuses every start") in out
    assert "blockers: none" not in out
    assert "image lmsysorg/sglang has no digest (tag family dev-cu13-minimax-m3)" in out
    assert "profile 'gb200' has status 'inferred'" in out


def test_blocked_profiles_get_a_blocked_file_and_no_unit(plans):
    plan_dir = plans["defaults"].dir
    assert not (plan_dir / "b200" / UNIT).exists() and (plan_dir / "b200" / "BLOCKED").exists()
    for profile in ("b300", "gb200", "h200", "mi300x"):
        files = [p.name for p in (plan_dir / profile).rglob("*") if p.is_file()]
        assert files == ["BLOCKED"], (profile, files)
        assert "has no digest" in (plan_dir / profile / "BLOCKED").read_text()


@pytest.mark.parametrize("profile", ["b300", "b200"])
def test_a_blocked_plan_exits_non_zero(tmp_path, profile):
    """b300: its image is not pinned; b200 as shipped: its manifest is not (the unit's ExecStartPre
    would refuse every start, so the plan may not say "no blockers")."""
    rc, out, runner = run_plan(tmp_path / "p", {"serving_profile": profile})
    assert rc != 0
    assert "1 of 1 profile(s) blocked: %s" % profile in " ".join(str(m) for m in failures(runner).values())
    assert "BLOCKED" in [p.name for p in (tmp_path / "p" / profile).iterdir()]
    assert not (tmp_path / "p" / profile / UNIT).exists()


def test_a_profile_name_never_reaches_outside_the_plan_dir(plans):
    """-e serving_profile=../outside: refused by name, and the plan neither empties nor writes
    <plan_dir>/../outside (it used to remove it before the profile was checked)."""
    outside = plans.outside
    assert outside.read_text() == "not the plan's\n"
    assert sorted(p.name for p in outside.parent.iterdir()) == ["keep"]
    out = " ".join(plans["traversal"].out.split()).replace("''", "'")
    assert "serving_profile '../outside' is not in the hardware matrix" in out
    assert "files: none (not a profile of the hardware matrix)" in out


@pytest.mark.parametrize("variant", ["ipv6", "keyed"])
def test_an_unblocked_plan_exits_zero_without_plan_allow_blocked(plans, variant):
    """The session's run planned these b200 variants without plan_allow_blocked (the fixture
    asserts its rc == 0): an unblocked plan passes."""
    assert plans[variant].strict and list(plans[variant].inputs) == ["b200"]
    assert (plans[variant].dir / "b200" / UNIT).exists()
    assert not (plans[variant].dir / "b200" / "BLOCKED").exists()


def test_ipv6_is_shown_and_published_bracketed(plans, tmp_path):
    plan = plans["ipv6"].dir / "b200"
    assert "exposed: http://[::1]:30000/health" in plans["ipv6"].out
    cmd = tokens((plan / CMD).read_text())
    assert cmd[cmd.index("-p") + 1] == "[::1]:30000:30000"
    if shutil.which("systemd-analyze"):
        assert systemd_verify(tmp_path, [plan / UNIT]) == []


def test_keyed_plan_mounts_config_without_the_key(plans):
    plan = plans["keyed"].dir / "b200"
    key = plans["keyed"].inputs["b200"]["serving_api_key"]
    cmd = tokens((plan / CMD).read_text())
    assert cmd[cmd.index("-p") + 1] == "0.0.0.0:30000:30000"
    assert "/etc/minimax-m3/engine.yaml:/etc/model-server/engine.yaml:ro" in cmd
    assert cmd[-2:] == ["--config", "/etc/model-server/engine.yaml"]
    config = plan / CONFIG
    assert config.exists() and oct(config.stat().st_mode & 0o777) == "0o600"
    assert "api-key:" in config.read_text()
    assert key not in plans["keyed"].out


def test_no_secret_in_any_plan_file_or_the_output(plans):
    """Every key and password any variant was planned with (tests/conftest.py VARIANTS)."""
    secrets = {value for plan in plans.plans.values() for inputs in plan.inputs.values()
               for name, value in inputs.items() if name in ("serving_api_key", "weights_sync_password")}
    assert len(secrets) >= 3  # the k8s key, the rsync password, the b200 plan's key
    for secret in secrets:
        assert secret not in plans.out
    for path in plans.root.rglob("*"):
        if path.is_file():
            text = path.read_text(errors="replace")
            assert not [s for s in secrets if s in text], path
