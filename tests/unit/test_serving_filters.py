"""Unit tests of the pure filters behind the serving and model_server roles
(filter_plugins/serving.py, filter_plugins/model_server.py), against the real matrix."""
import pathlib
import sys

import pytest
import yaml

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "filter_plugins"))

import model_server as ms  # noqa: E402
import serving  # noqa: E402
from helpers import serving_args  # noqa: E402

VARS = yaml.safe_load((ROOT / "roles" / "serving" / "vars" / "main.yml").read_text())
DIGEST = "sha256:" + "0123456789abcdef" * 4
SEED_DIGEST = "sha256:de63ac56df5d7b064451e21147eaab89634a02332d830ca8c01cb8c033b3a78f"


def resolve(profile, **kw):
    return serving.serving_resolve(*serving_args(profile=profile, **kw))


def test_filters_registered():
    assert set(serving.FilterModule().filters()) == {
        "serving_resolve", "serving_blockers_text", "serving_engine_url",
        "serving_health_url", "serving_release_part", "serving_release_line"}
    assert set(ms.FilterModule().filters()) == {
        "model_server_docker_argv", "model_server_deploy_blockers", "model_server_env_sources",
        "model_server_hardening_args",
        "model_server_msa_gate_argv", "model_server_precompile_argv", "model_server_precompile_steps",
        "model_server_invocation",
        "model_server_shell_join", "model_server_helper_files",
        "model_server_systemd_join", "model_server_k8s_manifests", "model_server_k8s_problems",
        "model_server_k8s_release_trust", "model_server_k8s_yaml",
        "model_server_release_trust_text"}


def test_merge_is_recursive_and_replaces_lists():
    base = {"gpu": {"count": 8, "vendor": "nvidia"}, "capabilities": ["text", "image"]}
    merged = serving.merge(base, {"gpu": {"count": 4}, "capabilities": ["text"]})
    assert merged == {"gpu": {"count": 4, "vendor": "nvidia"}, "capabilities": ["text"]}
    assert base["gpu"]["count"] == 8  # the matrix entry is never modified


def test_apply_presets_replaces_in_place_and_appends():
    args = [["--tp", "8"], ["--mem-fraction-static", "0.65"], ["--flag"]]
    presets = {"a": {"--mem-fraction-static": "0.60"}, "b": {"--chunked-prefill-size": "2048"}}
    new, unknown = serving.apply_presets(args, presets, ["a", "b", "zzz"])
    assert new == [["--tp", "8"], ["--mem-fraction-static", "0.60"], ["--flag"],
                   ["--chunked-prefill-size", "2048"]]
    assert unknown == ["zzz"]
    assert args[1] == ["--mem-fraction-static", "0.65"]


def test_preset_order_last_wins():
    new, _ = serving.apply_presets([["--chunked-prefill-size", "8192"]], VARS["serving_tuning_presets"],
                                   ["oom_step3", "long_context"])
    assert new == [["--chunked-prefill-size", "16384"], ["--mem-fraction-static", "0.60"]]


@pytest.mark.parametrize("image,ref", [
    ({"repository": "r/x", "digest": DIGEST}, "r/x@" + DIGEST),
    ({"repository": "r/x", "digest": DIGEST, "local_id": True}, DIGEST),
    ({"repository": "r/x", "tag_family": "dev"}, "r/x:dev"),
    ({"repository": "r/x", "tag": "t1", "tag_family": "dev"}, "r/x:t1"),
    ({"repository": "r/x"}, "r/x:latest")])
def test_image_ref(image, ref):
    assert serving.image_ref(image) == ref


def test_every_matrix_row_resolves_with_a_pinned_image():
    for profile, entry in VARS["serving_matrix"].items():
        engine = sorted(entry["engines"])[-1] if "sglang" not in entry["engines"] else "sglang"
        spec = resolve(profile, engine=engine, image={"digest": DIGEST}, allow_inferred=True,
                       weights_revision="f" * 40)
        assert spec["blockers"] == [], (profile, spec["blockers"])
        assert spec["tp"] == entry["tp"]
        assert spec["device_args"] == VARS["serving_device_args"][entry["gpu"]["vendor"]]
        assert "video" not in spec["capabilities"]
        if entry["gpu"]["vendor"] == "amd":
            assert "image" not in spec["capabilities"]


