#!/usr/bin/python
# -*- coding: utf-8 -*-
# Plan a pinned hub download and write its sha256 manifest, with the hub as trust anchor.
"""Ansible module weights_manifest."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: weights_manifest
short_description: Plan a pinned hub download and write its sha256 manifest from the hub's checksums
description:
  - Takes the hub's file listing of a pinned revision (the tree API answer) and the directory
    written by C(hf download --local-dir).
  - C(state=planned) reports which files are complete (size, commit and etag recorded by the
    client match the listing) and how many bytes are still to be fetched. Read-only.
  - C(state=present) writes a C(sha256sum -c) format manifest of every listed file. The trust
    anchor is the hub, not the local bytes. An LFS file's line is the hub's sha256 (its etag,
    which must equal the listing's C(lfs.oid)); a small file's local bytes must hash to the hub's
    git blob sha1 before their sha256 is recorded. Files differing from the hub are refused.
version_added: "1.0.0"
options:
  path:
    description: The C(--local-dir) of C(hf download).
    type: path
    required: true
  revision:
    description: The pinned 40-hex commit; the client's metadata must name it.
    type: str
    required: true
  repo:
    description:
      - The repository id, written with the revision into the manifest's header
        (C(# repo:) and C(# revision:) lines, which C(sha256sum -c) skips), so the manifest and
        the marker bound to it say what they are of.
    type: str
  tree:
    description: The hub's listing of the revision (C(GET /api/models/REPO/tree/REV?recursive=true)).
    type: list
    elements: dict
    required: true
  dest:
    description: The manifest file to write (C(state=present)).
    type: path
  license_file:
    description: The licence file of the repository (must be listed); its sha256 is returned.
    type: str
    default: LICENSE
  state:
    description: C(planned) reports, C(present) writes the manifest.
    type: str
    choices: [planned, present]
    default: present
attributes:
  check_mode:
    support: full
    details: Computes everything but writes no manifest.
  diff_mode:
    support: none
author:
  - MiniMax-M3 self-hosting project
"""

EXAMPLES = r"""
- name: What is still to download
  weights_manifest:
    path: /data/models/MiniMax-M3-MXFP8
    revision: c5454eb03678d8710e54a4e0fc681b9f3b4a3dba
    tree: "{{ weights_stage_tree.json }}"
    state: planned
  register: weights_stage_plan

- name: Manifest anchored on the hub's checksums
  weights_manifest:
    path: /data/models/MiniMax-M3-MXFP8
    repo: MiniMaxAI/MiniMax-M3-MXFP8
    revision: c5454eb03678d8710e54a4e0fc681b9f3b4a3dba
    tree: "{{ weights_stage_tree.json }}"
    dest: /data/models/MiniMax-M3-MXFP8.manifest.sha256
"""

RETURN = r"""
total_bytes:
  description: Size of all listed files.
  type: int
  returned: always
files:
  description: Number of listed files.
  type: int
  returned: always
complete_files:
  description: Files present with the listed size and the client's metadata for this revision.
  type: list
  elements: str
  returned: always
mismatched_files:
  description: Files fetched for this revision whose server etag is not the listed checksum (other bytes).
  type: list
  elements: str
  returned: always
pending_files:
  description: Files still to download.
  type: list
  elements: str
  returned: always
pending_bytes:
  description: Bytes of the pending files.
  type: int
  returned: always
stale_incomplete:
  description: Leftover C(*.incomplete) temp files of the client (relative to the download cache).
  type: list
  elements: str
  returned: always
manifest_sha256:
  description: sha256 of the manifest text.
  type: str
  returned: when state=present
license_sha256:
  description: sha256 of the licence file.
  type: str
  returned: when state=present
lfs_files:
  description: Files anchored on the hub's LFS sha256.
  type: int
  returned: when state=present
small_files:
  description: Files anchored on the hub's git blob sha1.
  type: int
  returned: when state=present
"""

