#!/usr/bin/python3
"""STAND-IN engine (not SGLang, not vLLM): the launch contract of the real engines, no model.

  sglang serve --model-path DIR [...] --host H --port P [--config FILE]
  vllm serve DIR | --model DIR [...] --host H --port P [--config FILE]
  standin-engine msa-gate [--fail]   (the MSA warm-up gate: warms the JIT cache, exits 0;
                                      --fail: exits 1 like an image without MSA)

The image reproduces vllm/vllm-openai's ENTRYPOINT ["vllm", "serve"] (images/standin-engine/
Dockerfile): arguments alone start the server; anything else needs --entrypoint.
Like a real multi-rank start on a cold MSA JIT cache (the seed's "AttributeError: Module has no
function 'plan'"), the server refuses to start when a JIT cache is mounted (XDG_CACHE_HOME set)
but the gate never warmed it.

Refuses to start (exit 2) unless HF_HUB_OFFLINE=1, the model directory exists with a
config.json and is mounted read-only. With --config, reads `api-key` from that YAML file and
requires `Authorization: Bearer <key>` on every path except /health (like SGLang). Never
prints the key. /health answers 503 for STANDIN_LOAD_SECONDS (default 2) and then 200.
"""
import errno
import json
import os
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def fail(msg):
    print("stand-in engine: refusing to start: " + msg, flush=True)
    sys.exit(2)


def option(argv, *names, default=None):
    for i, arg in enumerate(argv):
        if arg in names and i + 1 < len(argv):
            return argv[i + 1]
    return default


# Options of the real engines that take no value (everything else starting with - takes one);
# SGLang's --enable-metrics is a store_true switch (docs/references/production_metrics.md).
SWITCHES = {"--enable-auto-tool-choice", "--enforce-eager", "--trust-remote-code",
            "--skip-server-warmup", "--enable-log-requests", "--log-requests", "--enable-metrics"}


def positionals(tokens):
    """The bare tokens of a command line, option values skipped."""
    found, index = [], 0
    while index < len(tokens):
        token = tokens[index]
        if token.startswith("-"):
            index += 1 if (token in SWITCHES or "=" in token) else 2
            continue
        found.append(token)
        index += 1
    return found


def read_api_key(path):
    with open(path, encoding="utf-8") as handle:
        for line in handle:
            line = line.strip()
            if line.startswith("api-key:"):
                value = line.split(":", 1)[1].strip()
                return json.loads(value) if value.startswith('"') else value
    return None


def main(argv):
    prog = os.path.basename(argv[0])
    args = argv[1:]
    if args[:1] == ["msa-gate"]:
        if "--fail" in args:
            print("stand-in MSA gate: ModuleNotFoundError: No module named "
                  "'sglang.srt.layers.attention.minimax_sparse_ops'", file=sys.stderr, flush=True)
            return 1
        cache = os.environ.get("XDG_CACHE_HOME")
        if cache:
            os.makedirs(os.path.join(cache, "standin-msa"), exist_ok=True)
            with open(os.path.join(cache, "standin-msa", "warm"), "w", encoding="utf-8") as handle:
                handle.write("compiled\n")
        print("stand-in MSA gate: msa_available() = True (single process, cache %s)" % cache,
              flush=True)
        return 0
    if prog not in ("sglang", "vllm") or args[:1] != ["serve"]:
        print(__doc__)
        return 0 if "--help" in args else 64
    if os.environ.get("HF_HUB_OFFLINE") != "1":
        fail("HF_HUB_OFFLINE is not 1 (an air-gapped node must not reach the hub)")
    cache = os.environ.get("XDG_CACHE_HOME")
    if cache and not os.path.isfile(os.path.join(cache, "standin-msa", "warm")):
        fail("cold JIT cache at %s: AttributeError: Module has no function 'plan' (run the MSA "
             "gate once in this image and cache first)" % cache)
    positional = positionals(args[1:])
    if len(positional) > 1:
        # argparse in the real `vllm serve` / `sglang serve`: one positional (the model tag)
        print("usage: %s serve [model_tag] [options]\n%s serve: error: unrecognized arguments: %s"
              % (prog, prog, " ".join(positional[1:])), file=sys.stderr, flush=True)
        return 2
    model = option(args, "--model-path", "--model") or (positional[0] if positional else None)
    if not model or not os.path.isfile(os.path.join(model, "config.json")):
        fail("no model at %r (config.json missing)" % model)
    probe = os.path.join(model, ".write-probe")
    try:
        with open(probe, "w", encoding="utf-8"):
            pass
        os.remove(probe)
        fail("the weights at %s are writable: mount them read-only" % model)
    except OSError as exc:
        if exc.errno != errno.EROFS:
            fail("unexpected error probing %s: %s" % (model, exc))
    config = option(args, "--config")
    key = read_api_key(config) if config else None
    if config and not key:
        fail("--config %s has no api-key" % config)
    host = option(args, "--host", default="127.0.0.1")
    port = int(option(args, "--port", default="30000"))
    name = option(args, "--served-model-name", default=model)
    ready_at = time.time() + float(os.environ.get("STANDIN_LOAD_SECONDS", "2"))

    class Handler(BaseHTTPRequestHandler):
        def _send(self, code, body):
            data = json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self):  # noqa: N802 (http.server API)
            if self.path.startswith("/health"):
                if time.time() < ready_at:
                    return self._send(503, {"status": "loading"})
                return self._send(200, {"status": "ok"})
            if key and self.headers.get("Authorization") != "Bearer " + key:
                return self._send(401, {"error": "invalid api key"})
            if self.path == "/v1/models":
                return self._send(200, {"object": "list", "data": [{"id": name, "object": "model"}]})
            return self._send(404, {"error": "not found"})

        def log_message(self, fmt, *fargs):
            sys.stdout.write("stand-in engine: %s %s\n" % (self.address_string(), fmt % fargs))
            sys.stdout.flush()

    print("stand-in engine (%s): model %s (read-only), listening on %s:%d, api key %s"
          % (prog, model, host, port, "required" if key else "off"), flush=True)
    ThreadingHTTPServer((host, port), Handler).serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