def test_blockers_are_collected_not_raised():
    spec = resolve("mi325x", bind_address="0.0.0.0", port=0, capabilities=["video", "image"],
                   weights_revision="xyz", gpu_count=4)
    text = "\n".join(spec["blockers"])
    for fragment in ("serving_allow_inferred", "serving_gpu_count is 4", "'video'",
                     "'image' on ROCm", "not a 40-hex commit", "has no digest",
                     "not loopback", "serving_port is 0"):
        assert fragment in text, fragment
    assert serving.serving_blockers_text(spec).startswith("serving: profile 'mi325x' (sglang) refused:")


def test_unknown_profile_lists_valid_ones():
    spec = resolve("b201")
    assert spec["blockers"] == [
        "serving_profile 'b201' is not in the hardware matrix; valid profiles: " +
        ", ".join(sorted(VARS["serving_matrix"])) + ". Set serving_profile to one of them."]


def test_gpu_count_string_and_cpu_lab():
    assert not [b for b in resolve("b200", gpu_count="8")["blockers"] if "gpu_count" in b]
    assert [b for b in resolve("b200", gpu_count="7")["blockers"] if "gpu_count" in b]
    lab = resolve("cpu-lab", engine="vllm", gpu_count=0, image={"digest": DIGEST},
                  weights_revision="a" * 40)
    assert lab["blockers"] == []


def test_tp_flag_must_agree_with_tp():
    spec = resolve("b200", profile_overrides={"tp": 4})
    assert any("tp 4 but its sglang flags set 8" in b for b in spec["blockers"])


def test_tuning_refused_on_vllm():
    spec = resolve("h200", engine="vllm", image={"digest": DIGEST}, weights_revision="a" * 40,
                   tuning=["oom_step1"])
    assert any("serving_tuning presets are SGLang flags" in b for b in spec["blockers"])


SEED_OFFLINE = [
    "docker", "run", "--rm", "--name", "minimax-m3", "--gpus", "all", "--shm-size", "32g",
    "--ipc=host", "-p", "127.0.0.1:30000:30000", "-e", "HF_HUB_OFFLINE=1", "-v",
    "/data/models/MiniMax-M3-MXFP8:/models/MiniMax-M3-MXFP8:ro", "lmsysorg/sglang@" + SEED_DIGEST,
    "sglang", "serve", "--trust-remote-code", "--model-path", "/models/MiniMax-M3-MXFP8",
    "--reasoning-parser", "auto", "--tool-call-parser", "auto", "--tp", "8",
    "--attention-backend", "fa4", "--mm-attention-backend", "flashinfer_cudnn",
    "--moe-runner-backend", "deep_gemm", "--chunked-prefill-size", "8192",
    "--mem-fraction-static", "0.65", "--host", "0.0.0.0", "--port", "30000"]


SEED_MOUNT = "/data/models/MiniMax-M3-MXFP8:/models/MiniMax-M3-MXFP8:ro"
REVISION_MOUNT = ("/data/models/MiniMaxAI/MiniMax-M3-MXFP8/c5454eb03678d8710e54a4e0fc681b9f3b4a3dba"
                  ":/models/MiniMax-M3-MXFP8:ro")


# What every GPU engine container adds to the seed's command, after --ipc=host (issue 18).
LEAST_PRIVILEGE = ["--security-opt", "no-new-privileges", "--cap-drop", "ALL", "--pids-limit", "16384"]


