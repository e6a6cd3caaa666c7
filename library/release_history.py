#!/usr/bin/python
# -*- coding: utf-8 -*-
# Keep each serving node's release history: which release ran, from when to when, who put it
# there, and a copy of the files that made it, so a rollback can restore them without a transfer.
"""Ansible module release_history."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: release_history
short_description: Record the release a serving node runs, and keep its files for a rollback
description:
  - A release is what the files of the model server say together (the systemd unit, the launch
    command, the engine config holding the API key); a change of weights revision, image digest,
    engine flag, tuning or key is a new release. Its id is the sha256 of the files' names and
    sha256s (first 16 hex digits), so the same files always give the same id.
  - When the files give the id of the last entry, nothing changes (a rerun reports C(changed=false)).
    Otherwise the last entry is closed (C(until) set to now) and a new one is appended with its
    display fields (I(release)), C(from), C(by) and I(result), and copies of the files are kept
    under I(store_dir)/<id>/ (mode 0600, the config holds the key), so C(playbooks/rollback.yml)
    can restore the previous release by switching files and restarting only.
  - Copies are kept for the newest I(keep) releases; older copies are removed, their history
    entries stay. The history file is written atomically, mode 0600.
  - Check mode reports what would change and writes nothing.
version_added: "1.0.0"
options:
  path:
    description: The history file (JSON).
    type: path
    required: true
  files:
    description: The files whose contents make the release. Each must exist; their base names must differ.
    type: list
    elements: path
    required: true
  store_dir:
    description: Where the copies of each release's files are kept, one directory per release id.
    type: path
    required: true
  release:
    description:
      - What an operator reads about the release (for example revision, manifest_sha256, image,
        engine, profile). Not part of the id, so a display field alone never makes a new release.
    type: dict
    default: {}
  by:
    description: Who changed it (the controller's user).
    type: str
    default: unknown
  result:
    description: What the new entry records (C(serving) once the engine answered its health check).
    type: str
    default: serving
  keep:
    description: How many releases keep their file copies (at least 2, the current and the previous).
    type: int
    default: 5
attributes:
  check_mode:
    support: full
    details: Reports what would change and writes nothing.
  diff_mode:
    support: none
author: MiniMax-M3 deployment maintainers
"""

EXAMPLES = r"""
- name: Record the release the engine serves now
  release_history:
    path: /var/lib/minimax-m3/releases.json
    store_dir: /var/lib/minimax-m3/releases
    files:
      - /etc/systemd/system/minimax-m3.service
      - /etc/minimax-m3/docker-run.cmd
    release:
      revision: 8c694d849af242f2a47cb386aa89e1ad40fc6122
      image: registry.example/vllm/vllm-openai@sha256:0123...
    by: alice
"""

RETURN = r"""
current:
  description: The entry of the release the files make now (id, from, until, by, result, release, files).
  returned: always
  type: dict
previous:
  description: The entry before it (the release a rollback restores), or null when there is none.
  returned: always
  type: dict
recorded:
  description: Whether a new entry was (or in check mode would be) appended.
  returned: always
  type: bool
entries:
  description: How many entries the history holds.
  returned: always
  type: int
"""

import datetime
import hashlib
import json
import os
import shutil
import tempfile

from ansible.module_utils.basic import AnsibleModule

ID_LEN = 16


def file_sha256(path):
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def release_id(digests):
    """The id of a release from {basename: sha256}: the same files always give the same id."""
    text = "".join("%s %s\n" % (name, digests[name]) for name in sorted(digests))
    return hashlib.sha256(text.encode()).hexdigest()[:ID_LEN]


def load_history(text):
    """The entries of a history file's text ('' for none); anything else is refused."""
    if not text.strip():
        return []
    data = json.loads(text)
    entries = data.get("releases") if isinstance(data, dict) else None
    if not isinstance(entries, list) or not all(isinstance(e, dict) and e.get("id") for e in entries):
        raise ValueError("not a release history (expected {\"releases\": [{\"id\": ...}, ...]})")
    return entries


