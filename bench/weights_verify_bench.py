#!/usr/bin/env python3
"""Benchmark of weights_verify against `sha256sum -c` (one file at a time), plus the sync cost
of one changed shard.

Makes N synthetic shards (default 8 x 512 MB), writes their manifest, then prints:
  - single-core sha256 rate (hashlib: a cache-sized buffer and one in memory) x cores, and the
    cores hashing together (one process per CPU at once: what they deliver side by side, which a
    virtual machine's CPUs need not match x cores): the latter is the bound's;
  - cold-read rate of the shards, the faster of one reader and one per CPU (page cache dropped
    when permitted; otherwise says so);
  - `sha256sum -c MANIFEST` (sequential, one file at a time) and the weights_verify module
    (run through `ansible localhost -m weights_verify`, the real module path), cold and warm;
  - the ratio module / sha256sum and module / min(disk read, cores x single-core); target >= 0.90;
  - the module warm reading into a 1 MiB buffer (mapped=false, the default before mapped pages)
    against the default;
  - the module warm again over the page cache its cold run without hints left (the kernel's own
    read-ahead: large folios) instead of with them (4 KiB pages), and how much of the cache is held
    in 2 MiB folios each time;
  - bytes rsync moves to refresh a copy when 1 of N shards changed (target <= 1.05 x shard).
Every rate is the best of --repeat runs (default 3): the machines are shared.
usage: bench/weights_verify_bench.py [--shards 8] [--size-mb 512] [--dir /var/tmp/weights-bench] [--repeat 3]
"""

import argparse
import hashlib
import json
import multiprocessing
import os
import re
import shutil
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MB = 1_000_000
CHUNK = 16 * 1024 * 1024


def make_shards(d, n, size):
    os.makedirs(d, exist_ok=True)
    block = bytearray(os.urandom(CHUNK))
    lines = []
    for i in range(n):
        name = "model-%05d-of-%05d.safetensors" % (i + 1, n)
        h = hashlib.sha256()
        with open(os.path.join(d, name), "wb") as f:
            left, k = size, 0
            while left > 0:
                block[:16] = ("%08d%08d" % (i, k)).encode()   # every chunk distinct
                part = memoryview(block)[:min(CHUNK, left)]
                f.write(part)
                h.update(part)
                left -= len(part)
                k += 1
        lines.append("%s  %s\n" % (h.hexdigest(), name))
    manifest = d.rstrip("/") + ".manifest.sha256"
    with open(manifest, "w") as f:
        f.writelines(lines)
    return manifest


def single_core_rates():
    """(from cache, from memory): one core's sha256 rate over a 1 MiB buffer hashed 256 times
    (the data stays in the core's cache: the rate of the hash itself) and over one 256 MiB buffer
    (the data streams from memory)."""
    small = os.urandom(1 << 20)
    hashlib.sha256(small).hexdigest()
    t = time.perf_counter()
    h = hashlib.sha256()
    for _ in range(256):
        h.update(small)
    cached = 256 * len(small) / (time.perf_counter() - t)
    data = os.urandom(256 * 1024 * 1024)
    t = time.perf_counter()
    hashlib.sha256(data).hexdigest()
    return cached, len(data) / (time.perf_counter() - t)


def _hash_for(args):
    """Worker of cores_rate: wait for the others, hash a 1 MiB buffer `rounds` times."""
    barrier, rounds = args
    small = os.urandom(1 << 20)
    hashlib.sha256(small).hexdigest()
    barrier.wait()
    t = time.perf_counter()
    h = hashlib.sha256()
    for _ in range(rounds):
        h.update(small)
    return rounds * len(small), t, time.perf_counter()