def test_docker_argv_b200_is_the_seed_offline_command_plus_least_privilege():
    spec = resolve("b200")
    argv = ms.docker_run_argv(spec, config_host_path="/etc/minimax-m3/engine.yaml",
                              config_container_path="/etc/model-server/engine.yaml")
    at = SEED_OFFLINE.index("--ipc=host") + 1
    # The one other difference: the host side of the mount is the pinned revision's own
    # directory (one directory per revision), mounted where the seed mounts its copy.
    seed = [REVISION_MOUNT if a == SEED_MOUNT else a for a in SEED_OFFLINE]
    # And SGLang's --enable-metrics (monitoring scrapes /metrics), once, before --host.
    host = seed.index("--host")
    seed = seed[:host] + ["--enable-metrics"] + seed[host:]
    # And the engine's own output cap (serving_max_output_tokens), after HF_HUB_OFFLINE=1.
    offline = seed.index("HF_HUB_OFFLINE=1") + 1
    seed = seed[:offline] + ["-e", "SGLANG_MAX_NEW_TOKENS_LIMIT=32768"] + seed[offline:]
    assert argv == seed[:at] + LEAST_PRIVILEGE + seed[at:]


@pytest.mark.parametrize("container,expected", [
    ({}, []),
    ({"no_new_privileges": False, "cap_drop": [], "pids_limit": None}, []),
    ({"no_new_privileges": True, "cap_drop": ["ALL"], "cap_add": ["NET_BIND_SERVICE"], "pids_limit": 64,
      "read_only": True, "tmpfs": ["/tmp:size=1g", "/run"], "user": "1000:1000"},
     ["--security-opt", "no-new-privileges", "--cap-drop", "ALL", "--cap-add", "NET_BIND_SERVICE",
      "--pids-limit", "64", "--read-only", "--tmpfs", "/tmp:size=1g", "--tmpfs", "/run", "--user", "1000:1000"]),
])
def test_hardening_args(container, expected):
    assert ms.hardening_args(container) == expected


def test_container_env_joins_the_entry_env_sorted():
    spec = resolve("cpu-lab", engine="vllm", image={"digest": DIGEST}, weights_revision="a" * 40)
    argv = ms.docker_run_argv(spec)
    envs = [argv[i + 1] for i, a in enumerate(argv) if a == "-e"]
    assert envs == ["HF_HUB_OFFLINE=1", "HOME=/tmp", "VLLM_CPU_KVCACHE_SPACE=1"]
    assert argv[argv.index("--user") + 1] == "65534:65534" and "--read-only" in argv


@pytest.mark.parametrize("override,needle", [
    ({"pids_limit": "2048"}, "pids_limit is '2048': give a whole number"),
    ({"pids_limit": True}, "pids_limit is True"),
    ({"pids_limit": 0}, "pids_limit is 0"),
    ({"read_only": "yes"}, "read_only is 'yes': set true or false"),
    ({"no_new_privileges": None}, "no_new_privileges is None"),
    ({"cap_drop": "ALL"}, "cap_drop is 'ALL': give a list of capability names"),
    ({"cap_add": ["net_admin"]}, "cap_add is ['net_admin']"),
    ({"tmpfs": ["tmp"]}, "tmpfs is ['tmp']: give a list of absolute paths"),
    ({"tmpfs": ["/tmp\n[Service]"]}, "tmpfs is"),
    ({"user": "nobody"}, "user is 'nobody': give a numeric uid[:gid]"),
    ({"user": 1000}, "user is 1000"),
    ({"user": "1000\n"}, "user is '1000\\n'"),
    ({"tmpfs": ["/tmp\n"]}, "tmpfs is"),
    ({"env": {"HOME": "/tmp\nExecStartPre=/bin/true"}}, "env is"),
    ({"env": {"1BAD": "x"}}, "env is"),
])
def test_container_settings_refused_with_the_fix(override, needle):
    spec = resolve("b200", profile_overrides={"engines": {"sglang": {"container": override}}})
    found = [b for b in spec["blockers"] if "serving_profile_overrides.engines.sglang.container." in b]
    assert len(found) == 1 and needle in found[0], spec["blockers"]


