# -*- coding: utf-8 -*-
# Shared code of the weights modules (weights_verify, weights_manifest): manifest format,
# hashing with large reused buffers, the "verified" marker contract. Pure functions only,
# except the small I/O helpers at the end; unit tests call them directly.
"""Weights manifest, hashing and marker helpers."""

from __future__ import annotations

import hashlib
import json
import mmap
import os
import re
import stat

from ansible_collections.mm3.shared.plugins.module_utils.validation import has_control, is_sha256, whole_number
# Bytes handed to sha256 at a time. Mapped (the default), a piece of the mapping, between which the
# read-ahead hint moves on; read (mapped=False, or a file that cannot be mapped), small enough to
# stay in the core's L2 cache between the copy from the page cache and the hash (16 MiB reads
# hashed 0.70x as fast from the page cache on this project's CI machine:
# bench/weights_verify_bench.py), large enough that the syscalls cost ~1%.
DEFAULT_BUFFER = 1024 * 1024
# How far ahead of the read the kernel is asked to read (posix_fadvise WILLNEED): the disk's
# queue stays this deep whatever the read size, so a cold read overlaps disk and CPU.
READAHEAD_WINDOW = 16 * 1024 * 1024

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
    # Lines as `sha256sum -c` reads them: split at \n only (str.splitlines would also split at
    # \r, \x85, U+2028 and more, and so read entries sha256sum does not), a CRLF ending allowed.
    for number, raw in enumerate(text.split("\n"), start=1):
        line = raw[:-1] if raw.endswith("\r") else raw
        if has_control(line):
            raise ManifestError("line %d holds a control character (%r): sha256sum reads the line "
                                "otherwise; regenerate the manifest" % (number, line[:120]))
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


# Header lines of a manifest: `# <key>: <value>` before the first entry, naming what the
# manifest is of. `sha256sum -c` skips lines that begin with `#`, so the file stays its input.
HEADER_KEYS = ("repo", "revision")
HEADER_VALUE_RE = re.compile(r"^[A-Za-z0-9._/-]{1,200}$")


def manifest_header(text):
    """The `# key: value` header of a manifest as a dict (keys in HEADER_KEYS only)."""
    header = {}
    for raw in text.split("\n"):  # as parse_manifest reads lines
        line = raw[:-1] if raw.endswith("\r") else raw
        if not line.strip():
            continue
        if not line.startswith("#"):
            break
        match = re.match(r"^# ([a-z_]+): (.*)$", line)
        if match and match.group(1) in HEADER_KEYS and match.group(1) not in header:
            header[match.group(1)] = match.group(2).strip()
    return header


def format_manifest(entries, header=None):
    """Render (relpath, sha256) pairs as `sha256sum -c` input, sorted by path.

    header: optional {key: value} (keys from HEADER_KEYS) written first as `# key: value`.
    """
    lines = []
    for key in HEADER_KEYS:
        value = (header or {}).get(key)
        if value is None:
            continue
        if not HEADER_VALUE_RE.match(str(value)):
            raise ManifestError("manifest header %s is not a plain name: %r" % (key, value))
        lines.append("# %s: %s\n" % (key, value))
    for path, digest in sorted(entries):
        check_relpath(path)
        if not is_sha256(digest):
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


def marker_document(manifest_sha256, path, files, nbytes, verified_at, repo=None, revision=None,
                    stats=None):
    """The verified marker: bound to the manifest's hash and the repo and revision it names;
    stats ({relpath: [size, mtime_ns]}) let every engine start re-check the files cheaply."""
    return {
        "manifest_sha256": manifest_sha256,
        "repo": repo,
        "revision": revision,
        "path": path,
        "files": files,
        "bytes": nbytes,
        "stats": stats or {},
        "verified_at": verified_at,
    }


