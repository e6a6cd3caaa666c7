#!/usr/bin/env python3
"""What unauthenticated slow-body clients cost the gateway (roles/gateway: the real HAProxy with
the role's own templates, run by tests/gateway_harness.py in front of its recording upstream, a
stand-in for the engine named as such), against the configuration before issue 32 as baseline.

Attack, from one address (loopback): N connections (default 1000), each completes TLS, sends a
POST /v1/chat/completions without a key announcing a 1 MB body, sends 64 KiB of it and holds the
connection. Meanwhile one authenticated client sends a request. Per configuration:

  - HAProxy's resident memory (VmRSS of its process) before and with the N connections held;
  - how many of the N were answered 401 at once, refused before a byte was read (the per-address
    connection limit), or left waiting (their buffers held until the request timeout);
  - the authenticated request's status and latency while they are held.

Configurations: "shipped" (key checked before the body is read, gateway_max_connections and
gateway_max_connections_per_source at their defaults) and "before" (option http-buffer-request:
every body read before the first rule; no per-address limit).

  .venv/bin/python bench/gateway_slow_clients_bench.py
  .venv/bin/python bench/gateway_slow_clients_bench.py --connections 300
"""
from __future__ import annotations

import argparse
import os
import pathlib
import socket
import ssl
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
KEY = "Bq5Xn2Lw8Rt4Yc7Vm1Zs6Kd3Jf9Hg0Pa"


def rss_mib(pid):
    with open("/proc/%d/status" % pid) as handle:
        for line in handle:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024.0
    return float("nan")


def open_slow(port, context, count, body_kib):
    """count slow unauthenticated connections, each sending body_kib KiB of its announced 1 MB
    body after its headers; (held sockets, answered 401, refused before TLS)."""
    held, answered, refused = [], 0, 0
    head = (b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: 1000000\r\n\r\n")
    for _ in range(count):
        try:
            raw = socket.create_connection(("127.0.0.1", port), timeout=5)
            sock = context.wrap_socket(raw, server_hostname="127.0.0.1")
            sock.sendall(head)
        except (OSError, ssl.SSLError):
            refused += 1
            continue
        held.append(sock)
        try:
            sock.sendall(b" " * (body_kib * 1024))
        except (OSError, ssl.SSLError):
            pass  # the gateway answered and closed: the rest of the body is not read
    time.sleep(1.0)
    for sock in held:
        sock.setblocking(False)
        try:
            if sock.recv(64).startswith(b"HTTP/1.1 401"):
                answered += 1
        except (BlockingIOError, ssl.SSLWantReadError):
            pass
        except (OSError, ssl.SSLError):
            pass
    return held, answered, refused


def authenticated(port, context):
    started = time.monotonic()
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=30) as raw, \
                context.wrap_socket(raw, server_hostname="127.0.0.1") as sock:
            body = b'{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":8}'
            sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\n"
                         b"Content-Type: application/json\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s"
                         % (KEY.encode(), len(body), body))
            answer = b""
            while True:
                chunk = sock.recv(65536)
                if not chunk:
                    break
                answer += chunk
            status = answer.split(b"\r\n")[0].decode()
    except (OSError, ssl.SSLError) as exc:
        status = "failed (%s)" % exc.__class__.__name__
    return status, (time.monotonic() - started) * 1000.0


def before_issue_32(files):
    files["haproxy.cfg"] = files["haproxy.cfg"].replace(
        "    http-request del-header x-forwarded-for\n",
        "    option http-buffer-request\n    http-request del-header x-forwarded-for\n", 1)
    return files


def run(gh, ca_dir, workdir, name, count, body_kib, **options):
    with gh.RecordingUpstream() as up:
        spec = gh.lab_spec(ca_dir, up.port, [{"name": "bench", "key": KEY}])
        with gh.running_gateway(pathlib.Path(workdir) / name, spec, ca_dir, **options) as url:
            context = ssl.create_default_context(cafile=os.path.join(ca_dir, "ca.pem"))
            context.set_alpn_protocols(["http/1.1"])
            authenticated(spec["port"], context)
            idle = rss_mib(url.proc.pid)
            held, answered, refused = open_slow(spec["port"], context, count, body_kib)
            loaded = rss_mib(url.proc.pid)
            status, latency = authenticated(spec["port"], context)
            for sock in held:
                sock.close()
    return {"name": name, "idle": idle, "loaded": loaded, "answered": answered, "refused": refused,
            "waiting": len(held) - answered, "status": status, "latency": latency,
            "bufsize": spec["bufsize"], "per_source": spec["max_connections_per_source"],
            "max_connections": spec["max_connections"]}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--connections", type=int, default=1000)
    parser.add_argument("--body-kib", type=int, default=64, help="KiB of the body each sends")
    args = parser.parse_args()
    import resource
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, 4 * args.connections + 256)), hard))
    sys.path[:0] = [os.path.join(ROOT, "tests"), os.path.join(ROOT, "collections")]
    import gateway_harness as gh                  # noqa: E402 (needs tests/ on sys.path)

    workdir = tempfile.mkdtemp(prefix="gateway-slow-")
    ca_dir = os.path.join(workdir, "ca")
    subprocess.run([sys.executable, os.path.join(ROOT, "lab", "files", "make_site_ca.py"), ca_dir,
                    "127.0.0.1", "localhost"], check=True, capture_output=True)
    results = [run(gh, ca_dir, workdir, "before", args.connections, args.body_kib, edit=before_issue_32,
                   without=["per source"]),
               run(gh, ca_dir, workdir, "shipped", args.connections, args.body_kib)]
    first = results[1]
    print("bench: %d unauthenticated slow-body connections from one address, %d KiB of body each; "
          "bufsize %d B; shipped: gateway_max_connections %d, per address %d"
          % (args.connections, args.body_kib, first["bufsize"], first["max_connections"], first["per_source"]))
    print("%-8s %10s %10s %9s %8s %8s  %-28s %8s" % ("config", "idle MiB", "held MiB", "answered",
                                                    "refused", "waiting", "authenticated request", "ms"))
    for r in results:
        print("%-8s %10.1f %10.1f %9d %8d %8d  %-28s %8.1f" % (
            r["name"], r["idle"], r["loaded"], r["answered"], r["refused"], r["waiting"], r["status"],
            r["latency"]))
    before, shipped = results
    print("ratio shipped/before: memory held %.2f, memory growth %.2f" % (
        shipped["loaded"] / before["loaded"],
        (shipped["loaded"] - shipped["idle"]) / max(before["loaded"] - before["idle"], 0.1)))
    print("bound: gateway_max_connections x bufsize = %.0f MiB of request buffers at most"
          % (first["max_connections"] * first["bufsize"] / 1048576.0))


if __name__ == "__main__":
    main()
