#!/usr/bin/env python3
"""Benchmark of the weights fan-out: star (every node pulls from staging) versus waves (a node
that verified the revision serves the next wave; filter_plugins/weights_fanout.py plans every
wave from the sources that verified), for 1, 2, 4 and 8 nodes, in one run.

Real parts: rsync daemons on loopback (staging's and, once verified, each node's; read-only,
user and password, hosts allow 127.0.0.1, the same export filter as roles/weights_sync's
staging daemon), real rsync pulls, `sha256sum -c` of the pinned manifest on every node before
it may serve. Stand-ins: the nodes are directories on this machine and each source's network
link is a bandwidth: every source's link carries --link-mbps, shared by the pulls it serves at
once (rsync --bwlimit = link / concurrent pulls), so staging serving all N nodes at once takes
N transfer times, as through one real link. The shards are synthetic.

Prints per N and mode: waves, wall seconds, MB staging served, and the ratio waves / star;
then checks what the issue asks: staging serves at most the first wave's bytes, wall time grows
sub-linearly with N, and (--corrupt) a node whose copy fails verification is never a source.
usage: bench/weights_fanout_bench.py [--nodes 1,2,4,8] [--shards 4] [--size-mb 16]
       [--link-mbps 32] [--staging-slots 2] [--corrupt 3] [--dir /var/tmp/fanout-bench]
"""

import argparse
import hashlib
import os
import re
import shutil
import socket
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "filter_plugins"))
sys.path.insert(0, os.path.join(ROOT, "collections"))

import weights_fanout as fanout  # noqa: E402
from ansible_collections.mm3.shared.plugins.module_utils.weights_common import format_manifest  # noqa: E402

REPO = "bench-org/tiny-shards"
REVISION = "f" * 40
PASSWORD = "fanout-bench-password"
MIB = 1 << 20


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def make_staging(root, shards, size):
    rev = os.path.join(root, REPO, REVISION)
    os.makedirs(rev, exist_ok=True)
    entries = []
    for i in range(shards):
        name = "model-%05d-of-%05d.safetensors" % (i + 1, shards)
        data = os.urandom(size)
        with open(os.path.join(rev, name), "wb") as f:
            f.write(data)
        entries.append((name, hashlib.sha256(data).hexdigest()))
    text = format_manifest(entries, {"repo": REPO, "revision": REVISION})
    with open(os.path.join(root, REPO, REVISION + ".manifest.sha256"), "w") as f:
        f.write(text)
    return hashlib.sha256(text.encode()).hexdigest()


class Daemon:
    """A read-only rsync daemon exporting <root>/<repo>/<revision> and its manifest only."""

    def __init__(self, root, work):
        os.makedirs(work, exist_ok=True)
        secrets = os.path.join(work, "secrets")
        with open(secrets, "w") as f:
            f.write("weights:%s\n" % PASSWORD)
        os.chmod(secrets, 0o600)
        self.port = free_port()
        rules = ["- *.verified", "- .rsync-partial/", "+ /%s/" % REPO.split("/")[0], "+ /%s/" % REPO,
                 "+ /%s/%s/***" % (REPO, REVISION), "+ /%s/%s.manifest.sha256" % (REPO, REVISION), "- *"]
        conf = os.path.join(work, "rsyncd.conf")
        with open(conf, "w") as f:
            f.write("use chroot = no\npid file = %s/pid\nlog file = %s/log\n[weights]\npath = %s\n"
                    "read only = yes\nuid = root\ngid = root\nauth users = weights\nsecrets file = %s\n"
                    "hosts allow = 127.0.0.1\nhosts deny = *\nfilter = %s\n"
                    % (work, work, root, secrets, " ".join(rules)))
        self.proc = subprocess.Popen(["rsync", "--daemon", "--no-detach", "--address=127.0.0.1",
                                      "--port=%d" % self.port, "--config=" + conf])
        for _ in range(200):
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", self.port)) == 0:
                    return
            time.sleep(0.02)
        raise RuntimeError("rsync daemon on port %d did not start" % self.port)

    def stop(self):
        self.proc.terminate()
        self.proc.wait(timeout=10)