def marker_valid(marker_text, manifest_sha256, path=None, repo=None, revision=None, stats=None):
    """True when the marker parses and names this manifest hash (and dir, repo, revision and
    file stats if given)."""
    if marker_text is None:
        return False
    try:
        doc = json.loads(marker_text)
    except ValueError:
        return False
    if not isinstance(doc, dict) or doc.get("manifest_sha256") != manifest_sha256:
        return False
    for key, want in (("path", path), ("repo", repo), ("revision", revision), ("stats", stats)):
        if want is not None and doc.get(key) != want:
            return False
    return True


def pin_problem(manifest_sha256, pinned, header, repo=None, revision=None):
    """Why a manifest must not be trusted, or None.

    manifest_sha256: the sha256 of the manifest's bytes; pinned: the value the inventory or
    matrix pins (None = not pinned); header: manifest_header() of it; repo/revision: what the
    caller expects it to describe (None = not checked). Checked before any file is hashed.
    """
    if pinned is not None:
        pinned = str(pinned).strip().lower()
        if not is_sha256(pinned):
            return "the pinned manifest sha256 %r is not 64 hex characters" % pinned
        if manifest_sha256 != pinned:
            return ("the manifest hashes to %s, not to the pinned %s (serving_weights_manifest_sha256): "
                    "it was changed, or it is another revision's; no file was hashed"
                    % (manifest_sha256, pinned))
    for key, want in (("repo", repo), ("revision", revision)):
        if want is not None and header.get(key) != want:
            return ("the manifest names %s %r in its header, not %r: it belongs to another %s"
                    % (key, header.get(key), want, key))
    return None


def git_blob_sha1(data):
    """The git blob id of bytes (what the hub's etag is for a non-LFS file)."""
    h = hashlib.sha1()  # noqa: S324 - git's object id, not a security hash
    h.update(b"blob %d\0" % len(data))
    h.update(data)
    return h.hexdigest()


class ChangedWhileHashed(OSError):
    """A file whose inode, size, mtime or ctime moved while it was read: its digest is of no one
    state of the file, so nothing may be marked verified from it."""


def stat_identity(st):
    """What must not move while a file is hashed: device, inode, size, mtime and ctime (ctime
    also moves on a write that restores the mtime, which only the owner or root can do)."""
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def sha256_file(path, buffer_size=DEFAULT_BUFFER, readahead=True, window=READAHEAD_WINDOW, mapped=True):
    """sha256 of a file, `buffer_size` bytes at a time (bounded memory). Returns (hexdigest, bytes,
    stat): stat is [size, mtime_ns] of the open file (as file_stats records it), taken before the
    first read and found unchanged after the last one; ChangedWhileHashed otherwise, so a marker
    records the state whose bytes were hashed, never a later one.

    mapped: hash the page cache's pages in place (mmap, one `window` mapped at a time and its
    pages mapped in one call, MADV_POPULATE_READ) instead of copying each piece into a buffer
    first: from a warm page cache the copy costs a fifth of the hash (bench/weights_verify_bench.py).
    A file that cannot be mapped (empty, or a filesystem without mmap) is read into a buffer. A file
    that shrinks while mapped ends the process with SIGBUS: hash_files runs this in worker
    processes, so that is one failed file, never a verified one.

    readahead: ask the kernel (posix_fadvise SEQUENTIAL, then WILLNEED) to read `window` bytes
    ahead of the piece being hashed: the first window before the first piece, and after each piece
    the bytes that keep it `window` ahead, so that the disk works while the CPU hashes (a cold read
    otherwise alternates: read, then hash, with the disk idle in between).
    """
    h = hashlib.sha256()
    total = 0
    with open(path, "rb", buffering=0) as f:
        fd = f.fileno()
        before = os.fstat(fd)
        advise = readahead and hasattr(os, "posix_fadvise")
        if advise:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_SEQUENTIAL)
            os.posix_fadvise(fd, 0, window, os.POSIX_FADV_WILLNEED)
        pieces = _mapped_pieces(fd, before.st_size, buffer_size, window) if mapped else None
        if pieces is None:
            pieces = _read_pieces(f, buffer_size)
        for piece in pieces:
            n = len(piece)
            if advise:
                os.posix_fadvise(fd, total + window, n, os.POSIX_FADV_WILLNEED)
            h.update(piece)
            total += n
        after = os.fstat(fd)
    if stat_identity(before) != stat_identity(after) or total != before.st_size:
        raise ChangedWhileHashed(
            "%s changed while it was hashed (size %d -> %d, %d bytes read, mtime_ns %d -> %d): run the "
            "verification again once nothing writes to it" % (
                path, before.st_size, after.st_size, total, before.st_mtime_ns, after.st_mtime_ns))
    return h.hexdigest(), total, [before.st_size, before.st_mtime_ns]


