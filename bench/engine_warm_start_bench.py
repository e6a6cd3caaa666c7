#!/usr/bin/env python3
"""Cold against warm engine starts: what the per-image kernel cache saves on a restart.

Starts the lab's real engine (mm3-lab/vllm-cpu:lab, vLLM 0.32's CPU build, serving the tiny
stand-in model tests/fixtures/tiny-m3) with the `docker run` the model_server role renders for
the cpu-lab profile (filter_plugins/serving.py serving_resolve, then model_server.py
docker_run_argv: its least privilege - nobody, read-only root, /tmp tmpfs - and the kernel cache
mounted read-write with every cache variable of the engine pointed into it), on a free loopback
port. Per round: a cold start on an empty cache directory (owned by the container's user, as
tasks/cache.yml makes it), then a warm start on the same directory after the cold one stopped,
which is what a restart of the unit finds. Each start is timed from `docker run` to the first
200 on /health and to the first completion (one token), and the script prints every round, the
medians, warm/cold ratios and what the cold start left in the cache.

  .venv/bin/python bench/engine_warm_start_bench.py               # 3 rounds
  .venv/bin/python bench/engine_warm_start_bench.py --rounds 5 --image mm3-lab/vllm-cpu:lab

What to expect from the lab: the cpu-lab profile runs --enforce-eager (no torch.compile, no CUDA
graphs) and the image has no C compiler for Inductor, so no kernel is compiled; the one file the
cache keeps is vLLM's model inspection (VLLM_CACHE_ROOT/modelinfos/<architecture>.json, which a
cold start computes in a subprocess), worth seconds, not minutes. A start that gets no completion
back (vLLM's CPU worker dying on the host's CPU) is reported as such, timed to /health only.
The GPU profiles' cold starts are dominated by what the cache keeps
(DeepGEMM, Triton, FlashInfer, torch.compile): public figures for a ~500 GB model on 8 x B200
are 8 min cold against under 2 min with reused kernel caches (shared/reference/serving.md).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [os.path.join(ROOT, "filter_plugins"), os.path.join(ROOT, "collections"), os.path.join(ROOT, "tests")]


import model_server  # noqa: E402
import serving  # noqa: E402
from helpers import serving_args  # noqa: E402

TINY = os.path.join(ROOT, "tests", "fixtures", "tiny-m3")
REVISION = "0" * 40


def free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def image_id(image):
    out = subprocess.run(["docker", "image", "inspect", "--format", "{{.Id}}", image],
                         capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit("no image %s here: build it with scripts/vllm-cpu-image.sh" % image)
    return out.stdout.strip()


def lab_spec(image, port):
    """serving_spec of the cpu-lab profile, pinned to the local image by its ID (as the lab does)."""
    spec = serving.serving_resolve(*serving_args(
        profile="cpu-lab", engine="vllm", port=port, weights_revision=REVISION,
        weights_manifest_sha256="c" * 64,
        image={"repository": image.split(":")[0], "digest": image_id(image), "local_id": True}))
    if spec["blockers"]:
        raise SystemExit("cpu-lab does not resolve: %s" % spec["blockers"])
    return spec


def owned_cache_dir(parent, user):
    """An empty cache directory owned by the container's user (model_server tasks/cache.yml)."""
    path = tempfile.mkdtemp(prefix="cache-", dir=parent)
    uid, _, gid = str(user or "0").partition(":")
    os.chown(path, int(uid), int(gid or uid))
    os.chmod(path, 0o750)
    return path


def argv_for(spec, name, cache_dir):
    """The unit's docker run argv, the weights mount pointed at the fixture."""
    argv = model_server.docker_run_argv(spec, name=name, jit_cache_dir=cache_dir)
    weights = "%s:%s:ro" % (spec["weights"]["dir"], spec["weights"]["container_dir"])
    return [("%s:%s:ro" % (TINY, spec["weights"]["container_dir"]) if token == weights else token) for token in argv]


def wait_for(url, deadline, proc, probe):
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            return None
        try:
            if probe(url):
                return time.monotonic()
        except (urllib.error.URLError, OSError, ValueError):
            pass
        time.sleep(0.2)
    return None


def healthy(url):
    with urllib.request.urlopen(url, timeout=2) as resp:
        return resp.status == 200


