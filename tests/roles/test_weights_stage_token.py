"""weights_stage never hands the hub token to another address.

Ansible's uri module keeps the Authorization header when it follows a redirect, to whatever
host the Location names. Here the "hub" is a real HTTP server on loopback that answers the
file-list request with a 302 to a second server on another port (a stand-in for a compromised
or misconfigured mirror; the real hub answers renamed repositories with a redirect too). The
role runs against the controller in --check mode and must refuse the redirect, naming where
it pointed, while the second server never sees the token (nor any request at all). A redirect
that stays on the endpoint's own origin (olah, the lab's hub, answers the file list with a 307
to the same path plus a trailing slash) is followed, once.
"""
import http.server
import threading

import pytest
from helpers import failures, run_role_check

TOKEN = "hf_" + "Zq7Xk2Lm9Wv4Rt8Yp3Nb6Hc1Jd5Gf0Se"


class _Recorder(http.server.BaseHTTPRequestHandler):
    seen = None
    location = None

    def do_GET(self):  # noqa: N802 - http.server's name
        self.seen.append({"path": self.path, "authorization": self.headers.get("Authorization")})
        if self.location == "same-origin" and "/?" not in self.path:
            self.send_response(307)      # what olah does: the same path with a trailing slash
            self.send_header("Location", self.path.replace("?", "/?", 1))
            self.end_headers()
            return
        if self.location and self.location != "same-origin":
            self.send_response(302)
            self.send_header("Location", self.location + self.path)
            self.end_headers()
            return
        body = b"[]"
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def _serve(location=None):
    seen = []
    handler = type("Handler", (_Recorder,), {"seen": seen, "location": location})
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv, seen


@pytest.fixture
def redirecting_hub():
    other, other_seen = _serve()
    other_url = "http://127.0.0.1:%d" % other.server_address[1]
    hub, hub_seen = _serve(location=other_url)
    yield "http://127.0.0.1:%d" % hub.server_address[1], other_url, hub_seen, other_seen
    hub.shutdown()
    other.shutdown()


def run_stage(tmp_path, endpoint):
    """weights_stage against `endpoint` with a token, on the controller in --check mode."""
    return run_role_check("weights_stage", {
        "weights_stage_repo": "org/model", "weights_stage_revision": "a" * 40,
        "weights_stage_dir": str(tmp_path / "models" / "model"), "weights_stage_endpoint": endpoint,
        "weights_stage_hf_token": TOKEN, "weights_stage_manifest_sha256": ""}, tmp_path)


def test_a_redirect_is_refused_and_the_token_never_reaches_the_other_host(tmp_path, redirecting_hub):
    hub_url, other_url, hub_seen, other_seen = redirecting_hub
    runner, out = run_stage(tmp_path, hub_url)
    msgs = " ".join(str(m) for m in failures(runner).values())
    assert runner.rc != 0
    assert hub_seen and hub_seen[0]["authorization"] == "Bearer " + TOKEN   # the hub itself got it
    assert other_seen == [], "the token followed the redirect to %s: %r" % (other_url, other_seen)
    assert "redirected the file list of org/model (HTTP 302)" in msgs and other_url in msgs
    assert TOKEN not in out
    assert not (tmp_path / "models").exists()


def test_a_redirect_on_the_endpoints_own_origin_is_followed_once(tmp_path):
    hub, hub_seen = _serve(location="same-origin")
    try:
        runner, out = run_stage(tmp_path, "http://127.0.0.1:%d" % hub.server_address[1])
    finally:
        hub.shutdown()
    msgs = " ".join(str(m) for m in failures(runner).values())
    # both requests went to the hub itself, with the token; the (empty) listing was read
    assert [s["path"].split("?")[0][-1] for s in hub_seen] == ["a", "/"]
    assert all(s["authorization"] == "Bearer " + TOKEN for s in hub_seen)
    assert "redirected" not in msgs and "names no files" in msgs
    assert TOKEN not in out


def test_a_hub_across_the_network_over_plain_http_is_refused_before_any_request(tmp_path):
    """The token would travel in clear (issue 32): http:// is taken only to a loopback host."""
    hub, hub_seen = _serve()
    try:
        runner, out = run_stage(tmp_path, "http://127.0.0.2.nip.example:%d" % hub.server_address[1])
    finally:
        hub.shutdown()
    msgs = " ".join(str(m) for m in failures(runner).values())
    assert runner.rc != 0 and "Use the mirror's https:// address" in msgs, msgs
    assert hub_seen == [] and TOKEN not in out