@pytest.mark.parametrize("profile,engine,flag", [("b200", "sglang", "--log-requests"),
                                                 ("h200", "vllm", "--enable-log-requests")])
def test_request_logging_refused_unless_allowed(profile, engine, flag):
    args = VARS["serving_matrix"][profile]["engines"][engine]["args"] + [[flag]]
    over = {"engines": {engine: {"args": args}}}
    kw = dict(engine=engine, image={"digest": DIGEST}, weights_revision="a" * 40, profile_overrides=over)
    refused = [b for b in resolve(profile, **kw)["blockers"] if "logs prompts or outputs" in b]
    assert len(refused) == 1 and flag in refused[0] and "serving_allow_request_logging" in refused[0]
    assert resolve(profile, allow_request_logging=True, **kw)["blockers"] == []


def test_msa_gate_runs_with_the_servers_least_privilege():
    spec = resolve("b200")
    argv = ms.msa_gate_argv(spec, ["python3", "-c", "print(1)"])
    at = argv.index("--ipc=host") + 1
    assert argv[at:at + len(LEAST_PRIVILEGE)] == LEAST_PRIVILEGE


def test_docker_argv_with_key_mounts_config_and_never_the_key():
    spec = resolve("b200", bind_address="0.0.0.0", api_key="k" * 8 + "7f3a9c1e5d2b4a60" * 2, api_key_defined=True)
    argv = ms.docker_run_argv(spec, config_host_path="/etc/minimax-m3/engine.yaml",
                              config_container_path="/etc/model-server/engine.yaml")
    assert argv[argv.index("-p") + 1] == "0.0.0.0:30000:30000"
    assert "/etc/minimax-m3/engine.yaml:/etc/model-server/engine.yaml:ro" in argv
    assert argv[-2:] == ["--config", "/etc/model-server/engine.yaml"]
    assert not [a for a in argv if "api-key" in a or "api_key" in a]


def test_docker_argv_amd_env_and_devices():
    spec = resolve("mi300x", image={"digest": DIGEST})
    argv = ms.docker_run_argv(spec)
    assert argv[5:11] == ["--device", "/dev/kfd", "--device", "/dev/dri", "--group-add", "video"]
    assert "--gpus" not in argv
    assert argv[argv.index("HF_HUB_OFFLINE=1") + 2] == "SGLANG_MAX_NEW_TOKENS_LIMIT=32768"
    assert argv[argv.index("HF_HUB_OFFLINE=1") + 4] == "SGLANG_USE_AITER=1"


def test_msa_gate_argv():
    spec = resolve("b200")
    argv = ms.msa_gate_argv(spec, ["python3", "-c", "print(1)"], docker_bin="/usr/bin/docker")
    assert argv[:5] == ["/usr/bin/docker", "run", "--rm", "--name", "minimax-m3-msa-gate"]
    assert "-p" not in argv and "-v" not in argv  # no JIT cache directory given: none mounted
    assert argv[-3:] == ["python3", "-c", "print(1)"]
    cached = ms.msa_gate_argv(spec, ["python3", "-c", "print(1)"], jit_cache_dir="/var/cache/j/ab")
    assert cached[cached.index("-v") + 1] == "/var/cache/j/ab:/var/cache/minimax-m3-jit"
    assert "SGLANG_JIT_CACHE_DIR=/var/cache/minimax-m3-jit/sglang/jit" in cached


def test_shell_join_round_trips():
    text = ms.shell_join(SEED_OFFLINE + ["--x", "a b'c"], breaks=["lmsysorg/sglang@" + SEED_DIGEST])
    assert text.startswith("docker run --rm --name minimax-m3 \\\n  --gpus all \\\n")
    assert ms.command_tokens(text) == SEED_OFFLINE + ["--x", "a b'c"]


@pytest.mark.parametrize("token,quoted", [
    ("--ipc=host", "--ipc=host"), ("50%", "50%%"), ("$HOME", '"$$HOME"'),
    ("a b", '"a b"'), ('say "hi"', '"say \\"hi\\""')])
