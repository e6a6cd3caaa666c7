#!/usr/bin/python
# -*- coding: utf-8 -*-
# Verify a weights directory against its sha256 manifest, hashing files in parallel
# processes, and keep the "verified" marker that the model server requires.
"""Ansible module weights_verify."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: weights_verify
short_description: Verify a model weights directory against a sha256 manifest, in parallel
description:
  - Hashes every file named by a C(sha256sum -c) format manifest with several processes
    (one reused read buffer per process, so memory stays bounded), compares with the manifest
    and reports failed, missing and extra files, bytes hashed, seconds and rate.
  - Trust ends at a pinned value. Before a byte of the weights is read, the manifest must hash
    to I(manifest_sha256) (the value the inventory or matrix pins) and its header must name
    I(repo) and I(revision) when they are given; otherwise the task fails and a marker is removed.
  - Writes the verified marker (JSON bound to the sha256 of the manifest, the repo and the
    revision, with each file's size and mtime for the cheap re-check before every engine start,
    see role model_server) only when every file matches, none is missing and no file outside the manifest is
    in the directory (the whole directory is mounted into the engine); removes a stale marker
    otherwise.
  - With a signed release (O(release_bundle), issue 33), the bundle must also verify offline against
    the keys in O(release_trust) on this host's date, be release O(release_digest) and sign exactly
    this manifest (its sha256 and every file's), before a byte of the weights is read; otherwise the
    task fails naming what differs and a marker is removed. Needs Python's C(cryptography) on the host.
  - Files under the tool directories C(.cache), C(.rsync-partial) and C(.~tmp~) are ignored.
version_added: "1.0.0"
options:
  path:
    description: The weights directory; manifest paths are relative to it.
    type: path
    required: true
  manifest:
    description: The manifest file, C(sha256sum) format (text or binary mode lines).
    type: path
    required: true
  marker:
    description: Where the verified marker is written (and removed when verification fails).
    type: path
    required: true
  manifest_sha256:
    description:
      - The pinned sha256 of the manifest file. A manifest that hashes to anything else is
        refused before any file is hashed.
    type: str
    required: true
  repo:
    description: The repository the manifest header must name (C(# repo:)); unchecked when unset.
    type: str
  revision:
    description: The revision the manifest header must name (C(# revision:)); unchecked when unset.
    type: str
  extra_files:
    description:
      - C(refuse) fails verification when the directory holds files the manifest does not name
        (they would be mounted into the engine); C(report) only lists them.
    type: str
    choices: [refuse, report]
    default: refuse
  workers:
    description: Hashing processes; default the number of CPUs.
    type: int
  buffer_size:
    description:
      - Bytes handed to sha256 at a time, per process. Mapped, the piece of the mapping; read
        (O(mapped=false), or a file that cannot be mapped), the buffer, whose default (1 MiB) stays
        in the core's cache between the copy and the hash. The kernel reads 16 MiB ahead of it
        whatever its size.
    type: int
    default: 1048576
  mapped:
    description:
      - Hash the page cache's pages in place (C(mmap), 16 MiB mapped at a time) instead of copying
        each piece into a buffer (from a warm page cache the copy costs about a fifth of the hash).
        Off only to measure what it brings (C(bench/weights_verify_bench.py)).
    type: bool
    default: true
  readahead:
    description:
      - Ask the kernel to read 16 MiB ahead of the buffer being hashed
        (C(posix_fadvise) SEQUENTIAL and WILLNEED), overlapping disk and CPU on a cold read.
        Off only to measure what it brings (C(bench/weights_verify_bench.py)).
    type: bool
    default: true
  files:
    description:
      - Hash only these manifest entries (repair after a full verification); every other
        manifest entry must still be present. Empty means all entries.
    type: list
    elements: str
    default: []
  tool_dirs:
    description:
      - Directories at the top that belong to the download or the transfer and are not reported
        (the hub client's C(.cache), rsync's partial directories). A node's copy passes none, so a
        C(.cache/) there is an extra entry like any other.
    type: list
    elements: str
    default: [.cache, .rsync-partial, .~tmp~]
  verified_stats:
    description:
      - With O(files), the RV(stats) of the earlier full pass of the same run; every manifest file
        not re-hashed must still have that size and mtime, or nothing is marked verified. Without
        it, the stats the existing marker recorded are used; with neither, the repair is refused.
    type: dict
  fail_on_mismatch:
    description: Fail the task when a file is failed or missing (the results are returned either way).
    type: bool
    default: true
  release_bundle:
    description:
      - The signed release (the text of the sigstore bundle tools/release_sign.py wrote;
        serving_spec.release_bundle). Unset, no release is checked.
    type: str
  release_trust:
    description:
      - With O(release_bundle), required. The keys the host trusts less the revoked ones, the JSON
        document role serving resolves from release_keys and release_revoked
        (serving_spec.release_trust).
    type: str
  release_digest:
    description:
      - With O(release_bundle), required. The release the plan verified on the controller
        (serving_spec.release.digest); the bundle here must be that release.
    type: str
attributes:
  check_mode:
    support: full
    details: Hashes and reports, but neither writes nor removes the marker.
  diff_mode:
    support: none
author:
  - MiniMax-M3 self-hosting project
"""

