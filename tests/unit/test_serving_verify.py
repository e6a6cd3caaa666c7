"""Unit tests of the serving_verify module: its pure functions (SSE parsing, leak detection,
tool-call validation, statistics, reference comparison, image request building), the
DOCUMENTATION/argument_spec agreement, and main() through patch_module_args (option refusals
and a run against a closed loopback port: no server, so the health check must fail within its
timeout with the troubleshooting table's cause and fix, not a traceback).

The checks against a real engine are in tests/integration/test_serving_verify_vllm.py.
"""

from __future__ import annotations

import ast
import base64
import json
import os
import socket
import struct
import sys
import time
import zlib

import pytest
import yaml

from helpers import load_source  # tests/ is on sys.path (pytest.ini)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))



from ansible_collections.mm3.shared.plugins.module_utils import serving_verify_core as core  # noqa: E402
from ansible_collections.mm3.shared.plugins.module_utils import serving_verify_checks as checks  # noqa: E402
module = load_source("serving_verify", os.path.join(ROOT, "library", "serving_verify.py"))

from ansible.module_utils.testing import patch_module_args  # noqa: E402


# --- SSE ----------------------------------------------------------------------------------

def test_parse_sse_events_and_done():
    lines = [b'data: {"a": 1}\n', b"\n", b": keep-alive\n", b"\n", b"event: x\n", b'data: {"b":\n',
             b"data: 2}\n", b"\r\n", b"data: [DONE]\n", b"\n"]
    payloads = list(core.parse_sse(lines))
    assert payloads == ['{"a": 1}', '{"b":\n2}', "[DONE]"]
    assert core.decode_stream_events(payloads) == [{"a": 1}, {"b": 2}]


def test_parse_sse_trailing_event_without_blank_line():
    assert list(core.parse_sse(["data: x", "data:y"])) == ["x\ny"]


def test_decode_stream_events_rejects_bad_json():
    with pytest.raises(ValueError, match="invalid JSON"):
        core.decode_stream_events(["{not json"])


def test_parse_sse_line_state_is_reset():
    state = []
    assert core.parse_sse_line("data: 1", state) is None
    assert core.parse_sse_line("", state) == "1"
    assert state == []
    assert core.parse_sse_line("", state) is None


# --- leaks --------------------------------------------------------------------------------

@pytest.mark.parametrize("text,expected", [
    ("plain answer", []),
    ("<think>x</think>answer", ["<think>", "</think>"]),
    ("<mm:think>hidden</mm:think> ok", ["<mm:think>", "</mm:think>"]),
    ("reasoning only</think>answer", ["</think>"]),
    ("", []),
    (None, []),
])
def test_reasoning_leaks(text, expected):
    assert core.find_reasoning_leaks(text) == expected


@pytest.mark.parametrize("text,expected", [
    ('<tool_call>{"name": "f"}</tool_call>', ["<tool_call>", "</tool_call>"]),
    (']<]minimax[>[<tool_call>{"name": "f"}', ["]<]minimax[>[<tool_call>"]),
    ("<minimax:tool_call>x", ["<minimax:tool_call>"]),
    ("the weather is mild", []),
])
def test_tool_leaks(text, expected):
    assert core.find_tool_leaks(text) == expected


@pytest.mark.parametrize("message,expected", [
    ({"reasoning_content": "trace"}, "trace"),                 # SGLang
    ({"reasoning": "trace", "reasoning_content": None}, "trace"),  # vLLM
    ({"reasoning": "  "}, ""),
    ({}, ""),
    (None, ""),
])
def test_reasoning_of(message, expected):
    assert core.reasoning_of(message) == expected


# --- schema and tool calls ------------------------------------------------------------------

EVENT_SCHEMA = core.EVENT_TOOL["function"]["parameters"]


@pytest.mark.parametrize("value,errors", [
    ({"title": "R", "attendees": ["a"], "when": {"day": "mon", "hour": 10}}, []),
    ({"title": "R", "attendees": [], "when": {"day": "mon", "hour": 10}}, ["$.attendees: fewer than 1 items"]),
    ({"title": "R", "attendees": [1], "when": {"day": "mon", "hour": 10}}, ["$.attendees[0]: expected string, got int"]),
    ({"title": "R", "attendees": ["a"], "when": {"day": "mon", "hour": True}}, ["$.when.hour: expected integer, got bool"]),
    ({"title": "R", "attendees": ["a"]}, ["$: missing required property 'when'"]),
    ([], ["$: expected object, got list"]),
])
def test_validate_schema(value, errors):
    assert core.validate_schema(value, EVENT_SCHEMA) == errors


