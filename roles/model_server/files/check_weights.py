#!/usr/bin/python3
"""ExecStartPre of the model server unit: refuse to start the engine unless the weights
directory is still exactly what weights_verify verified (role model_server installs it).

No hashing: the manifest must hash to the pinned value and to the marker's binding, the
marker must name the repo and revision of the unit, every manifest file must have the size and
mtime recorded at verification and no other file may be in the directory. A restart or a
reboot therefore never serves bytes that changed underneath; re-run playbooks/weights.yml to
re-verify. The checks are weights_common.recheck, the same code the Ansible modules use,
imported by the same name from the collection layout the role installs beside this file.

usage: check_weights.py --dir D --manifest M --marker K --sha256 HEX --repo R --revision REV
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
# installed beside this file (role model_server, filter model_server_helper_files)
from ansible_collections.mm3.shared.plugins.module_utils.weights_common import recheck  # noqa: E402


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for name in ("--dir", "--manifest", "--marker", "--sha256", "--repo", "--revision"):
        ap.add_argument(name, required=True)
    a = ap.parse_args(argv)
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
    problems = recheck(a.dir.rstrip("/"), manifest, marker, a.sha256, a.repo, a.revision)
    if problems:
        print("minimax-m3: refusing to start: %s is not what was verified: %s. Re-run "
              "playbooks/weights.yml (sync + verify) before starting the engine."
              % (a.dir, "; ".join(problems)), file=sys.stderr)
        return 1
    print("minimax-m3: weights %s unchanged since verification (%s@%s)" % (a.dir, a.repo, a.revision))
    return 0


if __name__ == "__main__":
    sys.exit(main())
