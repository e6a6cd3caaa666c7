"""Run the gateway's real HAProxy (the distribution's package on this machine) with the role's
own templates, in front of a recording upstream, on loopback.

The recording upstream is a stand-in for the engine, named as such: an OpenAI-shaped HTTP
server that answers every path 200 (so a path the gateway lets through is visible as a 200)
and records what reached it (path, headers, body), streaming SSE when asked. It is only there
to show what the gateway forwards; the engine itself is exercised in the lab.

render() is the same data path as the role: filter_plugins/gateway.py resolves the inputs into
gateway_spec, and roles/gateway/templates/*.j2 render with it. `without` removes the block of
lines under a "# protection: <name>" marker (up to the next blank line or marker), so a test
can show that a check fails when its protection is gone.
"""
import contextlib
import http.server
import json
import os
import shutil
import socket
import socketserver
import subprocess
import threading
import time

import jinja2

from helpers import ROOT, load_source

gateway = load_source("mm3_gateway_filters", os.path.join(ROOT, "filter_plugins", "gateway.py"))
TEMPLATES = os.path.join(ROOT, "roles", "gateway", "templates")
HAPROXY = shutil.which("haproxy") or "/usr/sbin/haproxy"


def free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class RecordingUpstream(object):
    """The stand-in engine (see the module docstring)."""

    def __init__(self, delay=0.0):
        self.requests = []
        self.delay = delay
        # What /health answers: a test sets 503 for an engine that is (re)starting.
        self.health_status = 200
        self.port = free_port()
        owner = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def _answer(self):
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                owner.requests.append({"method": self.command, "path": self.path,
                                       "headers": dict(self.headers), "body": body})
                if owner.delay and self.path != "/health":
                    time.sleep(owner.delay)
                if self.path == "/health" and owner.health_status != 200:
                    self.send_response(owner.health_status)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                try:
                    stream = json.loads(body or b"{}").get("stream")
                except (ValueError, AttributeError):
                    stream = False
                if stream:
                    self.send_response(200)
                    self.send_header("Content-Type", "text/event-stream")
                    self.send_header("Transfer-Encoding", "chunked")
                    self.end_headers()
                    for index in range(4):
                        event = b'data: {"choices":[{"delta":{"content":"t%d"}}]}\n\n' % index
                        self.wfile.write(b"%x\r\n%s\r\n" % (len(event), event))
                        self.wfile.flush()
                    self.wfile.write(b"e\r\ndata: [DONE]\n\n\r\n0\r\n\r\n")
                    return
                payload = json.dumps({"object": "list", "data": [{"id": "tiny-m3"}],
                                      "choices": [{"message": {"content": "OK"}}],
                                      "path": self.path}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            do_GET = do_POST = do_PUT = do_DELETE = _answer

        class Server(socketserver.ThreadingMixIn, http.server.HTTPServer):
            daemon_threads = True
            allow_reuse_address = True

        self.server = Server(("127.0.0.1", self.port), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()


def render(spec, config_dir, runtime_dir, without=(), edit=None):
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(TEMPLATES), keep_trailing_newline=True,
                             trim_blocks=True, undefined=jinja2.StrictUndefined)
    context = {"gateway_spec": spec, "__gateway_config_dir": config_dir,
               "__gateway_runtime_dir": runtime_dir}
    files = {name: env.get_template(name + ".j2").render(**context)
             for name in ("haproxy.cfg", "policy.lua")}
    for protection in without:
        found = False
        for name, text in files.items():
            files[name], hit = strip_protection(text, protection)
            found = found or hit
        if not found:
            raise AssertionError("no 'protection: %s' block in the rendered files" % protection)
    # edit: a test's own change to the rendered files (to put back what a protection replaced)
    return edit(files) if edit else files


def strip_protection(text, name):
    """Drop the lines of one 'protection: NAME' block (up to a blank line or the next marker;
    Jinja loops inside a block render to plain lines, so they go too). Returns (text, found)."""
    out, dropping, found = [], False, False
    marker = "protection: %s" % name
    for line in text.splitlines(True):
        stripped = line.strip()
        if dropping and (not stripped or "protection:" in stripped):
            dropping = False
        if stripped.endswith(marker):
            dropping, found = True, True
            continue
        if not dropping:
            out.append(line)
    return "".join(out), found


class GatewayURL(str):
    """The gateway's base URL, carrying its process and configuration directory."""
    proc = None
    config_dir = None
    ca_dir = None


def write_keys(config_dir, spec):
    with open(os.path.join(config_dir, "clients.map"), "w") as handle:
        handle.write(gateway.gateway_keys_map(spec))


@contextlib.contextmanager
def running_gateway(tmp_path, spec, ca_dir, without=(), master_worker=False, edit=None):
    """Render, check (haproxy -c) and run HAProxy in the foreground; yields the base URL.
    master_worker: run as the packaged service does (-W: a master that reloads on SIGUSR2,
    old workers finishing their connections)."""
    config_dir = os.path.join(os.fspath(tmp_path), "etc")
    runtime_dir = os.path.join(os.fspath(tmp_path), "run")
    os.makedirs(config_dir, exist_ok=True)
    os.makedirs(runtime_dir, exist_ok=True)
    os.chmod(runtime_dir, 0o777)
    files = render(spec, config_dir, runtime_dir, without, edit)
    for name, text in files.items():
        with open(os.path.join(config_dir, name), "w") as handle:
            handle.write(text)
    write_keys(config_dir, spec)
    with open(os.path.join(config_dir, "gateway.pem"), "w") as handle:
        for part in ("gateway.pem", "gateway.key"):
            with open(os.path.join(ca_dir, part)) as src:
                handle.write(src.read())
    shutil.copy(os.path.join(ca_dir, "ca.pem"), os.path.join(config_dir, "ca.pem"))
    cfg = os.path.join(config_dir, "haproxy.cfg")
    check = subprocess.run([HAPROXY, "-c", "-f", cfg], capture_output=True, text=True)
    if check.returncode != 0:
        raise AssertionError("haproxy -c refused the rendered config:\n%s%s" % (check.stdout, check.stderr))
    proc = subprocess.Popen([HAPROXY] + (["-W"] if master_worker else []) + ["-db", "-f", cfg],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            with socket.socket() as sock:
                if sock.connect_ex(("127.0.0.1", spec["port"])) == 0:
                    break
            if proc.poll() is not None:
                raise AssertionError("haproxy exited: %s" % proc.stdout.read())
            time.sleep(0.05)
        url = GatewayURL("https://127.0.0.1:%d" % spec["port"])
        url.proc, url.config_dir, url.ca_dir = proc, config_dir, ca_dir
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()


def lab_spec(ca_dir, upstream_port, clients, **kwargs):
    """gateway_spec for a loopback gateway in front of the recording upstream."""
    def read(name):
        with open(os.path.join(ca_dir, name)) as handle:
            return handle.read()
    options = dict(port=free_port(), bind_address="127.0.0.1", allowed_networks=["127.0.0.0/8"],
                   upstreams=[{"name": "engine", "address": "127.0.0.1", "port": upstream_port or 1}],
                   tls_cert_pem=read("gateway.pem"), tls_key_pem=read("gateway.key"))
    options.update(kwargs)
    spec = gateway.gateway_resolve(clients, **options)
    assert not spec["blockers"], spec["blockers"]
    return spec
