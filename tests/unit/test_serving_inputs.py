"""Every operator input that could render a unit or a command that cannot start is refused by
serving_resolve (filter_plugins/serving.py) with a message naming the fix: one case per input
(issue 11), against the real matrix. Each case also fails when its check is removed: the
accepted twin of each refused value resolves without blockers."""
import json
import pathlib
import sys

import pytest
import yaml

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "filter_plugins"))

import model_server as ms  # noqa: E402
import serving  # noqa: E402
from helpers import engine_arg_lists, serving_args  # noqa: E402

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


# Inputs an outside review found rendering (issue 34): each refused naming the variable and the
# fix, and its accepted twin resolving clean, so the check is what makes the difference.
LOOSENED = {"engines": {"sglang": {"container": {"cap_add": ["ALL"]}}}}


@pytest.mark.parametrize("case,inputs,fragments", [
    ("image repository carrying a docker option",
     dict(image={"repository": "--mount=type=bind,source=/,target=/host", "digest": DIGEST}),
     ["serving_image.repository '--mount=type=bind,source=/,target=/host' is not an image repository"]),
    ("image repository --volume", dict(image={"repository": "--volume=/:/host", "digest": DIGEST}),
     ["serving_image.repository '--volume=/:/host'"]),
    ("image repository with a second token", dict(image={"repository": "lmsysorg/sglang --privileged",
                                                         "digest": DIGEST}),
     ["'lmsysorg/sglang --privileged' is not an image repository"]),
    ("image repository in upper case", dict(image={"repository": "LMSYSORG/sglang", "digest": DIGEST}),
     ["'LMSYSORG/sglang' is not an image repository"]),
    ("image tag with a space", dict(image={"tag": "dev -v /:/h", "digest": None}, allow_unpinned_image=True),
     ["serving_image.tag 'dev -v /:/h' is not a tag docker accepts"]),
    ("weights override walking out of the root", dict(profile_overrides={"weights": "../../etc"}),
     ["weights repository '../../etc' of profile 'b200' is not one of the matrix's",
      "set serving_profile_overrides.weights to one of them"]),
    ("HF_HUB_OFFLINE turned off after the project's =1",
     dict(profile_overrides={"engines": {"sglang": {"env": {"HF_HUB_OFFLINE": "0"}}}}),
     ["serving_profile_overrides.engines.sglang.env sets HF_HUB_OFFLINE, which the project sets itself"]),
    ("a kernel cache variable moved", dict(profile_overrides={"engines": {"sglang": {"container": {
        "env": {"TRITON_CACHE_DIR": "/tmp/t"}}}}}),
     ["engines.sglang.container.env sets TRITON_CACHE_DIR, which the project sets itself"]),
    ("every capability added", dict(profile_overrides=LOOSENED),
     ["loosens the engine container's reviewed least privilege (adds capabilities ALL)",
      "serving_allow_container_privileges: true"]),
    ("no-new-privileges off", dict(profile_overrides={"engines": {"sglang": {"container": {
        "no_new_privileges": False}}}}), ["(no-new-privileges off)"]),
    ("a process limit too low to start", dict(profile_overrides={"engines": {"sglang": {"container": {
        "pids_limit": 64}}}}), ["pids_limit is 64: give a whole number of processes between 512"]),
    ("an API key of 32 digits on every address", dict(bind_address="0.0.0.0", api_key="1" * 16 + "2345678901234567",
                                                      api_key_defined=True), ["serving_api_key is digits only"]),
    ("an API key repeating 8 characters", dict(bind_address="0.0.0.0", api_key="abcdefgh" * 4, api_key_defined=True),
     ["serving_api_key repeats a pattern of 8 characters"]),
    ("a link-local bind with a zone", dict(bind_address="fe80::1%eth0", api_key=GOOD_KEY, api_key_defined=True),
     ["serving_bind_address 'fe80::1%eth0' is not an IP address"]),
    ("a multicast bind", dict(bind_address="239.1.1.1", api_key=GOOD_KEY, api_key_defined=True),
     ["serving_bind_address 239.1.1.1 is a multicast address"]),
    ("a broadcast bind", dict(bind_address="255.255.255.255", api_key=GOOD_KEY, api_key_defined=True),
     ["serving_bind_address 255.255.255.255 is a broadcast address"]),
    ("a weights root component over 255 bytes", dict(weights_root="/data/" + "m" * 256),
     ["serving_weights_root has a path component of 256 bytes"]),
])
def test_what_the_review_found_rendering_is_refused(case, inputs, fragments):
    text = blockers(**inputs)
    for fragment in fragments:
        assert fragment in text, (case, text)


