"""The engine's kernel caches and precompile steps (issue 34, part 2): every profile of both
engines mounts the image's cache with every cache variable of its engine pointed into it (the
unit and the pod alike); SGLang's DeepGEMM precompile applies to the deep_gemm profiles only,
read from the resolved command the way argparse reads it; its container is the server's minus
the port and the key; its record is per GPU model and engine arguments.

The variables each engine must get are written out here from the upstream sources (the
comments of roles/serving/vars/main.yml name them), not read from the data: a variable dropped
from `serving_engines.<engine>.jit_cache` fails these tests.
"""
import copy
import pathlib
import sys

import pytest
import yaml
from ansible.errors import AnsibleFilterError

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "filter_plugins"))

import model_server as ms  # noqa: E402
import serving  # noqa: E402
from helpers import matrix_profiles, serving_args  # noqa: E402

VARS = yaml.safe_load((ROOT / "roles" / "serving" / "vars" / "main.yml").read_text())
K8S_DEFAULTS = yaml.safe_load((ROOT / "roles" / "model_server_k8s" / "defaults" / "main.yml").read_text())
K8S_VARS = yaml.safe_load((ROOT / "roles" / "model_server_k8s" / "vars" / "main.yml").read_text())
DIGEST = "sha256:" + "0123456789abcdef" * 4
MOUNT = "/var/cache/minimax-m3-jit"
HOST_DIR = "/var/cache/minimax-m3/jit/" + DIGEST.split(":")[1]

# Where each engine's kernels go, by variable (upstream file in roles/serving/vars/main.yml).
REQUIRED = {
    "sglang": ["SGLANG_DG_CACHE_DIR",        # DeepGEMM (compile_utils.py -> DG_JIT_CACHE_DIR)
               "SGLANG_CACHE_DIR",           # srt/environ.py: newer deep_gemm, cute_aot
               "SGLANG_JIT_CACHE_DIR",       # SGLang's own JIT kernels
               "TVM_FFI_CACHE_DIR",          # older jit_kernel
               "MINFER_FMHA_CACHE_DIR",      # MSA's fmha_sm100
               "FLASHINFER_WORKSPACE_BASE",  # flashinfer/jit/env.py
               "TRITON_CACHE_DIR",           # triton knobs.py
               "TORCHINDUCTOR_CACHE_DIR",    # torch/_inductor/runtime/cache_dir_utils.py
               "XDG_CACHE_HOME"],
    "vllm": ["VLLM_CACHE_ROOT",              # vllm/envs.py: torch.compile, deep_gemm, autotune
             "FLASHINFER_WORKSPACE_BASE", "TRITON_CACHE_DIR", "TORCHINDUCTOR_CACHE_DIR", "XDG_CACHE_HOME"],
}
# The profiles whose flags run DeepGEMM's MoE runner (--moe-runner-backend deep_gemm): the
# Blackwell SGLang rows of the cookbook (shared/reference/serving.md).
DEEP_GEMM = ["b200", "b300", "gb300", "gb200"]
CASES = [(p, "sglang") for p in matrix_profiles("sglang")] + [(p, "vllm") for p in matrix_profiles("vllm")]


def resolve(profile, engine="sglang", **kw):
    kw.setdefault("image", {"digest": DIGEST})
    kw.setdefault("weights_revision", "b" * 40)
    kw.setdefault("allow_inferred", True)
    spec = serving.serving_resolve(*serving_args(profile=profile, engine=engine, **kw))
    assert spec["blockers"] == [], spec["blockers"]
    return spec


def env_of(argv):
    return {token.split("=", 1)[0]: token.split("=", 1)[1]
            for index, token in enumerate(argv) if index and argv[index - 1] == "-e"}


@pytest.mark.parametrize("profile,engine", CASES)
def test_every_profile_mounts_the_images_cache_with_its_engines_variables(profile, engine):
    argv = ms.docker_run_argv(resolve(profile, engine), jit_cache_dir=HOST_DIR)
    mounts = [argv[i + 1] for i, token in enumerate(argv) if token == "-v"]
    assert "%s:%s" % (HOST_DIR, MOUNT) in mounts  # read-write: no :ro
    env = env_of(argv)
    for name in REQUIRED[engine]:
        assert env.get(name, "").startswith(MOUNT), (name, env)