# Linux 5.14's madvise(MADV_POPULATE_READ) (Python's mmap module names it from 3.13): map a window's
# pages in one call rather than one page fault per 64 KiB. (MADV_HUGEPAGE as well mapped a warm
# page cache 2 MiB at a time, 1.05x warm, but read a cold one 0.85x: the posix_fadvise read-ahead
# fills the cache in small folios, which only a fault in the mapping reads as 2 MiB ones.)
MADV_POPULATE_READ = getattr(mmap, "MADV_POPULATE_READ", 22)


def _read_pieces(f, buffer_size):
    """The file's bytes as views of one reused buffer, one read each."""
    buf = bytearray(buffer_size)
    view = memoryview(buf)
    while True:
        n = f.readinto(buf)
        if not n:
            return
        yield view[:n]


def _mapped_pieces(fd, size, buffer_size, window):
    """The file's bytes as views of its mapping, `window` (rounded to the mapping granularity)
    mapped at a time; None where the file cannot be mapped (then it is read)."""
    if size == 0 or not hasattr(mmap, "PROT_READ"):
        return None
    span = max(mmap.ALLOCATIONGRANULARITY, window - window % mmap.ALLOCATIONGRANULARITY)
    try:
        first = mmap.mmap(fd, min(span, size), prot=mmap.PROT_READ)
    except (OSError, ValueError):
        return None
    return _map_windows(fd, size, buffer_size, span, first)


def _map_windows(fd, size, buffer_size, span, first):
    """Generator of _mapped_pieces: each window's pieces, then the next window mapped."""
    offset, mapping = 0, first
    while True:
        length = len(mapping)
        try:
            mapping.madvise(MADV_POPULATE_READ)
        except (OSError, ValueError):
            pass   # an older kernel: the pages are mapped by page faults instead
        view = memoryview(mapping)
        try:
            for start in range(0, length, buffer_size):
                piece = view[start:start + buffer_size]
                try:
                    yield piece
                finally:
                    piece.release()   # or the mapping cannot be closed
        finally:
            view.release()
            mapping.close()
        offset += length
        if offset >= size:
            return
        mapping = mmap.mmap(fd, min(span, size - offset), prot=mmap.PROT_READ, offset=offset)


def sha256_text(data):
    """sha256 hex of bytes."""
    return hashlib.sha256(data).hexdigest()


def scan(root, tool_dirs=TOOL_DIRS):
    """(regular files, odd entries) under root. Files: relative paths of regular files (no
    symlink). Odd: every other entry the engine would see in the mounted directory, each as
    'path (what it is)': a symlink (to anywhere: /etc/passwd, /), a FIFO, socket or device, and a
    hidden directory (none is part of a model; `.cache/` on a node survives a sync that excludes
    it). `tool_dirs` at the top are left out: the download's and rsync's own, where they belong
    (staging); a node's copy passes none."""
    found, odd = set(), []
    for dirpath, dirnames, filenames in os.walk(root):
        rel = os.path.relpath(dirpath, root)
        rel = "" if rel == "." else rel
        keep = []
        for name in dirnames:
            path = os.path.join(rel, name) if rel else name
            if not rel and name in tool_dirs:
                continue
            if os.path.islink(os.path.join(dirpath, name)):
                odd.append("%s (symlink to %s)" % (path, os.readlink(os.path.join(dirpath, name))))
            elif name.startswith("."):
                odd.append("%s/ (hidden directory)" % path)
            else:
                keep.append(name)
        dirnames[:] = keep
        for name in filenames:
            full, path = os.path.join(dirpath, name), os.path.join(rel, name) if rel else name
            mode = os.lstat(full).st_mode
            if stat.S_ISREG(mode):
                found.add(path)
            elif stat.S_ISLNK(mode):
                odd.append("%s (symlink to %s)" % (path, os.readlink(full)))
            else:
                odd.append("%s (%s)" % (path, "fifo" if stat.S_ISFIFO(mode) else "socket" if stat.S_ISSOCK(mode)
                                        else "device" if stat.S_ISBLK(mode) or stat.S_ISCHR(mode) else "special file"))
    return found, sorted(odd)


