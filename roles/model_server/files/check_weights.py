#!/usr/bin/python3
"""ExecStartPre of the model server unit: refuse to start the engine unless the weights
directory is still exactly what weights_verify verified, and the engine can read it (role
model_server installs it).

No hashing: the manifest must hash to the pinned value and to the marker's binding, the
marker must name the repo and revision of the unit, every manifest file must have the size and
mtime recorded at verification and no other file may be in the directory. A restart or a
reboot therefore never serves bytes that changed underneath; re-run playbooks/weights.yml to
re-verify. And the engine's user (--user, as `docker run --user` gets it; absent = root), which
has no capability in its container, must be able to read every manifest file and every
directory on its way through the mode bits alone. The checks are weights_common.recheck_findings,
the same code the Ansible modules use, imported by the same name from the collection layout the
role installs beside this file.

usage: check_weights.py --dir D --manifest M --marker K --sha256 HEX --repo R --revision REV [--user UID[:GID]]
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
# installed beside this file (role model_server, filter model_server_helper_files)
from ansible_collections.mm3.shared.plugins.module_utils.weights_common import (  # noqa: E402
    engine_identity, recheck_findings)

# How many problems of each kind one journal line names.
SHOWN = 10


def listed(problems):
    """The first SHOWN problems, and how many more there are."""
    more = len(problems) - SHOWN
    return "; ".join(problems[:SHOWN]) + (" (and %d more)" % more if more > 0 else "")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for name in ("--dir", "--manifest", "--marker", "--sha256", "--repo", "--revision"):
        ap.add_argument(name, required=True)
    ap.add_argument("--user", default=None, help="the engine container's --user (uid[:gid]); absent = root")
    a = ap.parse_args(argv)
    try:
        uid, gid = engine_identity(a.user)
    except ValueError as exc:
        print("minimax-m3: refusing to start: %s" % exc, file=sys.stderr)
        return 1
    try:
        with open(a.manifest, "rb") as f:
            manifest = f.read()
    except OSError as exc:
        print("minimax-m3: refusing to start: cannot read the manifest %s: %s" % (a.manifest, exc), file=sys.stderr)
        return 1
    try:
        with open(a.marker) as f:
            marker = f.read()
    except OSError:
        marker = None
    root = a.dir.rstrip("/")
    changed, unreadable = recheck_findings(root, manifest, marker, a.sha256, a.repo, a.revision, uid, gid)
    if changed:
        print("minimax-m3: refusing to start: %s is not what was verified: %s. Re-run "
              "playbooks/weights.yml (sync + verify) before starting the engine."
              % (a.dir, "; ".join(changed)), file=sys.stderr)
    if unreadable:
        print("minimax-m3: refusing to start: the engine cannot read the weights in %s: %s. It has no "
              "capability in its container, so only the mode bits count: re-run playbooks/weights.yml, "
              "which sets root as their owner and modes 0755 (directories) and 0644 (files), or make "
              "them readable by hand: chmod -R o+rX %s" % (a.dir, listed(unreadable), a.dir), file=sys.stderr)
    if changed or unreadable:
        return 1
    print("minimax-m3: weights %s unchanged since verification (%s@%s), readable by uid %d"
          % (a.dir, a.repo, a.revision, uid))
    return 0


if __name__ == "__main__":
    sys.exit(main())
