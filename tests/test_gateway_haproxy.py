"""The gateway's protections against the real HAProxy (the distribution's package on this
machine), rendered from the role's own templates and filter, in front of the recording upstream
(tests/gateway_harness.py; a stand-in for the engine, named as such). The verification module's
gateway checks pass against the full configuration, and each fails when the one protection it
probes is removed from the rendered files (strip_protection), so no check passes whatever the
gateway does. The engine itself behind the gateway is exercised in the lab (make lab)."""
import concurrent.futures
import os
import subprocess
import time

import pytest

import gateway_harness as gh
from helpers import ROOT, load_source

from ansible_collections.mm3.shared.plugins.module_utils import serving_verify_http as http  # noqa: E402
from ansible_collections.mm3.shared.plugins.module_utils import serving_verify_checks as checks  # noqa: E402

MAIN_KEY = "mK3vQ9zL2xR7tB5nW8cJ4hF6dS1aG0pE"
LIMITS_KEY = "Lq7Wc2Zr9Tn4Vb6Xm1Ks8Jd3Hf5Gp0Ay"
CLIENTS = [
    {"name": "main", "key": MAIN_KEY},
    {"name": "limits", "key": LIMITS_KEY, "requests_per_minute": 5, "concurrent": 2,
     "max_body_bytes": 4096, "max_tokens": 64},
]
GATEWAY_OPTS = {"limits_key": LIMITS_KEY, "rate_per_minute": 5, "max_body_bytes": 4096,
                "max_tokens": 64, "private_paths": ["/invocations", "/tokenize", "/flush_cache",
                                                    "/get_server_info", "/update_weights_from_disk",
                                                    "/metrics"]}


@pytest.fixture(scope="module")
def site_ca(tmp_path_factory):
    out = tmp_path_factory.mktemp("ca")
    subprocess.run(["python3", os.path.join(ROOT, "lab", "files", "make_site_ca.py"), str(out),
                    "127.0.0.1", "localhost"], check=True, capture_output=True)
    return str(out)


def verifier(url, ca_dir, key=MAIN_KEY):
    client = http.Client(url, key, timeout=10, ca_path=os.path.join(ca_dir, "ca.pem"))
    params = {"timeouts": {"health": 10, "interval": 0.5, "request": 10, "bench": 30},
              "gateway": dict(GATEWAY_OPTS), "model": "tiny-m3", "max_tokens": 16,
              "temperature": 1.0, "top_p": 0.95}
    return checks.Verifier(client, params)


def run_check(tmp_path, ca, name, without=(), upstream=None):
    with gh.RecordingUpstream() as up:
        spec = gh.lab_spec(ca, up.port, CLIENTS)
        with gh.running_gateway(tmp_path, spec, ca, without=without) as url:
            result = getattr(verifier(url, ca), "check_" + name)()
            return result, up.requests


ALL = ["gateway_paths", "gateway_body", "gateway_max_tokens", "gateway_media", "gateway_tls", "gateway_rate"]


def test_every_gateway_check_passes_against_the_full_config(tmp_path, site_ca):
    with gh.RecordingUpstream() as up:
        spec = gh.lab_spec(site_ca, up.port, CLIENTS)
        with gh.running_gateway(tmp_path, spec, site_ca) as url:
            v = verifier(url, site_ca)
            v.p["api_key"] = MAIN_KEY
            results = v.run(ALL + ["auth"])
    failed = [r for r in results if r["status"] != "passed"]
    assert not failed, failed
    by_name = {r["name"]: r for r in results}
    assert "rate limit" in by_name["gateway_rate"]["detail"]
    assert "HTTP 413" in by_name["gateway_body"]["detail"]
    # Nothing that was refused reached the engine; nothing that reached it carried a key.
    reached = [r["path"] for r in up.requests]
    assert not set(reached) & set(GATEWAY_OPTS["private_paths"]), reached
    assert all("authorization" not in {h.lower() for h in r["headers"]} for r in up.requests)