@pytest.mark.parametrize("engine", sorted(REQUIRED))
def test_every_cache_variable_points_into_the_mount(engine):
    """A variable outside the mount would land in the container and go with it (`--rm`)."""
    cache = VARS["serving_engines"][engine]["jit_cache"]
    assert cache["container_dir"] == MOUNT
    for name, value in cache["env"].items():
        assert value == MOUNT or value.startswith(MOUNT + "/"), name


def test_deep_gemms_cache_is_not_the_xdg_default():
    """SGLang reads SGLANG_DG_CACHE_DIR, not XDG_CACHE_HOME: ~/.cache/deep_gemm was lost on every
    restart of a deep_gemm profile while XDG_CACHE_HOME pointed into the cache."""
    env = env_of(ms.docker_run_argv(resolve("b200"), jit_cache_dir=HOST_DIR))
    assert env["SGLANG_DG_CACHE_DIR"] == MOUNT + "/deep_gemm"


@pytest.mark.parametrize("profile,engine", CASES)
def test_the_pod_carries_the_same_cache_on_an_empty_dir(profile, engine):
    settings = {}
    values = dict(K8S_DEFAULTS, model_server_k8s_prefill_image="r.example/p@sha256:" + "d" * 64,
                  model_server_k8s_rsync_server="staging.example")
    for key, template in K8S_VARS["__model_server_k8s_settings"].items():
        name = str(template).strip("{} ")
        settings[key] = copy.deepcopy(values[name]) if name in values else template
    spec = resolve(profile, engine, weights_manifest_sha256="c" * 64)
    pod = next(o for o in ms.k8s_manifests(spec, settings) if o["kind"] == "Deployment")["spec"]["template"]["spec"]
    engine_container = pod["containers"][0]
    assert {"name": "jit-cache", "mountPath": MOUNT} in engine_container["volumeMounts"]
    assert {"name": "jit-cache", "emptyDir": {"sizeLimit": settings["jit_cache_size"]}} in pod["volumes"]
    env = {e["name"]: e["value"] for e in engine_container["env"]}
    for name in REQUIRED[engine]:
        assert env[name].startswith(MOUNT), name


@pytest.mark.parametrize("profile,engine", CASES)
def test_the_deep_gemm_precompile_runs_on_the_deep_gemm_profiles_only(profile, engine):
    steps = ms.precompile_steps(resolve(profile, engine))
    assert [s["name"] for s in steps] == (["deep_gemm"] if profile in DEEP_GEMM and engine == "sglang" else [])


@pytest.mark.parametrize("tokens,expected", [
    (["--moe-runner-backend", "deep_gemm"], "deep_gemm"),
    (["--moe-runner-backend=deep_gemm"], "deep_gemm"),
    (["--moe-runner-backend", "deep_gemm", "--moe-runner-backend", "triton"], "triton"),
    (["--moe-runner-backend=triton", "--moe-runner-backend", "deep_gemm"], "deep_gemm"),
    (["--moe-runner-backend"], True),
    (["--moe-runner-backend", "--tp", "8"], True),
    (["--moe-runner-backends", "deep_gemm"], None),
    ([], None)])
def test_flag_value_reads_as_argparse_does(tokens, expected):
    assert ms.flag_value(["sglang", "serve"] + tokens, "--moe-runner-backend") == expected


def override_args(profile, extra):
    return {"engines": {"sglang": {"args": VARS["serving_matrix"][profile]["engines"]["sglang"]["args"] + extra}}}


def test_an_override_that_leaves_deep_gemm_drops_the_step():
    """A site that changes the MoE runner (an override may change a required flag, never drop it)
    runs no DeepGEMM precompile."""
    args = [["--moe-runner-backend", "triton"] if a[0] == "--moe-runner-backend" else a
            for a in VARS["serving_matrix"]["b300"]["engines"]["sglang"]["args"]]
    spec = resolve("b300", profile_overrides={"engines": {"sglang": {"args": args}}})
    assert ms.precompile_steps(spec) == []