def test_validate_schema_enum_and_additional_properties():
    schema = {"type": "object", "properties": {"u": {"type": "string", "enum": ["c", "f"]}},
              "additionalProperties": False}
    assert core.validate_schema({"u": "k", "x": 1}, schema) == ["$.u: 'k' not one of ['c', 'f']",
                                                                "$: unexpected property 'x'"]


def _call(name, args):
    return {"id": "c", "type": "function", "function": {"name": name, "arguments": args}}


def test_validate_tool_calls_parallel_ok():
    calls = [_call("get_weather", '{"location": "Paris"}'), _call("get_weather", {"location": "Tokyo", "unit": "celsius"})]
    errors, parsed = core.validate_tool_calls(calls, core.TOOLS, ["get_weather", "get_weather"])
    assert errors == []
    assert [c["arguments"]["location"] for c in parsed] == ["Paris", "Tokyo"]


@pytest.mark.parametrize("calls,expect,needle", [
    (None, ["get_weather"], "no tool_calls"),
    ([], ["get_weather"], "no tool_calls"),
    ([_call("get_weather", "{bad json")], ["get_weather"], "not valid JSON"),
    ([_call("rm_rf", "{}")], ["get_weather"], "unknown function"),
    ([_call("get_weather", '{"unit": "kelvin"}')], ["get_weather"], "missing required property 'location'"),
    ([_call("get_weather", '{"location": "Paris"}')], ["get_weather", "get_weather"], "expected calls"),
])
def test_validate_tool_calls_errors(calls, expect, needle):
    errors, _ = core.validate_tool_calls(calls, core.TOOLS, expect)
    assert any(needle in e for e in errors), errors


# --- statistics and benchmark ---------------------------------------------------------------

@pytest.mark.parametrize("values,pct,expected", [
    ([1, 2, 3, 4], 50, 2.5),
    ([1, 2, 3, 4], 99, 3.97),
    ([5], 99, 5.0),
    ([3, 1, 2], 0, 1.0),
    ([], 50, None),
])
def test_percentile_matches_numpy_linear(values, pct, expected):
    got = core.percentile(values, pct)
    assert (got is None and expected is None) or abs(got - expected) < 1e-9


def test_summarize_scales_and_skips_none():
    s = core.summarize([0.1, None, 0.3], 1000.0)
    assert s["count"] == 2 and abs(s["mean"] - 200.0) < 1e-9 and abs(s["median"] - 200.0) < 1e-9


def test_request_timings_definitions():
    t = core.request_timings(10.0, [10.5, 10.6, 10.8, 11.0], output_tokens=4)
    assert abs(t["ttft"] - 0.5) < 1e-9
    assert [round(x, 6) for x in t["itl"]] == [0.1, 0.2, 0.2]
    assert abs(t["latency"] - 1.0) < 1e-9
    assert abs(t["tpot"] - (1.0 - 0.5) / 3) < 1e-9


def test_request_timings_single_token_and_empty():
    assert core.request_timings(0.0, [0.2])["tpot"] is None
    assert core.request_timings(0.0, [])["ttft"] is None


def test_bench_metrics_throughput_and_failures():
    reqs = [
        {"ok": True, "ttft": 0.1, "tpot": 0.01, "itl": [0.01, 0.01], "latency": 0.12, "output_tokens": 3, "input_tokens": 10},
        {"ok": True, "ttft": 0.3, "tpot": 0.03, "itl": [0.03], "latency": 0.33, "output_tokens": 2, "input_tokens": 10},
        {"ok": False, "error": "HTTP 500: boom"},
    ]
    m = core.bench_metrics(reqs, 2.0)
    assert m["completed"] == 2 and m["failed"] == 1 and m["errors"] == ["HTTP 500: boom"]
    assert m["output_throughput"] == 2.5 and m["total_token_throughput"] == 12.5 and m["request_throughput"] == 1.0
    assert abs(m["ttft_ms"]["mean"] - 200.0) < 1e-9 and m["itl_ms"]["count"] == 3


SEED_WORKLOAD = dict(core.REFERENCE_WORKLOAD)


@pytest.mark.parametrize("ttft,tpot,status", [
    (1580.0, 24.1, "pass"),
    (1700.0, 24.0, "pass"),      # 7.6 % slower: inside 10 %
    (1800.0, 24.0, "warn"),      # 13.9 % slower TTFT
    (1000.0, 30.0, "warn"),
])
def test_compare_reference_b200(ttft, tpot, status):
    metrics = {"ttft_ms": {"mean": ttft}, "tpot_ms": {"mean": tpot}}
    res = core.compare_reference(metrics, core.REFERENCE_FIGURES["b200"], SEED_WORKLOAD, 0.10)
    assert res["status"] == status
    assert abs(res["ttft_ms"]["ratio"] - ttft / 1580.0) < 1e-9