@pytest.mark.parametrize("protection,check", [
    ("paths", "gateway_paths"),
    ("body size", "gateway_body"),
    ("max_tokens", "gateway_max_tokens"),
    ("media", "gateway_media"),
    ("rate", "gateway_rate"),
])
def test_each_check_fails_without_its_protection(tmp_path, site_ca, protection, check):
    result, _ = run_check(tmp_path, site_ca, check, without=[protection])
    assert result["status"] == "failed", result


def test_auth_check_fails_without_key_checking(tmp_path, site_ca):
    with gh.RecordingUpstream() as up:
        spec = gh.lab_spec(site_ca, up.port, CLIENTS)
        with gh.running_gateway(tmp_path, spec, site_ca, without=["auth"]) as url:
            v = verifier(url, site_ca)
            v.p["api_key"] = MAIN_KEY
            result = v.check_auth()
    assert result["status"] == "failed" and "without a key got HTTP 200" in result["detail"], result


def test_the_engine_sees_no_key_and_sees_one_without_that_protection(tmp_path, site_ca):
    for without, expect_key in (((), False), (("no key upstream",), True)):
        with gh.RecordingUpstream() as up:
            spec = gh.lab_spec(site_ca, up.port, CLIENTS)
            with gh.running_gateway(tmp_path, spec, site_ca, without=without) as url:
                assert verifier(url, site_ca).client.get("/v1/models").status == 200
        seen = [r["headers"].get("Authorization") or r["headers"].get("authorization") for r in up.requests
                if r["path"] == "/v1/models"]
        assert seen and (MAIN_KEY in str(seen)) is expect_key, (without, seen)


def test_tls_check_fails_on_a_plain_http_gateway(tmp_path, site_ca):
    with gh.RecordingUpstream() as up:
        spec = gh.lab_spec(site_ca, up.port, CLIENTS)
        with gh.running_gateway(tmp_path, spec, site_ca) as url:
            # The TLS check against a URL that is not https, and a client that trusts nothing
            # but the system store, both fail.
            assert verifier(url.replace("https", "http"), site_ca).check_gateway_tls()["status"] == "failed"
            untrusting = http.Client(url, MAIN_KEY, timeout=5)
            assert untrusting.get("/v1/models").status is None


def test_concurrency_limit_per_client_and_its_removal(tmp_path, site_ca):
    payload = {"model": "tiny-m3", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}
    for without, expect_refusal in (((), True), (("concurrency",), False)):
        with gh.RecordingUpstream(delay=1.5) as up:
            spec = gh.lab_spec(site_ca, up.port, CLIENTS)
            with gh.running_gateway(tmp_path, spec, site_ca, without=without) as url:
                client = verifier(url, site_ca).client
                with concurrent.futures.ThreadPoolExecutor(4) as pool:
                    answers = list(pool.map(lambda _: client.post("/v1/chat/completions", payload, key=LIMITS_KEY),
                                            range(4)))
        refused = [a for a in answers if a.status == 429]
        assert bool(refused) is expect_refusal, [(a.status, a.error) for a in answers]
        if refused:
            assert "concurrency limit" in refused[0].error


def test_streaming_passes_through_unbuffered(tmp_path, site_ca):
    with gh.RecordingUpstream() as up:
        spec = gh.lab_spec(site_ca, up.port, CLIENTS)
        with gh.running_gateway(tmp_path, spec, site_ca) as url:
            client = verifier(url, site_ca).client
            lines = []
            resp, _ = client.stream("/v1/chat/completions", {"model": "tiny-m3", "stream": True, "max_tokens": 8,
                                                               "messages": []}, lambda line, t: lines.append(line))
    assert resp.status == 200 and sum(1 for line in lines if line.startswith(b"data:")) == 5


