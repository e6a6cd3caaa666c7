"""Every operator input that could render a unit or a command that cannot start is refused by
serving_resolve (filter_plugins/serving.py) with a message naming the fix: one case per input
(issue 11), against the real matrix. Each case also fails when its check is removed: the
accepted twin of each refused value resolves without blockers."""
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
GOOD_KEY = "c0dec454d3adf3edd2988d15279be2412f7144ae335d8659"  # openssl rand -hex 24


def resolve(profile="b200", **kw):
    kw.setdefault("engine", "sglang")
    return serving.serving_resolve(*serving_args(profile=profile, **kw))


def blockers(**kw):
    return "\n".join(resolve(**kw)["blockers"])


H200_VLLM = dict(profile="h200", engine="vllm", image={"digest": DIGEST}, weights_revision="a" * 40)

# (case, inputs, fragments the refusal must contain: what is wrong and the fix)
REFUSED = [
    ("api key null", dict(api_key=None, api_key_defined=True),
     ["serving_api_key is set but null", "openssl rand -hex 32"]),
    ("api key of one character", dict(api_key="x", api_key_defined=True),
     ["has 1 characters (at least 32)"]),
    ("api key of spaces only", dict(api_key=" " * 40, api_key_defined=True),
     ["whitespace or a control character"]),
    ("api key with a newline", dict(api_key=GOOD_KEY + "\nExecStartPre=/bin/sh", api_key_defined=True),
     ["whitespace or a control character"]),
    ("api key placeholder", dict(api_key="<your-api-key>" + "5d1e0b7a9c3f" * 2, api_key_defined=True),
     ["looks like a placeholder"]),
    ("api key of one repeated character", dict(api_key="a" * 40, api_key_defined=True),
     ["looks like a placeholder"]),
    ("api key not a string", dict(api_key=12345678901234567890123456789012345, api_key_defined=True),
     ["is a int, not a string"]),
    ("bind localhost", dict(bind_address="localhost"),
     ["'localhost', which docker -p does not accept: set 127.0.0.1"]),
    ("bind a hostname", dict(bind_address="gpu01.example", api_key=GOOD_KEY, api_key_defined=True),
     ["'gpu01.example' is not an IP address"]),
    ("port true", dict(port=True), ["serving_port is True (bool)"]),
    ("port 0", dict(port=0), ["serving_port is 0: set a TCP port number between 1 and 65535"]),
    ("port 70000", dict(port="70000"), ["serving_port is '70000'"]),
    ("port a float", dict(port=30000.5), ["(float)"]),
    ("weights root relative", dict(weights_root="data/models"), ["not absolute and normalised"]),
    ("weights root with ..", dict(weights_root="/data/../etc"), ["not absolute and normalised"]),
    ("weights root with :", dict(weights_root="/data:/etc"), ["holds ':'"]),
    ("weights root empty", dict(weights_root=""), ["serving_weights_root is ''"]),
    ("weights root with a newline", dict(weights_root="/data\n/models"), ["control character"]),
    ("newline in an override", dict(profile_overrides={"description": "x\nExecStartPre=/bin/sh"}),
     ["serving.description", "control character"]),
    ("newline in a flag value",
     dict(profile_overrides={"engines": {"sglang": {"env": {"NCCL_DEBUG": "INFO\nX=1"}}}}),
     ["serving.env.NCCL_DEBUG", "control character"]),
    ("override drops --tp, parsers and backends",
     dict(profile_overrides={"engines": {"sglang": {"args": [["--mem-fraction-static", "0.6"]]}}}),
     ["flag --tp of profile 'b200' is missing", "flag --reasoning-parser", "flag --tool-call-parser",
      "flag --attention-backend", "flag --moe-runner-backend", "never drop it"]),
    ("vllm override drops --block-size and the tool switch",
     dict(H200_VLLM, profile_overrides={"engines": {"vllm": {"args": [
         ["--tensor-parallel-size", "8"], ["--max-model-len", "65536"], ["--tool-call-parser", "minimax_m3"],
         ["--reasoning-parser", "minimax_m3"]]}}}),
     ["flag --block-size", "flag --enable-auto-tool-choice"]),
    ("mem fraction 1.2", dict(profile_overrides={"engines": {"sglang": {"args": [
        ["--reasoning-parser", "auto"], ["--tool-call-parser", "auto"], ["--tp", "8"],
        ["--attention-backend", "fa4"], ["--mm-attention-backend", "flashinfer_cudnn"],
        ["--moe-runner-backend", "deep_gemm"], ["--mem-fraction-static", "1.2"]]}}}),
     ["--mem-fraction-static is 1.2: it must be a number > 0, < 1"]),
    ("chunked prefill 0 through a site override", dict(profile_overrides={"engines": {"sglang": {"args": [
        ["--reasoning-parser", "auto"], ["--tool-call-parser", "auto"], ["--tp", "8"],
        ["--attention-backend", "fa4"], ["--mm-attention-backend", "flashinfer_cudnn"],
        ["--moe-runner-backend", "deep_gemm"], ["--chunked-prefill-size", "0"]]}}}),
     ["--chunked-prefill-size is 0: it must be an integer >= 1 (or -1)"]),
    ("tp not a number", dict(profile_overrides={"tp": "eight"}), ["has tp 'eight'"]),
    ("conflicting presets", dict(tuning=["oom_step3", "long_context"]),
     ["presets 'oom_step3' and 'long_context' set --chunked-prefill-size to 2048 and 16384"]),
    ("tuning as a string", dict(tuning="oom_step1"),
     ["serving_tuning is str ('oom_step1'): give a list (e.g. [oom_step1])"]),
    ("capabilities as a string", dict(capabilities="text"),
     ["serving_capabilities is str ('text'): give a list"]),
    ("overrides as a list", dict(profile_overrides=["tp", 4]), ["serving_profile_overrides is list"]),
    ("args as a string", dict(profile_overrides={"engines": {"sglang": {"args": "--tp 8"}}}),
     ["serving_profile_overrides.engines.sglang.args is '--tp 8': give a list of [flag, value]"]),
]


