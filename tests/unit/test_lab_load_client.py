"""The release drill's background client (lab/files/lab_load_client.py) counts what a real HTTP
server answers: the drill's "no failed request" is only as good as this count."""
from __future__ import annotations

import json
import os
import socket
import ssl
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from helpers import load_source

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
client = load_source("lab_load_client", os.path.join(ROOT, "lab", "files", "lab_load_client.py"))


class Handler(BaseHTTPRequestHandler):
    """Answers by the path the test server was started for: ok, 503, empty, garbage."""
    mode = "ok"
    seen = []

    def do_POST(self):  # noqa: N802 (http.server's name)
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        Handler.seen.append((self.headers.get("Authorization"), body))
        status, payload = {"ok": (200, b'{"choices": [{"message": {"content": "hi"}}]}'),
                           "503": (503, b'{"error": "no server"}'),
                           "empty": (200, b'{"choices": []}'),
                           "garbage": (200, b"<html>")}[Handler.mode]
        self.send_response(status)
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, *args):
        pass


@pytest.fixture()
def server():
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    Handler.seen = []
    yield "http://127.0.0.1:%d" % httpd.server_address[1]
    httpd.shutdown()


@pytest.mark.parametrize("mode, expected", [("ok", None), ("503", "HTTP 503"), ("empty", "200 without a choice"),
                                            ("garbage", "JSONDecodeError")])
def test_each_answer_is_counted_as_it_came(server, mode, expected):
    Handler.mode = mode
    reason = client.one_request(server, ssl.create_default_context(), "k" * 40, "mm3-lab/tiny-m3")
    assert reason == expected or (expected and reason.startswith(expected))
    key, body = Handler.seen[-1]
    assert key == "Bearer " + "k" * 40 and body["model"] == "mm3-lab/tiny-m3"


def test_a_refused_connection_is_a_failure():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    reason = client.one_request("http://127.0.0.1:%d" % port, ssl.create_default_context(), "k", "m", timeout=2)
    assert reason and "refused" in reason.lower()


def test_summary_counts_failures_with_their_time():
    results = [(100.0, None), (100.5, "HTTP 503"), (101.0, None), (102.25, "HTTP 503"), (103.0, "timed out")]
    summary = client.summarize(results, 100.0, 104.0)
    assert summary["requests"] == 5 and summary["ok"] == 2 and summary["failed"] == 3
    assert summary["reasons"] == {"HTTP 503": 2, "timed out": 1}
    assert summary["first_failures"][1] == {"t": 2.25, "reason": "HTTP 503"}
    assert client.summarize([], 1.0, 2.0)["failed"] == 0