@pytest.mark.parametrize("case,inputs", [
    ("a registry mirror's repository", dict(image={"repository": "registry.site.internal:5000/lmsysorg/sglang",
                                                   "digest": DIGEST})),
    ("the matrix's own weights named again", dict(profile_overrides={"weights": "MiniMaxAI/MiniMax-M3-MXFP8"})),
    ("another variable in the engine's environment",
     dict(profile_overrides={"engines": {"sglang": {"env": {"NCCL_DEBUG": "INFO"}}}})),
    ("a loosening acknowledged", dict(profile_overrides=LOOSENED, allow_container_privileges=True)),
    ("a tighter process limit", dict(profile_overrides={"engines": {"sglang": {"container": {"pids_limit": 4096}}}})),
    ("a random key on every address", dict(bind_address="0.0.0.0", api_key=GOOD_KEY, api_key_defined=True)),
    ("a key with < and >", dict(bind_address="0.0.0.0", api_key="<" + GOOD_KEY + ">", api_key_defined=True)),
    ("IPv4-mapped loopback without a key", dict(bind_address="::ffff:127.0.0.1")),
    ("a weights root with a trailing slash", dict(weights_root="/data/models/")),
])
def test_their_twins_resolve(case, inputs):
    assert blockers(**inputs) == "", case


def test_an_acknowledged_loosening_is_in_the_spec_for_the_plan():
    spec = resolve(profile_overrides=LOOSENED, allow_container_privileges=True)
    assert spec["container_loosened"] == ["adds capabilities ALL"]
    assert resolve()["container_loosened"] == []


# --- Engine flags read the way the engine's argparse reads them (issue 34) ----------------------
# Every bypass the review found, refused naming the variable and the fix, beside its accepted twin.

B200_ARGS = [list(a) for a in VARS["serving_matrix"]["b200"]["engines"]["sglang"]["args"]]
H200_ARGS = [list(a) for a in VARS["serving_matrix"]["h200"]["engines"]["vllm"]["args"]]
SITE = "serving_profile_overrides.engines.%s.args"


def sglang_site(*extra, base=None):
    return dict(profile_overrides={"engines": {"sglang": {"args": (base or B200_ARGS) + [list(e) for e in extra]}}})


def vllm_site(*extra, base=None):
    return dict(H200_VLLM, profile_overrides={"engines": {"vllm": {"args": (base or H200_ARGS) + [list(e) for e in extra]}}})