def start_pull(source_port, dest_root, bwlimit_kib, pwfile):
    url = "rsync://weights@127.0.0.1:%d/weights/%s" % (source_port, REPO)
    dest = os.path.join(dest_root, REPO)
    os.makedirs(dest, exist_ok=True)
    cmd = ("rsync --times --password-file=%s %s/%s.manifest.sha256 %s/ && "
           "rsync --archive --stats --partial-dir=.rsync-partial --bwlimit=%d --password-file=%s %s/%s/ %s/%s/"
           % (pwfile, url, REVISION, dest, bwlimit_kib, pwfile, url, REVISION, dest, REVISION))
    return subprocess.Popen(["sh", "-c", cmd], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def received_bytes(stdout):
    match = re.search(r"Total bytes received: ([\d,]+)", stdout)
    return int(match.group(1).replace(",", "")) if match else 0


def verified(node_root, pin):
    """The node's own check before it may serve: the manifest is the pinned one and every file
    matches it (sha256sum -c); only then the marker."""
    manifest = os.path.join(node_root, REPO, REVISION + ".manifest.sha256")
    with open(manifest, "rb") as f:
        if hashlib.sha256(f.read()).hexdigest() != pin:
            return False
    ok = subprocess.run(["sha256sum", "--check", "--quiet", manifest], cwd=os.path.join(node_root, REPO, REVISION),
                        capture_output=True).returncode == 0
    if ok:
        with open(os.path.join(node_root, REPO, REVISION + ".verified"), "w") as f:
            f.write(pin + "\n")
    return ok


def run_case(base, staging_root, pin, n, mode, link_kib, staging_slots, corrupt):
    """One fan-out: returns (wall s, waves, bytes staging served, sources used, failed nodes)."""
    work = os.path.join(base, "%s-%d" % (mode, n))
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    pwfile = os.path.join(work, "pw")
    with open(pwfile, "w") as f:
        f.write(PASSWORD + "\n")
    os.chmod(pwfile, 0o600)
    nodes = ["node%d" % i for i in range(n)]
    daemons = {fanout.STAGING: Daemon(staging_root, os.path.join(work, "staging-daemon"))}
    sources, pending, waves, staging_bytes, used, failed = [fanout.STAGING], list(nodes), 0, 0, set(), set()
    start = time.monotonic()
    try:
        while pending:
            if mode == "star":
                wave = [(node, fanout.STAGING) for node in pending]
            else:
                wave = fanout.fanout_next_wave(sources, pending, staging_slots=staging_slots, node_slots=1)
            waves += 1
            sharing = {}
            for _, source in wave:
                sharing[source] = sharing.get(source, 0) + 1
            pulls = []
            for node, source in wave:
                assert source in sources, "%s chosen as a source before it verified" % source
                used.add(source)
                pulls.append((node, source, start_pull(daemons[source].port, os.path.join(work, node),
                                                       link_kib // sharing[source], pwfile)))
            for node, source, proc in pulls:
                out, err = proc.communicate(timeout=600)
                if proc.returncode != 0:
                    raise RuntimeError("pull of %s from %s failed: %s" % (node, source, err))
                if source == fanout.STAGING:
                    staging_bytes += received_bytes(out)
                node_root = os.path.join(work, node)
                if node == corrupt and node not in failed:  # a copy damaged after the transfer
                    shard = os.path.join(node_root, REPO, REVISION, "model-00001-of-%05d.safetensors"
                                         % len(os.listdir(os.path.join(staging_root, REPO, REVISION))))
                    with open(shard, "r+b") as f:
                        f.write(b"\0")
                if verified(node_root, pin):
                    pending.remove(node)
                    if mode == "waves":
                        daemons[node] = Daemon(node_root, os.path.join(work, node + "-daemon"))
                        sources.append(node)
                else:
                    failed.add(node)  # pulls again next wave; this copy never serves
        return time.monotonic() - start, waves, staging_bytes, used, failed
    finally:
        for daemon in daemons.values():
            daemon.stop()


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--nodes", default="1,2,4,8")
    parser.add_argument("--shards", type=int, default=4)
    parser.add_argument("--size-mb", type=int, default=16, help="MiB per shard")
    parser.add_argument("--link-mbps", type=int, default=32, help="MiB/s of each source's link")
    parser.add_argument("--staging-slots", type=int, default=2)
    parser.add_argument("--corrupt", type=int, default=3, help="node index whose first copy is damaged (-1: none)")
    parser.add_argument("--dir", default="/var/tmp/fanout-bench")
    args = parser.parse_args()
    if shutil.which("rsync") is None:
        sys.exit("rsync is not installed (apt-get install rsync)")
    counts = [int(x) for x in args.nodes.split(",")]
    shutil.rmtree(args.dir, ignore_errors=True)
    staging_root = os.path.join(args.dir, "staging")
    pin = make_staging(staging_root, args.shards, args.size_mb * MIB)
    revision_bytes = args.shards * args.size_mb * MIB
    link_kib = args.link_mbps * 1024
    print("fan-out bench: %d x %d MiB shards (%.0f MiB), each source's link %d MiB/s, staging slots %d"
          % (args.shards, args.size_mb, revision_bytes / MIB, args.link_mbps, args.staging_slots))
    print("one transfer time through a free link: %.1f s" % (revision_bytes / MIB / args.link_mbps))
    print("%-3s %-6s %5s %8s %14s %10s" % ("N", "mode", "waves", "wall s", "staging MiB", "waves/star"))
    results, problems = {}, []
    for n in counts:
        corrupt = "node%d" % args.corrupt if 0 <= args.corrupt < n else None
        for mode in ("star", "waves"):
            wall, waves, staging_bytes, used, failed = run_case(
                args.dir, staging_root, pin, n, mode, link_kib, args.staging_slots, corrupt)
            results[(n, mode)] = (wall, staging_bytes)
            ratio = "%.2f" % (wall / results[(n, "star")][0]) if mode == "waves" else ""
            print("%-3d %-6s %5d %8.1f %14.1f %10s%s" % (
                n, mode, waves, wall, staging_bytes / MIB, ratio,
                "  (%s failed verification, re-pulled; never a source)" % ", ".join(sorted(failed)) if failed else ""))
            if mode == "waves":
                first_wave = min(n, args.staging_slots) * revision_bytes
                if staging_bytes > first_wave * 1.02:
                    problems.append("N=%d: staging served %.1f MiB, more than the first wave's %.1f MiB"
                                    % (n, staging_bytes / MIB, first_wave / MIB))
                if failed & used:
                    problems.append("N=%d: %s served a copy that failed verification" % (n, failed & used))
    big, small = max(counts), min(c for c in counts if c > 1) if len(counts) > 1 else None
    if small and big > small:
        growth = results[(big, "waves")][0] / results[(small, "waves")][0]
        print("waves: wall(N=%d) / wall(N=%d) = %.2f for %.0f x the nodes; star: %.2f"
              % (big, small, growth, big / small, results[(big, "star")][0] / results[(small, "star")][0]))
        if growth >= big / small * 0.9:
            problems.append("waves' wall time grew about linearly (x%.2f for x%.0f nodes)" % (growth, big / small))
    for problem in problems:
        print("FAIL:", problem)
    shutil.rmtree(args.dir, ignore_errors=True)
    sys.exit(1 if problems else 0)


if __name__ == "__main__":
    main()