EXAMPLES = r"""
- name: Verify the staging copy, and that the signed release signs exactly its manifest
  weights_verify:
    path: /data/models/MiniMax-M3-MXFP8
    manifest: /data/models/MiniMax-M3-MXFP8.manifest.sha256
    marker: /data/models/MiniMax-M3-MXFP8.verified.json
    manifest_sha256: "{{ serving_spec.weights.manifest_sha256 }}"
    release_bundle: "{{ serving_spec.release_bundle }}"
    release_trust: "{{ serving_spec.release_trust | to_json }}"
    release_digest: "{{ serving_spec.release.digest }}"

- name: Verify the synced weights
  weights_verify:
    path: /data/models/MiniMax-M3-MXFP8
    manifest: /data/models/MiniMax-M3-MXFP8.manifest.sha256
    marker: /data/models/MiniMax-M3-MXFP8.verified.json
    manifest_sha256: "{{ serving_spec.weights.manifest_sha256 }}"
    repo: MiniMaxAI/MiniMax-M3-MXFP8
    revision: c5454eb03678d8710e54a4e0fc681b9f3b4a3dba
  register: weights_sync_verify

- name: Re-verify only the files that were repaired
  weights_verify:
    path: /data/models/MiniMax-M3-MXFP8
    manifest: /data/models/MiniMax-M3-MXFP8.manifest.sha256
    marker: /data/models/MiniMax-M3-MXFP8.verified.json
    manifest_sha256: "{{ serving_spec.weights.manifest_sha256 }}"
    files: "{{ weights_sync_verify.failed_files + weights_sync_verify.missing_files }}"
"""

RETURN = r"""
verified:
  description: Every manifest file is present and matches.
  type: bool
  returned: always
failed_files:
  description: Files whose sha256 differs from the manifest (or that could not be read).
  type: list
  elements: str
  returned: always
missing_files:
  description: Manifest files absent from the directory.
  type: list
  elements: str
  returned: always
extra_files:
  description: Files in the directory that the manifest does not name, then every symlink, FIFO,
    socket, device or hidden directory as 'path (what it is)' (refused unless extra_files=report).
  type: list
  elements: str
  returned: always
files:
  description: Number of manifest entries.
  type: int
  returned: always
files_hashed:
  description: Number of files hashed by this run.
  type: int
  returned: always
bytes_hashed:
  description: Bytes read and hashed.
  type: int
  returned: always
seconds:
  description: Wall-clock seconds spent hashing.
  type: float
  returned: always
rate:
  description: Bytes per second (bytes_hashed / seconds).
  type: float
  returned: always
workers:
  description: Processes used.
  type: int
  returned: always
manifest_sha256:
  description: sha256 of the manifest file (what the marker is bound to).
  type: str
  returned: always
repo:
  description: The repository the manifest header names.
  type: str
  returned: always
revision:
  description: The revision the manifest header names.
  type: str
  returned: always
marker_written:
  description: The marker was (or in check mode would be) written.
  type: bool
  returned: always
marker_removed:
  description: A stale marker was (or would be) removed.
  type: bool
  returned: always
changed_files:
  description: Files whose size or mtime moved while or since they were verified (each with both
    states); any of them keeps the marker withheld.
  type: list
  elements: str
  returned: always
stats:
  description: '{path: [size, mtime_ns]} of each file hashed by this run, as it was when hashed
    (what a repair passes back as O(verified_stats)).'
  type: dict
  returned: always
release:
  description: The signed release that signs this manifest (O(release_bundle) given), else null.
  type: dict
  returned: always
  contains:
    digest:
      description: The release's digest (the sha256 of the signed payload).
      type: str
    key:
      description: The name of the key that signed it.
      type: str
    key_id:
      description: That key's id (the sha256 of its public key PEM).
      type: str
"""