@pytest.mark.parametrize("url,allowed", [
    ("data:image/png;base64,iVBORw0KGgo=", True),
    ("https://images.intranet/cat.png", True),
    ("https://IMAGES.intranet./cat.png", True),
    ("https://images.intranet.evil.example/cat.png", False),
    ("https://evil.example@images.intranet/cat.png", False),
    ("http://10.0.0.1/cat.png", False),
    ("file:///etc/passwd", False),
    ("https://images.intranet%2f@evil.example/x", False),
])
def test_media_policy_allowlist(tmp_path, site_ca, url, allowed):
    with gh.RecordingUpstream() as up:
        spec = gh.lab_spec(site_ca, up.port, CLIENTS, media_allowlist=["images.intranet"])
        with gh.running_gateway(tmp_path, spec, site_ca) as base:
            client = verifier(base, site_ca).client
            # The URL also travels JSON-escaped: the policy decodes before it looks.
            payload = {"model": "tiny-m3", "max_tokens": 8, "messages": [{"role": "user", "content": [
                {"type": "image_url", "image_url": {"url": url}}]}]}
            resp = client.post("/v1/chat/completions", payload)
    assert (resp.status == 200) is allowed, (resp.status, resp.error)
    if not allowed:
        assert resp.status == 400 and "media policy" in resp.error


def test_a_json_escaped_url_is_decoded_before_the_policy_looks(tmp_path, site_ca):
    import socket
    import ssl
    body = (b'{"model":"tiny-m3","max_tokens":8,"messages":[{"role":"user","content":[{"type":"image_url",'
            b'"image_url":{"\\u0075rl":"\\u0068ttp://evil.example/x.png"}}]}]}')
    with gh.RecordingUpstream() as up:
        spec = gh.lab_spec(site_ca, up.port, CLIENTS)
        with gh.running_gateway(tmp_path, spec, site_ca) as base:
            ctx = ssl.create_default_context(cafile=os.path.join(site_ca, "ca.pem"))
            with socket.create_connection(("127.0.0.1", spec["port"])) as raw, \
                    ctx.wrap_socket(raw, server_hostname="127.0.0.1") as sock:
                sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\n"
                             b"Content-Type: application/json\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s"
                             % (MAIN_KEY.encode(), len(body), body))
                answer = b""
                while True:
                    chunk = sock.recv(65536)
                    if not chunk:
                        break
                    answer += chunk
    assert answer.startswith(b"HTTP/1.1 400") and b"media policy" in answer, answer[:300]
    assert not [r for r in up.requests if r["path"] == "/v1/chat/completions"]


def test_a_body_the_policy_cannot_parse_is_refused(tmp_path, site_ca):
    with gh.RecordingUpstream() as up:
        spec = gh.lab_spec(site_ca, up.port, CLIENTS)
        with gh.running_gateway(tmp_path, spec, site_ca) as base:
            client = verifier(base, site_ca).client
            huge = client.post("/v1/chat/completions", {"model": "x", "max_tokens": 1e300, "messages": []})
            not_object = client.post("/v1/chat/completions", ["a list"])
    assert huge.status == 400 and "max_tokens limit" in huge.error, (huge.status, huge.error)
    assert not_object.status == 400, (not_object.status, not_object.error)


def _admin(tmp_dir, command):
    import socket as socketlib
    with socketlib.socket(socketlib.AF_UNIX) as sock:
        sock.connect(os.path.join(str(tmp_dir), "run", "admin.sock"))
        sock.sendall(command.encode() + b"\n")
        data = b""
        while True:
            chunk = sock.recv(65536)
            if not chunk:
                return data.decode()
            data += chunk


def test_fleet_gateway_balances_over_node_gateways_drains_and_survives_a_dead_node(tmp_path, site_ca):
    """The second topology: a `gateway` host in front of every node's gateway, over verified
    TLS. The key reaches the node gateways (they authenticate again) but never an engine; a
    drained node gets no new request; a node whose gateway dies leaves the pool without a
    failed request (redispatch, then the health check)."""
    import contextlib
    with contextlib.ExitStack() as stack:
        ups, node_dirs, node_cms, fleet_dir, client = _fleet_of_two(stack, tmp_path, site_ca)
        statuses = [client.get("/v1/models").status for _ in range(10)]
        assert statuses == [200] * 10
        counts = [len([r for r in up.requests if r["path"] == "/v1/models"]) for up in ups]
        assert all(c > 0 for c in counts), counts
        assert all("authorization" not in {h.lower() for h in r["headers"]} for up in ups for r in up.requests)
        # Without a key the fleet gateway refuses before any node sees the request.
        assert client.get("/v1/models", auth=False).status == 401

        _admin(fleet_dir, "set server mm3_engines/node0 state drain")
        before = len(ups[0].requests)
        assert [client.get("/v1/models").status for _ in range(6)] == [200] * 6
        assert len([r for r in ups[0].requests[before:] if r["path"] != "/health"]) == 0
        _admin(fleet_dir, "set server mm3_engines/node0 state ready")

        node_cms[1].__exit__(None, None, None)   # node1's gateway dies
        statuses = [client.get("/v1/models").status for _ in range(8)]
        assert statuses == [200] * 8, statuses
        assert _wait_down(fleet_dir, "node1")


