#!/usr/bin/python3
"""ExecStartPre of the model server unit when the release is signed (issue 33): refuse to start
the engine unless the release bundle on this node verifies, offline, against the keys the node
trusts (role model_server writes <config_dir>/release-trust.json from release_keys and
release_revoked; playbooks/release-trust.yml alone pushes a revocation), is the release the unit
was rendered for, signs exactly the weights manifest on this node, and is what the unit runs: the
unit's ExecStart as systemd parsed it (read over D-Bus with busctl, drop-ins and edits included)
runs the signed image, environment and engine argv, and mounts the verified weights where the
engine reads them (release_signing.run_differences).

No hashing and no network: the signature is checked over the bundle's payload, and the signed
files are compared with the manifest; check_weights.py (the next ExecStartPre) binds the bytes
on disk to that manifest through the verified marker. The key's validity dates are read against
this node's own clock. The checks are release_signing's, the same code the controller verifies
with, imported by the same name from the collection layout the role installs beside this file.

usage: check_release.py --bundle B --trust T --digest SHA256 --manifest M
         [--unit NAME.service [--entrypoint=TOKEN]... [--config-path P] [--extra-env=NAME]...
          [--weights-dir D --weights-target C]]
  --entrypoint: the image's ENTRYPOINT as the plan knew it (serving_spec.entrypoint), one token each;
  --config-path: the engine's key file the unit passes as --config; --extra-env: a variable the
  unit sets beyond the signed ones (the JIT caches'); --weights-dir / --weights-target: the
  directory check_weights.py verifies and the container path the engine reads the model at, which
  the unit must mount read-only there, with nothing else mounted over it.
"""
import argparse
import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
# installed beside this file (role model_server, filter model_server_helper_files)
from ansible_collections.mm3.shared.plugins.module_utils import release_signing as rs  # noqa: E402


def problems(bundle_text, trust_text, digest, manifest_bytes, today=None, run=None):
    """Why this node must not start the release (one line naming the fix), or None. run: what the
    unit runs ({argv: ExecStart's argv, entrypoint, config_path, extra_env}; None: not checked)."""
    checked, problem = rs.weights_problem(bundle_text, trust_text, digest, manifest_bytes, today, "on this node")
    if problem:
        return problem
    signed = checked["release"] if isinstance(checked["release"], dict) else {}
    if run is not None:
        differ = rs.run_differences(signed, run["argv"], run.get("entrypoint") or (), run.get("config_path"),
                                    run.get("extra_env") or (), run.get("weights"))
        if differ:
            return ("the unit does not run the signed release (%s). Re-run playbooks/serve.yml (or rollback.yml), "
                    "and remove any drop-in or edit that changes its ExecStart." % "; ".join(differ))
    return None


def unit_path(unit):
    """The unit's D-Bus object path (sd-bus's label escaping: every byte but a letter, or a digit
    after the first, as _xx)."""
    label = "".join(ch if ch.isascii() and (ch.isalpha() or (i > 0 and ch.isdigit())) else "_%02x" % ord(ch)
                    for i, ch in enumerate(unit))
    return "/org/freedesktop/systemd1/unit/" + label


def exec_start(data):
    """The argv of the single ExecStart command in busctl --json=short's reply for the property
    ExecStart (a(sasbttttuii): path, argv, ignore-failure, times, pid, status)."""
    commands = (data or {}).get("data") or []
    if len(commands) != 1 or not isinstance(commands[0], list) or len(commands[0]) < 2:
        raise ValueError("the unit has %d ExecStart commands (one expected)" % len(commands))
    return [str(token) for token in commands[0][1]]


def read_exec_start(unit):
    """ExecStart's argv as systemd holds it for `unit` (read over D-Bus: the unit file, its drop-ins
    and a daemon-reload's edits, exactly as systemd will run it)."""
    try:
        run = subprocess.run(["busctl", "--json=short", "get-property", "org.freedesktop.systemd1", unit_path(unit),
                              "org.freedesktop.systemd1.Service", "ExecStart"], capture_output=True, text=True)
    except OSError as exc:
        raise ValueError("busctl cannot run: %s" % exc)
    if run.returncode != 0:
        raise ValueError("busctl could not read %s's ExecStart: %s" % (unit, (run.stderr or run.stdout).strip()))
    return exec_start(json.loads(run.stdout))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for name in ("--bundle", "--trust", "--digest", "--manifest"):
        ap.add_argument(name, required=True)
    ap.add_argument("--unit")
    ap.add_argument("--entrypoint", action="append", default=[])
    ap.add_argument("--config-path")
    ap.add_argument("--extra-env", action="append", default=[])
    ap.add_argument("--weights-dir")
    ap.add_argument("--weights-target")
    a = ap.parse_args(argv)
    if bool(a.weights_dir) != bool(a.weights_target):
        ap.error("--weights-dir and --weights-target go together")
    texts = {}
    for what, path, mode in (("bundle", a.bundle, "r"), ("trust", a.trust, "r"), ("manifest", a.manifest, "rb")):
        try:
            with open(path, mode) as handle:
                texts[what] = handle.read()
        except (OSError, UnicodeDecodeError) as exc:
            print("minimax-m3: refusing to start: cannot read the release %s %s: %s. Re-run playbooks/serve.yml."
                  % (what, path, exc), file=sys.stderr)
            return 1
    run = None
    if a.unit:
        try:
            run = {"argv": read_exec_start(a.unit), "entrypoint": a.entrypoint,
                   "config_path": a.config_path, "extra_env": a.extra_env,
                   "weights": (a.weights_dir, a.weights_target) if a.weights_dir else None}
        except ValueError as exc:
            print("minimax-m3: refusing to start: cannot read what %s runs: %s" % (a.unit, exc), file=sys.stderr)
            return 1
    problem = problems(texts["bundle"], texts["trust"], a.digest, texts["manifest"], run=run)
    if problem:
        print("minimax-m3: refusing to start: %s" % problem, file=sys.stderr)
        return 1
    print("minimax-m3: signed release %s verified on this node (%s)" % (a.digest[:16], a.bundle))
    return 0


if __name__ == "__main__":
    sys.exit(main())