def cores_rate(cores, rounds=512):
    """sha256 bytes per second of `cores` processes hashing at once (each from its own cache-sized
    buffer, started together): what the CPUs deliver side by side, the bound's factor."""
    ctx = multiprocessing.get_context("fork")
    with ctx.Manager() as manager, ctx.Pool(cores) as pool:
        done = pool.map(_hash_for, [(manager.Barrier(cores), rounds)] * cores, chunksize=1)
    return sum(n for n, _, _ in done) / (max(end for _, _, end in done) - min(start for _, start, _ in done))


def best_module_run(repeat, *args, **kwargs):
    """run_module `repeat` times; the (result, wall) whose hashing rate was highest."""
    return max((run_module(*args, **kwargs) for _ in range(max(1, repeat))), key=lambda run: run[0]["rate"])


def measure_bounds(d, cores, repeat):
    """What a bound is made of, each the best of `repeat` runs: one core's sha256 from cache and
    from memory, the cores hashing together, the read rate with the page cache dropped (and whether
    it could be) and from the page cache, each the faster of one reader and one per CPU."""
    runs, streams = range(max(1, repeat)), sorted({1, cores})
    singles = [single_core_rates() for _ in runs]
    together = max(cores_rate(cores) for _ in runs)
    reads = [cold_read_rate(d, n) for _ in runs for n in streams]
    cached = max(read_rate(d, n) for _ in runs for n in streams)   # the cold reads left the shards there
    return {"from_cache": max(r[0] for r in singles), "from_memory": max(r[1] for r in singles),
            "together": together, "disk": max(r[0] for r in reads), "dropped": reads[0][1], "cached": cached}


def drop_caches():
    try:
        subprocess.run(["sync"], check=True)
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
        return True
    except OSError:
        return False


def file_huge_pages():
    """MB of file pages the kernel holds in 2 MiB folios (/proc/meminfo FileHugePages), or '?'."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("FileHugePages:"):
                    return "%d" % (int(line.split()[1]) * 1024 // MB)
    except OSError:
        pass
    return "?"


def cold_read_rate(d, streams=1):
    """(read rate with the page cache dropped first, whether it could be dropped)."""
    dropped = drop_caches()
    return read_rate(d, streams), dropped


def _read_files(paths):
    buf, total = bytearray(CHUNK), 0
    for path in paths:
        with open(path, "rb", buffering=0) as f:
            while True:
                n = f.readinto(buf)
                if not n:
                    break
                total += n
    return total


def read_rate(d, streams=1):
    """Bytes per second reading every shard once, as the page cache stands: one file at a time, or
    `streams` processes each reading every streams-th file (a disk that serves several requests at
    once reads faster so, as the verifier's workers read it)."""
    paths = [os.path.join(d, name) for name in sorted(os.listdir(d))]
    t = time.perf_counter()
    if streams <= 1:
        total = _read_files(paths)
    else:
        with multiprocessing.get_context("fork").Pool(streams) as pool:
            total = sum(pool.map(_read_files, [paths[i::streams] for i in range(streams)], chunksize=1))
    return total / (time.perf_counter() - t)


def run_sha256sum(d, manifest, cold):
    if cold:
        drop_caches()
    t = time.perf_counter()
    subprocess.run(["sha256sum", "--check", "--quiet", manifest], cwd=d, check=True)
    return time.perf_counter() - t


def run_module(d, manifest, cold, workers, readahead=True, buffer_size=None, mapped=True):
    if cold:
        drop_caches()
    marker = d.rstrip("/") + ".verified.json"
    if os.path.exists(marker):
        os.unlink(marker)
    with open(manifest, "rb") as f:
        pinned = hashlib.sha256(f.read()).hexdigest()   # what an operator pins after review
    args = "path=%s manifest=%s marker=%s manifest_sha256=%s" % (d, manifest, marker, pinned)
    if workers:
        args += " workers=%d" % workers
    if not readahead:
        args += " readahead=false"
    if buffer_size:
        args += " buffer_size=%d" % buffer_size
    if not mapped:
        args += " mapped=false"
    env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(ROOT, "ansible.cfg"), ANSIBLE_STDOUT_CALLBACK="oneline",
               ANSIBLE_LOAD_CALLBACK_PLUGINS="1")
    t = time.perf_counter()
    out = subprocess.run(["ansible", "localhost", "-c", "local", "-i", "localhost,", "-m", "weights_verify",
                          "-e", "ansible_python_interpreter=" + sys.executable,
                          "-a", args], cwd=ROOT, env=env, check=True, capture_output=True, text=True).stdout
    wall = time.perf_counter() - t
    res = json.loads(re.search(r"=> (\{.*\})", out).group(1))
    if not res.get("verified"):
        sys.exit("weights_verify did not verify the bench shards: %s" % res.get("msg"))
    return res, wall