def test_a_node_goes_back_into_the_fleet_pool_only_once_its_own_gateway_routes_to_its_engine(tmp_path, site_ca):
    """playbooks/tasks/rollout-pool.yml (state enabled), as rollout.yml runs it after a restart,
    against the real fleet and node gateways. HAProxy puts a server that leaves maintenance UP at
    once, before any check, while the node's own gateway still answers 503 until its checks see
    the restarted engine: the two-node release drill counted 9 and 20 failed requests there. Here
    the node's engine (the recording stand-in) answers /health 503 until 3 s into the switch,
    and a client sends requests through the fleet gateway all along: none may fail, and the node
    must serve again afterwards. With the wait task removed this fails (HTTP 503)."""
    import contextlib
    import json
    import sys
    import threading
    from helpers import run_playbook
    with contextlib.ExitStack() as stack:
        ups, node_dirs, _, fleet_dir, client = _fleet_of_two(stack, tmp_path, site_ca)
        local = {"ansible_connection": "local", "ansible_python_interpreter": sys.executable}
        inventory = tmp_path / "inventory.json"
        inventory.write_text(json.dumps({"all": {"children": {
            "nodes": {"hosts": {"node0": dict(local, serving_spec={"gateway": True},
                                              rollout_gateway_socket=str(node_dirs[0] / "run" / "admin.sock"))}},
            "gateway": {"hosts": {"fleet": dict(local, rollout_gateway_socket=str(fleet_dir / "run" / "admin.sock"))}}}}}))
        # The drain (state disabled): node0 leaves the fleet's pool and gets no new request.
        runner, out = run_playbook("tests/playbooks/rollout-pool.yml", tmp_path / "drain",
                                   extravars={"pool_state": "disabled"}, inventory=str(inventory))
        assert runner.rc == 0, out[-3000:]
        before = len(ups[0].requests)
        assert [client.get("/v1/models").status for _ in range(6)] == [200] * 6
        assert len([r for r in ups[0].requests[before:] if r["path"] != "/health"]) == 0
        # node0's engine restarts: DOWN in its own gateway.
        ups[0].health_status = 503
        assert _wait_down(node_dirs[0], "engine")
        statuses, stop = [], threading.Event()

        def send():
            while not stop.is_set():
                statuses.append(client.get("/v1/models").status)
                time.sleep(0.05)
        sender = threading.Thread(target=send, daemon=True)
        back = threading.Timer(3.0, setattr, (ups[0], "health_status", 200))
        sender.start()
        back.start()
        try:
            runner, out = run_playbook("tests/playbooks/rollout-pool.yml", tmp_path / "pool",
                                       extravars={"pool_state": "enabled"}, inventory=str(inventory))
            time.sleep(1)
        finally:
            stop.set()
            back.cancel()
            sender.join(timeout=20)
        assert runner.rc == 0, out[-3000:]
        assert statuses and set(statuses) == {200}, {s: statuses.count(s) for s in set(statuses)}
        before = len(ups[0].requests)
        assert [client.get("/v1/models").status for _ in range(6)] == [200] * 6
        assert len([r for r in ups[0].requests[before:] if r["path"] != "/health"]) > 0