def test_compare_reference_skips_other_workload_and_missing_reference():
    metrics = {"ttft_ms": {"mean": 1.0}, "tpot_ms": {"mean": 1.0}}
    other = dict(SEED_WORKLOAD, input_len=64)
    assert core.compare_reference(metrics, core.REFERENCE_FIGURES["h200"], other)["status"] == "skipped"
    assert "input_len 64 != 2048" in core.compare_reference(metrics, core.REFERENCE_FIGURES["h200"], other)["reason"]
    assert core.compare_reference(metrics, None, SEED_WORKLOAD)["status"] == "skipped"


def test_reference_figures_are_the_seeds():
    assert core.REFERENCE_FIGURES["b200"]["ttft_ms"] == 1580.0 and core.REFERENCE_FIGURES["b200"]["tpot_ms"] == 24.1
    assert core.REFERENCE_FIGURES["h200"]["ttft_ms"] == 1054.0 and core.REFERENCE_FIGURES["h200"]["tpot_ms"] == 70.8
    assert core.REFERENCE_WORKLOAD == {"input_len": 2048, "output_len": 256, "concurrency": 64, "num_prompts": 128}


def test_bench_prompts_are_reproducible_and_sized():
    a = core.bench_prompts(3, 100, 0.5, seed=7)
    assert a == core.bench_prompts(3, 100, 0.5, seed=7)
    assert len(a) == 3 and all(len(p.split()) == 50 for p in a)
    assert a != core.bench_prompts(3, 100, 0.5, seed=8)


# --- image ----------------------------------------------------------------------------------

def test_make_png_is_a_valid_png():
    png = core.make_png(8, 4)
    assert png.startswith(b"\x89PNG\r\n\x1a\n")
    length, kind = struct.unpack(">I4s", png[8:16])
    assert kind == b"IHDR" and length == 13
    width, height, depth, color = struct.unpack(">IIBB", png[16:26])
    assert (width, height, depth, color) == (8, 4, 8, 2)
    idat_len = struct.unpack(">I", png[33:37])[0]
    raw = zlib.decompress(png[41:41 + idat_len])
    assert len(raw) == 4 * (1 + 8 * 3)


def test_image_request_uses_a_data_uri():
    uri = core.png_data_uri()
    assert uri.startswith("data:image/png;base64,")
    assert base64.b64decode(uri.split(",", 1)[1]).startswith(b"\x89PNG")
    msgs = core.image_messages(uri)
    assert msgs[0]["content"][0] == {"type": "text", "text": core.IMAGE_PROMPT}
    assert msgs[0]["content"][1] == {"type": "image_url", "image_url": {"url": uri}}


@pytest.mark.parametrize("url,allow,ok", [
    ("https://raw.githubusercontent.com/sgl-project/x.png", ["https://raw.githubusercontent.com/sgl-project"], True),
    ("https://raw.githubusercontent.com/sgl-project-evil/x.png", ["https://raw.githubusercontent.com/sgl-project"], False),
    ("https://raw.githubusercontent.com.evil.io/x.png", ["https://raw.githubusercontent.com"], False),
    ("http://169.254.169.254/latest", [], False),
    ("https://images.example/a.png", ["https://images.example/"], True),
])
def test_url_allowlist(url, allow, ok):
    assert core.url_allowed(url, allow) is ok


# --- results and diagnosis ------------------------------------------------------------------

def test_failure_message_names_cause_and_fix():
    r = core.check_result("reasoning", False, "reasoning markup leaked into content: <think>", 0.1,
                          diagnosis="reasoning_leak")
    assert r["status"] == "failed" and "--reasoning-parser" in r["fix"]
    msg = core.failure_message([r, core.check_result("chat", True, "ok", 0.1)])
    assert msg.startswith("verification failed: reasoning:") and "likely cause" in msg and "chat" not in msg
    assert core.failure_message([core.check_result("chat", True, "ok", 0.1)]) == ""


def test_every_diagnosis_key_used_exists():
    src = open(checks.__file__).read()
    for key in ("unreachable", "not_ready", "auth", "model", "reasoning_leak", "tool_leak", "image", "generation", "bench"):
        assert core.diagnose(key)["fix"], key
        assert '"%s"' % key in src or "'%s'" % key in src


# --- documentation in step with the argument_spec -------------------------------------------

