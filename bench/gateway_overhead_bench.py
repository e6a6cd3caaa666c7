#!/usr/bin/env python3
"""Overhead of the gateway (roles/gateway: the real HAProxy with the role's own templates) on
time-to-first-token and streaming throughput, against the same upstream reached directly.

The upstream is a streaming stand-in for the engine, named as such: a threaded HTTP/1.1 server
on loopback (its own process, so it shares no GIL with the clients) that answers POST
/v1/completions and /v1/chat/completions with `stream: true` by an SSE response (chunked) of
max_tokens token events, the first one after a fixed "prefill" delay (default 20 ms) and the
others a fixed inter-token delay apart (default 5 ms, on an absolute schedule, so sleep overshoot
does not add up), then `data: [DONE]`; GET /health answers 200. It sets TCP_NODELAY, as the
engine's server (uvicorn on asyncio) does.

The gateway is rendered and run by tests/gateway_harness.py (running_gateway: the role's
filter and templates, the distribution's haproxy binary, TLS with a site CA made by
lab/files/make_site_ca.py), with one client whose limits are far above the workload.

Workload, the same through both paths: C worker threads, each with ONE persistent connection
(plain HTTP to the upstream; HTTPS to the gateway, trusting the site CA, with the client's
Bearer key), connected and warmed up with one uncounted request before timing starts (so no
TLS handshake is timed), then R streaming /v1/completions requests each. Per request: TTFT =
from sending the request to the first `data:` line with a token; total = to the end of the
response; per run: throughput = token events received / wall time. Rounds alternate direct,
gateway; the table gives the median over rounds of each figure. Targets (the gateway issue):
p50 TTFT overhead < 2 ms, throughput gateway/direct >= 0.97.

Figures are from one run on a shared machine (clients, upstream and HAProxy share its CPUs):
read them as orders of magnitude, and rerun before concluding from a small difference.

  .venv/bin/python bench/gateway_overhead_bench.py                     # 8 x 25 requests, 64 tokens, 3 rounds
  .venv/bin/python bench/gateway_overhead_bench.py --rounds 1 --requests 5
  .venv/bin/python bench/gateway_overhead_bench.py --concurrency 32 --tokens 256 --json /tmp/gw.json
"""
from __future__ import annotations

import argparse
import http.client
import http.server
import json
import os
import pathlib
import secrets
import shutil
import socketserver
import ssl
import statistics
import string
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TTFT_GOAL_MS = 2.0
THROUGHPUT_GOAL = 0.97


# --- the streaming upstream stand-in (runs as a child process: --serve-upstream) -------------