def list_files(root, tool_dirs=TOOL_DIRS):
    """Relative paths of regular files under root, tool directories excluded (scan's first half)."""
    return scan(root, tool_dirs)[0]


def file_stats(root, relpaths):
    """{relpath: [size, mtime_ns]} of files under root (what a restart re-checks cheaply)."""
    stats = {}
    for rel in relpaths:
        st = os.stat(os.path.join(root, rel))
        stats[rel] = [st.st_size, st.st_mtime_ns]
    return stats


# The engine reads the weights as an ordinary process: its container runs with --cap-drop ALL,
# so even as root it has no CAP_DAC_OVERRIDE or CAP_DAC_READ_SEARCH, and the kernel grants access
# through exactly one class of the mode bits: the owner's when the uid owns the inode, else the
# group's when the gid is the inode's group, else the others' (path_resolution(7); the kernel's
# generic_permission). A directory must be readable (the engine lists it: *.safetensors) and
# searchable (x) to reach what is inside it.
READ = 4
SEARCH = 1
# A uid or gid as Linux takes it (uid_t; (uid_t)-1 means "no change" and is never an identity).
MAX_ID = 2 ** 32 - 2


def engine_identity(user):
    """(uid, gid or None) the engine's container runs as, from serving_spec.container.user in
    the form `docker run --user` takes ("uid" or "uid:gid"); None or "" = root (0, 0), the user
    of the engine images. With a uid alone docker takes the gid from the image's passwd, which
    is not known here: gid None, so no group bits are counted for it. Raises ValueError."""
    if user is None or user == "":
        return 0, 0
    uid_text, colon, gid_text = str(user).partition(":")
    uid = whole_number(uid_text, 0, MAX_ID)
    gid = whole_number(gid_text, 0, MAX_ID) if colon else None
    if uid is None or (colon and gid is None):
        raise ValueError("the engine's user %r is not a numeric uid[:gid] (serving_spec.container.user)" % (user,))
    return uid, gid


def lacks_access(mode, owner, group, uid, gid, want):
    """True when a process of uid/gid without capabilities (and without supplementary groups,
    which are not known here) lacks any of the `want` bits (READ, SEARCH) on an inode of this
    mode, owner and group: one class of bits decides, as in the kernel."""
    if uid == owner:
        bits = (mode >> 6) & 7
    elif gid is not None and gid == group:
        bits = (mode >> 3) & 7
    else:
        bits = mode & 7
    return bits & want != want


def access_paths(relpaths):
    """[(relpath, is_directory)] the engine must reach to read relpaths: '' (the directory
    itself), every directory on the way to each file, then the file; each once, in order."""
    paths, seen = [], set()
    for rel in relpaths:
        parts = rel.split("/")
        for depth in range(len(parts)):
            sub = "/".join(parts[:depth])
            if sub not in seen:
                seen.add(sub)
                paths.append((sub, True))
        paths.append((rel, False))
    return paths


def access_problem(rel, is_directory, mode, owner, group, uid, gid):
    """Why the engine, as uid/gid, cannot use one path of access_paths (a directory must be
    readable and searchable, a file readable), naming its mode and owner; None when it can."""
    want = READ | SEARCH if is_directory else READ
    if not lacks_access(mode, owner, group, uid, gid, want):
        return None
    who = "uid %d" % uid if gid is None else "uid %d gid %d" % (uid, gid)
    what = ("directory %s is not readable and searchable" % (rel or ".") if is_directory
            else "%s is not readable" % rel)
    return "%s by %s (mode %04o, owner %d:%d)" % (what, who, mode & 0o7777, owner, group)