def sync_bytes(d, n, size):
    """rsync (delta algorithm, as over the daemon) a copy after one shard was rewritten."""
    if not shutil.which("rsync"):
        return None
    copy = d.rstrip("/") + "-copy"
    subprocess.run(["rsync", "-a", d + "/", copy + "/"], check=True)
    name = "model-%05d-of-%05d.safetensors" % (1, n)
    with open(os.path.join(d, name), "r+b") as f:         # rewrite one shard entirely
        left = size
        while left > 0:
            part = os.urandom(min(CHUNK, left))
            f.write(part)
            left -= len(part)
    out = subprocess.run(["rsync", "-a", "--no-whole-file", "--stats", "--no-human-readable",
                          "--partial-dir=.rsync-partial", "--delay-updates", d + "/", copy + "/"],
                         check=True, capture_output=True, text=True).stdout
    shutil.rmtree(copy)
    sent = int(re.search(r"Total bytes sent: ([0-9]+)", out).group(1))
    files = int(re.search(r"Number of regular files transferred: ([0-9]+)", out).group(1))
    return sent, files


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shards", type=int, default=8)
    ap.add_argument("--size-mb", type=int, default=512)
    ap.add_argument("--dir", default="/var/tmp/weights-bench/shards")
    ap.add_argument("--workers", type=int, default=0, help="weights_verify workers (0 = CPU count)")
    ap.add_argument("--repeat", type=int, default=3, help="runs per rate; the best is reported")
    ap.add_argument("--keep", action="store_true")
    a = ap.parse_args()
    size = a.size_mb * MB
    cores = os.cpu_count() or 1
    print("bench: %d shards x %d MB in %s, %d CPUs" % (a.shards, a.size_mb, a.dir, cores))
    manifest = make_shards(a.dir, a.shards, size)
    total = a.shards * size

    m = measure_bounds(a.dir, cores, a.repeat)
    from_cache, from_memory, together, disk, dropped = (
        m["from_cache"], m["from_memory"], m["together"], m["disk"], m["dropped"])
    core = max(from_cache, from_memory)
    print("single-core sha256 (hashlib): %8.1f MB/s from cache, %.1f MB/s from memory; x %d cores = %.1f MB/s" % (
        from_cache / MB, from_memory / MB, cores, cores * core / MB))
    print("%d cores hashing together:        %8.1f MB/s (= %.2f of single-core x %d)" % (
        cores, together / MB, together / (cores * core), cores))
    print("read rate of the shards:              %8.1f MB/s (the faster of 1 and %d readers; %s)" % (
        disk / MB, cores, "cold: page cache dropped" if dropped else
        "WARM: dropping the page cache is not permitted here, so this is a cache read rate"))
    cached = m["cached"]
    bounds = {"cold": min(disk, together), "warm": min(cached, together)}
    bound = bounds["cold"]
    results = {}
    for label, cold in (("cold", True), ("warm", False)):
        if cold and not dropped:
            continue
        if not cold:
            run_sha256sum(a.dir, manifest, False)          # warm the cache
        s = min(run_sha256sum(a.dir, manifest, cold) for _ in range(max(1, a.repeat)))
        res, wall = best_module_run(a.repeat, a.dir, manifest, cold, a.workers)
        results[label] = (total / s, res["rate"], total / wall, res["workers"])
        print("%s: sha256sum -c (one file at a time) %8.1f MB/s | weights_verify %8.1f MB/s hashing "
              "(%.1f MB/s incl. ansible start-up, %d workers) | ratio %.2f x" % (
                  label, total / s / MB, res["rate"] / MB, total / wall / MB, res["workers"],
                  res["rate"] / (total / s)))
    # the baseline of this run for mapped pages: each piece read into a 1 MiB buffer, warm, over the
    # page cache the warm run above had
    res, _wall = best_module_run(a.repeat, a.dir, manifest, False, a.workers, mapped=False)
    print("warm, read into a buffer (mapped=false, baseline): weights_verify %8.1f MB/s = %.2f of the warm bound; "
          "mapped (the default) %.1f MB/s = %.2f (x %.2f)" % (
              res["rate"] / MB, res["rate"] / bounds["warm"], results["warm"][1] / MB,
              results["warm"][1] / bounds["warm"], results["warm"][1] / res["rate"]))
    if dropped:
        # What the warm rate depends on: how the page cache holds the shards. The module's cold pass
        # with its hints (posix_fadvise WILLNEED) leaves them in 4 KiB pages; without them the
        # kernel's own read-ahead (as a copy or `cat` reads) leaves large folios, counted 2 MiB ones
        # in /proc/meminfo FileHugePages, which cost less to map. The targets stay the runs above.
        after_hints = file_huge_pages()
        # the baseline of this run: the module without its read-ahead hints, cold
        res, _wall = best_module_run(a.repeat, a.dir, manifest, True, a.workers, readahead=False)
        print("cold, read-ahead hints off (baseline): weights_verify %8.1f MB/s = %.2f of the bound; "
              "with them %.1f MB/s = %.2f (x %.2f)" % (
                  res["rate"] / MB, res["rate"] / bound, results["cold"][1] / MB, results["cold"][1] / bound,
                  results["cold"][1] / res["rate"]))
        after_plain = file_huge_pages()
        res, _wall = best_module_run(a.repeat, a.dir, manifest, False, a.workers)
        print("warm, page cache left by the cold run without hints (%s MB of it in 2 MiB folios; %s MB as the "
              "cold run with them left it): weights_verify %8.1f MB/s = %.2f of the warm bound (x %.2f the "
              "warm run above)" % (after_plain, after_hints, res["rate"] / MB, res["rate"] / bounds["warm"],
                                   res["rate"] / results["warm"][1]))
    for label, got in ((label, results[label][1]) for label in ("cold", "warm") if label in results):
        limit = bounds[label]
        print("target %s: weights_verify >= 0.90 x min(read %.1f %s, %d cores hashing together %.1f) = %.1f MB/s; "
              "got %.1f MB/s = %.2f of the bound -> %s (%.2f of single-core x %d)" % (
                  label, (disk if label == "cold" else cached) / MB, "cold" if label == "cold" else "from the page cache",
                  cores, together / MB, limit / MB, got / MB, got / limit, "MET" if got >= 0.9 * limit else "NOT MET",
                  got / (cores * core), cores))
    moved = sync_bytes(a.dir, a.shards, size)
    if moved is None:
        print("sync: rsync not installed, bytes moved not measured")
    else:
        sent, files = moved
        print("sync after 1 of %d shards rewritten: %d bytes moved, %d file(s) = %.3f x shard (target <= 1.05) -> %s"
              % (a.shards, sent, files, sent / size, "MET" if sent <= 1.05 * size else "NOT MET"))
    if not a.keep:
        shutil.rmtree(a.dir)
        for suffix in (".manifest.sha256", ".verified.json"):
            if os.path.exists(a.dir.rstrip("/") + suffix):
                os.unlink(a.dir.rstrip("/") + suffix)


if __name__ == "__main__":
    main()