@pytest.mark.parametrize("case,inputs,fragments", REFUSED, ids=[c[0] for c in REFUSED])
def test_refused_with_the_fix(case, inputs, fragments):
    text = blockers(**inputs)
    for fragment in fragments:
        assert fragment in text, (case, text)


def test_list_typed_input_refused_once_not_per_character():
    spec = resolve(capabilities="text")
    assert len([b for b in spec["blockers"] if "serving_capabilities" in b]) == 1
    spec = resolve(tuning="oom_step1")
    assert len([b for b in spec["blockers"] if "serving_tuning" in b]) == 1


def test_the_key_is_never_in_the_spec_or_a_message():
    secret = GOOD_KEY + "\n"
    spec = resolve(api_key=secret, api_key_defined=True, bind_address="0.0.0.0")
    assert GOOD_KEY not in repr(spec)
    spec = resolve(api_key=GOOD_KEY, api_key_defined=True, bind_address="0.0.0.0")
    assert spec["blockers"] == [] and spec["auth"] is True
    assert GOOD_KEY not in repr(spec)


@pytest.mark.parametrize("inputs", [
    dict(api_key=GOOD_KEY, api_key_defined=True, bind_address="0.0.0.0"),
    dict(api_key_defined=False),                       # unset: loopback without a key
    dict(bind_address="::1"), dict(port="30001"), dict(port=8443),
    dict(weights_root="/"), dict(weights_root="/srv/weights"),
    dict(tuning=["oom_step1", "oom_step2"]),           # same value for the flag they share
    dict(tuning=["long_context"]), dict(capabilities=["text", "tools"]),
    dict(profile_overrides={"engines": {"sglang": {"env": {"NCCL_DEBUG": "INFO"}}}}),
], ids=lambda d: ",".join("%s=%r" % kv for kv in d.items())[:60])
def test_the_accepted_twins_resolve(inputs):
    assert resolve(**inputs)["blockers"] == []


def test_override_may_change_but_not_drop_and_capabilities_decide_the_parsers():
    args = [list(a) for a in VARS["serving_matrix"]["b200"]["engines"]["sglang"]["args"]]
    changed = [a if a[0] != "--mem-fraction-static" else ["--mem-fraction-static", "0.55"] for a in args]
    spec = resolve(profile_overrides={"engines": {"sglang": {"args": changed}}})
    assert spec["blockers"] == []
    assert ["--mem-fraction-static 0.55", "site override (serving_profile_overrides)"] in spec["arg_sources"]
    # a site that does not advertise reasoning may drop the reasoning parser, not the tool parser
    no_reasoning = [a for a in args if a[0] != "--reasoning-parser"]
    assert resolve(capabilities=["text", "tools", "image"],
                   profile_overrides={"engines": {"sglang": {"args": no_reasoning}}})["blockers"] == []
    assert "--reasoning-parser" in blockers(profile_overrides={"engines": {"sglang": {"args": no_reasoning}}})


def test_flag_sources():
    spec = resolve(tuning=["oom_step1"])
    sources = dict(spec["arg_sources"])
    assert sources["--tp 8"] == "seed"
    assert sources["--mem-fraction-static 0.60"] == "tuning preset oom_step1"
    assert spec["source"].startswith("the seed's offline quickstart")
    assert dict(resolve("b300", image={"digest": DIGEST})["arg_sources"])["--tp 4"] == "cookbook"
    assert dict(resolve(**H200_VLLM)["arg_sources"])["--block-size 128"] == "vllm-recipe"


