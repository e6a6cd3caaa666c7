"""Refusals of the `serving` role, each driven through ansible-runner (real runs, no mocks).

Every refusal the issue lists is one case: the run must fail (rc != 0) before anything
changes, and the message must name the fix. Positive twins show the same input passes once
the fix is applied. Runs tests/playbooks/serving-resolve.yml on localhost.
"""
import json
import pathlib

import pytest
from helpers import failures, matrix_profiles, run_playbook

ROOT = pathlib.Path(__file__).resolve().parents[1]
PLAYBOOK = ROOT / "tests" / "playbooks" / "serving-resolve.yml"
DIGEST = "sha256:" + "a" * 64  # a well-formed digest for profiles the matrix leaves unpinned
SECRET = "test-key-7f3a9c1e-never-printed-0b5d2e"


def run_serving(extra, tmp_path):
    spec_out = tmp_path / "spec.json"
    runner, out = run_playbook("tests/playbooks/serving-resolve.yml", tmp_path,
                               extravars=dict(extra, spec_out=str(spec_out)))
    spec = json.loads(spec_out.read_text()) if spec_out.exists() else None
    if runner.rc != 0:
        # the refusal is the serving role's own fail task, not some other error
        assert "Refuse the serving choices when something blocks a deployment" in " ".join(
            str(task) for task in failures(runner)), out[-3000:]
    return runner.rc, out, spec


REFUSALS = [
    ("unknown-profile", {"serving_profile": "z100"},
     ["'z100' is not in the hardware matrix", "valid profiles: " + ", ".join(sorted(matrix_profiles()))]),
    ("empty-profile", {"serving_profile": ""}, ["serving_profile is not set", "valid profiles"]),
    # the engine list is the matrix's (serving_engines), not a second list in the argument spec
    ("unknown-engine", {"serving_profile": "b200", "serving_engine": "trtllm"},
     ["serving_engine 'trtllm' is unknown; valid engines: sglang, vllm"]),
    ("engine-without-flags", {"serving_profile": "b200", "serving_engine": "vllm"},
     ["no flags for engine 'vllm'", "engines with flags for it: sglang"]),
    ("inferred-gb200", {"serving_profile": "gb200", "serving_image": {"digest": DIGEST}},
     ["status 'inferred'", "serving_allow_inferred: true"]),
    ("inferred-mi350x", {"serving_profile": "mi350x", "serving_image": {"digest": DIGEST}},
     ["status 'inferred'", "serving_allow_inferred: true"]),
    ("inferred-mi325x", {"serving_profile": "mi325x", "serving_image": {"digest": DIGEST}},
     ["status 'inferred'", "serving_allow_inferred: true"]),
    ("gpu-count-not-tp", {"serving_profile": "b200", "serving_gpu_count": 4},
     ["serving_gpu_count is 4 but profile 'b200' needs 8 GPUs (TP 8)"]),
    ("gpu-count-b300", {"serving_profile": "b300", "serving_gpu_count": 8,
                        "serving_image": {"digest": DIGEST}},
     ["serving_gpu_count is 8 but profile 'b300' needs 4 GPUs (TP 4)"]),
    ("video", {"serving_profile": "b200", "serving_capabilities": ["text", "video"]},
     ["includes 'video'", "remove it"]),
    ("image-on-rocm", {"serving_profile": "mi355x", "serving_image": {"digest": DIGEST},
                       "serving_capabilities": ["text", "image"]},
     ["'image' on ROCm profile 'mi355x'"]),
    ("revision-not-hex", {"serving_profile": "b200", "serving_weights_revision": "main"},
     ["revision 'main'", "not a 40-hex commit", "serving_weights_revision"]),
    ("revision-short", {"serving_profile": "b200", "serving_weights_revision": "c5454eb"},
     ["not a 40-hex commit"]),
    ("manifest-pin-not-hex", {"serving_profile": "b200", "serving_weights_manifest_sha256": "sha256:" + "a" * 64},
     ["serving_weights_manifest_sha256", "is not a sha256 (64 lowercase hex)", "the staging run printed"]),
    ("revision-missing-bf16", {"serving_profile": "h200", "serving_image": {"digest": DIGEST}},
     ["no pinned weights revision for MiniMaxAI/MiniMax-M3", "serving_weights_revision"]),
    ("image-without-digest", {"serving_profile": "b300"},
     ["image lmsysorg/sglang has no digest", "serving_allow_unpinned_image"]),
    ("image-digest-malformed", {"serving_profile": "b200", "serving_image": {"digest": "sha256:abc"}},
     ["image digest 'sha256:abc' is not 'sha256:<64 hex>'"]),
    ("bind-all-without-key", {"serving_profile": "b200", "serving_bind_address": "0.0.0.0"},
     ["serving_bind_address 0.0.0.0 is not loopback and serving_api_key is not set"]),
    ("bind-lan-without-key", {"serving_profile": "b200", "serving_bind_address": "10.1.2.3"},
     ["serving_bind_address 10.1.2.3 is not loopback"]),
    ("port-zero", {"serving_profile": "b200", "serving_port": 0}, ["serving_port is 0: set a TCP port number between 1 and 65535"]),
    ("port-too-high", {"serving_profile": "b200", "serving_port": 70000},
     ["serving_port is 70000: set a TCP port number between 1 and 65535"]),
    ("tuning-unknown", {"serving_profile": "b200", "serving_tuning": ["turbo"]},
     ["serving_tuning preset 'turbo' is unknown"]),
    ("request-logging", {"serving_profile": "b200", "serving_profile_overrides": {"engines": {"sglang": {
        "args": [["--tp", "8"], ["--log-requests"]]}}}},
     ["flags include --log-requests, which logs prompts or outputs", "serving_allow_request_logging: true"]),
    ("container-user-name", {"serving_profile": "b200", "serving_profile_overrides": {"engines": {"sglang": {
        "container": {"user": "sglang"}}}}},
     ["serving_profile_overrides.engines.sglang.container.user is 'sglang'", "numeric uid[:gid]"]),
    ("container-pids-string", {"serving_profile": "b200", "serving_profile_overrides": {"engines": {"sglang": {
        "container": {"pids_limit": "lots"}}}}},
     ["container.pids_limit is 'lots'", "whole number of processes"]),
]


