#!/usr/bin/env python3
"""Benchmark of signed releases (issue 33): signing and verifying a release against the
cores x sha256 bound, with the upstream model-signing CLI as the baseline, in one run.

A release statement lists the weights manifest's entries, so on the node the per-file check is
the project's parallel verifier (weights_verify against the manifest) and the signature adds one
ECDSA operation and a comparison of the lists; on the staging host signing reads the manifest the
weights playbook wrote (the hub's digests, already checked). This bench makes N shards and their
manifest, then prints:
  - the cores hashing together (weights_verify_bench.cores_rate; single-core x cores beside it),
    and the read rate of the shards (the faster of 1 and one reader per CPU): the bound;
  - sign: statement from the manifest + ECDSA P-256 (module_utils/release_signing), in ms;
  - verify: weights_verify (the real module through `ansible`) + bundle verification + the
    comparison with the manifest, as a rate over the shards' bytes and as a ratio of the bound
    (target >= 0.90). Each run has its own bound: cold, min(the cold read rate, the cores hashing
    together); warm, min(the read rate from the page cache, the cores hashing together);
  - the same verification by `model_signing verify key` (upstream 1.1.1, which hashes the files
    itself), and `model_signing sign key`: rates and the ratio project / upstream.
Every rate is the best of --repeat runs (default 3): the machines are shared.
usage: bench/release_signing_bench.py [--shards 8] [--size-mb 256] [--dir /var/tmp/release-bench/shards] [--repeat 3]
The upstream CLI comes from tools/model_signing/requirements.lock (pip --require-hashes), in
.cache/model-signing-venv, as the tests install it.
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "bench"))
sys.path.insert(0, os.path.join(ROOT, "collections"))
sys.path.insert(0, os.path.join(ROOT, "tools", "model_signing"))

import weights_verify_bench as wb  # noqa: E402
from cli import model_signing_cli  # noqa: E402
from ansible_collections.mm3.shared.plugins.module_utils import release_signing as rs  # noqa: E402
from ansible_collections.mm3.shared.plugins.module_utils.weights_common import parse_manifest  # noqa: E402

MB = 1_000_000


def keypair(d):
    os.makedirs(d, exist_ok=True)
    key, pub = os.path.join(d, "site.pem"), os.path.join(d, "site.pub")
    subprocess.run(["openssl", "ecparam", "-name", "prime256v1", "-genkey", "-noout", "-out", key], check=True)
    subprocess.run(["openssl", "ec", "-in", key, "-pubout", "-out", pub], check=True, capture_output=True)
    return key, pub


def timed(fn, *args):
    start = time.perf_counter()
    result = fn(*args)
    return result, time.perf_counter() - start


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shards", type=int, default=8)
    ap.add_argument("--size-mb", type=int, default=256)
    ap.add_argument("--dir", default="/var/tmp/release-bench/shards")
    ap.add_argument("--repeat", type=int, default=3, help="runs per rate; the best is reported")
    ap.add_argument("--keep", action="store_true")
    a = ap.parse_args()
    total = a.shards * a.size_mb * MB
    cores = os.cpu_count() or 1
    print("bench: %d shards x %d MB in %s, %d CPUs" % (a.shards, a.size_mb, a.dir, cores))
    manifest = wb.make_shards(a.dir, a.shards, a.size_mb * MB)
    key, pub = keypair(os.path.dirname(a.dir.rstrip("/")) + "/keys")
    sig = os.path.dirname(a.dir.rstrip("/")) + "/release.sig"
    m = wb.measure_bounds(a.dir, cores, a.repeat)
    core, together = max(m["from_cache"], m["from_memory"]), m["together"]
    disk, dropped, cached = m["disk"], m["dropped"], m["cached"]
    bounds = {"cold": min(disk, together), "warm": min(cached, together)}
    print("%d cores hashing together: %.1f MB/s sha256 (single-core x %d: %.1f MB/s)" % (
        cores, together / MB, cores, cores * core / MB))
    print("bound cold: min(read %.1f MB/s %s, %d cores hashing together) = %.1f MB/s" % (
        disk / MB, "cold" if dropped else "WARM (page cache not droppable here)", cores, bounds["cold"] / MB))
    print("bound warm: min(read %.1f MB/s from the page cache, %d cores hashing together) = %.1f MB/s" % (
        cached / MB, cores, bounds["warm"] / MB))

    # Sign on staging: the statement from the manifest the weights playbook wrote, one signature.
    with open(manifest) as handle:
        entries = parse_manifest(handle.read())
    with open(key, "rb") as handle:
        private = handle.read()
    release = {"repo": "bench/shards", "revision": "a" * 40, "images": ["x@sha256:" + "b" * 64]}
    bundle, sign_s = timed(lambda: json.dumps(rs.sign(rs.statement("shards", entries, release=release), private)))
    with open(sig, "w") as handle:
        handle.write(bundle)
    print("project sign (statement from the manifest + ECDSA P-256): %.1f ms" % (sign_s * 1000))

    # Verify on the node: the parallel verifier over the files, then the bundle and the lists;
    # upstream's CLI on the same files; cold (page cache dropped, where permitted) and warm.
    with open(pub) as handle:
        keys = rs.trusted_keys([{"name": "site", "public_key": handle.read()}])
    cli = model_signing_cli()
    upstream_sig = sig + ".upstream"
    _, up_sign_s = timed(subprocess.run, [cli, "sign", "key", a.dir, "--private_key", key, "--signature",
                                          upstream_sig])
    print("upstream model_signing 1.1.1 sign: %.1f MB/s (incl. start-up)" % (total / up_sign_s / MB))
    for label, cold in (("cold", True), ("warm", False)):
        if cold and not dropped:
            continue
        res, _wall = wb.best_module_run(a.repeat, a.dir, manifest, cold, 0)
        checked, check_s = timed(lambda: rs.verify(bundle, keys))
        assert rs.manifest_differences(checked["entries"], entries) == []
        rate = total / (res["seconds"] + check_s)
        if cold:
            wb.drop_caches()
        done, up_verify_s = timed(subprocess.run, [cli, "verify", "key", a.dir, "--public_key", pub,
                                                   "--signature", upstream_sig])
        if done.returncode != 0:
            sys.exit("model_signing verify failed on its own signature")
        up_rate = total / up_verify_s
        bound = bounds[label]
        print("%s verify: project (weights_verify %.1f MB/s, %d workers, + bundle %.1f ms) %.1f MB/s = %.2f of the "
              "bound -> %s (%.2f of single-core x %d) | upstream %.1f MB/s (incl. start-up) = %.2f of the bound | "
              "project / upstream %.2f x" % (
                  label, res["rate"] / MB, res["workers"], check_s * 1000, rate / MB, rate / bound,
                  "MET" if rate >= 0.9 * bound else "NOT MET", rate / (cores * core), cores, up_rate / MB,
                  up_rate / bound, rate / up_rate))
    if not a.keep:
        shutil.rmtree(os.path.dirname(a.dir.rstrip("/")))


if __name__ == "__main__":
    main()