# --- The image's own ENTRYPOINT (issue 11: `vllm serve vllm serve ...`) ------------------------

def test_vllm_renders_arguments_only_after_its_entrypoint():
    spec = resolve(**H200_VLLM)
    argv = ms.docker_run_argv(spec)
    after = argv[argv.index("vllm/vllm-openai@" + DIGEST) + 1:]
    assert after[:3] == ["/models/MiniMax-M3", "--served-model-name", "MiniMaxAI/MiniMax-M3"]
    assert "vllm" not in after and "serve" not in after and "--entrypoint" not in argv


def test_sglang_renders_its_command_after_the_image():
    argv = ms.docker_run_argv(resolve())
    image = argv.index(resolve()["image"]["ref"])
    assert argv[image + 1:image + 4] == ["sglang", "serve", "--trust-remote-code"]


def test_other_commands_replace_an_image_entrypoint():
    vllm = resolve(**H200_VLLM)
    assert ms.invocation(vllm, ["nvidia-smi", "-L"]) == [
        "--entrypoint", "nvidia-smi", "vllm/vllm-openai@" + DIGEST, "-L"]
    sglang = resolve()
    assert ms.invocation(sglang, ["nvidia-smi", "-L"]) == [sglang["image"]["ref"], "nvidia-smi", "-L"]
    gate = ms.msa_gate_argv(vllm, ["python3", "-c", "print(1)"])
    assert gate[-5:] == ["--entrypoint", "python3", "vllm/vllm-openai@" + DIGEST, "-c", "print(1)"]


def test_ipv6_publish_is_bracketed():
    spec = resolve(bind_address="::1")
    argv = ms.docker_run_argv(spec)
    assert argv[argv.index("-p") + 1] == "[::1]:30000:30000"


def test_argv_builder_refuses_a_control_character_whatever_the_spec():
    spec = resolve()
    with pytest.raises(Exception, match="control character"):
        ms.docker_run_argv(spec, name="minimax-m3\nExecStartPre=/bin/sh")
    with pytest.raises(Exception, match="control character"):
        ms.msa_gate_argv(spec, ["python3", "-c", "a\nb"])


def test_served_model_name_is_what_the_engine_will_list():
    """playbooks/verify.yml requires this name in /v1/models: the hub name where the engine is
    told it (vLLM --served-model-name), else SGLang's own default, the model path."""
    assert resolve()["served_model_name"] == "/models/MiniMax-M3-MXFP8"
    assert resolve(**H200_VLLM)["served_model_name"] == "MiniMaxAI/MiniMax-M3"


# --- the pinned manifest hash (issue 12) ---------------------------------------------------

PIN = "3a" * 32


def test_manifest_pin_from_the_inventory_reaches_the_spec():
    spec = resolve(weights_manifest_sha256=PIN)
    assert spec["blockers"] == [] and spec["weights"]["manifest_sha256"] == PIN


@pytest.mark.parametrize("value", ["abc", PIN.upper(), "sha256:" + PIN, PIN + "0", PIN[:-1] + "\n"])
def test_malformed_manifest_pin_is_refused(value):
    spec = resolve(weights_manifest_sha256=value)
    assert any("serving_weights_manifest_sha256" in b for b in spec["blockers"]), value
    assert spec["weights"]["manifest_sha256"] is None


def test_matrix_pin_holds_only_for_the_matrix_revision():
    repos = {k: dict(v) for k, v in VARS["serving_weights_repos"].items()}
    repos["MiniMaxAI/MiniMax-M3-MXFP8"]["manifest_sha256"] = PIN
    matrix_rev = repos["MiniMaxAI/MiniMax-M3-MXFP8"]["revision"]
    same = serving.manifest_pin_for("", repos["MiniMaxAI/MiniMax-M3-MXFP8"], matrix_rev, "")
    assert same == (PIN, None)
    # the inventory moved to another revision: the matrix's hash is not that revision's
    other = serving.manifest_pin_for("", repos["MiniMaxAI/MiniMax-M3-MXFP8"], "d" * 40, "d" * 40)
    assert other == (None, None)
    # the inventory's own pin always wins
    assert serving.manifest_pin_for("4" * 64, repos["MiniMaxAI/MiniMax-M3-MXFP8"], matrix_rev, "")[0] == "4" * 64


def test_unpinned_manifest_is_not_a_blocker_at_resolve_time():
    """The staging run is what produces the hash to review: resolving must not refuse it."""
    spec = resolve()
    assert spec["blockers"] == [] and spec["weights"]["manifest_sha256"] is None