@pytest.mark.parametrize("case,extra,messages", REFUSALS, ids=[r[0] for r in REFUSALS])
def test_refused(case, extra, messages, tmp_path):
    rc, out, spec = run_serving(extra, tmp_path)
    assert rc != 0, "%s was not refused:\n%s" % (case, out[-2000:])
    assert spec is None
    for message in messages:
        assert message in out, "%s: %r not in output:\n%s" % (case, message, out[-3000:])


ACCEPTED = [
    ("b200-defaults", {"serving_profile": "b200"}),
    ("inferred-acknowledged", {"serving_profile": "gb200", "serving_allow_inferred": True,
                               "serving_image": {"digest": DIGEST}}),
    ("gpu-count-equal", {"serving_profile": "b200", "serving_gpu_count": 8}),
    ("unpinned-lab", {"serving_profile": "b300", "serving_allow_unpinned_image": True}),
    ("bind-all-with-key", {"serving_profile": "b200", "serving_bind_address": "0.0.0.0",
                           "serving_api_key": SECRET}),
    ("text-only-on-rocm", {"serving_profile": "mi355x", "serving_image": {"digest": DIGEST},
                           "serving_capabilities": ["text", "tools"]}),
    ("vllm-h200", {"serving_profile": "h200", "serving_engine": "vllm",
                   "serving_image": {"digest": DIGEST}, "serving_weights_revision": "b" * 40}),
]


@pytest.mark.parametrize("case,extra", ACCEPTED, ids=[a[0] for a in ACCEPTED])
def test_accepted(case, extra, tmp_path):
    rc, out, spec = run_serving(extra, tmp_path)
    assert rc == 0, "%s refused:\n%s" % (case, out[-3000:])
    assert spec["blockers"] == []
    assert spec["profile"] == extra["serving_profile"]
    assert SECRET not in out