def serve_upstream(prefill_s, token_delay_s):
    """Listen on a free loopback port, print 'PORT <n>' and serve until terminated."""

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        disable_nagle_algorithm = True          # TCP_NODELAY, as uvicorn/asyncio sets it

        def log_message(self, *args):
            pass

        def _json(self, status, doc):
            payload = json.dumps(doc).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        def do_GET(self):
            if self.path == "/health":
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()
            else:
                self._json(404, {"error": {"message": "not found (stand-in upstream)"}})

        def do_POST(self):
            start = time.perf_counter()
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length) if length else b""
            if self.path not in ("/v1/completions", "/v1/chat/completions"):
                return self._json(404, {"error": {"message": "not found (stand-in upstream)"}})
            try:
                doc = json.loads(body or b"{}")
                tokens = int(doc.get("max_tokens") or doc.get("max_completion_tokens") or 16)
            except (ValueError, TypeError, AttributeError):
                return self._json(400, {"error": {"message": "body is not a JSON object"}})
            if not doc.get("stream"):
                time.sleep(prefill_s + token_delay_s * max(tokens - 1, 0))
                return self._json(200, {"choices": [{"text": "tok" * tokens}]})
            if self.path == "/v1/chat/completions":
                event = b'data: {"choices":[{"delta":{"content":"tok"}}]}\n\n'
            else:
                event = b'data: {"choices":[{"text":"tok"}]}\n\n'
            chunk = b"%x\r\n%s\r\n" % (len(event), event)
            done = b"data: [DONE]\n\n"
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Cache-Control", "no-cache")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            for index in range(tokens):
                # absolute schedule: token i leaves at prefill + i * delay after the request
                wait = start + prefill_s + index * token_delay_s - time.perf_counter()
                if wait > 0:
                    time.sleep(wait)
                self.wfile.write(chunk)             # one write per event (wfile is unbuffered)
            # the last event and the terminating chunk in one write
            self.wfile.write(b"%x\r\n%s\r\n0\r\n\r\n" % (len(done), done))

    class Server(socketserver.ThreadingMixIn, http.server.HTTPServer):
        daemon_threads = True
        allow_reuse_address = True
        request_queue_size = 1024

        def handle_error(self, request, client_address):
            # HAProxy ends its health checks and, when it stops, its idle connections with a
            # reset: not an error of the workload (a failed stream shows in the client's figures)
            if not isinstance(sys.exc_info()[1], (ConnectionResetError, BrokenPipeError)):
                super().handle_error(request, client_address)

    server = Server(("127.0.0.1", 0), Handler)
    print("PORT %d" % server.server_address[1], flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()


def start_upstream(args):
    cmd = [sys.executable, os.path.abspath(__file__), "--serve-upstream",
           "--prefill-ms", str(args.prefill_ms), "--token-delay-ms", str(args.token_delay_ms)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    line = proc.stdout.readline().split()
    if len(line) != 2 or line[0] != "PORT":
        stop_upstream(proc)
        raise RuntimeError("the upstream stand-in did not start (said %r)" % line)
    port = int(line[1])
    deadline = time.monotonic() + 10
    while True:
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
            conn.request("GET", "/health")
            status = conn.getresponse().status
            conn.close()
            if status == 200:
                return proc, port
        except OSError:
            pass
        if time.monotonic() > deadline or proc.poll() is not None:
            stop_upstream(proc)
            raise RuntimeError("the upstream stand-in on port %d is not healthy" % port)
        time.sleep(0.05)


def stop_upstream(proc):
    proc.terminate()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    if proc.stdout:
        proc.stdout.close()


# --- the clients ------------------------------------------------------------------------------

class Target(object):
    """How a worker reaches one path: a connection factory and the request bytes."""

    def __init__(self, name, make_conn, host, body, extra_headers=()):
        self.name = name
        self.make_conn = make_conn
        headers = ["POST /v1/completions HTTP/1.1", "Host: %s" % host,
                   "Content-Type: application/json", "Accept: text/event-stream",
                   "Content-Length: %d" % len(body)] + list(extra_headers)
        # headers and body in one send (http.client sends them in two), so neither path
        # waits on a second segment
        self.raw = ("\r\n".join(headers) + "\r\n\r\n").encode() + body


def stream_once(sock, target, tokens_expected):
    """Send one streaming request on an open connection; (ttft_s, total_s, tokens, gaps_s)."""
    sent = time.perf_counter()
    sock.sendall(target.raw)
    resp = http.client.HTTPResponse(sock, method="POST")
    resp.begin()
    if resp.status != 200:
        raise RuntimeError("%s: HTTP %d: %s" % (target.name, resp.status, resp.read()[:300]))
    if resp.will_close:
        raise RuntimeError("%s: the response closes the connection (no keep-alive)" % target.name)
    ttft, last, tokens, gaps, done = None, None, 0, [], False
    while True:
        line = resp.readline()
        if not line:
            break
        if not line.startswith(b"data:"):
            continue
        now = time.perf_counter()
        if line[5:].strip() == b"[DONE]":
            done = True
            continue
        tokens += 1
        if ttft is None:
            ttft = now - sent
        else:
            gaps.append(now - last)
        last = now
    total = time.perf_counter() - sent
    if not done or tokens != tokens_expected:
        raise RuntimeError("%s: stream gave %d of %d tokens%s" % (
            target.name, tokens, tokens_expected, "" if done else " and no [DONE]"))
    return ttft, total, tokens, gaps


def run_workload(target, args):
    """C workers, one persistent connection each, R requests each; the figures of one run."""
    barrier = threading.Barrier(args.concurrency + 1)
    results, errors, lock = [], [], threading.Lock()

    def worker():
        conn = None
        try:
            conn = target.make_conn()
            conn.connect()                       # TCP (and TLS handshake) before timing
            stream_once(conn.sock, target, args.tokens)      # warm-up, not counted
            barrier.wait()
            mine = [stream_once(conn.sock, target, args.tokens) for _ in range(args.requests)]
            with lock:
                results.extend(mine)
        except threading.BrokenBarrierError:
            pass
        except Exception as exc:                 # reported by the main thread
            with lock:
                errors.append("%s: %s" % (type(exc).__name__, exc))
            barrier.abort()
        finally:
            if conn is not None:
                conn.close()

    threads = [threading.Thread(target=worker, daemon=True) for _ in range(args.concurrency)]
    for thread in threads:
        thread.start()
    try:
        barrier.wait(timeout=120)
    except threading.BrokenBarrierError:
        barrier.abort()
        if not errors:
            errors.append("the workers did not all connect and warm up within 120 s")
    start = time.perf_counter()
    for thread in threads:
        thread.join()
    wall = time.perf_counter() - start
    if errors:
        raise RuntimeError("%s: %d worker(s) failed; first: %s" % (target.name, len(errors), errors[0]))
    ttfts = [r[0] * 1000 for r in results]
    gaps = [g * 1000 for r in results for g in r[3]]
    tokens = sum(r[2] for r in results)
    return {"requests": len(results), "tokens": tokens, "wall_s": wall,
            "ttft_p50_ms": statistics.median(ttfts), "ttft_p99_ms": percentile(ttfts, 99),
            "ttft_mean_ms": statistics.fmean(ttfts),
            "total_mean_ms": statistics.fmean(r[1] * 1000 for r in results),
            "itl_p50_ms": statistics.median(gaps) if gaps else None,
            "itl_p99_ms": percentile(gaps, 99) if gaps else None,
            "tokens_per_s": tokens / wall}


def percentile(values, pct):
    if len(values) < 2:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[pct - 1]


# --- main -------------------------------------------------------------------------------------

def make_ca(ca_dir):
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "lab", "files", "make_site_ca.py"),
                           ca_dir, "127.0.0.1", "localhost"], capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError("make_site_ca.py failed: %s%s" % (proc.stdout, proc.stderr))