def next_history(entries, digests, release, by, result, now):
    """(entries, recorded): a new entry appended and the last one closed when the files make
    another release than the last entry's; the same list otherwise. Pure."""
    rid = release_id(digests)
    if entries and entries[-1]["id"] == rid:
        return entries, False
    closed = [dict(e) for e in entries]
    if closed and not closed[-1].get("until"):
        closed[-1]["until"] = now
    closed.append({"id": rid, "from": now, "until": None, "by": by, "result": result,
                   "release": dict(release), "files": dict(digests)})
    return closed, True


def kept_ids(entries, keep):
    """The release ids whose file copies stay: the newest `keep` distinct ids."""
    ids = []
    for entry in reversed(entries):
        if entry["id"] not in ids:
            ids.append(entry["id"])
    return ids[:max(keep, 2)]


def write_atomic(path, text):
    directory = os.path.dirname(path) or "."
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".release-history.")
    try:
        with os.fdopen(fd, "w") as handle:
            handle.write(text)
        os.chmod(tmp, 0o600)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def store_copies(store_dir, rid, files):
    """Copy the files into store_dir/rid/ (0600); True when something was written."""
    target = os.path.join(store_dir, rid)
    wrote = False
    os.makedirs(target, mode=0o700, exist_ok=True)
    for path in files:
        dest = os.path.join(target, os.path.basename(path))
        if os.path.exists(dest) and file_sha256(dest) == file_sha256(path):
            continue
        shutil.copyfile(path, dest + ".tmp")
        os.chmod(dest + ".tmp", 0o600)
        os.replace(dest + ".tmp", dest)
        wrote = True
    return wrote


def main():
    module = AnsibleModule(
        argument_spec=dict(
            path=dict(type="path", required=True),
            files=dict(type="list", elements="path", required=True),
            store_dir=dict(type="path", required=True),
            release=dict(type="dict", default={}),
            by=dict(type="str", default="unknown"),
            result=dict(type="str", default="serving"),
            keep=dict(type="int", default=5),
        ),
        supports_check_mode=True,
    )
    p = module.params
    names = [os.path.basename(f) for f in p["files"]]
    if not p["files"] or len(set(names)) != len(names):
        module.fail_json(msg="release_history: files must be given, with distinct base names: %s" % names)
    missing = [f for f in p["files"] if not os.path.isfile(f)]
    if missing:
        module.fail_json(msg="release_history: these files of the release are missing: %s" % ", ".join(missing))
    digests = {os.path.basename(f): file_sha256(f) for f in p["files"]}
    try:
        text = open(p["path"]).read() if os.path.exists(p["path"]) else ""
        entries = load_history(text)
    except (ValueError, OSError) as exc:
        module.fail_json(msg="release_history: %s cannot be read: %s. Move it aside to start a new history."
                         % (p["path"], exc))
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    entries, recorded = next_history(entries, digests, p["release"], p["by"], p["result"], now)
    current = entries[-1]
    copy_dir = os.path.join(p["store_dir"], current["id"])
    copies_ok = all(os.path.isfile(os.path.join(copy_dir, n)) and file_sha256(os.path.join(copy_dir, n)) == digests[n]
                    for n in names)
    keep = kept_ids(entries, p["keep"])
    stale = sorted(d for d in (os.listdir(p["store_dir"]) if os.path.isdir(p["store_dir"]) else [])
                   if d not in keep and not d.startswith("."))
    changed = recorded or not copies_ok or bool(stale)
    if changed and not module.check_mode:
        os.makedirs(p["store_dir"], mode=0o700, exist_ok=True)
        store_copies(p["store_dir"], current["id"], p["files"])
        for name in stale:
            shutil.rmtree(os.path.join(p["store_dir"], name), ignore_errors=True)
        if recorded:
            write_atomic(p["path"], json.dumps({"releases": entries}, indent=1, sort_keys=True) + "\n")
    module.exit_json(changed=changed, recorded=recorded, current=current,
                     previous=entries[-2] if len(entries) > 1 else None, entries=len(entries))


if __name__ == "__main__":
    main()