def _fleet_of_two(stack, tmp_path, site_ca):
    """Two recording engines, each behind its node's gateway, and a fleet gateway over both
    (servers node0, node1), entered on stack. Returns (engines, node gateway dirs, their
    context managers, fleet dir, a client of the fleet gateway)."""
    ups = [stack.enter_context(gh.RecordingUpstream()) for _ in range(2)]
    node_specs = [gh.lab_spec(site_ca, up.port, CLIENTS) for up in ups]
    node_dirs = [tmp_path / ("node%d" % i) for i in range(2)]
    node_cms = [gh.running_gateway(d, spec, site_ca) for d, spec in zip(node_dirs, node_specs)]
    for cm in node_cms:
        stack.enter_context(cm)
    fleet_spec = gh.lab_spec(site_ca, None, CLIENTS, upstreams=[
        {"name": "node%d" % i, "address": "localhost", "port": spec["port"], "tls": True}
        for i, spec in enumerate(node_specs)])
    fleet_dir = tmp_path / "fleet"
    url = stack.enter_context(gh.running_gateway(fleet_dir, fleet_spec, site_ca))
    return ups, node_dirs, node_cms, fleet_dir, verifier(url, site_ca).client


def _wait_down(gateway_dir, server, timeout=20):
    """Whether the gateway's health checks mark server DOWN within timeout seconds."""
    deadline = time.monotonic() + timeout
    while server not in _down_servers(gateway_dir) and time.monotonic() < deadline:
        time.sleep(0.2)
    return server in _down_servers(gateway_dir)


def _down_servers(fleet_dir):
    lines = _admin(fleet_dir, "show stat").splitlines()
    header = lines[0].lstrip("# ").split(",")
    rows = [dict(zip(header, line.split(","))) for line in lines[1:] if line]
    return [r["svname"] for r in rows if r.get("pxname") == "mm3_engines" and r.get("status", "").startswith("DOWN")]


def test_key_rotation_reloads_without_dropping_a_stream(tmp_path, site_ca):
    """Rotation as docs/operations/gateway.md describes it: add the new key, reload (the packaged service's
    master-worker mode, SIGUSR2), move the client, remove the old key, reload. A stream that
    started before the first reload finishes; the old key is refused only after the second."""
    import signal
    import threading
    new_key = "Nw4Rt8Yq2Ue6Io0Pa3Sd7Fg1Hj5Kl9Zx"
    payload = {"model": "tiny-m3", "stream": True, "max_tokens": 8, "messages": []}
    with gh.RecordingUpstream(delay=3.0) as up:
        spec = gh.lab_spec(site_ca, up.port, CLIENTS)
        with gh.running_gateway(tmp_path, spec, site_ca, master_worker=True) as url:
            client = verifier(url, site_ca).client
            lines, result = [], {}
            stream = threading.Thread(target=lambda: result.update(
                resp=client.stream("/v1/chat/completions", payload, lambda line, t: lines.append(line))[0]))
            stream.start()
            time.sleep(1.0)   # the stream is in flight (the upstream waits 3 s before answering)
            both = CLIENTS + [{"name": "main-next", "key": new_key}]
            gh.write_keys(url.config_dir, gh.lab_spec(site_ca, up.port, both, port=spec["port"]))
            url.proc.send_signal(signal.SIGUSR2)
            time.sleep(1.0)
            new_client = http.Client(url, new_key, timeout=10, ca_path=os.path.join(site_ca, "ca.pem"))
            assert new_client.get("/v1/models").status == 200
            assert client.get("/v1/models").status == 200      # the old key still works
            only_new = [c for c in both if c["name"] != "main"]
            gh.write_keys(url.config_dir, gh.lab_spec(site_ca, up.port, only_new, port=spec["port"]))
            url.proc.send_signal(signal.SIGUSR2)
            time.sleep(1.0)
            stream.join(timeout=20)
            assert client.get("/v1/models").status == 401
            assert new_client.get("/v1/models").status == 200
    assert result["resp"].status == 200 and sum(1 for line in lines if line.startswith(b"data:")) == 5, \
        (result, lines)