def bench(args):
    sys.path[:0] = [os.path.join(ROOT, "tests"), os.path.join(ROOT, "collections")]
    import gateway_harness as gh                  # noqa: E402 (needs tests/ on sys.path)

    body = json.dumps({"model": "x", "prompt": "hi", "max_tokens": args.tokens,
                       "stream": True}).encode()
    key = "".join(secrets.choice(string.ascii_letters + string.digits) for _ in range(40))
    clients = [{"name": "bench", "key": key, "requests_per_minute": 1000000,
                "concurrent": 10000, "max_tokens": 100000}]
    workdir = tempfile.mkdtemp(prefix="gateway-bench-")
    upstream = None
    try:
        ca_dir = os.path.join(workdir, "ca")
        make_ca(ca_dir)
        upstream, up_port = start_upstream(args)
        spec = gh.lab_spec(ca_dir, up_port, clients)
        gw_dir = pathlib.Path(workdir) / "gateway"
        gw_dir.mkdir()
        with gh.running_gateway(gw_dir, spec, ca_dir) as url:
            gw_port = spec["port"]
            context = ssl.create_default_context(cafile=os.path.join(ca_dir, "ca.pem"))
            context.set_alpn_protocols(["http/1.1"])
            direct = Target("direct", lambda: http.client.HTTPConnection("127.0.0.1", up_port, timeout=30),
                            "127.0.0.1:%d" % up_port, body)
            gateway = Target("gateway",
                             lambda: http.client.HTTPSConnection("127.0.0.1", gw_port, timeout=30,
                                                                 context=context),
                             "127.0.0.1:%d" % gw_port, body,
                             ["Authorization: Bearer %s" % key])
            print("bench: %d workers x %d requests, %d tokens, prefill %.1f ms, token delay %.1f ms, "
                  "%d round(s), %d CPUs; upstream stand-in 127.0.0.1:%d, gateway %s (%s)"
                  % (args.concurrency, args.requests, args.tokens, args.prefill_ms,
                     args.token_delay_ms, args.rounds, os.cpu_count() or 1, up_port, url,
                     gh.HAPROXY))
            rounds = []
            for rnd in range(args.rounds):
                d = run_workload(direct, args)
                g = run_workload(gateway, args)
                rounds.append({"direct": d, "gateway": g})
                print("round %d: TTFT p50 direct %.2f ms, gateway %.2f ms (+%.2f); tok/s %.1f / %.1f (%.3f)"
                      % (rnd + 1, d["ttft_p50_ms"], g["ttft_p50_ms"], g["ttft_p50_ms"] - d["ttft_p50_ms"],
                         d["tokens_per_s"], g["tokens_per_s"], g["tokens_per_s"] / d["tokens_per_s"]))
    finally:
        if upstream is not None:
            stop_upstream(upstream)
        shutil.rmtree(workdir, ignore_errors=True)
    return rounds