ENGINE_FLAG_REFUSED = [
    ("TP appended after the matrix's", sglang_site(["--tp", "4"]),
     [SITE % "sglang" + ": --tp sets --tp-size, which --tp already set (the engine keeps the last): give it once",
      "profile 'b200' has tp 8 but its sglang flags set 4"]),
    ("TP appended in the = form", sglang_site(["--tp=4"]),
     ["--tp sets --tp-size, which --tp already set", "its sglang flags set 4"]),
    ("TP under its long alias", sglang_site(["--tensor-parallel-size", "4"]),
     ["--tensor-parallel-size sets --tp-size, which --tp already set"]),
    ("vLLM TP by its short alias", vllm_site(["-tp", "4"]),
     [SITE % "vllm" + ": -tp sets --tensor-parallel-size, which --tensor-parallel-size already set",
      "profile 'h200' has tp 8 but its vllm flags set 4"]),
    ("vLLM TP in the underscore form replacing the matrix's",
     vllm_site(base=[["--tensor_parallel_size", "4"]] + H200_ARGS[1:]),
     ["profile 'h200' has tp 8 but its vllm flags set 4: make them agree"]),
    ("mem fraction 1.5 in the = form", sglang_site(base=[a for a in B200_ARGS if a[0] != "--mem-fraction-static"]
                                                   + [["--mem-fraction-static=1.5"]]),
     ["sglang --mem-fraction-static is 1.5: it must be a number > 0, < 1"]),
    ("mem fraction 1.5 in the split form", sglang_site(base=[a for a in B200_ARGS if a[0] != "--mem-fraction-static"]
                                                       + [["--mem-fraction-static", "1.5"]]),
     ["sglang --mem-fraction-static is 1.5: it must be a number > 0, < 1"]),
    ("an abbreviated mem fraction", sglang_site(base=[a for a in B200_ARGS if a[0] != "--mem-fraction-static"]
                                                + [["--mem-fraction-stat", "0.5"]]),
     [SITE % "sglang" + ": --mem-fraction-stat abbreviates --mem-fraction-static (the engine accepts a unique "
      "prefix): write --mem-fraction-static"]),
    ("an 8-character API key in argv", sglang_site(["--api-key", "shortkey"]),
     [SITE % "sglang" + " sets --api-key, which the project sets itself: remove it and set serving_api_key"]),
    ("an API key in the = form", vllm_site(["--api-key=shortkey"]),
     [SITE % "vllm" + " sets --api-key, which the project sets itself"]),
    ("the model path around the verified mount", sglang_site(["--model-path", "/etc"]),
     [SITE % "sglang" + " sets --model-path, which the project sets itself: remove it"]),
    ("SGLang's --model alias", sglang_site(["--model=/etc"]),
     ["sets --model (--model-path), which the project sets itself"]),
    ("vLLM's --model", vllm_site(["--model", "/etc"]),
     [SITE % "vllm" + " sets --model, which the project sets itself",
      "vLLM moves --model to the front as the positional model"]),
    ("the served name", vllm_site(["--served-model-name", "other"]),
     ["sets --served-model-name, which the project sets itself"]),
    ("the port inside the container", sglang_site(["--port", "30001"]), ["sets --port, which the project sets itself"]),
    ("a config file of the site's", sglang_site(["--config", "/tmp/x.yaml"]), ["sets --config, which the project sets"]),
    ("request logging by a prefix (ambiguous in SGLang)", sglang_site(["--log-request"]),
     [SITE % "sglang" + ": --log-request is ambiguous: the engine could read it as --log-requests"]),
    ("request logging by a unique prefix (vLLM)", vllm_site(["--enable-log-req"]),
     ["--enable-log-req abbreviates --enable-log-requests", "vllm flags include --enable-log-req, which logs prompts"]),
    ("a flag the engine does not know", sglang_site(["--block-size", "128"]),
     [SITE % "sglang" + ": --block-size is not an option of sglang 0.5.23 (its recorded argument list)"]),
    ("a value outside the engine's choices", sglang_site(base=[a for a in B200_ARGS if a[0] != "--attention-backend"]
                                                         + [["--attention-backend", "fa9"]]),
     ["--attention-backend fa9 is not one of the engine's choices"]),
    ("a value-less flag that needs one", sglang_site(["--watchdog-timeout"]),
     ["--watchdog-timeout needs a value and has none"]),
    ("vLLM's dotted form", vllm_site(["--max-model-len.x", "1"]), ["give --max-model-len its whole JSON value"]),
    ("a tuning preset over a site's = form", dict(tuning=["oom_step1"], **sglang_site(
        base=[a for a in B200_ARGS if a[0] != "--mem-fraction-static"] + [["--mem-fraction-static=0.5"]])),
     ["--mem-fraction-static sets --mem-fraction-static, which --mem-fraction-static in "
      + SITE % "sglang" + " already set"]),
]


@pytest.mark.parametrize("case,inputs,fragments", ENGINE_FLAG_REFUSED, ids=[c[0] for c in ENGINE_FLAG_REFUSED])
def test_engine_flags_are_read_as_the_engine_reads_them(case, inputs, fragments):
    text = blockers(**inputs)
    for fragment in fragments:
        assert fragment in text, (case, text)