@pytest.mark.parametrize("metrics_networks,expect", [([], 403), (["127.0.0.0/8"], 200)])
def test_metrics_paths_only_for_the_monitoring_networks(tmp_path, site_ca, metrics_networks, expect):
    """/metrics (the engine's, through the gateway) and /gateway/metrics (HAProxy's exporter)
    answer the monitoring networks only: from any other source they are 403 and the engine is
    never asked. With loopback listed, the exporter answers in the Prometheus text format with
    the gateway's own frontend and pool, the names the alert rules read."""
    with gh.RecordingUpstream() as up:
        spec = gh.lab_spec(site_ca, up.port, CLIENTS, metrics_networks=metrics_networks)
        with gh.running_gateway(tmp_path, spec, site_ca) as url:
            client = verifier(url, site_ca).client
            engine, own = client.get("/metrics"), client.get("/gateway/metrics")
    assert (engine.status, own.status) == (expect, expect), (engine.status, own.status)
    assert ("/metrics" in [r["path"] for r in up.requests]) is (expect == 200)
    text = own.body if isinstance(own.body, str) else str(own.error or own.body)
    if expect == 200:
        assert 'haproxy_frontend_http_requests_total{proxy="mm3_gateway"}' in text, text[:400]
        assert 'haproxy_backend_active_servers{proxy="mm3_engines"}' in text
        assert "/gateway/metrics" not in [r["path"] for r in up.requests]
    else:
        assert "monitoring networks" in text


def _raw(port, ca_dir, request, timeout=10.0):
    """Send request bytes over TLS to the gateway; (the answer's status line and body, seconds
    until it came). A request a test leaves unfinished is answered or times out."""
    import socket
    import ssl
    ctx = ssl.create_default_context(cafile=os.path.join(ca_dir, "ca.pem"))
    started = time.monotonic()
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as raw, \
            ctx.wrap_socket(raw, server_hostname="127.0.0.1") as sock:
        parts = request if isinstance(request, list) else [request]
        for index, part in enumerate(parts):
            if index:
                time.sleep(1.0)
            sock.sendall(part)
        answer = b""
        try:
            while b"\r\n\r\n" not in answer or not _complete(answer):
                chunk = sock.recv(65536)
                if not chunk:
                    break
                answer += chunk
        except socket.timeout:
            return None, time.monotonic() - started
    return answer, time.monotonic() - started


def _complete(answer):
    head, _, body = answer.partition(b"\r\n\r\n")
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            return len(body) >= int(line.split(b":")[1])
    return False


def _post(path, body, key, declared=None, close=True):
    return (b"POST %s HTTP/1.1\r\nHost: x\r\n%sContent-Type: application/json\r\nContent-Length: %d\r\n%s\r\n"
            % (path.encode(), b"Authorization: Bearer %s\r\n" % key.encode() if key else b"",
               len(body) if declared is None else declared, b"Connection: close\r\n" if close else b"")) + body