def _argument_spec():
    tree = ast.parse(open(os.path.join(ROOT, "library", "serving_verify.py")).read())
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "AnsibleModule":
            for kw in node.keywords:
                if kw.arg == "argument_spec":
                    return ast.literal_eval(_dict_call_to_literal(kw.value))
    raise AssertionError("no AnsibleModule(argument_spec=...) in main()")


def _dict_call_to_literal(node):
    """Turn nested dict(k=v) calls into a literal dict node; a name (choices=ALL_CHECKS) becomes
    the value the loaded module gives it."""
    if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "dict":
        return ast.Dict(keys=[ast.Constant(kw.arg) for kw in node.keywords],
                        values=[_dict_call_to_literal(kw.value) for kw in node.keywords])
    if isinstance(node, ast.List):
        return ast.List(elts=[_dict_call_to_literal(e) for e in node.elts], ctx=ast.Load())
    if isinstance(node, ast.Name):
        return ast.Constant(getattr(module, node.id))
    return node


def test_the_check_list_is_defined_once_and_documented_as_it_is():
    """The `checks` choices are the shared ALL_CHECKS (no copy in the module), DOCUMENTATION lists
    exactly those names in that order, and the documented default is default_checks()."""
    spec = _argument_spec()["checks"]
    assert spec["choices"] is checks.ALL_CHECKS
    assert "default" not in spec  # unset: default_checks(eval_set), resolved in main()
    doc = yaml.safe_load(module.DOCUMENTATION)["options"]["checks"]
    assert doc["choices"] == checks.ALL_CHECKS
    assert "default" not in doc
    text = " ".join(doc["description"])
    documented_default = ", ".join("C(%s)" % name for name in checks.default_checks())
    assert documented_default + " - then C(eval) when C(eval_set) is given" in text
    # every name has its check and every check its name (Verifier.run calls check_<name>)
    methods = {n[len("check_"):] for n in dir(checks.Verifier) if n.startswith("check_")}
    assert methods == set(checks.ALL_CHECKS)
    assert len(set(checks.ALL_CHECKS)) == len(checks.ALL_CHECKS)
    assert {"eval", "bench"} <= set(checks.ALL_CHECKS) and set(checks.GATEWAY_CHECKS) <= set(checks.ALL_CHECKS)


def test_the_default_checks_are_the_functional_ones_and_eval_with_a_set():
    assert checks.default_checks() == checks.FUNCTIONAL_CHECKS
    assert checks.default_checks({"cases": []}) == checks.FUNCTIONAL_CHECKS + ["eval"]
    assert checks.default_checks() is not checks.FUNCTIONAL_CHECKS  # a copy, not the constant
    assert not set(checks.FUNCTIONAL_CHECKS) & ({"eval", "bench"} | set(checks.GATEWAY_CHECKS))


def _string_lists(node):
    if isinstance(node, list):
        if node and all(isinstance(item, str) for item in node):
            yield node
        for item in node:
            yield from _string_lists(item)
    elif isinstance(node, dict):
        for value in node.values():
            yield from _string_lists(value)


def test_no_role_or_playbook_keeps_a_copy_of_the_check_list():
    """The role's default is null (the module's default_checks); no tasks, defaults or playbook
    spells the default or the whole list again (a site's inventory may choose its own)."""
    defaults = yaml.safe_load(open(os.path.join(ROOT, "roles", "serving_verify", "defaults", "main.yml")))
    assert defaults["serving_verify_checks"] is None
    copies = [checks.ALL_CHECKS, checks.default_checks(), checks.default_checks({"cases": [1]})]
    found = []
    for top in ("roles", "playbooks", "lab"):
        for base, _, files in os.walk(os.path.join(ROOT, top)):
            for name in files:
                if name.endswith((".yml", ".yaml")) and "templates" not in base:
                    path = os.path.join(base, name)
                    tree = yaml.safe_load(open(path))
                    found += ["%s: %s" % (os.path.relpath(path, ROOT), lst)
                              for lst in _string_lists(tree) if lst in copies]
    assert not found, found


def test_the_report_carries_the_limits_but_never_the_limits_key():
    params = {"base_url": "https://127.0.0.1:8443", "engine": "sglang", "checks": ["gateway_rate"],
              "ca_path": "/etc/haproxy/mm3/ca.pem",
              "gateway": {"limits_key": "Lq7Wc2Zr9Tn4Vb6Xm1Ks8Jd3Hf5Gp0Ay", "rate_per_minute": 600}}
    verifier = checks.Verifier(None, params)
    report = module.build_report(params, verifier, [], "2026-01-01T00:00:00Z", 0.0)
    assert report["gateway"] == {"rate_per_minute": 600} and report["ca_path"] == params["ca_path"]
    assert "Lq7Wc2Zr9Tn4" not in json.dumps(report)