import datetime
import json
import multiprocessing
import os
import time
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.mm3.shared.plugins.module_utils.weights_common import (
    DEFAULT_BUFFER,
    TOOL_DIRS,
    ManifestError,
    compare,
    file_stats,
    manifest_header,
    marker_document,
    marker_valid,
    parse_manifest,
    pin_problem,
    scan,
    sha256_file,
    sha256_text,
)

try:  # Python's cryptography, needed only where a signed release is checked (release_bundle)
    from ansible_collections.mm3.shared.plugins.module_utils import release_signing as rs
except ImportError as exc:
    rs, RELEASE_IMPORT_ERROR = None, exc
else:
    RELEASE_IMPORT_ERROR = None


# What a file gets when the process hashing it, or one beside it, died (SIGBUS: a file shrank under
# its mapping; or killed): it was not hashed, so nothing is marked verified.
WORKER_DIED = ("not hashed: a hashing process died (SIGBUS when a file shrinks while it is hashed, or killed); "
               "run the verification again once nothing writes to the directory")


def _hash_one(args):
    """Worker: (relpath, fullpath, buffer_size, readahead, mapped) -> (relpath, digest or None,
    bytes, error, [size, mtime_ns] of the state hashed or None)."""
    rel, full, buffer_size, readahead, mapped = args
    try:
        digest, nbytes, stat = sha256_file(full, buffer_size, readahead, mapped=mapped)
        return rel, digest, nbytes, None, stat
    except OSError as exc:
        return rel, None, 0, str(exc), None


def plan_hashing(entries, present, only, sizes):
    """Which files to hash, largest first (so the long ones start early).

    entries: [(relpath, sha256)]; present: set of relpaths on disk; only: subset or empty;
    sizes: {relpath: bytes}. Returns the list of relpaths.
    """
    wanted = [p for p, _ in entries if p in present and (not only or p in only)]
    return sorted(wanted, key=lambda p: (-sizes.get(p, 0), p))


def hash_files(root, relpaths, workers, buffer_size, readahead=True, mapped=True):
    """Hash files in worker processes, one process even for one worker: sha256_file hashes mapped
    pages, and a file that shrinks under its mapping ends the process with SIGBUS, which must fail
    that run's files, not the module. Returns ({relpath: digest or None}, bytes, errors,
    {relpath: [size, mtime_ns] of the state that was hashed})."""
    digests, errors, stats, total = {}, {}, {}, 0
    jobs = [(rel, os.path.join(root, rel), buffer_size, readahead, mapped) for rel in relpaths]
    if not jobs:
        return digests, 0, errors, stats
    workers = max(1, min(workers, len(jobs)))
    ctx = multiprocessing.get_context("fork")
    pool = ProcessPoolExecutor(max_workers=workers, mp_context=ctx)
    try:
        futures = [(rel, pool.submit(_hash_one, job)) for rel, job in zip(relpaths, jobs)]
        for rel, future in futures:
            try:
                _rel, digest, nbytes, err, stat = future.result()
            except BrokenProcessPool:
                digest, nbytes, err, stat = None, 0, WORKER_DIED, None
            digests[rel], total = digest, total + nbytes
            if err:
                errors[rel] = err
            else:
                stats[rel] = stat
    finally:
        pool.shutdown()
    return digests, total, errors, stats


def moved_since_hashed(now, hashed, vouched):
    """Files whose [size, mtime_ns] now differs from the state that was hashed (`hashed`) or, for a
    file this run did not hash, from the state an earlier pass verified (`vouched`): each as
    'path (what it was -> what it is)'. A file with no vouched state at all is listed too: a marker
    may only record states whose bytes were hashed."""
    moved = []
    for path in sorted(now):
        was = hashed.get(path, vouched.get(path))
        if was != now[path]:
            moved.append("%s (%s -> %s)" % (path, "not verified" if was is None else "size %s, mtime_ns %s"
                                             % tuple(was), "size %s, mtime_ns %s" % tuple(now[path])))
    return moved