# A client whose cap is 64 tokens, at the default rate. (path, raw JSON body, expected status,
# what the refusal says)
TOKENS_KEY = "Tz4Nq8Rw1Ye6Ub3Io7Pa2Sd9Fg5Hj0Kl"
TOKEN_CLIENTS = CLIENTS + [{"name": "tokens", "key": TOKENS_KEY, "max_tokens": 64}]
TOKEN_CASES = [
    ("/v1/completions", b'{"model":"m","prompt":"x","max_tokens":64}', 200, None),
    ("/v1/completions", b'{"model":"m","prompt":"x"}', 400, b"state max_tokens (at most 64"),
    ("/v1/completions", b'{"model":"m","prompt":"x","max_tokens":null}', 400, b"state max_tokens"),
    ("/v1/completions", b'{"model":"m","prompt":"x","max_tokens":8,"n":256}', 400, b"= 2048 tokens"),
    ("/v1/completions", b'{"model":"m","prompt":"x","max_tokens":8,"best_of":9}', 400, b"= 72 tokens"),
    ("/v1/completions", b'{"model":"m","prompt":[' + b",".join([b'"p"'] * 100) + b'],"max_tokens":1}',
     400, b"= 100 tokens"),
    ("/v1/completions", b'{"model":"m","prompt":[' + b",".join([b'"p"'] * 8) + b'],"max_tokens":8}', 200, None),
    ("/v1/completions", b'{"model":"m","prompt":[' + b",".join([b"7"] * 100) + b'],"max_tokens":64}', 200, None),
    ("/v1/completions", b'{"model":"m","prompt":[[1,2],[3,4]],"max_tokens":40}', 400, b"= 80 tokens"),
    ("/v1/completions", b'{"model":"m","prompt":"x","max_tokens":8,"ignore_eos":true,"min_tokens":100000}',
     400, b"min_tokens 100000"),
    ("/v1/completions", b'{"model":"m","prompt":"x","max_tokens":8.5}', 400, b"max_tokens 8.5 is not a whole number"),
    ("/v1/completions", b'{"model":"m","prompt":"x","max_tokens":-1}', 400, b"is not a whole number"),
    ("/v1/completions", b'{"model":"m","prompt":"x","max_tokens":"8"}', 400, b"max_tokens string is not"),
    ("/v1/completions", b'{"model":"m","prompt":"x","max_tokens":8,"max_completion_tokens":1000}', 400,
     b"max_tokens 1000 is above"),
    # a duplicate key: the last one counts, as in the engines' JSON parser (Python's json)
    ("/v1/completions", b'{"model":"m","prompt":"x","max_tokens":1,"max_tokens":100000}', 400, b"max_tokens 100000"),
    ("/v1/chat/completions", b'{"model":"m","messages":[{"role":"user","content":"x"}],"max_tokens":16,"n":5}',
     400, b"= 80 tokens"),
    # JSON's own numbers only (Python's json reads NaN, Infinity; lua-cjson by default hex too)
    ("/v1/completions", b'{"model":"m","prompt":"x","max_tokens":8,"temperature":NaN}', 400, b"not a JSON object"),
    ("/v1/completions", b'{"model":"m","prompt":"x","max_tokens":0x10}', 400, b"not a JSON object"),
    ("/v1/completions", b'{"model":"m","prompt":"x","max_tokens":Infinity}', 400, b"not a JSON object"),
]
# What each protection alone refuses of the cases above (their indexes).
TOKEN_PROTECTIONS = {"max_tokens": [1, 2, 3, 4, 5, 8, 9, 10, 11, 12, 13, 14, 15],
                     "strict numbers": [16, 17]}


def _token_answers(tmp_path, site_ca, without=()):
    with gh.RecordingUpstream() as up:
        spec = gh.lab_spec(site_ca, up.port, TOKEN_CLIENTS)
        with gh.running_gateway(tmp_path, spec, site_ca, without=without) as base:
            answers = [_raw(spec["port"], site_ca, _post(path, body, TOKENS_KEY))[0]
                       for path, body, _, _ in TOKEN_CASES]
    return answers, up.requests


def test_the_token_cap_holds_whatever_the_request_asks(tmp_path, site_ca):
    """Issue 32: no cap sent, n, best_of, a batch of prompts, min_tokens with ignore_eos,
    fractions, strings, duplicate keys, NaN and hex numbers each got past the cap."""
    answers, reached = _token_answers(tmp_path, site_ca)
    for (path, body, status, says), answer in zip(TOKEN_CASES, answers):
        assert answer.startswith(b"HTTP/1.1 %d" % status), (body[:120], answer[:400])
        if says:
            assert says in answer, (body[:120], answer[:400])
    assert len([r for r in reached if r["path"] != "/health"]) == len([c for c in TOKEN_CASES if c[2] == 200])


@pytest.mark.parametrize("protection", sorted(TOKEN_PROTECTIONS))
def test_each_token_case_gets_through_without_its_protection(tmp_path, site_ca, protection):
    answers, _ = _token_answers(tmp_path, site_ca, without=[protection])
    through = [i for i, answer in enumerate(answers)
               if TOKEN_CASES[i][2] == 400 and answer.startswith(b"HTTP/1.1 200")]
    assert set(TOKEN_PROTECTIONS[protection]) <= set(through), (protection, through)


def _buffer_request_first(files):
    """The configuration before issue 32: the whole body read before the first rule."""
    files["haproxy.cfg"] = files["haproxy.cfg"].replace(
        "    http-request del-header x-forwarded-for\n",
        "    option http-buffer-request\n    http-request del-header x-forwarded-for\n", 1)
    return files