def test_an_override_that_chooses_deep_gemm_gets_the_step():
    spec = resolve("h200", profile_overrides=override_args("h200", [["--moe-runner-backend=deep_gemm"]]))
    assert [s["name"] for s in ms.precompile_steps(spec)] == ["deep_gemm"]


def test_the_precompile_container_is_the_servers_without_port_or_key():
    spec = resolve("b200", bind_address="0.0.0.0", api_key="k" * 8 + "7f3a9c1e5d2b4a60" * 2, api_key_defined=True)
    server = ms.docker_run_argv(spec, config_host_path="/etc/minimax-m3/engine.yaml",
                                config_container_path="/etc/model-server/engine.yaml", jit_cache_dir=HOST_DIR)
    step = ms.precompile_steps(spec)[0]
    argv = ms.precompile_argv(spec, step, 1800, jit_cache_dir=HOST_DIR)
    assert argv[:5] == ["docker", "run", "--rm", "--name", "minimax-m3-precompile-deep_gemm"]
    assert "-p" not in argv and "--config" not in argv and "/etc/minimax-m3/engine.yaml" not in " ".join(argv)
    image = argv.index(spec["image"]["ref"])
    # the server's devices, shared memory, least privilege, environment, weights and cache, in order
    options = [t for t in server[5:server.index(spec["image"]["ref"])]]
    publish = options.index("-p")
    del options[publish:publish + 2]
    config = options.index("/etc/minimax-m3/engine.yaml:/etc/model-server/engine.yaml:ro")
    del options[config - 1:config + 1]
    assert argv[5:image] == options
    # the server's arguments after the tool, then its bound
    server_args = server[server.index("serve") + 1:server.index("--config")]
    assert argv[image + 1:] == ["python3", "-m", "sglang.compile_deep_gemm"] + server_args + ["--timeout", "1800"]


def test_the_precompile_refuses_to_run_without_the_cache():
    spec = resolve("b200")
    with pytest.raises(AnsibleFilterError, match="needs the image's kernel cache directory"):
        ms.precompile_argv(spec, ms.precompile_steps(spec)[0], 3600)


def test_a_precompile_whose_command_head_does_not_match_is_refused():
    spec = resolve("b200")
    spec["jit_cache"] = dict(spec["jit_cache"], precompile={"deep_gemm": dict(
        spec["jit_cache"]["precompile"]["deep_gemm"], replaces=["python3", "-m", "sglang.launch_server"])})
    with pytest.raises(AnsibleFilterError, match="fix serving_engines.sglang.jit_cache.precompile.deep_gemm.replaces"):
        ms.precompile_steps(spec)


def marker(profile, **kw):
    return ms.precompile_steps(resolve(profile, **kw))[0]["marker"]


def test_the_record_is_per_gpu_model_and_arguments_not_per_start():
    b300 = marker("b300")
    assert b300.startswith(".precompile-deep_gemm-b300-") and b300.endswith(".json")
    assert marker("b300") == b300  # the same node, image and flags: once
    assert marker("gb300") != b300 and marker("gb300").startswith(".precompile-deep_gemm-gb300-")  # same flags
    # another argument list (a tuning preset) compiles again; an environment change does not
    assert marker("b300", tuning=["oom_step3"]) != b300
    assert marker("b300", profile_overrides={"engines": {"sglang": {"env": {"NCCL_DEBUG": "INFO"}}}}) == b300


def test_the_unit_and_the_step_share_one_cache_directory():
    spec = resolve("b200")
    server = ms.docker_run_argv(spec, jit_cache_dir=HOST_DIR)
    step = ms.precompile_argv(spec, ms.precompile_steps(spec)[0], 3600, jit_cache_dir=HOST_DIR)
    assert env_of(server) == env_of(step)
    assert "%s:%s" % (HOST_DIR, MOUNT) in server and "%s:%s" % (HOST_DIR, MOUNT) in step