def previous_stats(marker_text):
    """{relpath: [size, mtime_ns]} a marker recorded, or {} (none, unreadable, older format)."""
    try:
        doc = json.loads(marker_text) if marker_text else None
    except ValueError:
        return {}
    stats = doc.get("stats") if isinstance(doc, dict) else None
    return stats if isinstance(stats, dict) else {}


def mismatch_message(root, outcome, moved=()):
    """What differs from the manifest, and the way out."""
    parts = []
    if moved:
        parts.append("%d file(s) changed while or since they were verified (%s): nothing may be marked "
                     "verified from bytes that are no longer there; run a full verification (no files) "
                     "once nothing writes to the directory" % (len(moved), "; ".join(moved[:10])))
    if outcome["failed_files"] or outcome["missing_files"]:
        parts.append("%d failed (%s), %d missing (%s): re-sync these files"
                     % (len(outcome["failed_files"]), ", ".join(outcome["failed_files"][:10]),
                        len(outcome["missing_files"]), ", ".join(outcome["missing_files"][:10])))
    if outcome["extra_files"]:
        parts.append("%d file(s) the manifest does not name (%s): remove them, the whole directory "
                     "is mounted into the engine" % (len(outcome["extra_files"]),
                                                     ", ".join(outcome["extra_files"][:10])))
    return "%s does not match its manifest: %s" % (root, "; ".join(parts))


def release_refusal(bundle_text, trust_text, digest, manifest_bytes, today=None):
    """(release, None) when the signed release verifies here against the trust document, is release
    `digest` and signs exactly this manifest (release_signing.weights_problem, the check the node's
    start check makes too); else (None, why: one line naming the fix)."""
    checked, problem = rs.weights_problem(bundle_text, trust_text, digest, manifest_bytes, today)
    if problem:
        return None, problem
    return {"digest": checked["release_digest"], "key": checked["key"], "key_id": checked["key_id"]}, None