@pytest.mark.parametrize("edit", [None, _buffer_request_first], ids=["as shipped", "body read first"])
def test_an_unauthenticated_request_is_answered_on_its_headers(tmp_path, site_ca, edit):
    """A request without a key that announces 1 MB and sends none of it is refused at once; the
    gateway does not hold a buffer for it until the 30 s request timeout."""
    with gh.RecordingUpstream() as up:
        spec = gh.lab_spec(site_ca, up.port, CLIENTS)
        with gh.running_gateway(tmp_path, spec, site_ca, edit=edit) as base:
            answer, seconds = _raw(spec["port"], site_ca,
                                   _post("/v1/completions", b"", None, declared=1000000), timeout=5)
    if edit is None:
        assert answer and answer.startswith(b"HTTP/1.1 401") and seconds < 4, (answer, seconds)
    else:
        assert answer is None or not answer.startswith(b"HTTP/1.1 401"), (answer, seconds)


@pytest.mark.parametrize("without", [(), ("auth before body",)], ids=["as shipped", "without it"])
def test_an_authenticated_body_is_waited_for_and_checked_whole(tmp_path, site_ca, without):
    """The body an authenticated client sends in two parts a second apart reaches the policy
    whole (wait-for-body); without that rule the policy would see half of it."""
    body = b'{"model":"m","prompt":"x","max_tokens":8}'
    with gh.RecordingUpstream() as up:
        spec = gh.lab_spec(site_ca, up.port, CLIENTS)
        with gh.running_gateway(tmp_path, spec, site_ca, without=without) as base:
            request = _post("/v1/completions", body, MAIN_KEY)
            answer, _ = _raw(spec["port"], site_ca, [request[:-20], request[-20:]])
    if not without:
        assert answer.startswith(b"HTTP/1.1 200"), answer[:300]
        assert [r["body"] for r in up.requests if r["path"] == "/v1/completions"] == [body]
    else:
        assert answer.startswith(b"HTTP/1.1 413"), answer[:300]


@pytest.mark.parametrize("without", [(), ("health from the pool",)], ids=["as shipped", "without it"])
def test_health_is_the_gateways_view_of_its_pool_and_never_reaches_the_engine(tmp_path, site_ca, without):
    """An unauthenticated /health never becomes an engine request (SGLang's /health runs a
    generation); it says 200 while a server is up by the health checks, 503 once none is."""
    with gh.RecordingUpstream() as up:
        spec = gh.lab_spec(site_ca, up.port, CLIENTS)
        with gh.running_gateway(tmp_path, spec, site_ca, without=without) as base:
            client = verifier(base, site_ca).client
            first = client.get("/health")
            forwarded = [r for r in up.requests if r["path"] == "/health"
                         and "x-forwarded-for" in {h.lower() for h in r["headers"]}]
            up.health_status = 503
            deadline = time.monotonic() + 20
            while client.get("/health").status != 503 and time.monotonic() < deadline:
                time.sleep(0.2)
            last = client.get("/health")
    if not without:
        assert first.status == 200 and forwarded == [], (first.status, forwarded)
        assert last.status == 503
    else:
        assert forwarded, "the gateway forwarded no /health, yet the protection was removed"


@pytest.mark.parametrize("without", [(), ("per source",)], ids=["as shipped", "without it"])
def test_one_address_holds_at_most_its_connections(tmp_path, site_ca, without):
    import socket
    import ssl
    ctx = ssl.create_default_context(cafile=os.path.join(site_ca, "ca.pem"))
    with gh.RecordingUpstream() as up:
        spec = gh.lab_spec(site_ca, up.port, CLIENTS, max_connections_per_source=3)
        with gh.running_gateway(tmp_path, spec, site_ca, without=without) as base:
            held = [ctx.wrap_socket(socket.create_connection(("127.0.0.1", spec["port"]), timeout=5),
                                    server_hostname="127.0.0.1") for _ in range(3)]
            try:
                extra = _raw(spec["port"], site_ca, _post("/v1/models", b"", MAIN_KEY))
                refused = False
            except (ssl.SSLError, ConnectionError, OSError):
                refused = True
            for sock in held:
                sock.close()
            time.sleep(0.2)
            again = _raw(spec["port"], site_ca, b"GET /v1/models HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\n"
                         b"Connection: close\r\n\r\n" % MAIN_KEY.encode())[0]
    assert again.startswith(b"HTTP/1.1 200"), again[:200]
    assert refused is (not without), extra if not refused else "refused"