import hashlib
import os

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.mm3.shared.plugins.module_utils.validation import is_git_commit, is_sha256
from ansible_collections.mm3.shared.plugins.module_utils.weights_common import (
    ManifestError,
    check_relpath,
    format_manifest,
    git_blob_sha1,
)

META_DIR = os.path.join(".cache", "huggingface", "download")


class AnchorError(ValueError):
    """Local bytes or metadata that disagree with the hub."""


def listed_files(tree):
    """Normalise the hub listing: [{path, size, oid, lfs_sha256 or None}] sorted by path."""
    out = []
    for item in tree:
        if item.get("type", "file") != "file":
            continue
        path = item.get("path") or ""
        check_relpath(path)
        lfs = item.get("lfs") or {}
        lfs_oid = (lfs.get("oid") or lfs.get("sha256") or "").lower() or None
        if lfs_oid and not is_sha256(lfs_oid):
            raise ManifestError("hub listing: LFS oid of %s is not a sha256: %r" % (path, lfs_oid))
        oid = (item.get("oid") or "").lower()
        if not lfs_oid and not is_git_commit(oid):
            raise ManifestError("hub listing: %s has neither an LFS sha256 nor a git blob id" % path)
        out.append({"path": path, "size": int(item.get("size") or 0), "oid": oid, "lfs_sha256": lfs_oid})
    if not out:
        raise ManifestError("hub listing names no files")
    return sorted(out, key=lambda e: e["path"])


def parse_metadata(text):
    """The client's `<file>.metadata`: commit, etag, timestamp (one per line)."""
    lines = text.splitlines()
    if len(lines) < 2:
        return None
    return {"commit": lines[0].strip().lower(), "etag": lines[1].strip().strip('"').lower()}


def expected_etag(entry):
    """What the hub's etag is for this file: LFS sha256, else the git blob sha1."""
    return entry["lfs_sha256"] or entry["oid"]


def plan(entries, revision, local):
    """Split the listing into complete and pending files.

    local: {relpath: {"size": int, "metadata": dict or None}} for files found locally.
    """
    complete, pending, mismatched, pending_bytes = [], [], [], 0
    for e in entries:
        found = local.get(e["path"])
        meta = found and found.get("metadata")
        fetched = (found is not None and found["size"] == e["size"] and meta is not None
                   and meta["commit"] == revision)
        if fetched and meta["etag"] == expected_etag(e):
            complete.append(e["path"])
        elif fetched:
            # Downloaded for this revision, but the server's etag is not the listed checksum:
            # the mirror served other bytes. Not pending (the client will not fetch it again).
            mismatched.append(e["path"])
        else:
            pending.append(e["path"])
            pending_bytes += e["size"]
    return {
        "complete_files": complete,
        "mismatched_files": mismatched,
        "pending_files": pending,
        "pending_bytes": pending_bytes,
        "total_bytes": sum(e["size"] for e in entries),
        "files": len(entries),
    }


def anchor_entry(entry, revision, metadata, read_bytes):
    """The manifest digest of one file, anchored on the hub. Raises AnchorError.

    metadata: parsed client metadata (or None); read_bytes: callable returning the file's
    bytes (only called for small, non-LFS files).
    """
    path = entry["path"]
    if metadata is None:
        raise AnchorError("%s: no download metadata (not fetched by hf download?)" % path)
    if metadata["commit"] != revision:
        raise AnchorError("%s: downloaded from commit %s, not the pinned %s" % (path, metadata["commit"], revision))
    if entry["lfs_sha256"]:
        if metadata["etag"] != entry["lfs_sha256"]:
            raise AnchorError("%s: the hub lists sha256 %s but the server's etag at download was %s: the mirror "
                              "served other bytes for this name" % (path, entry["lfs_sha256"], metadata["etag"]))
        return entry["lfs_sha256"], "lfs"
    data = read_bytes()
    blob = git_blob_sha1(data)
    if blob != entry["oid"] or metadata["etag"] != entry["oid"]:
        raise AnchorError("%s: local bytes have git blob sha1 %s, the hub lists %s (etag %s): the mirror "
                          "served other bytes for this name" % (path, blob, entry["oid"], metadata["etag"]))
    return hashlib.sha256(data).hexdigest(), "small"