def access_problems(root, relpaths, uid, gid):
    """What the engine, as uid/gid, could not read of the weights under root (access_paths, each
    stat'ed; access_problem). The directories above root are not the engine's to traverse: Docker
    resolves the bind mount as root. A path that is missing is left to the caller (recheck names
    it)."""
    problems = []
    for rel, is_directory in access_paths(relpaths):
        try:
            st = os.stat(os.path.join(root, rel) if rel else root)
        except OSError:
            continue
        problem = access_problem(rel, is_directory, st.st_mode, st.st_uid, st.st_gid, uid, gid)
        if problem:
            problems.append(problem)
    return problems


def recheck(root, manifest_bytes, marker_text, pinned, repo=None, revision=None, uid=0, gid=0):
    """The cheap check before every engine start (no hashing): a list of problems, empty when
    the directory is still exactly what was verified and the engine can read it (recheck_findings,
    both lists in one)."""
    changed, unreadable = recheck_findings(root, manifest_bytes, marker_text, pinned, repo, revision, uid, gid)
    return changed + unreadable


def recheck_findings(root, manifest_bytes, marker_text, pinned, repo=None, revision=None, uid=0, gid=0):
    """(changed, unreadable): what differs from what was verified, and what the engine could not
    read, each a list of problems (the unit's check words the two refusals differently).

    changed: the manifest must hash to the pinned value and to what the marker is bound to; the
    marker must name repo and revision; every manifest file must have the size and mtime
    recorded at verification; no file outside the manifest may be in the directory.
    unreadable: the engine, as uid/gid (engine_identity; root by default), must be able to read
    every manifest file and every directory on its way (access_problems).
    """
    problems = []
    manifest_sha256 = sha256_text(manifest_bytes)
    if manifest_sha256 != pinned:
        problems.append("the manifest hashes to %s, not to the pinned %s" % (manifest_sha256, pinned))
    try:
        doc = json.loads(marker_text) if marker_text is not None else None
    except ValueError:
        doc = None
    if not isinstance(doc, dict):
        return problems + ["no readable verified marker"], []
    if doc.get("manifest_sha256") != manifest_sha256:
        problems.append("the marker is bound to manifest %s, the manifest on disk hashes to %s"
                        % (doc.get("manifest_sha256"), manifest_sha256))
    for key, want in (("repo", repo), ("revision", revision)):
        if want is not None and doc.get(key) != want:
            problems.append("the marker names %s %r, not %r" % (key, doc.get(key), want))
    try:
        entries = parse_manifest(manifest_bytes.decode("utf-8"))
    except (ManifestError, UnicodeDecodeError) as exc:
        return problems + ["the manifest is not usable: %s" % exc], []
    unreadable = access_problems(root, [path for path, _ in entries], uid, gid)
    stats = doc.get("stats")
    if not isinstance(stats, dict) or not stats:
        return problems + ["the marker records no file sizes and mtimes (written by an older version)"], unreadable
    changed = []
    for path, _digest in entries:
        try:
            st = os.stat(os.path.join(root, path))
        except OSError:
            changed.append("%s is missing" % path)
            continue
        if [st.st_size, st.st_mtime_ns] != stats.get(path):
            changed.append("%s (size %s -> %d, mtime_ns %s -> %d)" % (
                path, (stats.get(path) or ["?", "?"])[0], st.st_size, (stats.get(path) or ["?", "?"])[1],
                st.st_mtime_ns))
    if changed:
        problems.append("changed since verification: %s" % "; ".join(changed[:10]))
    present, odd = scan(root, ())
    extra = sorted(present - {path for path, _ in entries}) + odd
    if extra:
        problems.append("files the manifest does not name: %s" % ", ".join(extra[:10]))
    return problems, unreadable
