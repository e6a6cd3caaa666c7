# -*- coding: utf-8 -*-
# Shared code of the weights modules (weights_verify, weights_manifest): manifest format,
# hashing with large reused buffers, the "verified" marker contract. Pure functions only,
# except the small I/O helpers at the end; unit tests call them directly.
"""Weights manifest, hashing and marker helpers."""

from __future__ import annotations

import hashlib
import json
import os
import re

SHA256_RE = re.compile(r"^[0-9a-f]{64}$")
SHA1_RE = re.compile(r"^[0-9a-f]{40}$")
DEFAULT_BUFFER = 16 * 1024 * 1024

# Paths inside a weights directory that belong to tools, never to the model:
# the hub client's cache and rsync's partial/delay directories.
TOOL_DIRS = (".cache", ".rsync-partial", ".~tmp~")


class ManifestError(ValueError):
    """A manifest line that cannot be trusted."""


def parse_manifest(text):
    """Parse `sha256sum` output into an ordered list of (relpath, sha256).

    Accepts text mode (`<hex>  <name>`) and binary mode (`<hex> *<name>`), skips blank lines
    and `#` comments. Refuses (ManifestError) bad lines, absolute or escaping paths,
    backslash-escaped names (sha256sum's `\\` prefix) and duplicates, so a manifest can only
    name files inside the weights directory.
    """
    entries = []
    seen = set()
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.rstrip("\r")
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        if line.startswith("\\"):
            raise ManifestError("line %d: escaped file names are not supported: %r" % (number, line))
        match = re.match(r"^([0-9a-fA-F]{64}) ([ *])(.+)$", line)
        if not match:
            raise ManifestError("line %d: not '<sha256>  <path>' (sha256sum format): %r" % (number, line))
        digest, path = match.group(1).lower(), match.group(3)
        check_relpath(path, number)
        if path in seen:
            raise ManifestError("line %d: duplicate entry for %s" % (number, path))
        seen.add(path)
        entries.append((path, digest))
    if not entries:
        raise ManifestError("the manifest lists no files")
    return entries


def check_relpath(path, number=0):
    """Refuse a path that is absolute, escapes the directory or is not normalised."""
    parts = path.split("/")
    if path.startswith("/") or any(p in ("", ".", "..") for p in parts) or "\0" in path:
        raise ManifestError("line %d: path must be relative and normalised: %r" % (number, path))
    return path


def format_manifest(entries):
    """Render (relpath, sha256) pairs as `sha256sum -c` input, sorted by path."""
    lines = []
    for path, digest in sorted(entries):
        check_relpath(path)
        if not SHA256_RE.match(digest):
            raise ManifestError("not a sha256 for %s: %r" % (path, digest))
        if "\n" in path or "\\" in path:
            raise ManifestError("file name needs escaping, unsupported: %r" % path)
        lines.append("%s  %s\n" % (digest, path))
    return "".join(lines)


def compare(expected, actual_digests, present):
    """Compare the manifest with what was found.

    expected: list of (relpath, sha256); actual_digests: {relpath: sha256 or None (unreadable)};
    present: set of relpaths found on disk (regular files, tool dirs excluded).
    Returns dict with ok, failed_files, missing_files, extra_files.
    """
    failed, missing = [], []
    names = set()
    for path, digest in expected:
        names.add(path)
        if path not in present:
            missing.append(path)
        elif actual_digests.get(path) != digest:
            failed.append(path)
    extra = sorted(p for p in present if p not in names)
    return {
        "ok": not failed and not missing,
        "failed_files": sorted(failed),
        "missing_files": sorted(missing),
        "extra_files": extra,
    }


def marker_document(manifest_sha256, path, files, nbytes, verified_at):
    """The verified marker (contract in the brief): bound to the manifest's hash."""
    return {
        "manifest_sha256": manifest_sha256,
        "path": path,
        "files": files,
        "bytes": nbytes,
        "verified_at": verified_at,
    }


def marker_valid(marker_text, manifest_sha256, path=None):
    """True when the marker parses and names this manifest hash (and this dir if given)."""
    if marker_text is None:
        return False
    try:
        doc = json.loads(marker_text)
    except ValueError:
        return False
    if not isinstance(doc, dict) or doc.get("manifest_sha256") != manifest_sha256:
        return False
    if path is not None and doc.get("path") != path:
        return False
    return True


def git_blob_sha1(data):
    """The git blob id of bytes (what the hub's etag is for a non-LFS file)."""
    h = hashlib.sha1()  # noqa: S324 - git's object id, not a security hash
    h.update(b"blob %d\0" % len(data))
    h.update(data)
    return h.hexdigest()


def sha256_file(path, buffer_size=DEFAULT_BUFFER):
    """sha256 of a file with one reused buffer (bounded memory). Returns (hexdigest, bytes)."""
    h = hashlib.sha256()
    buf = bytearray(buffer_size)
    view = memoryview(buf)
    total = 0
    with open(path, "rb", buffering=0) as f:
        while True:
            n = f.readinto(buf)
            if not n:
                break
            h.update(view[:n])
            total += n
    return h.hexdigest(), total


def sha256_text(data):
    """sha256 hex of bytes."""
    return hashlib.sha256(data).hexdigest()


def list_files(root):
    """Relative paths of regular files under root, tool directories excluded."""
    found = set()
    for dirpath, dirnames, filenames in os.walk(root):
        rel = os.path.relpath(dirpath, root)
        if rel == ".":
            dirnames[:] = [d for d in dirnames if d not in TOOL_DIRS]
            rel = ""
        for name in filenames:
            full = os.path.join(dirpath, name)
            if os.path.isfile(full) and not os.path.islink(full):
                found.add(os.path.join(rel, name) if rel else name)
    return found