def test_main_runs_the_default_checks_when_none_are_given(capsys):
    """No `checks`: the report names default_checks() (a closed port: every check fails fast)."""
    code, out = _run_main({"base_url": "http://127.0.0.1:%d" % _closed_port(),
                           "timeouts": {"health": 0.5, "interval": 0.1, "request": 0.5}}, capsys)
    assert code == 1
    assert out["report"]["checks"] == checks.default_checks()
    assert [r["name"] for r in out["results"]] == checks.default_checks()


def test_api_key_is_no_log():
    assert _argument_spec()["api_key"]["no_log"] is True


def test_module_defaults_match_the_documented_bench_and_timeouts():
    doc = yaml.safe_load(module.DOCUMENTATION)["options"]
    for key, sub in doc["bench"]["suboptions"].items():
        if "default" in sub:
            assert module.BENCH_DEFAULTS[key] == sub["default"], key
    for key, sub in doc["timeouts"]["suboptions"].items():
        assert module.TIMEOUT_DEFAULTS[key] == sub["default"], key


# --- main() ---------------------------------------------------------------------------------

def _run_main(args, capsys):
    with patch_module_args(args):
        with pytest.raises(SystemExit) as exc:
            module.main()
    out = json.loads(capsys.readouterr().out)
    return exc.value.code, out


def _closed_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


@pytest.mark.parametrize("args,needle", [
    ({"base_url": "127.0.0.1:30000"}, "base_url must start with http"),
    ({"base_url": "http://127.0.0.1:1", "bench": {"concurrency": 0}}, "bench.concurrency must be >= 1"),
    ({"base_url": "http://127.0.0.1:1", "timeouts": {"health": 0}}, "timeouts.health must be > 0"),
    ({"base_url": "http://127.0.0.1:1", "image_url": "file:///etc/passwd"}, "image_url must be an http(s) URL"),
])
def test_main_refuses_bad_options(args, needle, capsys):
    code, out = _run_main(args, capsys)
    assert code == 1 and out["failed"] and needle in out["msg"]


def test_main_health_fails_within_timeout_without_traceback(capsys, tmp_path):
    port = _closed_port()
    report = tmp_path / "r" / "verify.json"
    start = time.monotonic()
    code, out = _run_main({"base_url": "http://127.0.0.1:%d" % port, "api_key": "s3cret-key",
                           "engine": "vllm", "checks": ["health"], "report_path": str(report),
                           "timeouts": {"health": 3, "interval": 0.5, "request": 1}}, capsys)
    elapsed = time.monotonic() - start
    assert code == 1 and out["failed"]
    assert elapsed < 8, elapsed
    res = out["results"][0]
    assert res["name"] == "health" and res["status"] == "failed" and res["data"]["attempts"] >= 2
    assert "Connection refused" in res["detail"] or "refused" in res["detail"].lower()
    assert "port" in res["fix"] and "likely cause" in out["msg"]
    assert "Traceback" not in json.dumps(out) and "s3cret-key" not in json.dumps(out)
    saved = json.loads(report.read_text())
    assert saved["summary"] == {"passed": 0, "failed": 1, "skipped": 0, "warn": 0, "total": 1}
    assert oct(report.stat().st_mode & 0o777) == "0o640"


def test_main_check_mode_writes_no_report_and_skips_outside_boundary(capsys, tmp_path):
    report = tmp_path / "verify.json"
    code, out = _run_main({"base_url": "http://127.0.0.1:%d" % _closed_port(), "checks": ["image", "auth"],
                           "capabilities": ["text", "reasoning", "tools"], "report_path": str(report),
                           "_ansible_check_mode": True}, capsys)
    assert code == 0 and not out.get("failed") and out["changed"] is False
    assert [r["status"] for r in out["results"]] == ["skipped", "skipped"]
    assert "capability boundary" in out["results"][0]["detail"]
    assert "no API key" in out["results"][1]["detail"]
    assert not report.exists()


def test_image_url_outside_allowlist_is_refused_before_sending(capsys):
    # No server listens: the refusal must come from the allowlist, not from a network error.
    code, out = _run_main({"base_url": "http://127.0.0.1:%d" % _closed_port(), "checks": ["image"],
                           "model": "m", "image_url": "https://evil.example/x.png",
                           "image_url_allowlist": ["https://raw.githubusercontent.com/sgl-project"]}, capsys)
    assert code == 1
    assert "not in image_url_allowlist" in out["results"][0]["detail"]