def main():
    module = AnsibleModule(
        argument_spec=dict(
            path=dict(type="path", required=True),
            manifest=dict(type="path", required=True),
            marker=dict(type="path", required=True),
            manifest_sha256=dict(type="str", required=True),
            repo=dict(type="str"),
            revision=dict(type="str"),
            extra_files=dict(type="str", choices=["refuse", "report"], default="refuse"),
            workers=dict(type="int"),
            buffer_size=dict(type="int", default=DEFAULT_BUFFER),
            readahead=dict(type="bool", default=True),
            mapped=dict(type="bool", default=True),
            files=dict(type="list", elements="str", default=[]),
            verified_stats=dict(type="dict"),
            tool_dirs=dict(type="list", elements="str", default=list(TOOL_DIRS)),
            fail_on_mismatch=dict(type="bool", default=True),
            release_bundle=dict(type="str"),
            release_trust=dict(type="str"),
            release_digest=dict(type="str"),
        ),
        required_by={"release_bundle": ("release_trust", "release_digest")},
        supports_check_mode=True,
    )
    p = module.params
    root = p["path"].rstrip("/") or "/"
    workers = p["workers"] or os.cpu_count() or 1
    if workers < 1 or p["buffer_size"] < 65536:
        module.fail_json(msg="workers must be >= 1 and buffer_size >= 65536 (got %s, %s)"
                         % (workers, p["buffer_size"]))
    if not os.path.isdir(root):
        module.fail_json(msg="weights directory %s does not exist: sync or download it first" % root)
    try:
        with open(p["manifest"], "rb") as f:
            manifest_bytes = f.read()
    except OSError as exc:
        module.fail_json(msg="cannot read the manifest %s: %s" % (p["manifest"], exc))
    manifest_sha256 = sha256_text(manifest_bytes)
    try:
        manifest_text = manifest_bytes.decode("utf-8")
        entries = parse_manifest(manifest_text)
    except (ManifestError, UnicodeDecodeError) as exc:
        entries, manifest_text = None, ""
        problem = "manifest %s is not usable: %s" % (p["manifest"], exc)
    header = manifest_header(manifest_text)
    refusal = pin_problem(manifest_sha256, p["manifest_sha256"], header, p["repo"], p["revision"])
    release = None
    if not refusal and entries is not None and p["release_bundle"] is not None:
        if rs is None and not module.check_mode:
            module.fail_json(msg="a signed release is checked here, and this host's Python has no cryptography "
                                 "(%s): install python3-cryptography." % RELEASE_IMPORT_ERROR)
        if rs is None:  # check mode, before the run that installs it: said, and nothing is written
            module.warn("the signed release is not checked in check mode: this host has no python3-cryptography "
                        "yet (the run installs it before this check)")
        else:
            release, refusal = release_refusal(p["release_bundle"], p["release_trust"], p["release_digest"],
                                               manifest_bytes)
    if refusal or entries is None:
        # Nothing in the directory is trusted: a marker from an earlier run goes too.
        removed = os.path.exists(p["marker"])
        if removed and not module.check_mode:
            os.unlink(p["marker"])
        # a manifest that cannot be read is said to be so first (it also fails its pin)
        module.fail_json(msg="; ".join(m for m in (None if entries else problem,
                                                   refusal and "%s: %s" % (p["manifest"], refusal)) if m),
                         manifest_sha256=manifest_sha256, verified=False, marker_removed=removed,
                         changed=removed)

    names = {path for path, _ in entries}
    only = set(p["files"])
    unknown = sorted(only - names)
    if unknown:
        module.fail_json(msg="files not in the manifest: %s" % ", ".join(unknown))

    present, odd = scan(root, tuple(p["tool_dirs"]))
    sizes = {}
    for rel in present & names:
        try:
            sizes[rel] = os.path.getsize(os.path.join(root, rel))
        except OSError:
            sizes[rel] = 0
    todo = plan_hashing(entries, present, only, sizes)

    start = time.monotonic()
    digests, nbytes, errors, hashed = hash_files(root, todo, workers, p["buffer_size"], p["readahead"], p["mapped"])
    seconds = max(time.monotonic() - start, 1e-9)

    if only:
        # Entries not re-hashed are taken as matching (the previous full run checked them);
        # they must still be present.
        for path, digest in entries:
            if path not in only and path in present:
                digests[path] = digest
    outcome = compare(entries, digests, present)
    outcome["extra_files"] += odd
    if outcome["extra_files"] and p["extra_files"] == "refuse":
        outcome["ok"] = False

    marker_text = None
    if os.path.exists(p["marker"]):
        try:
            with open(p["marker"], "r") as f:
                marker_text = f.read()
        except OSError:
            marker_text = ""
    marker_written = marker_removed = False
    moved = []
    if outcome["ok"]:
        # The marker records the states whose bytes were hashed: a file hashed here must still be
        # as it was hashed, and in a repair every other file as the earlier pass verified it
        # (verified_stats from that pass's result, else the marker it left).
        stats = file_stats(root, sorted(names))
        vouched = p["verified_stats"] if p["verified_stats"] is not None else previous_stats(marker_text)
        moved = moved_since_hashed(stats, hashed, vouched if only else {})
        if moved:
            outcome["ok"] = False
    if outcome["ok"]:
        if not marker_valid(marker_text, manifest_sha256, root, header.get("repo"), header.get("revision"),
                            stats):
            marker_written = True
            if not module.check_mode:
                doc = marker_document(
                    manifest_sha256, root, len(entries),
                    sum(sizes.get(path, 0) for path in names),
                    datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
                    header.get("repo"), header.get("revision"), stats)
                tmp = p["marker"] + ".tmp"
                with open(tmp, "w") as f:
                    json.dump(doc, f, indent=2, sort_keys=True)
                    f.write("\n")
                os.replace(tmp, p["marker"])
    elif marker_text is not None:
        marker_removed = True
        if not module.check_mode:
            os.unlink(p["marker"])

    result = dict(
        changed=marker_written or marker_removed,
        verified=outcome["ok"],
        failed_files=outcome["failed_files"],
        missing_files=outcome["missing_files"],
        extra_files=outcome["extra_files"],
        read_errors=errors,
        files=len(entries),
        files_hashed=len(todo),
        bytes_hashed=nbytes,
        seconds=round(seconds, 3),
        rate=round(nbytes / seconds, 1),
        workers=max(1, min(workers, len(todo) or 1)),
        manifest_sha256=manifest_sha256,
        repo=header.get("repo"),
        revision=header.get("revision"),
        marker_written=marker_written,
        marker_removed=marker_removed,
        changed_files=moved,
        stats=hashed,
        release=release,
    )
    if not outcome["ok"] and p["fail_on_mismatch"]:
        module.fail_json(msg=mismatch_message(root, outcome, moved), **result)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