@pytest.mark.parametrize("case,inputs", [
    ("the matrix's own list copied", sglang_site()),
    ("TP changed in the = form, agreeing", dict(profile="b300", image={"digest": DIGEST}, **sglang_site(
        base=[a for a in VARS["serving_matrix"]["b300"]["engines"]["sglang"]["args"] if a[0] != "--tp"]
        + [["--tp-size=4"]]))),
    ("mem fraction 0.5 in the = form", sglang_site(base=[a for a in B200_ARGS if a[0] != "--mem-fraction-static"]
                                                   + [["--mem-fraction-static=0.5"]])),
    ("another known flag", sglang_site(["--watchdog-timeout", "600"])),
    ("vLLM TP in the underscore form, agreeing", vllm_site(base=[["--tensor_parallel_size", "8"]] + H200_ARGS[1:])),
    ("vLLM TP by its short alias alone", vllm_site(base=[["-tp", "8"]] + H200_ARGS[1:])),
    ("vLLM logging spelled whole and allowed", dict(allow_request_logging=True, **vllm_site(["--enable-log-requests"]))),
    ("vLLM logging switched off explicitly", vllm_site(["--no-enable-log-requests"])),
    ("SGLang logging spelled whole and allowed", dict(allow_request_logging=True, **sglang_site(["--log-requests"]))),
    ("a key the right way", dict(api_key=GOOD_KEY, api_key_defined=True, bind_address="0.0.0.0")),
])
def test_their_engine_flag_twins_resolve(case, inputs):
    assert blockers(**inputs) == "", case


@pytest.mark.parametrize("profile,engine", [(p, e) for p, entry in VARS["serving_matrix"].items()
                                            for e in entry["engines"]])
def test_every_matrix_entry_passes_its_engines_parser(profile, engine):
    """Each profile's flags, the project's own tokens around them and every preset, as the
    engine reads them: nothing unknown, abbreviated (beyond the reviewed --tp), repeated or owned."""
    kw = dict(image={"digest": DIGEST}, weights_revision="a" * 40, allow_inferred=True)
    assert resolve(profile, engine=engine, **kw)["blockers"] == []
    if engine == "sglang":
        for name in VARS["serving_tuning_presets"]:
            assert resolve(profile, engine=engine, tuning=[name], **kw)["blockers"] == [], name


def test_a_matrix_flag_the_engine_does_not_know_is_refused():
    matrix = json.loads(json.dumps(VARS["serving_matrix"]))
    matrix["b200"]["engines"]["sglang"]["args"].append(["--block-size", "128"])
    text = "\n".join(serving.serving_resolve(*serving_args(profile="b200", engine="sglang",
                                                           tables={"matrix": matrix}))["blockers"])
    assert "sglang flags in serving_matrix.b200.engines.sglang.args: --block-size is not an option" in text


def test_the_projects_own_tokens_are_read_too():
    """A recorded list without --trust-remote-code (an engine that dropped it) refuses the
    project's command and says to record the image's list."""
    lists = {engine: json.loads(json.dumps(record)) for engine, record in engine_arg_lists(VARS["serving_engines"]).items()}
    lists["sglang"]["actions"] = [a for a in lists["sglang"]["actions"] if "--trust-remote-code" not in a["option_strings"]]
    text = "\n".join(serving.serving_resolve(*serving_args(profile="b200", engine="sglang",
                                                           tables={"engine_args": lists}))["blockers"])
    assert "sglang flags in the project's own command: --trust-remote-code is not an option" in text
    assert "tools/engine_args/record_image.sh" in text


@pytest.mark.parametrize("args", [[["--api-key", "shortkey"]], [["--api-key=shortkey"]], [["--api-k", "shortkey"]]])
def test_a_key_given_as_a_flag_is_refused_and_never_printed(args):
    """The plan prints the flags with their sources even for a refused profile: the key is not in
    them, whatever form it was given in."""
    base = VARS["serving_matrix"]["b200"]["engines"]["sglang"]["args"]
    spec = resolve(profile_overrides={"engines": {"sglang": {"args": base + args}}})
    assert any("sets --api-k" in b for b in spec["blockers"]), spec["blockers"]
    printed = " ".join(text for text, _ in spec["arg_sources"])
    assert "shortkey" not in printed and "<redacted>" in printed


@pytest.mark.parametrize("kw, fragment", [
    (dict(profile="h200", imex_domain="rack_a", imex_domain_members={"gpu01": "h200"}),
     "serving_imex_domain is 'rack_a' but this profile's GPUs (H200) have no IMEX domain"),
    (dict(profile="gb200", imex_domain="rack_b", imex_domain_members=None),
     "serving_imex_domain names group 'rack_b', which the inventory does not have"),
    (dict(profile="gb200", imex_domain="rack_a", imex_domain_members={"tray2": "gb200"}),
     "serving_imex_domain names group 'rack_a', which does not hold tray1"),
    (dict(profile="gb200", imex_domain="rack_a", imex_domain_members={"tray1": "gb200", "gpu01": "h200"}),
     "IMEX domain 'rack_a' holds gpu01 (h200), whose profile has no IMEX fabric"),
    (dict(profile="gb200", imex_domain="rack a", imex_domain_members=None),
     "serving_imex_domain must be the name of the inventory group"),
])
def test_an_imex_domain_that_cannot_form_is_refused(kw, fragment):
    """A tray's NVLink domain is its inventory group: another rack's trays, an H200 or a missing group
    in it would write a node list IMEX cannot form a domain from."""
    assert fragment in blockers(host="tray1", allow_inferred=True, **kw)