def _local_state(root, entries):
    local = {}
    for e in entries:
        full = os.path.join(root, e["path"])
        if not os.path.isfile(full):
            continue
        meta = None
        meta_path = os.path.join(root, META_DIR, e["path"] + ".metadata")
        try:
            with open(meta_path) as f:
                meta = parse_metadata(f.read())
        except OSError:
            meta = None
        local[e["path"]] = {"size": os.path.getsize(full), "metadata": meta}
    return local


def _stale_incomplete(root):
    found = []
    base = os.path.join(root, META_DIR)
    for dirpath, _dirs, names in os.walk(base):
        for name in names:
            if name.endswith(".incomplete"):
                found.append(os.path.relpath(os.path.join(dirpath, name), base))
    return sorted(found)


def main():
    module = AnsibleModule(
        argument_spec=dict(
            path=dict(type="path", required=True),
            revision=dict(type="str", required=True),
            repo=dict(type="str"),
            tree=dict(type="list", elements="dict", required=True),
            dest=dict(type="path"),
            license_file=dict(type="str", default="LICENSE"),
            state=dict(type="str", choices=["planned", "present"], default="present"),
        ),
        required_if=[("state", "present", ["dest"])],
        supports_check_mode=True,
    )
    p = module.params
    root = p["path"].rstrip("/")
    revision = p["revision"].lower()
    if not is_git_commit(revision):
        module.fail_json(msg="revision must be a full 40-hex commit, got %r" % p["revision"])
    try:
        entries = listed_files(p["tree"])
    except ManifestError as exc:
        module.fail_json(msg=str(exc))
    local = _local_state(root, entries) if os.path.isdir(root) else {}
    result = plan(entries, revision, local)
    result["stale_incomplete"] = _stale_incomplete(root)
    result["changed"] = False
    if p["state"] == "planned":
        module.exit_json(**result)

    if result["pending_files"]:
        module.fail_json(msg="download incomplete, cannot write the manifest; pending: %s"
                         % ", ".join(result["pending_files"][:10]), **result)
    names = [e["path"] for e in entries]
    if p["license_file"] not in names:
        module.fail_json(msg="the repository has no %s at this revision: the licence must be stored "
                         "next to the weights (set weights_stage_license_file)" % p["license_file"], **result)
    lines, kinds, license_sha = [], {"lfs": 0, "small": 0}, None
    for e in entries:
        full = os.path.join(root, e["path"])

        def read(full=full):
            with open(full, "rb") as f:
                return f.read()
        try:
            digest, kind = anchor_entry(e, revision, local[e["path"]]["metadata"], read)
        except AnchorError as exc:
            module.fail_json(msg="refusing the download: %s; delete the file and fix the mirror" % exc, **result)
        kinds[kind] += 1
        lines.append((e["path"], digest))
        if e["path"] == p["license_file"]:
            license_sha = digest
    try:
        text = format_manifest(lines, {"repo": p["repo"], "revision": revision})
    except ManifestError as exc:
        module.fail_json(msg=str(exc), **result)
    data = text.encode("utf-8")
    result.update(manifest_sha256=hashlib.sha256(data).hexdigest(), license_sha256=license_sha,
                  lfs_files=kinds["lfs"], small_files=kinds["small"])
    current = None
    if os.path.exists(p["dest"]):
        with open(p["dest"], "rb") as f:
            current = f.read()
    if current != data:
        result["changed"] = True
        if not module.check_mode:
            tmp = p["dest"] + ".tmp"
            with open(tmp, "wb") as f:
                f.write(data)
            os.chmod(tmp, 0o644)
            os.replace(tmp, p["dest"])
    module.exit_json(**result)


if __name__ == "__main__":
    main()