def test_systemd_quote(token, quoted):
    assert ms.systemd_quote(token) == quoted


def test_served_model_name_when_the_engine_declares_it():
    engines = {k: dict(v) for k, v in VARS["serving_engines"].items()}
    engines["vllm"]["served_model_name_arg"] = "--served-model-name"
    spec = serving.serving_resolve(*serving_args(
        tables={"engines": engines}, profile="h200", engine="vllm", image={"digest": DIGEST},
        weights_revision="a" * 40))
    # positional model: `vllm serve MODEL` (--model is deprecated there)
    assert spec["command"][:5] == ["vllm", "serve", "/models/MiniMax-M3",
                                   "--served-model-name", "MiniMaxAI/MiniMax-M3"]


def test_local_tag_names_a_loaded_image_by_its_digest():
    digest = "sha256:" + "ab" * 32
    img = {"repository": "lmsysorg/sglang", "digest": digest}
    assert serving.image_local_tag(img) == "lmsysorg/sglang:pinned-" + "ab" * 32
    # No digest, or an image already pinned by its ID: nothing to bridge.
    assert serving.image_local_tag({"repository": "r", "tag": "lab"}) is None
    assert serving.image_local_tag({"repository": "r", "digest": digest, "local_id": True}) is None


@pytest.mark.parametrize("bind,url", [
    ("127.0.0.1", "http://127.0.0.1:30000/health"), ("0.0.0.0", "http://127.0.0.1:30000/health"),
    ("::", "http://127.0.0.1:30000/health"), ("10.0.0.5", "http://10.0.0.5:30000/health"),
    ("fd00::5", "http://[fd00::5]:30000/health"),
])
def test_the_health_url_a_probe_on_the_node_asks(bind, url):
    """One URL for model_server's readiness wait and diagnose's health read."""
    spec = {"bind_address": bind, "port": 30000, "health_path": "/health"}
    assert serving.health_url(spec) == url
    assert serving.engine_url(spec) == url[:-len("/health")]


def test_a_deployment_is_judged_by_what_the_unit_could_start_with():
    """model_server_deploy_blockers: the resolution's blockers, then what the unit's ExecStartPre
    re-check would refuse every start for (no manifest pin), the one list the plan, the rollout's
    plan and model_server judge by."""
    shipped = resolve("b200")
    assert shipped["blockers"] == []
    assert [b.split(":")[0] for b in ms.deploy_blockers(shipped)] == [
        "serving_weights_manifest_sha256 is not pinned for MiniMaxAI/MiniMax-M3-MXFP8@"
        "c5454eb03678d8710e54a4e0fc681b9f3b4a3dba"]
    assert ms.deploy_blockers(resolve("b200", weights_manifest_sha256="c" * 64)) == []
    refused = resolve("b300")
    assert ms.deploy_blockers(refused)[:len(refused["blockers"])] == refused["blockers"]


def test_the_plan_lists_every_variable_with_its_source():
    spec = resolve("mi300x", image={"digest": DIGEST})
    env = dict(ms.env_sources(spec))
    assert env["HF_HUB_OFFLINE=1"].startswith("seed:")
    assert env["SGLANG_USE_AITER=1"].endswith("(the profile's engine env)")
    lab = resolve("cpu-lab", engine="vllm", allow_unpinned_image=True)
    assert dict(ms.env_sources(lab))["HOME=/tmp"].startswith("the engine's container settings")


def test_a_vendors_own_container_options_are_data_with_their_source():
    """AMD's instructions add ptrace and an unconfined seccomp profile; the matrix records both,
    with their source and why they are not applied, for the plan of every AMD profile."""
    notes = resolve("mi300x", image={"digest": DIGEST})["container_notes"]
    assert [n["option"] for n in notes] == ["--cap-add=SYS_PTRACE", "--security-opt seccomp=unconfined"]
    assert all(n["applied"] is False and "rocm.docs.amd.com" in n["source"] and n["reason"] for n in notes)
    assert resolve("b200")["container_notes"] == []