def summarise(rounds):
    keys = ("ttft_p50_ms", "ttft_p99_ms", "ttft_mean_ms", "total_mean_ms", "itl_p50_ms",
            "itl_p99_ms", "tokens_per_s")
    median = {}
    for mode in ("direct", "gateway"):
        median[mode] = {k: statistics.median(r[mode][k] for r in rounds) for k in keys}
    overhead = median["gateway"]["ttft_p50_ms"] - median["direct"]["ttft_p50_ms"]
    ratio = median["gateway"]["tokens_per_s"] / median["direct"]["tokens_per_s"]
    return median, overhead, ratio


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--concurrency", type=int, default=8, help="worker threads (one connection each)")
    ap.add_argument("--requests", type=int, default=25, help="timed requests per worker")
    ap.add_argument("--tokens", type=int, default=64, help="token events per response (max_tokens)")
    ap.add_argument("--token-delay-ms", type=float, default=5.0, help="upstream inter-token delay")
    ap.add_argument("--prefill-ms", type=float, default=20.0, help="upstream delay to the first token")
    ap.add_argument("--rounds", type=int, default=3, help="direct then gateway, this many times")
    ap.add_argument("--json", metavar="PATH", help="also write the figures as JSON")
    ap.add_argument("--serve-upstream", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.serve_upstream:
        serve_upstream(args.prefill_ms / 1000.0, args.token_delay_ms / 1000.0)
        return 0
    if min(args.concurrency, args.requests, args.tokens, args.rounds) < 1 or \
            min(args.token_delay_ms, args.prefill_ms) < 0:
        ap.error("--concurrency, --requests, --tokens, --rounds must be >= 1 and delays >= 0")
    try:
        rounds = bench(args)
    except Exception as exc:
        print("error: %s: %s" % (type(exc).__name__, exc), file=sys.stderr)
        return 1
    median, overhead, ratio = summarise(rounds)

    print("\nmedian over %d round(s) (%d requests, %d token events per path per round):"
          % (len(rounds), rounds[0]["direct"]["requests"], rounds[0]["direct"]["tokens"]))
    print("%-8s %12s %12s %14s %12s %12s %12s" % ("path", "p50 TTFT ms", "p99 TTFT ms", "mean total ms",
                                                  "tokens/s", "p50 ITL ms", "p99 ITL ms"))
    for mode in ("direct", "gateway"):
        m = median[mode]
        print("%-8s %12.2f %12.2f %14.2f %12.1f %12.2f %12.2f" % (
            mode, m["ttft_p50_ms"], m["ttft_p99_ms"], m["total_mean_ms"], m["tokens_per_s"],
            m["itl_p50_ms"] or 0, m["itl_p99_ms"] or 0))
    ttft_met = overhead < TTFT_GOAL_MS
    tput_met = ratio >= THROUGHPUT_GOAL
    print("\nTTFT p50 overhead: %.2f ms (goal < %g ms) -> goal %s"
          % (overhead, TTFT_GOAL_MS, "met" if ttft_met else "missed"))
    print("throughput ratio gateway/direct: %.3f (goal >= %.2f) -> goal %s"
          % (ratio, THROUGHPUT_GOAL, "met" if tput_met else "missed"))
    if args.json:
        doc = {"workload": {"concurrency": args.concurrency, "requests_per_worker": args.requests,
                            "tokens": args.tokens, "token_delay_ms": args.token_delay_ms,
                            "prefill_ms": args.prefill_ms, "rounds": args.rounds,
                            "cpus": os.cpu_count()},
               "rounds": rounds, "median": median,
               "ttft_p50_overhead_ms": overhead, "throughput_ratio": ratio,
               "goals": {"ttft_p50_overhead_ms": {"goal": "< %g" % TTFT_GOAL_MS, "met": ttft_met},
                         "throughput_ratio": {"goal": ">= %g" % THROUGHPUT_GOAL, "met": tput_met}}}
        try:
            with open(args.json, "w") as handle:
                json.dump(doc, handle, indent=2)
                handle.write("\n")
        except OSError as exc:
            print("error: cannot write %s: %s" % (args.json, exc), file=sys.stderr)
            return 1
        print("figures written to %s" % args.json)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
