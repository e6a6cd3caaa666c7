#!/usr/bin/env python3
"""What an Ansible module task costs on a test host, with and without the zipimport bytecode
cache the test hosts carry (images/debian-systemd/mm3_zipimport_cache.py).

One container of the lab's base image (mm3-lab/debian12-systemd:latest, systemd as PID 1, as
Molecule and the lab start it), reached over the project's connection (community.docker.docker,
pipelining on, ansible.cfg). One playbook run per round and mode: N tasks of each of stat,
command, file and copy (each task a module run: a new Python importing its AnsiballZ zip), with
MM3_ZIPIMPORT_CACHE=off in the task environment for the baseline. Per run: wall time, the
controller's CPU (ansible-playbook and its children) and the host's CPU (the container's cgroup
cpu.stat usage_usec, where every module's Python runs); per task: the three divided by the
number of tasks. Modes alternate within each round; the table gives the best of the rounds
(the least disturbed by the rest of a shared machine) and cached/off ratios.

  .venv/bin/python bench/module_task_bench.py                 # 10 tasks per module, 3 rounds
  .venv/bin/python bench/module_task_bench.py --tasks 25 --rounds 5
"""
from __future__ import annotations

import argparse
import json
import os
import pathlib
import resource
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
IMAGE = "mm3-lab/debian12-systemd:latest"
NAME = "mm3-bench-module-task"
MODULES = {
    "stat": {"ansible.builtin.stat": {"path": "/etc/os-release"}},
    "command": {"ansible.builtin.command": {"argv": ["true"]}, "changed_when": False},
    "file": {"ansible.builtin.file": {"path": "/tmp/bench-dir", "state": "directory", "mode": "0755"}},
    "copy": {"ansible.builtin.copy": {"dest": "/tmp/bench-file", "content": "bench\n", "mode": "0644"}},
}


def playbook(tasks, cache):
    env = {} if cache else {"MM3_ZIPIMPORT_CACHE": "off"}
    return [{"name": "module tasks", "hosts": NAME, "gather_facts": False, "environment": env,
             "tasks": [dict(body, name=f"{module} {i}") for module, body in MODULES.items()
                       for i in range(tasks)]}]


def container_cpu_s(cid):
    """CPU seconds the container's cgroup has used (v2: cpu.stat under the systemd or cgroupfs
    driver's path; v1: cpuacct.usage)."""
    for path in (f"/sys/fs/cgroup/system.slice/docker-{cid}.scope/cpu.stat",
                 f"/sys/fs/cgroup/docker/{cid}/cpu.stat"):
        if os.path.exists(path):
            with open(path) as f:
                usage = dict(line.split() for line in f)
            return int(usage["usage_usec"]) / 1e6
    for path in (f"/sys/fs/cgroup/cpuacct/docker/{cid}/cpuacct.usage",
                 f"/sys/fs/cgroup/cpuacct/system.slice/docker-{cid}.scope/cpuacct.usage"):
        if os.path.exists(path):
            with open(path) as f:
                return int(f.read()) / 1e9
    raise SystemExit(f"no cgroup CPU account found for container {cid}")


def run(work, cid, tasks, cache):
    book = work / ("cached.yml" if cache else "off.yml")
    book.write_text(json.dumps(playbook(tasks, cache)))
    inventory = work / "inventory.yml"
    inventory.write_text(json.dumps({"all": {"hosts": {NAME: {
        "ansible_connection": "community.docker.docker", "ansible_python_interpreter": "/usr/bin/python3"}}}}))
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    host0, t0 = container_cpu_s(cid), time.monotonic()
    out = subprocess.run([str(ROOT / ".venv" / "bin" / "ansible-playbook"), "-i", str(inventory), str(book)],
                         capture_output=True, text=True, env=dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg")))
    wall, host = time.monotonic() - t0, container_cpu_s(cid) - host0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if out.returncode != 0:
        raise SystemExit(out.stdout[-3000:] + out.stderr[-2000:])
    controller = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return {"wall": wall, "controller": controller, "host": host}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", type=int, default=10, help="tasks per module per run (4 modules)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--image", default=IMAGE)
    args = parser.parse_args()
    subprocess.run(["docker", "rm", "-f", NAME], capture_output=True)
    cid = subprocess.run(
        ["docker", "run", "-d", "--name", NAME, "--cap-add", "SYS_ADMIN", "--cgroupns", "host",
         "-v", "/sys/fs/cgroup:/sys/fs/cgroup:rw", "--tmpfs", "/run", "--tmpfs", "/run/lock",
         args.image, "/lib/systemd/systemd"], capture_output=True, text=True, check=True).stdout.strip()
    n = args.tasks * len(MODULES)
    try:
        with tempfile.TemporaryDirectory() as tmp:
            work = pathlib.Path(tmp)
            run(work, cid, 1, True)  # warm-up: the host boots, the controller's caches fill
            results = {"off": [], "cached": []}
            for r in range(args.rounds):
                for mode in ("off", "cached"):
                    results[mode].append(run(work, cid, args.tasks, mode == "cached"))
                    m = results[mode][-1]
                    print(f"round {r + 1} {mode:6s}: {n} tasks in {m['wall']:.1f} s wall, "
                          f"controller {m['controller']:.1f} CPU-s, host {m['host']:.1f} CPU-s", flush=True)
    finally:
        subprocess.run(["docker", "rm", "-f", NAME], capture_output=True)
    best = {mode: {k: min(m[k] for m in runs) for k in ("wall", "controller", "host")}
            for mode, runs in results.items()}
    print(f"\nper module task (best of {args.rounds} rounds, {n} tasks per run: "
          f"{args.tasks} each of {', '.join(MODULES)}):")
    print(f"{'':22s}{'cache off':>12s}{'cached':>12s}{'cached/off':>12s}")
    for key, label in (("wall", "wall (ms)"), ("controller", "controller CPU (ms)"), ("host", "host CPU (ms)")):
        off, on = best["off"][key] / n * 1000, best["cached"][key] / n * 1000
        print(f"{label:22s}{off:12.0f}{on:12.0f}{on / off:12.2f}")
    total_off = (best["off"]["controller"] + best["off"]["host"]) / n * 1000
    total_on = (best["cached"]["controller"] + best["cached"]["host"]) / n * 1000
    print(f"{'CPU in all (ms)':22s}{total_off:12.0f}{total_on:12.0f}{total_on / total_off:12.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
