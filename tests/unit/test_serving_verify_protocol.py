"""Protocol tests of serving_verify against a STAND-IN SGLang server (in-process, loopback).

SGLang cannot run on CPU here (its wheels need CUDA kernels, shared/reference/cpu-engine.md), and
the tiny vLLM model has no vision tower, so the SGLang-specific paths and the image check are
exercised against a small HTTP server that answers with SGLang's documented shapes
(shared/reference/serving.md): /health 503 while loading then 200; every path but /health needs
the key (401); reasoning in `message.reasoning_content`; tool calls in `message.tool_calls`;
with the parsers "off" the raw `<mm:think>` and `]<]minimax[>[<tool_call>` markup lands in
`content`. This is a stand-in for the protocol, not an engine: the real-engine tests are in
tests/integration/test_serving_verify_vllm.py.
"""

from __future__ import annotations

import base64
import json
import os
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import test_serving_verify as tsv  # noqa: E402  (loads the module and its module_utils)

module = tsv.module
KEY = "sgl-standin-key"


class StandIn(object):
    def __init__(self, parsers=True, load_seconds=0.0, image_ok=True):
        self.parsers = parsers
        self.ready_at = time.monotonic() + load_seconds
        self.image_ok = image_ok
        self.requests = []


def _handler(state):
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def _send(self, code, body):
            data = json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _authorized(self):
            return self.headers.get("Authorization") == "Bearer " + KEY

        def do_GET(self):
            if self.path == "/health":
                return self._send(200 if time.monotonic() >= state.ready_at else 503, {})
            if not self._authorized():
                return self._send(401, {"error": {"message": "Unauthorized"}})
            if self.path == "/v1/models":
                return self._send(200, {"object": "list", "data": [{"id": "MiniMaxAI/MiniMax-M3-MXFP8"}]})
            return self._send(404, {})

        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
            state.requests.append((self.path, body))
            if not self._authorized():
                return self._send(401, {"error": {"message": "Unauthorized"}})
            msgs = body.get("messages") or []
            content = msgs[-1]["content"] if msgs else ""
            message = {"role": "assistant", "content": "Sparse attention looks at a few tokens."}
            if isinstance(content, list):
                url = content[1]["image_url"]["url"]
                if url.startswith("data:image/png;base64,"):
                    assert base64.b64decode(url.split(",", 1)[1]).startswith(b"\x89PNG")
                message["content"] = "A red square on blue." if state.image_ok else ""
            elif body.get("tools"):
                names = [c["expect"] for c in tsv.core.TOOL_CASES if c["prompt"] == content][0]
                if state.parsers:
                    args = {"get_weather": {"location": "Paris"},
                            "create_event": {"title": "Review", "attendees": ["alice", "bob"],
                                             "when": {"day": "monday", "hour": 10}}}
                    message["content"] = None
                    message["tool_calls"] = [{"id": "c%d" % i, "type": "function", "function": {
                        "name": n, "arguments": json.dumps(args[n])}} for i, n in enumerate(names)]
                else:
                    message["content"] = ']<]minimax[>[<tool_call>{"name": "%s"}' % names[0]
            elif "17 + 25" in str(content):
                if state.parsers:
                    message.update(content="42.", reasoning_content="17 + 25 = 42")
                else:
                    message["content"] = "<mm:think>17 + 25 = 42</mm:think>42."
            return self._send(200, {"choices": [{"index": 0, "message": message, "finish_reason": "stop"}]})

    return Handler


@pytest.fixture
def standin(request):
    state = StandIn(**getattr(request, "param", {}))
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(state))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    state.url = "http://127.0.0.1:%d" % server.server_address[1]
    yield state
    server.shutdown()
    server.server_close()


def _run(args, capsys):
    return tsv._run_main(args, capsys)


ALL = ["health", "models", "chat", "reasoning", "tools", "image", "auth"]


@pytest.mark.parametrize("standin", [{"load_seconds": 1.5}], indirect=True)
def test_sglang_shapes_pass_and_health_waits_for_loading(standin, capsys):
    code, out = _run({"base_url": standin.url, "api_key": KEY, "engine": "sglang",
                      "expected_model": "MiniMaxAI/MiniMax-M3-MXFP8", "checks": ALL,
                      "capabilities": ["text", "reasoning", "tools", "image"],
                      "image_url": "https://raw.githubusercontent.com/sgl-project/sglang/x/example_image.png",
                      "image_url_allowlist": ["https://raw.githubusercontent.com/sgl-project/sglang"],
                      "timeouts": {"health": 10, "interval": 0.5}}, capsys)
    res = {r["name"]: r for r in out["results"]}
    assert code == 0, out["msg"]
    assert res["health"]["data"]["attempts"] >= 2  # 503 while loading, then 200
    assert "SGLang generates one token" in res["health"]["detail"]
    assert res["reasoning"]["data"]["field"] == "reasoning_content"
    assert "data URI and allowlisted URL" in res["image"]["detail"]
    posted = [b for p, b in standin.requests if p == "/v1/chat/completions"]
    reasoning_req = [b for b in posted if "17 + 25" in str(b["messages"])][0]
    assert reasoning_req["separate_reasoning"] is True
    assert reasoning_req["chat_template_kwargs"]["thinking_mode"] == "enabled"
    # SGLang's /health generates itself: no extra 1-token generation was sent.
    assert not any(b.get("max_tokens") == 1 for b in posted)


@pytest.mark.parametrize("standin", [{"parsers": False}], indirect=True)
def test_sglang_parsers_off_names_minimax_markup(standin, capsys):
    code, out = _run({"base_url": standin.url, "api_key": KEY, "checks": ["reasoning", "tools"]}, capsys)
    res = {r["name"]: r for r in out["results"]}
    assert code == 1
    assert "<mm:think>" in res["reasoning"]["detail"] and "--reasoning-parser auto" in res["reasoning"]["fix"]
    assert "]<]minimax[>[<tool_call>" in res["tools"]["detail"] and "--tool-call-parser auto" in res["tools"]["fix"]


@pytest.mark.parametrize("standin", [{"image_ok": False}], indirect=True)
def test_image_empty_answer_fails_with_the_seed_row(standin, capsys):
    code, out = _run({"base_url": standin.url, "api_key": KEY, "checks": ["image"]}, capsys)
    res = out["results"][0]
    assert code == 1 and res["detail"] == "data URI: empty answer"
    assert "allowlisted URL" in res["fix"]


def test_sglang_without_key_fails_every_check_as_auth(standin, capsys):
    code, out = _run({"base_url": standin.url, "checks": ["models", "chat"]}, capsys)
    assert code == 1
    for r in out["results"]:
        assert r["status"] == "failed" and "HTTP 401" in r["detail"] and "Bearer" in r["fix"]