def completion(model):
    def probe(url):
        body = json.dumps({"model": model, "prompt": "Hello", "max_tokens": 1, "temperature": 0}).encode()
        request = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=60) as resp:
            return resp.status == 200 and json.load(resp)["choices"]
    return probe


def start(spec, cache_dir, timeout, log_dir, label):
    """Seconds to a healthy /health and to the first completion; the engine stopped after."""
    name = "mm3-warm-start-bench-%d-%s" % (os.getpid(), label)
    base = "http://127.0.0.1:%d" % spec["port"]
    log_path = os.path.join(log_dir, name + ".log")
    subprocess.run(["docker", "rm", "--force", name], capture_output=True)
    with open(log_path, "w") as log:
        t0 = time.monotonic()
        proc = subprocess.Popen(argv_for(spec, name, cache_dir), stdout=log, stderr=subprocess.STDOUT)
        try:
            deadline = t0 + timeout
            t_health = wait_for(base + spec["health_path"], deadline, proc, healthy)
            t_first = t_health and wait_for(base + "/v1/completions", deadline, proc,
                                            completion(spec["served_model_name"]))
        finally:
            subprocess.run(["docker", "rm", "--force", name], capture_output=True, timeout=120)
            proc.wait(timeout=120)
    with open(log_path) as log:
        text = log.read()
    if not t_health:
        raise SystemExit("the engine (%s) did not answer /health within %d s:\n%s" % (label, timeout, text[-3000:]))
    if not t_first:
        # Reported, not hidden: the start is still timed to /health. (On a host whose CPU the
        # image's kernels do not run on, vLLM's worker dies on the first forward pass.)
        died = [line for line in text.splitlines() if "died unexpectedly" in line]
        died = died or [line for line in text.splitlines() if "EngineDeadError" in line]
        return t_health - t0, None, (died[0].split("]", 1)[-1].strip() if died else "no completion within %d s" % timeout)
    return t_health - t0, t_first - t0, None


def cache_contents(path):
    """(bytes, files, the files' paths in the cache) of a cache directory."""
    size, found = 0, []
    for folder, _, names in os.walk(path):
        for file_name in names:
            found.append(os.path.relpath(os.path.join(folder, file_name), path))
            size += os.lstat(os.path.join(folder, file_name)).st_size
    return size, len(found), sorted(found)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--image", default="mm3-lab/vllm-cpu:lab")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--timeout", type=int, default=600, help="seconds one start may take")
    args = parser.parse_args()

    spec = lab_spec(args.image, free_port())
    work = tempfile.mkdtemp(prefix="mm3-warm-start-")
    rows = []
    try:
        print("engine: %s (%s), profile cpu-lab, flags %s"
              % (args.image, spec["image"]["ref"][:19], " ".join(serving.flatten_args(spec["args"]))))
        print("cache: %s (read-write), %s" % (spec["jit_cache"]["container_dir"],
                                             ", ".join(name for name, _ in model_server.jit_cache_env(spec))))
        print("%-6s %-5s %10s %14s" % ("round", "start", "health s", "first token s"))
        notes = set()
        for index in range(1, args.rounds + 1):
            cache = owned_cache_dir(work, spec["container"].get("user"))
            cold = start(spec, cache, args.timeout, work, "cold-%d" % index)
            size, files, top = cache_contents(cache)
            warm = start(spec, cache, args.timeout, work, "warm-%d" % index)
            rows.append((cold, warm))
            for name, run in (("cold", cold), ("warm", warm)):
                print("%-6d %-5s %10.1f %14s" % (index, name, run[0], "%.1f" % run[1] if run[1] else "n/a"))
                notes.update([run[2]] if run[2] else [])
            print("       cache after the cold start: %d files, %.1f KiB (%s)"
                  % (files, size / 1024.0, ", ".join(top[:4]) + (", ..." if len(top) > 4 else "") or "empty"))
        for note in sorted(notes):
            print("no first token: %s" % note)
        for what, at in (("health", 0), ("first token", 1)):
            cold_s = [r[0][at] for r in rows if r[0][at]]
            warm_s = [r[1][at] for r in rows if r[1][at]]
            if not cold_s or not warm_s:
                print("%-12s n/a (no completion came back)" % what)
                continue
            cold_m, warm_m = statistics.median(cold_s), statistics.median(warm_s)
            print("%-12s median cold %.1f s, warm %.1f s, ratio warm/cold %.2f (below 1: the cache saves time)"
                  % (what, cold_m, warm_m, warm_m / cold_m))
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