def test_a_key_with_a_newline_is_never_printed(tmp_path):
    rc, out, spec = run_serving({"serving_profile": "b200", "serving_api_key": SECRET + "\nX=1"}, tmp_path)
    assert rc != 0 and SECRET not in out


def test_spec_contract_b200(tmp_path):
    """The keys other roles rely on (the lead's contract), with the seed's values."""
    rc, out, spec = run_serving({"serving_profile": "b200"}, tmp_path)
    assert rc == 0, out[-3000:]
    assert spec["status"] == "validated" and spec["engine"] == "sglang" and spec["tp"] == 8
    burnin = spec["gpu"].pop("burnin")
    assert spec["gpu"] == {"vendor": "nvidia", "model": "B200", "count": 8,
                           "driver_floor": "570.133.20", "rocm_floor": None, "rocm_default": None,
                           "fabric": "nvlink5"}
    assert burnin["min_busbw_gbps"] == 340 and "nccl-tests#212" in burnin["source"]
    assert spec["capabilities"] == ["text", "reasoning", "tools", "image"]
    weights = spec["weights"]
    assert weights["repo"] == "MiniMaxAI/MiniMax-M3-MXFP8"
    assert weights["revision"] == "c5454eb03678d8710e54a4e0fc681b9f3b4a3dba"
    assert weights["size_gb"] == 444 and weights["format"] == "MXFP8"
    # one directory per revision; manifest, marker and the links beside it, never inside
    rev_dir = "/data/models/MiniMaxAI/MiniMax-M3-MXFP8/c5454eb03678d8710e54a4e0fc681b9f3b4a3dba"
    assert weights["root"] == "/data/models"
    assert weights["repo_dir"] == "/data/models/MiniMaxAI/MiniMax-M3-MXFP8"
    assert weights["dir"] == rev_dir
    assert weights["manifest"] == rev_dir + ".manifest.sha256"
    assert weights["marker"] == rev_dir + ".verified.json"
    assert weights["current"] == "/data/models/MiniMaxAI/MiniMax-M3-MXFP8/current"
    assert weights["serving"] == "/data/models/MiniMaxAI/MiniMax-M3-MXFP8/serving"
    assert weights["previous"] == "/data/models/MiniMaxAI/MiniMax-M3-MXFP8/previous"
    assert weights["container_dir"] == "/models/MiniMax-M3-MXFP8"
    assert spec["image"]["ref"] == ("lmsysorg/sglang@sha256:de63ac56df5d7b064451e21147eaab8963"
                                    "4a02332d830ca8c01cb8c033b3a78f")
    assert spec["device_args"] == ["--gpus", "all"]
    assert (spec["bind_address"], spec["port"], spec["container_port"]) == ("127.0.0.1", 30000, 30000)
    assert spec["health_path"] == "/health" and spec["msa_warmup"] is True and spec["auth"] is False


def test_overrides_merge_and_tuning(tmp_path):
    """Overrides merge into the entry (combine recursive); presets replace a flag's value."""
    rc, out, spec = run_serving({
        "serving_profile": "b200", "serving_tuning": ["oom_step1", "long_context"],
        "serving_profile_overrides": {"engines": {"sglang": {"env": {"NCCL_DEBUG": "INFO"}}}}},
        tmp_path)
    assert rc == 0, out[-3000:]
    assert spec["env"] == {"NCCL_DEBUG": "INFO", "SGLANG_MAX_NEW_TOKENS_LIMIT": "32768"}  # the project's cap
    assert ["--mem-fraction-static", "0.60"] in spec["args"]
    assert ["--chunked-prefill-size", "16384"] in spec["args"]
    assert ["--attention-backend", "fa4"] in spec["args"]  # the rest of the entry is kept
    assert spec["command"].count("--chunked-prefill-size") == 1
