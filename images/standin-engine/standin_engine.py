#!/usr/bin/python3
"""STAND-IN engine (not SGLang, not vLLM): the launch contract of the real engines, no model.

  sglang serve --model-path DIR [...] --host H --port P [--config FILE]
  vllm serve DIR | --model DIR [...] --host H --port P [--config FILE]
  standin-engine msa-gate [--fail]   (the MSA warm-up gate: warms the JIT cache, exits 0;
                                      --fail: exits 1 like an image without MSA)
  standin-engine compile-deep-gemm <the server's arguments> [--timeout S]
                                     (SGLang's `python3 -m sglang.compile_deep_gemm`, below)

The image reproduces vllm/vllm-openai's ENTRYPOINT ["vllm", "serve"] (images/standin-engine/
Dockerfile): arguments alone start the server; anything else needs --entrypoint.
Like a real multi-rank start on a cold MSA JIT cache (the seed's "AttributeError: Module has no
function 'plan'"), the server refuses to start when a JIT cache is mounted (XDG_CACHE_HOME set)
but the gate never warmed it.

compile-deep-gemm reproduces sgl-project/sglang python/sglang/compile_deep_gemm.py (commit
06c48ca8da0b): it takes the server's arguments plus --timeout (default 3600), prints what the real
one prints ("Disable CUDA Graph and Torch Compile to save time...", "Set load format to dummy to
save time...", "Begin DeepGEMM Kernels compilation...", "DeepGEMM Kernels compilation finished
successfully.") and writes the kernels where DeepGEMM caches them: DG_JIT_CACHE_DIR, which SGLang
sets from SGLANG_DG_CACHE_DIR, else ~/.cache/deep_gemm (srt/layers/deep_gemm_wrapper/
compile_utils.py), as <dir>/cache/kernel.<name>.<hash>/{kernel.cu,kernel.cubin} (deepseek-ai/
DeepGEMM csrc/jit/compiler.hpp). The compilation takes STANDIN_COMPILE_SECONDS (default 1); past
--timeout it raises the real TimeoutError and exits 1. STANDIN_COMPILE_HANG=1 never returns, like
the real one when its server accepts the connection and never answers (its requests.get has no
timeout), which only a bound outside it stops. The model must be there and read-only, as for serve.

Refuses to start (exit 2) unless HF_HUB_OFFLINE=1, the model directory exists with a
config.json and is mounted read-only. With --config, reads `api-key` from that YAML file and
requires `Authorization: Bearer <key>` on every path except /health (like SGLang). Never
prints the key. /health answers 503 for STANDIN_LOAD_SECONDS (default 2) and then 200.
"""
import errno
import hashlib
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


def model_problem(args):
    """Why the model the arguments name cannot be served (missing, or writable), or None."""
    positional = positionals(args)
    model = option(args, "--model-path", "--model") or (positional[0] if positional else None)
    if not model or not os.path.isfile(os.path.join(model, "config.json")):
        return "no model at %r (config.json missing)" % model
    probe = os.path.join(model, ".write-probe")
    try:
        with open(probe, "w", encoding="utf-8"):
            pass
        os.remove(probe)
        return "the weights at %s are writable: mount them read-only" % model
    except OSError as exc:
        if exc.errno != errno.EROFS:
            return "unexpected error probing %s: %s" % (model, exc)
    return None


# Kernels a MoE model's DeepGEMM precompile builds (DeepGEMM's kernel names, one configuration each).
STANDIN_KERNELS = ("sm100_fp8_gemm_1d1d", "sm100_m_grouped_fp8_gemm_contiguous_1d1d",
                   "sm100_m_grouped_fp8_gemm_masked_1d1d")


def compile_deep_gemm(args):
    """python3 -m sglang.compile_deep_gemm, as the stand-in runs it (module docstring)."""
    timeout = int(option(args, "--timeout", default="3600"))
    server_args = list(args)
    if "--timeout" in server_args:
        at = server_args.index("--timeout")
        del server_args[at:at + 2]
    if os.environ.get("HF_HUB_OFFLINE") != "1":
        fail("HF_HUB_OFFLINE is not 1 (an air-gapped node must not reach the hub)")
    problem = model_problem(server_args)
    if problem:
        fail(problem)
    print("Disable CUDA Graph and Torch Compile to save time...", flush=True)
    print("Set load format to dummy to save time...", flush=True)
    print("Begin DeepGEMM Kernels compilation...\nIt may take a long time and timeout maybe raised "
          "while the compilation is still in progress.\nJust feel free to restart the command "
          "until the compilation is fully finished.\n", flush=True)
    if os.environ.get("STANDIN_COMPILE_HANG") == "1":
        while True:
            time.sleep(3600)
    seconds = float(os.environ.get("STANDIN_COMPILE_SECONDS", "1"))
    if seconds > timeout:
        time.sleep(timeout)
        print("Traceback (most recent call last):\nTimeoutError: DeepGEMM Kernels compilation timeout."
              "\n\nFeel free and please restart the command.", file=sys.stderr, flush=True)
        return 1
    time.sleep(seconds)
    cache = os.environ.get("SGLANG_DG_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "deep_gemm")
    print("\nGenerate warm up request for compiling DeepGEMM...\n", flush=True)
    for name in STANDIN_KERNELS:
        digest = hashlib.sha256(("%s$$%s" % (name, " ".join(server_args))).encode()).hexdigest()[:32]
        kernel = os.path.join(cache, "cache", "kernel.%s.%s" % (name, digest))
        os.makedirs(kernel, exist_ok=True)
        for file_name in ("kernel.cu", "kernel.cubin"):
            with open(os.path.join(kernel, file_name), "w", encoding="utf-8") as handle:
                handle.write("stand-in %s of %s\n" % (file_name, name))
    print("\nDeepGEMM Kernels compilation finished successfully.", flush=True)
    return 0


def main(argv):
    prog = os.path.basename(argv[0])
    args = argv[1:]
    if args[:1] == ["compile-deep-gemm"]:
        return compile_deep_gemm(args[1:])
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
    problem = model_problem(args[1:])
    if problem:
        fail(problem)
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