def test_a_tray_s_domain_is_its_group_or_itself():
    spec = resolve(profile="gb200", host="tray1", allow_inferred=True, imex_domain="rack_a",
                   imex_domain_members={"tray1": "gb200", "tray2": "gb300"})
    assert spec["imex"] == {"group": "rack_a", "hosts": ["tray1", "tray2"]}
    assert not [b for b in spec["blockers"] if "imex" in b.lower()]
    assert resolve(profile="gb200", host="tray1", allow_inferred=True)["imex"] == {"group": None, "hosts": ["tray1"]}
    assert resolve(profile="h200", host="gpu01")["imex"] is None


# --- The engine's own output cap (issue 32): serving_max_output_tokens --------------------------

@pytest.mark.parametrize("value", [0, -1, "many", True, 10 ** 8, 1.5, "0x10", None])
def test_an_output_cap_that_is_not_a_whole_number_in_range_is_refused(value):
    text = blockers(max_output_tokens=value)
    assert "serving_max_output_tokens is %r: give a whole number from 1 to 10000000" % (value,) in text, text


def test_vllm_gets_its_output_cap_as_the_projects_generation_default():
    spec = resolve(**dict(H200_VLLM, max_output_tokens=4096))
    assert spec["blockers"] == [] and spec["max_output_tokens"] == 4096
    at = spec["command"].index("--override-generation-config")
    assert json.loads(spec["command"][at + 1]) == {"max_new_tokens": 4096}
    assert spec["command"].count("--override-generation-config") == 1
    assert "SGLANG_MAX_NEW_TOKENS_LIMIT" not in spec["env"]
    assert ["--override-generation-config {\"max_new_tokens\":4096}",
            "project: the engine's own output cap (serving_max_output_tokens, serving_engines.vllm.output_cap)"
            ] in spec["command_sources"]


def test_sglang_gets_its_output_cap_as_the_schedulers_variable():
    spec = resolve(max_output_tokens="2048")  # -e gives a string
    assert spec["blockers"] == [] and spec["max_output_tokens"] == 2048
    assert spec["env"]["SGLANG_MAX_NEW_TOKENS_LIMIT"] == "2048"
    assert not any(t.startswith("--override-generation") or t == "--preferred-sampling-params" for t in spec["command"])
    assert ["SGLANG_MAX_NEW_TOKENS_LIMIT=2048", "project: the engine's own output cap (serving_max_output_tokens)"
            ] in ms.env_sources(spec)
    argv = ms.docker_run_argv(spec)
    assert argv[argv.index("SGLANG_MAX_NEW_TOKENS_LIMIT=2048") - 1] == "-e"


@pytest.mark.parametrize("args", [
    [["--override-generation-config", '{"max_new_tokens": 100000000}']],
    [['--override-generation-config={"temperature": 0.7}']],
    [["--override_generation_config", "{}"]],  # FlexibleArgumentParser reads _ as -
], ids=["split", "equals", "underscore"])
def test_a_site_cannot_lift_vllm_s_output_cap(args):
    text = blockers(**vllm_site(*args))
    assert "which the project sets itself: remove it (it carries the engine's output cap: set " \
           "serving_max_output_tokens" in text, text


@pytest.mark.parametrize("where", ["env", "container"])
def test_a_site_cannot_lift_sglang_s_output_cap(where):
    env = {"SGLANG_MAX_NEW_TOKENS_LIMIT": "0"}  # 0: the scheduler's "no limit"
    override = {"env": env} if where == "env" else {"container": {"env": env}}
    text = blockers(profile_overrides={"engines": {"sglang": override}})
    assert "sets SGLANG_MAX_NEW_TOKENS_LIMIT, which the project sets itself (the engine's output cap: set " \
           "serving_max_output_tokens): remove it." in text, text
