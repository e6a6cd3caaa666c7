"""Unit tests of the weights modules: weights_verify, weights_manifest and their shared code.

Pure functions are called directly; main() runs with ansible-core's patch_module_args on real
files in a temporary directory (no mocks of hashing or the file system).
"""

from __future__ import annotations

import faulthandler
import hashlib
import json
import os
import sys

import pytest

from helpers import load_source  # tests/ is on sys.path (pytest.ini)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))



from ansible_collections.mm3.shared.plugins.module_utils import weights_common as common  # noqa: E402
verify = load_source("weights_verify", os.path.join(ROOT, "library", "weights_verify.py"))
manifest_mod = load_source("weights_manifest", os.path.join(ROOT, "library", "weights_manifest.py"))

from ansible.module_utils.testing import patch_module_args  # noqa: E402

H1 = "a" * 64
H2 = "b" * 64


# --- manifest parsing -------------------------------------------------------------------

@pytest.mark.parametrize("text,expected", [
    ("%s  model.safetensors\n" % H1, [("model.safetensors", H1)]),
    ("%s *model.safetensors\n" % H1, [("model.safetensors", H1)]),          # binary mode
    ("%s  a b.py\n%s  sub/c.json\n" % (H1, H2), [("a b.py", H1), ("sub/c.json", H2)]),
    ("# comment\n\n%s  x\r\n" % H1.upper(), [("x", H1)]),                  # case, CRLF, comments
    # sha256sum splits at \n only: U+2028 is part of the name, not a second entry
    ("%s  a\u2028%s  b\n" % (H1, H2), [("a\u2028%s  b" % H2, H1)]),
])
def test_parse_manifest_accepts(text, expected):
    assert common.parse_manifest(text) == expected


@pytest.mark.parametrize("text,needle", [
    ("", "lists no files"),
    ("%s model\n" % H1[:63], "sha256sum format"),
    ("nothex  file\n", "sha256sum format"),
    ("%s\tfile\n" % H1, "control character"),
    ("%s  a\x85%s  b\n" % (H1, H2), "line 1 holds a control character"),     # NEL: splitlines splits there
    ("%s  a\r%s  b\n" % (H1, H2), "line 1 holds a control character"),
    ("%s  a\n%s  b\x0c\n" % (H1, H2), "line 2 holds a control character"),
    ("%s  /etc/passwd\n" % H1, "relative"),
    ("%s  ../x\n" % H1, "relative"),
    ("%s  a//b\n" % H1, "relative"),
    ("%s  x\n%s  x\n" % (H1, H2), "duplicate"),
    ("\\%s  a\\nb\n" % H1, "escaped"),
])
def test_parse_manifest_refuses(text, needle):
    with pytest.raises(common.ManifestError, match=needle):
        common.parse_manifest(text)


def test_format_manifest_roundtrip_and_sha256sum_format():
    text = common.format_manifest([("z.py", H2), ("a/b.safetensors", H1)])
    assert text == "%s  a/b.safetensors\n%s  z.py\n" % (H1, H2)
    assert common.parse_manifest(text) == [("a/b.safetensors", H1), ("z.py", H2)]
    with pytest.raises(common.ManifestError):
        common.format_manifest([("x", "123")])


# --- comparison and marker --------------------------------------------------------------

def test_compare_all_cases():
    expected = [("a", H1), ("b", H2), ("c", H1)]
    out = common.compare(expected, {"a": H1, "b": H1}, {"a", "b", "extra.txt"})
    assert out == {"ok": False, "failed_files": ["b"], "missing_files": ["c"], "extra_files": ["extra.txt"]}
    assert common.compare(expected, {"a": H1, "b": H2, "c": H1}, {"a", "b", "c"})["ok"] is True
    # an unreadable file (digest None) is failed, not passed
    assert common.compare([("a", H1)], {"a": None}, {"a"})["failed_files"] == ["a"]


@pytest.mark.parametrize("text,sha,path,valid", [
    (None, H1, None, False),
    ("not json", H1, None, False),
    ("[]", H1, None, False),
    (json.dumps({"manifest_sha256": H1, "path": "/d"}), H1, "/d", True),
    (json.dumps({"manifest_sha256": H1, "path": "/d"}), H2, "/d", False),    # other manifest
    (json.dumps({"manifest_sha256": H1, "path": "/d"}), H1, "/other", False),
])
def test_marker_valid(text, sha, path, valid):
    assert common.marker_valid(text, sha, path) is valid


def test_git_blob_sha1_matches_git():
    # `printf 'hello\n' | git hash-object --stdin`
    assert common.git_blob_sha1(b"hello\n") == "ce013625030ba8dba906f756967f9e9ca394464a"


def test_sha256_file_small_buffer(tmp_path):
    data = os.urandom(300_000)
    f = tmp_path / "x"
    f.write_bytes(data)
    st = f.stat()
    assert common.sha256_file(str(f), 65536) == (hashlib.sha256(data).hexdigest(), len(data),
                                                 [st.st_size, st.st_mtime_ns])


@pytest.mark.parametrize("size", [0, 65536, 65537, 300_000])
def test_sha256_file_keeps_the_kernel_reading_a_window_ahead_and_hashes_the_same(tmp_path, monkeypatch, size):
    """With readahead the kernel is asked for the first window before the first read, then after
    each read for the bytes that keep it one window ahead (the disk works while the current buffer
    is hashed); the digest is the same either way."""
    data = os.urandom(size)
    f = tmp_path / "x"
    f.write_bytes(data)
    calls = []
    real = os.posix_fadvise
    monkeypatch.setattr(common.os, "posix_fadvise", lambda fd, off, n, advice: calls.append((off, n, advice))
                        or real(fd, off, n, advice))
    assert common.sha256_file(str(f), 65536, readahead=False)[:2] == (hashlib.sha256(data).hexdigest(), size)
    assert calls == []
    window = 4 * 65536
    assert common.sha256_file(str(f), 65536, window=window)[:2] == (hashlib.sha256(data).hexdigest(), size)
    assert calls[0] == (0, 0, os.POSIX_FADV_SEQUENTIAL)
    willneed = [(off, n) for off, n, advice in calls if advice == os.POSIX_FADV_WILLNEED]
    reads = [min(65536, size - off) for off in range(0, size, 65536)]   # the reads that return bytes
    assert willneed == [(0, window)] + [(65536 * i + window, n) for i, n in enumerate(reads)]


def test_the_default_read_stays_in_cache_and_the_window_stays_deep():
    """The measured choice (bench/weights_verify_bench.py): 1 MiB reads, 16 MiB read ahead."""
    assert (common.DEFAULT_BUFFER, common.READAHEAD_WINDOW) == (1 << 20, 16 << 20)


def test_plan_hashing_largest_first_and_subset():
    entries = [("a", H1), ("b", H1), ("c", H1), ("d", H1)]
    sizes = {"a": 1, "b": 30, "c": 20}
    assert verify.plan_hashing(entries, {"a", "b", "c"}, set(), sizes) == ["b", "c", "a"]
    assert verify.plan_hashing(entries, {"a", "b", "c"}, {"a", "d"}, sizes) == ["a"]


# --- weights_verify main() on real files -----------------------------------------------

def _make_dir(tmp_path, n=4, size=200_000, node=False):
    """A revision directory, its manifest and marker path: as staging holds it (with the hub
    client's .cache/, which the verifier leaves to the download) or, node=True, as a node's copy."""
    wdir = tmp_path / "weights"
    (wdir / "sub").mkdir(parents=True)
    lines = []
    for i in range(n):
        rel = "model-%05d.safetensors" % i if i else "sub/modeling.py"
        data = os.urandom(size if i else 1000)
        (wdir / rel).write_bytes(data)
        lines.append("%s  %s\n" % (hashlib.sha256(data).hexdigest(), rel))
    if not node:
        (wdir / ".cache" / "huggingface").mkdir(parents=True)
        (wdir / ".cache" / "huggingface" / "x.metadata").write_text("junk")
    man = tmp_path / "weights.manifest.sha256"
    man.write_text("# repo: org/tiny\n# revision: %s\n%s" % ("a" * 40, "".join(lines)))
    return wdir, man, tmp_path / "weights.verified.json"


def _pin(man):
    """What an operator pins after review: the sha256 of the manifest's bytes."""
    return hashlib.sha256(man.read_bytes()).hexdigest()


def _run(module, args, check=False):
    if check:
        args = dict(args, _ansible_check_mode=True)
    with patch_module_args(args):
        with pytest.raises(SystemExit):
            module.main()


def _result(capsys):
    return json.loads(capsys.readouterr().out)


def test_verify_main_ok_writes_marker_then_idempotent(tmp_path, capsys):
    wdir, man, marker = _make_dir(tmp_path)
    args = {"path": str(wdir), "manifest": str(man), "marker": str(marker), "workers": 2,
            "buffer_size": 65536, "manifest_sha256": _pin(man), "repo": "org/tiny", "revision": "a" * 40}
    _run(verify, args, check=True)
    res = _result(capsys)
    assert res["verified"] and res["changed"] and res["marker_written"] and not marker.exists()
    _run(verify, args)
    res = _result(capsys)
    assert res["verified"] and res["changed"] and res["files"] == 4 and res["files_hashed"] == 4
    assert res["bytes_hashed"] == 3 * 200_000 + 1000 and res["rate"] > 0 and res["extra_files"] == []
    doc = json.loads(marker.read_text())
    assert doc["manifest_sha256"] == hashlib.sha256(man.read_bytes()).hexdigest()
    assert doc["path"] == str(wdir) and doc["files"] == 4 and doc["bytes"] == 600_000 + 1000
    assert doc["repo"] == "org/tiny" and doc["revision"] == "a" * 40
    assert doc["verified_at"].endswith("Z")
    _run(verify, args)
    assert _result(capsys)["changed"] is False


def test_verify_main_flipped_byte_missing_extra_removes_marker(tmp_path, capsys):
    wdir, man, marker = _make_dir(tmp_path)
    args = {"path": str(wdir), "manifest": str(man), "marker": str(marker), "workers": 2,
            "manifest_sha256": _pin(man)}
    _run(verify, args)
    _result(capsys)
    shard = wdir / "model-00002.safetensors"
    data = bytearray(shard.read_bytes())
    data[12345] ^= 0x01
    shard.write_bytes(bytes(data))
    (wdir / "model-00003.safetensors").unlink()
    (wdir / "stray.bin").write_bytes(b"x")
    _run(verify, args, check=True)               # check mode: reports, removes nothing
    res = _result(capsys)
    assert res["failed"] and res["marker_removed"] and marker.exists()
    _run(verify, dict(args, fail_on_mismatch=False))
    res = _result(capsys)
    assert not res.get("failed") and res["verified"] is False
    assert res["failed_files"] == ["model-00002.safetensors"]
    assert res["missing_files"] == ["model-00003.safetensors"]
    assert res["extra_files"] == ["stray.bin"] and res["marker_removed"] and not marker.exists()


def test_verify_main_subset_for_repair(tmp_path, capsys):
    wdir, man, marker = _make_dir(tmp_path)
    full = {"path": str(wdir), "manifest": str(man), "marker": str(marker), "workers": 1,
            "manifest_sha256": _pin(man), "fail_on_mismatch": False}
    shard = wdir / "model-00001.safetensors"
    good = shard.read_bytes()
    shard.write_bytes(b"x" + good[1:])
    _run(verify, full)
    first = _result(capsys)
    assert first["failed_files"] == ["model-00001.safetensors"] and sorted(first["stats"]) == sorted(
        ["model-00001.safetensors", "model-00002.safetensors", "model-00003.safetensors", "sub/modeling.py"])
    shard.write_bytes(good)                      # the repair re-syncs the failed file
    args = dict(full, files=["model-00001.safetensors"], verified_stats=first["stats"])
    _run(verify, args)
    res = _result(capsys)
    assert res["verified"] and res["files_hashed"] == 1 and res["bytes_hashed"] == 200_000, res
    assert json.loads(marker.read_text())["stats"] == common.file_stats(str(wdir), sorted(first["stats"]))
    (wdir / "sub" / "modeling.py").unlink()      # absence still counts in a subset run
    _run(verify, args)
    res = _result(capsys)
    assert res["missing_files"] == ["sub/modeling.py"] and not marker.exists()


@pytest.mark.parametrize("make,reported", [
    (lambda w: (w / "passwd.py").symlink_to("/etc/passwd"), "passwd.py (symlink to /etc/passwd)"),
    (lambda w: (w / "sub" / "root").symlink_to("/"), "sub/root (symlink to /)"),
    (lambda w: os.mkfifo(w / "sub" / "pipe"), "sub/pipe (fifo)"),
    (lambda w: (w / "sub" / ".git" / "hooks").mkdir(parents=True), "sub/.git/ (hidden directory)"),
    (lambda w: (w / ".venv").mkdir(), ".venv/ (hidden directory)"),
])
def test_entries_that_are_no_regular_file_are_refused(tmp_path, capsys, make, reported):
    """Everything in the directory is mounted into the engine: a symlink (to /etc/passwd, to /),
    a FIFO or a hidden directory is no part of a model and was not reported."""
    wdir, man, marker = _make_dir(tmp_path)
    make(wdir)
    _run(verify, {"path": str(wdir), "manifest": str(man), "marker": str(marker), "manifest_sha256": _pin(man)})
    res = _result(capsys)
    assert res["failed"] and not res["verified"] and not marker.exists() and reported in res["extra_files"], res
    assert "file(s) the manifest does not name (" in res["msg"] and reported in res["msg"]


def test_a_cache_dir_is_the_downloads_on_staging_and_refused_in_a_nodes_copy(tmp_path, capsys):
    wdir, man, marker = _make_dir(tmp_path)     # holds .cache/huggingface as hf download leaves it
    args = {"path": str(wdir), "manifest": str(man), "marker": str(marker), "manifest_sha256": _pin(man)}
    _run(verify, args)
    assert _result(capsys)["verified"]
    _run(verify, dict(args, tool_dirs=[]))
    res = _result(capsys)
    assert res["failed"] and res["extra_files"] == [".cache/ (hidden directory)"] and not marker.exists()


def test_a_repair_marks_nothing_verified_that_no_pass_hashed(tmp_path, capsys):
    """files=[a] vouches only for a; every other file must be as an earlier pass hashed it: a file
    rewritten meanwhile (same size), or a repair with no earlier pass, writes no marker."""
    wdir, man, marker = _make_dir(tmp_path)
    full = {"path": str(wdir), "manifest": str(man), "marker": str(marker), "workers": 1,
            "manifest_sha256": _pin(man), "fail_on_mismatch": False}
    _run(verify, dict(full, files=["model-00001.safetensors"]))
    res = _result(capsys)
    assert not res["verified"] and not marker.exists()
    assert "model-00002.safetensors (not verified -> size 200000" in " ".join(res["changed_files"])
    _run(verify, full)
    stats = _result(capsys)["stats"]
    other = wdir / "model-00002.safetensors"
    other.write_bytes(os.urandom(200_000))       # not the bytes the full pass hashed
    os.utime(other, ns=(stats["model-00002.safetensors"][1] + 10**9,) * 2)
    _run(verify, dict(full, files=["model-00001.safetensors"], verified_stats=stats, fail_on_mismatch=True))
    res = _result(capsys)
    assert res["failed"] and not res["verified"] and not marker.exists(), res
    assert res["changed_files"][0].startswith("model-00002.safetensors (size 200000, mtime_ns %d -> size 200000"
                                              % stats["model-00002.safetensors"][1])
    assert "changed while or since they were verified" in res["msg"] and "run a full verification" in res["msg"]


def test_a_file_written_while_it_is_hashed_gets_no_marker(tmp_path, capsys, monkeypatch):
    """The real hashing loop, with a writer appending to the file between two of its reads (the
    readahead call is the hook): the digest is of no one state, so the file fails, no marker."""
    wdir, man, marker = _make_dir(tmp_path)
    shard = wdir / "model-00002.safetensors"
    real, calls = os.posix_fadvise, []

    def writer(fd, off, n, advice):
        calls.append(off)
        if len(calls) == 3:
            with open(shard, "ab") as f:
                f.write(b"late")
        return real(fd, off, n, advice)
    monkeypatch.setattr(common.os, "posix_fadvise", writer)
    with pytest.raises(common.ChangedWhileHashed, match="changed while it was hashed"):
        common.sha256_file(str(shard), 65536)
    shard.write_bytes(shard.read_bytes()[:-4])
    calls.clear()
    monkeypatch.setattr(verify, "plan_hashing", lambda *a: ["model-00002.safetensors", "model-00001.safetensors",
                                                           "model-00003.safetensors", "sub/modeling.py"])
    _run(verify, {"path": str(wdir), "manifest": str(man), "marker": str(marker), "workers": 1,
                  "buffer_size": 65536, "manifest_sha256": _pin(man), "fail_on_mismatch": False})
    res = _result(capsys)
    assert not res["verified"] and not marker.exists() and "model-00002.safetensors" in res["failed_files"]
    assert "changed while it was hashed" in res["read_errors"]["model-00002.safetensors"]


@pytest.mark.parametrize("size", [0, 1, 4095, 8192, 8193, 300_000])
def test_sha256_file_mapped_hashes_the_pages_in_place_window_by_window(tmp_path, monkeypatch, size):
    """Mapped (the default), the file's pages are hashed in place, one window mapped at a time,
    with the same digest, bytes and stat as read into a buffer; an empty file is read (mmap
    refuses length 0), and a file that cannot be mapped is read instead of failing."""
    data = os.urandom(size)
    f = tmp_path / "x"
    f.write_bytes(data)
    maps = []
    real = common.mmap.mmap
    monkeypatch.setattr(common.mmap, "mmap", lambda *a, **k: maps.append((a[1], k.get("offset", 0))) or real(*a, **k))
    expected = (hashlib.sha256(data).hexdigest(), size, [size, f.stat().st_mtime_ns])
    assert common.sha256_file(str(f), 4096, mapped=False, window=8192) == expected
    assert maps == []
    assert common.sha256_file(str(f), 4096, window=8192) == expected
    assert maps == [(min(8192, size - off), off) for off in range(0, size, 8192)]

    def refuse(*a, **k):
        raise OSError(19, "No such device")   # what mmap says on a filesystem without it
    monkeypatch.setattr(common.mmap, "mmap", refuse)
    assert common.sha256_file(str(f), 4096, window=8192) == expected


def test_a_file_truncated_under_its_mapping_fails_that_file_not_the_module(tmp_path, capsys, monkeypatch):
    """The real hashing loop with one worker, the file cut to nothing between two pieces (the
    readahead call is the hook): the mapped pages are gone and the next one raises SIGBUS, which
    ends the worker process. The module fails the files that process had, writes no marker, and
    the next run, with the file intact again, verifies. In the module's own process (what
    hash_files did for one worker before pages were mapped) SIGBUS would end the module."""
    wdir, man, marker = _make_dir(tmp_path)
    shard = wdir / "model-00002.safetensors"
    intact = shard.read_bytes()
    real, calls = os.posix_fadvise, []

    def cutter(fd, off, n, advice):
        calls.append(off)
        if len(calls) == 3 and os.fstat(fd).st_ino == shard.stat().st_ino:
            os.truncate(shard, 0)
        return real(fd, off, n, advice)
    monkeypatch.setattr(common.os, "posix_fadvise", cutter)
    monkeypatch.setattr(verify, "plan_hashing", lambda *a: ["model-00002.safetensors", "model-00001.safetensors",
                                                           "model-00003.safetensors", "sub/modeling.py"])
    args = {"path": str(wdir), "manifest": str(man), "marker": str(marker), "workers": 1,
            "buffer_size": 65536, "manifest_sha256": _pin(man), "fail_on_mismatch": False}
    dumping = faulthandler.is_enabled()   # pytest's: the worker would print its stack on SIGBUS
    faulthandler.disable()
    try:
        _run(verify, args)
    finally:
        if dumping:
            faulthandler.enable(file=sys.__stderr__)
    res = _result(capsys)
    assert not res["verified"] and not marker.exists()
    assert res["read_errors"]["model-00002.safetensors"] == verify.WORKER_DIED
    assert "model-00002.safetensors" in res["failed_files"]
    shard.write_bytes(intact)
    monkeypatch.setattr(common.os, "posix_fadvise", real)
    _run(verify, args)
    res = _result(capsys)
    assert res["verified"] and marker.exists()


def test_a_file_changed_after_it_was_hashed_gets_no_marker(tmp_path, capsys, monkeypatch):
    """Hashed intact, then rewritten before the marker is written: the marker would record the
    new size and mtime beside the old digest, and the unit's re-check accept the new bytes."""
    wdir, man, marker = _make_dir(tmp_path)
    real = verify.hash_files

    def then_rewrite(*args, **kwargs):
        out = real(*args, **kwargs)
        (wdir / "model-00003.safetensors").write_bytes(os.urandom(200_000))
        return out
    monkeypatch.setattr(verify, "hash_files", then_rewrite)
    _run(verify, {"path": str(wdir), "manifest": str(man), "marker": str(marker), "workers": 1,
                  "manifest_sha256": _pin(man)})
    res = _result(capsys)
    assert res["failed"] and not res["verified"] and not marker.exists()
    assert res["changed_files"] and res["changed_files"][0].startswith("model-00003.safetensors (size 200000")


@pytest.mark.parametrize("change,needle", [
    ({"manifest": "/nonexistent/m"}, "cannot read the manifest"),
    ({"path": "/nonexistent/w"}, "does not exist"),
    ({"files": ["not-listed"]}, "not in the manifest"),
    ({"buffer_size": 10}, "buffer_size"),
])
def test_verify_main_refusals(tmp_path, capsys, change, needle):
    wdir, man, marker = _make_dir(tmp_path)
    args = dict({"path": str(wdir), "manifest": str(man), "marker": str(marker),
                 "manifest_sha256": _pin(man)}, **change)
    _run(verify, args)
    res = _result(capsys)
    assert res["failed"] and needle in res["msg"]


def test_verify_main_bad_manifest(tmp_path, capsys):
    wdir, man, marker = _make_dir(tmp_path)
    man.write_text("garbage line\n")
    _run(verify, {"path": str(wdir), "manifest": str(man), "marker": str(marker), "manifest_sha256": _pin(man)})
    res = _result(capsys)
    assert res["failed"] and "not usable" in res["msg"]


def test_a_malformed_manifest_is_called_malformed_first(tmp_path, capsys):
    """It used to be reported as the manifest of another repository (its header could not be
    read either): the line that cannot be read comes first, the pin's verdict after it."""
    wdir, man, marker = _make_dir(tmp_path)
    man.write_text("# repo: org/tiny\x01\n# revision: %s\n%s  a\n" % ("a" * 40, H1))
    _run(verify, {"path": str(wdir), "manifest": str(man), "marker": str(marker), "manifest_sha256": _pin(man),
                  "repo": "org/tiny", "revision": "a" * 40})
    res = _result(capsys)
    assert res["failed"] and res["msg"].startswith(
        "manifest %s is not usable: line 1 holds a control character" % man), res["msg"]
    assert "org/tiny" in res["msg"].split("; ", 1)[1]           # then the pin's verdict


def test_verify_main_extra_file_refused_unless_report(tmp_path, capsys):
    """A file the manifest does not name would be mounted into the engine (--trust-remote-code
    imports *.py from there): verification fails and names it; extra_files=report only lists it."""
    wdir, man, marker = _make_dir(tmp_path)
    args = {"path": str(wdir), "manifest": str(man), "marker": str(marker), "manifest_sha256": _pin(man)}
    _run(verify, args)
    assert _result(capsys)["verified"] and marker.exists()
    (wdir / "evil_extra.py").write_text("import os\n")
    _run(verify, args)
    res = _result(capsys)
    assert res["failed"] and res["verified"] is False and res["extra_files"] == ["evil_extra.py"]
    assert "evil_extra.py" in res["msg"] and "does not name" in res["msg"] and not marker.exists()
    _run(verify, dict(args, extra_files="report"))
    res = _result(capsys)
    assert res["verified"] and res["extra_files"] == ["evil_extra.py"] and marker.exists()


def _tamper_shard_and_line(wdir, man):
    """Rewrite a shard and its manifest line together (consistent, but not what was pinned)."""
    shard = wdir / "model-00001.safetensors"
    shard.write_bytes(b"other bytes")
    digest = hashlib.sha256(b"other bytes").hexdigest()
    lines = [("%s  model-00001.safetensors" % digest) if line.endswith("model-00001.safetensors") else line
             for line in man.read_text().splitlines()]
    man.write_text("\n".join(lines) + "\n")


@pytest.mark.parametrize("fault", ["shard and line rewritten", "cut to one file", "header of another revision"])
def test_verify_main_refuses_a_manifest_that_is_not_the_pinned_one(tmp_path, capsys, monkeypatch, fault):
    """The pinned hash is checked before any byte is hashed; a marker from before goes."""
    wdir, man, marker = _make_dir(tmp_path)
    pinned = _pin(man)
    args = {"path": str(wdir), "manifest": str(man), "marker": str(marker), "manifest_sha256": pinned}
    _run(verify, args)
    assert _result(capsys)["verified"] and marker.exists()
    if fault == "shard and line rewritten":
        _tamper_shard_and_line(wdir, man)
    elif fault == "cut to one file":
        man.write_text("".join(l + "\n" for l in man.read_text().splitlines() if l.endswith("modeling.py")))
    else:
        man.write_text(man.read_text().replace("# revision: " + "a" * 40, "# revision: " + "b" * 40))
    hashed = []
    monkeypatch.setattr(verify, "hash_files", lambda *a, **k: hashed.append(a) or ({}, 0, {}, {}))
    _run(verify, args)
    res = _result(capsys)
    assert res["failed"] and res["verified"] is False and res["marker_removed"] and not marker.exists()
    assert pinned in res["msg"] and res["manifest_sha256"] in res["msg"] and "no file was hashed" in res["msg"]
    assert hashed == []


def test_verify_main_refuses_a_manifest_of_another_repo_or_revision(tmp_path, capsys):
    wdir, man, marker = _make_dir(tmp_path)
    args = {"path": str(wdir), "manifest": str(man), "marker": str(marker), "manifest_sha256": _pin(man)}
    _run(verify, dict(args, revision="b" * 40))
    res = _result(capsys)
    assert res["failed"] and "revision" in res["msg"] and "a" * 40 in res["msg"] and "b" * 40 in res["msg"]
    _run(verify, dict(args, repo="org/other"))
    res = _result(capsys)
    assert res["failed"] and "'org/tiny'" in res["msg"] and "'org/other'" in res["msg"]


def test_verify_main_refuses_a_malformed_pin(tmp_path, capsys):
    wdir, man, marker = _make_dir(tmp_path)
    _run(verify, {"path": str(wdir), "manifest": str(man), "marker": str(marker), "manifest_sha256": "abc"})
    res = _result(capsys)
    assert res["failed"] and "not 64 hex" in res["msg"]


def test_manifest_header_and_pin_problem():
    text = common.format_manifest([("a", H1)], {"repo": "org/r", "revision": "c" * 40})
    assert text.startswith("# repo: org/r\n# revision: " + "c" * 40 + "\n")
    assert common.manifest_header(text) == {"repo": "org/r", "revision": "c" * 40}
    assert common.parse_manifest(text) == [("a", H1)]
    sha = hashlib.sha256(text.encode()).hexdigest()
    header = common.manifest_header(text)
    assert common.pin_problem(sha, sha, header, "org/r", "c" * 40) is None
    assert "not to the pinned" in common.pin_problem(sha, "0" * 64, header)
    assert "another revision" in common.pin_problem(sha, sha, header, revision="d" * 40)
    with pytest.raises(common.ManifestError):
        common.format_manifest([("a", H1)], {"repo": "org/r\n0000  evil"})


# --- a signed release checked where the weights are (staging before export, a node before `current`)

def _release_keys():
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    out = {}
    for name in ("site", "stranger"):
        key = ec.generate_private_key(ec.SECP256R1())
        out[name] = (key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                       serialization.NoEncryption()),
                     key.public_key().public_bytes(serialization.Encoding.PEM,
                                                   serialization.PublicFormat.SubjectPublicKeyInfo).decode())
    return out


RELEASE_KEYS = None


def _signed_release(man, key="site", entries=None, manifest_sha256=None, revoked=()):
    """(args for weights_verify, the release's digest): the manifest's files signed with key `key`
    (or `entries` in their place, or another signed manifest_sha256), trusting key "site" less
    `revoked`."""
    from ansible_collections.mm3.shared.plugins.module_utils import release_signing as rs
    global RELEASE_KEYS
    RELEASE_KEYS = RELEASE_KEYS or _release_keys()
    listed = common.parse_manifest(man.read_text())
    document = rs.statement("tiny", entries or listed, release={
        "repo": "org/tiny", "revision": "a" * 40, "manifest_sha256": manifest_sha256 or _pin(man)})
    bundle = json.dumps(rs.sign(document, RELEASE_KEYS[key][0]))
    trust = rs.trust_document([{"name": "site", "public_key": RELEASE_KEYS["site"][1]}], revoked)
    digest = rs.release_digest(rs.payload_bytes(document))
    return {"release_bundle": bundle, "release_trust": json.dumps(trust), "release_digest": digest}, digest


def test_a_signed_release_of_exactly_this_manifest_is_verified_with_the_bytes(tmp_path, capsys):
    wdir, man, marker = _make_dir(tmp_path)
    release, digest = _signed_release(man)
    args = dict({"path": str(wdir), "manifest": str(man), "marker": str(marker), "workers": 2,
                 "manifest_sha256": _pin(man)}, **release)
    _run(verify, args)
    res = _result(capsys)
    assert res["verified"] and res["marker_written"] and marker.exists()
    assert res["release"]["digest"] == digest and res["release"]["key"] == "site"
    _run(verify, args)                           # idempotent, like without a release
    assert _result(capsys)["changed"] is False
    # without a release the result says none
    _run(verify, {k: v for k, v in args.items() if not k.startswith("release_")})
    assert _result(capsys)["release"] is None


def test_a_host_without_cryptography_refuses_to_check_a_release_except_in_check_mode(tmp_path, capsys, monkeypatch):
    wdir, man, marker = _make_dir(tmp_path)
    release, _ = _signed_release(man)
    args = dict({"path": str(wdir), "manifest": str(man), "marker": str(marker), "workers": 2,
                 "manifest_sha256": _pin(man)}, **release)
    monkeypatch.setattr(verify, "rs", None)
    monkeypatch.setattr(verify, "RELEASE_IMPORT_ERROR", ImportError("No module named 'cryptography'"))
    _run(verify, args)
    res = _result(capsys)
    assert res["failed"] and "install python3-cryptography" in res["msg"] and not marker.exists()
    _run(verify, args, check=True)                # check mode (the package is not installed yet): said
    res = _result(capsys)
    assert res["verified"] and res["release"] is None and not marker.exists()


@pytest.mark.parametrize("case,needle", [
    ("another manifest signed", "is not the signed one"),
    ("a file's sha256 signed otherwise", "1 file(s) with another sha256 than the signed one: sub/modeling.py"),
    ("a file signed that is not listed", "1 file(s) signed but not in the manifest: extra.bin"),
    ("signed by a key not trusted", "which is not in release_keys"),
    ("the key revoked", "which release_revoked revokes"),
    ("another release than the planned one", "not the release"),
    ("a malformed bundle", "not JSON"),
])
def test_weights_a_release_does_not_sign_get_no_marker(tmp_path, capsys, case, needle):
    """Each refused before a byte is hashed, naming what differs; the marker an earlier pass wrote
    is removed, so neither staging's export nor a node's `current` switch goes on."""
    wdir, man, marker = _make_dir(tmp_path)
    base = {"path": str(wdir), "manifest": str(man), "marker": str(marker), "workers": 2,
            "manifest_sha256": _pin(man)}
    _run(verify, base)
    assert _result(capsys)["marker_written"] and marker.exists()
    listed = common.parse_manifest(man.read_text())
    kwargs = {
        "another manifest signed": {"manifest_sha256": "c" * 64},
        "a file's sha256 signed otherwise": {"entries": [(p, H1 if p == "sub/modeling.py" else d) for p, d in listed]},
        "a file signed that is not listed": {"entries": listed + [("extra.bin", H2)]},
        "signed by a key not trusted": {"key": "stranger"},
        "the key revoked": {"revoked": ["site"]},
    }.get(case, {})
    release, _ = _signed_release(man, **kwargs)
    if case == "another release than the planned one":
        release["release_digest"] = "d" * 64
    if case == "a malformed bundle":
        release["release_bundle"] = release["release_bundle"][:-2]
    _run(verify, dict(base, **release))
    res = _result(capsys)
    assert res["failed"] and needle in res["msg"], res["msg"]
    assert res["verified"] is False and res["marker_removed"] and not marker.exists()
    assert "bytes_hashed" not in res


# --- the re-check before every engine start (role model_server, ExecStartPre) -------------

CHECKER = os.path.join(ROOT, "roles", "model_server", "files", "check_weights.py")
ms_filters = load_source("model_server_filters", os.path.join(ROOT, "filter_plugins", "model_server.py"))


UNIT_TEMPLATE = os.path.join(ROOT, "roles", "model_server", "templates", "model-server.service.j2")


def _unit_recheck_argv(spec, python, libexec):
    """The argv of the unit's weights re-check as the role renders it: the template's
    ExecStartPre line that runs check_weights.py, rendered with its filter from serving_spec (an
    undefined key chains to undefined, as in Ansible), split the way systemd reads it."""
    import re

    import jinja2
    with open(UNIT_TEMPLATE) as handle:
        text = handle.read()
    expression = re.search(r"^ExecStartPre=(\{\{(?:(?!\}\}).)*check_weights\.py.*?\}\})$", text, re.S | re.M)
    env = jinja2.Environment(undefined=jinja2.ChainableUndefined)
    env.filters["model_server_systemd_join"] = ms_filters.systemd_join
    line = env.from_string(expression.group(1)).render(
        serving_spec=spec, model_server_python=python, model_server_libexec_dir=libexec)
    return ms_filters.command_tokens(line)


def _checker(wdir, man, marker, pin, repo="org/tiny", revision="a" * 40, user=None):
    """Run the installed form of the check as the unit runs it: the script and the shared code it
    imports, laid out by the filter the role installs them with (model_server_helper_files), with
    the argv of the unit's ExecStartPre rendered for a serving_spec naming these weights and the
    engine's user (serving_spec.container.user; None: the image's, root)."""
    import subprocess

    from helpers import install_node_checks
    libexec = wdir.parent / "libexec"
    install_node_checks(str(libexec), [CHECKER])
    spec = {"weights": {"dir": str(wdir), "manifest": str(man), "marker": str(marker), "manifest_sha256": pin,
                        "repo": repo, "revision": revision},
            "container": {"user": user}}
    argv = _unit_recheck_argv(spec, sys.executable, str(libexec))
    return subprocess.run(argv, capture_output=True, text=True)


@pytest.mark.parametrize("change,needle", [
    ("none", None),
    ("same size, new mtime", "changed since verification: model-00001.safetensors"),
    ("bytes rewritten, mtime restored", "changed since verification: model-00002.safetensors (size 200000 -> 5"),
    ("file removed", "sub/modeling.py is missing"),
    ("extra file", "files the manifest does not name: evil_extra.py"),
    ("manifest and marker re-bound", "not to the pinned"),
    ("other revision", "the marker names revision"),
    ("marker removed", "no readable verified marker"),
    ("a .cache/ in the node's copy", "files the manifest does not name: .cache/ (hidden directory)"),
    ("symlink to /etc/passwd", "files the manifest does not name: passwd.py (symlink to /etc/passwd)"),
    ("fifo", "files the manifest does not name: sub/pipe (fifo)"),
])
def test_recheck_before_start(tmp_path, capsys, change, needle):
    """Every start of the engine re-checks, without hashing, that the directory is what was
    verified; each change below makes the unit refuse to start, naming what differs."""
    wdir, man, marker = _make_dir(tmp_path, node=True)
    pin = _pin(man)
    _run(verify, {"path": str(wdir), "manifest": str(man), "marker": str(marker), "manifest_sha256": pin,
                  "tool_dirs": []})
    assert _result(capsys)["verified"]
    doc = json.loads(marker.read_text())
    assert set(doc["stats"]) == {"sub/modeling.py", "model-00001.safetensors", "model-00002.safetensors",
                                 "model-00003.safetensors"}
    revision = "a" * 40
    if change == "same size, new mtime":
        os.utime(wdir / "model-00001.safetensors", ns=(0, 1_000_000_000))
    elif change == "bytes rewritten, mtime restored":
        st = os.stat(wdir / "model-00002.safetensors")
        (wdir / "model-00002.safetensors").write_bytes(b"other")
        os.utime(wdir / "model-00002.safetensors", ns=(st.st_atime_ns, st.st_mtime_ns))
    elif change == "file removed":
        (wdir / "sub" / "modeling.py").unlink()
    elif change == "extra file":
        (wdir / "evil_extra.py").write_text("import os\n")
    elif change == "manifest and marker re-bound":
        man.write_text(man.read_text() + "%s  added.bin\n" % ("0" * 64))
        doc["manifest_sha256"] = _pin(man)
        marker.write_text(json.dumps(doc))
    elif change == "other revision":
        revision = "b" * 40
    elif change == "marker removed":
        marker.unlink()
    elif change == "a .cache/ in the node's copy":
        (wdir / ".cache" / "huggingface").mkdir(parents=True)
    elif change == "symlink to /etc/passwd":
        (wdir / "passwd.py").symlink_to("/etc/passwd")
    elif change == "fifo":
        os.mkfifo(wdir / "sub" / "pipe")
    proc = _checker(wdir, man, marker, pin, revision=revision)
    if needle is None:
        assert proc.returncode == 0 and "unchanged since verification" in proc.stdout, proc.stderr
    else:
        assert proc.returncode == 1 and needle in proc.stderr, proc.stderr
        assert "Re-run playbooks/weights.yml" in proc.stderr


def test_touched_file_that_still_verifies_gets_a_fresh_marker(tmp_path, capsys):
    """A copy whose bytes are right but whose mtimes moved (a restore, an rsync -t) verifies
    again and the marker is rewritten with the new stats, so the start check passes."""
    wdir, man, marker = _make_dir(tmp_path, node=True)
    args = {"path": str(wdir), "manifest": str(man), "marker": str(marker), "manifest_sha256": _pin(man),
            "tool_dirs": []}
    _run(verify, args)
    _result(capsys)
    os.utime(wdir / "model-00001.safetensors", ns=(0, 2_000_000_000))
    assert _checker(wdir, man, marker, _pin(man)).returncode == 1
    _run(verify, args)
    res = _result(capsys)
    assert res["verified"] and res["marker_written"]
    assert _checker(wdir, man, marker, _pin(man)).returncode == 0


# --- the engine can read what it serves (no capability: the mode bits alone) --------------

@pytest.mark.parametrize("user,expected", [
    (None, (0, 0)), ("", (0, 0)), ("65534:65534", (65534, 65534)), ("1000", (1000, None)), ("0:0", (0, 0)),
])
def test_engine_identity(user, expected):
    assert common.engine_identity(user) == expected


@pytest.mark.parametrize("user", ["nobody", "1000:", ":1000", "-1", "1000:abc", "1:2:3", "4294967295", "1e3"])
def test_engine_identity_refuses(user):
    with pytest.raises(ValueError, match="serving_spec.container.user"):
        common.engine_identity(user)


@pytest.mark.parametrize("mode,owner,group,uid,gid,want,lacks", [
    (0o644, 0, 0, 65534, 65534, common.READ, False),             # others read
    (0o640, 1000, 1000, 65534, 65534, common.READ, True),        # neither owner nor group
    (0o640, 1000, 65534, 65534, 65534, common.READ, False),      # the group reads
    (0o640, 1000, 0, 65534, None, common.READ, True),            # gid unknown: no group bits
    (0o640, 1000, 1000, 0, 0, common.READ, True),                # root without CAP_DAC_OVERRIDE
    (0o044, 0, 0, 0, 0, common.READ, True),                      # the owner's bits alone decide
    (0o604, 1000, 65534, 65534, 65534, common.READ, True),       # the group's bits alone decide
    (0o755, 0, 0, 65534, 65534, common.READ | common.SEARCH, False),
    (0o754, 0, 0, 65534, 65534, common.READ | common.SEARCH, True),   # listed, not entered
    (0o751, 0, 0, 65534, 65534, common.READ | common.SEARCH, True),   # entered, not listed
])
def test_lacks_access(mode, owner, group, uid, gid, want, lacks):
    """One class of mode bits decides, as the kernel's generic_permission does for a process
    without capabilities: the owner's, else the group's, else the others'."""
    assert common.lacks_access(mode, owner, group, uid, gid, want) is lacks


def test_access_paths_name_every_directory_on_the_way_once():
    assert common.access_paths(["a", "sub/b", "sub/deep/c", "sub/d"]) == [
        ("", True), ("a", False), ("sub", True), ("sub/b", False), ("sub/deep", True), ("sub/deep/c", False),
        ("sub/d", False)]


def _verified(tmp_path, capsys):
    """A node's copy weights_verify verified, its manifest, marker and pin."""
    wdir, man, marker = _make_dir(tmp_path, node=True)
    pin = _pin(man)
    _run(verify, {"path": str(wdir), "manifest": str(man), "marker": str(marker), "manifest_sha256": pin,
                  "repo": "org/tiny", "revision": "a" * 40, "tool_dirs": []})
    assert _result(capsys)["verified"]
    return wdir, man, marker, pin


def _recheck(wdir, man, marker, pin, uid, gid):
    return common.recheck_findings(str(wdir), man.read_bytes(), marker.read_text(), pin, "org/tiny", "a" * 40,
                                   uid, gid)


@pytest.mark.parametrize("case,path,mode,owner,uid,gid,needle", [
    ("file of another user, 0640", "model-00001.safetensors", 0o640, (1000, 1000), 65534, 65534,
     "model-00001.safetensors is not readable by uid 65534 gid 65534 (mode 0640, owner 1000:1000)"),
    ("root reads only through the bits", "model-00002.safetensors", 0o640, (1000, 1000), 0, 0,
     "model-00002.safetensors is not readable by uid 0 gid 0 (mode 0640, owner 1000:1000)"),
    ("root's own file without its read bit", "model-00003.safetensors", 0o044, (0, 0), 0, 0,
     "model-00003.safetensors is not readable by uid 0 gid 0 (mode 0044, owner 0:0)"),
    ("gid not known (docker takes it from the image's passwd)", "model-00001.safetensors", 0o640, (1000, 0),
     65534, None, "model-00001.safetensors is not readable by uid 65534 (mode 0640, owner 1000:0)"),
    ("subdirectory not searchable", "sub", 0o754, (0, 0), 65534, 65534,
     "directory sub is not readable and searchable by uid 65534 gid 65534 (mode 0754, owner 0:0)"),
    ("subdirectory not listable", "sub", 0o711, (0, 0), 65534, 65534,
     "directory sub is not readable and searchable by uid 65534 gid 65534 (mode 0711, owner 0:0)"),
    ("the revision directory itself", "", 0o750, (1000, 1000), 65534, 65534,
     "directory . is not readable and searchable by uid 65534 gid 65534 (mode 0750, owner 1000:1000)"),
    ("readable through the group", "model-00001.safetensors", 0o640, (1000, 65534), 65534, 65534, None),
    ("root owns it, 0600, the engine is root", "model-00001.safetensors", 0o600, (0, 0), 0, 0, None),
    ("as weights_sync leaves it", "model-00001.safetensors", 0o644, (0, 0), 65534, 65534, None),
])
def test_recheck_refuses_what_the_engine_cannot_read(tmp_path, capsys, case, path, mode, owner, uid, gid, needle):
    """On a real directory with real owners and modes (the tests run as root, so chown works):
    the re-check refuses any manifest file, or directory on its way, the engine's uid/gid could
    not read through the mode bits, naming the path, its mode and owner; a copy it can read
    passes. The verification itself is untouched (modes are not what was verified)."""
    if os.geteuid() != 0:
        pytest.skip("chown to another user needs root")
    wdir, man, marker, pin = _verified(tmp_path, capsys)
    target = wdir / path if path else wdir
    os.chown(target, *owner)
    target.chmod(mode)
    changed, unreadable = _recheck(wdir, man, marker, pin, uid, gid)
    assert changed == []
    if needle is None:
        assert unreadable == []
    else:
        assert len(unreadable) == 1 and needle in unreadable[0], unreadable
        assert common.recheck(str(wdir), man.read_bytes(), marker.read_text(), pin, "org/tiny", "a" * 40,
                              uid, gid) == unreadable


def test_the_installed_check_refuses_weights_the_engines_user_cannot_read(tmp_path, capsys):
    """The check as the unit runs it (the argv of its ExecStartPre, --user from
    serving_spec.container.user): a verified copy with a shard 0640 of another user is refused for
    the lab's 65534:65534 and for root, naming the file and the fix; made 0644 it starts."""
    if os.geteuid() != 0:
        pytest.skip("chown to another user needs root")
    wdir, man, marker, pin = _verified(tmp_path, capsys)
    shard = wdir / "model-00002.safetensors"
    os.chown(shard, 1000, 1000)
    shard.chmod(0o640)
    for user, who in (("65534:65534", "uid 65534 gid 65534"), (None, "uid 0 gid 0")):
        proc = _checker(wdir, man, marker, pin, user=user)
        assert proc.returncode == 1, proc.stdout
        assert ("refusing to start: the engine cannot read the weights in %s: model-00002.safetensors is not "
                "readable by %s (mode 0640, owner 1000:1000)" % (wdir, who)) in proc.stderr, proc.stderr
        assert "re-run playbooks/weights.yml" in proc.stderr and "chmod -R o+rX %s" % wdir in proc.stderr
        assert "is not what was verified" not in proc.stderr
    shard.chmod(0o644)
    proc = _checker(wdir, man, marker, pin, user="65534:65534")
    assert proc.returncode == 0 and "readable by uid 65534" in proc.stdout, proc.stderr


def test_the_unit_runs_the_check_as_the_engines_user():
    """The unit's ExecStartPre passes serving_spec.container.user as --user, exactly as docker run
    gets it, and nothing for the image's user (null: root)."""
    spec = {"weights": {"dir": "/w/r", "manifest": "/w/r.m", "marker": "/w/r.v", "manifest_sha256": "0" * 64,
                        "repo": "o/r", "revision": "a" * 40}, "container": {"user": "65534:65534"}}
    argv = _unit_recheck_argv(spec, "/usr/bin/python3", "/usr/local/libexec/mm3")
    assert argv[argv.index("--user") + 1] == "65534:65534"
    assert ms_filters.hardening_args(spec["container"])[-2:] == ["--user", "65534:65534"]
    assert "--user" not in _unit_recheck_argv(dict(spec, container={"user": None}), "/p", "/l")
    assert "--user" not in _unit_recheck_argv({"weights": spec["weights"]}, "/p", "/l")


def test_the_check_refuses_a_user_it_cannot_read(tmp_path, capsys):
    wdir, man, marker, pin = _verified(tmp_path, capsys)
    proc = _checker(wdir, man, marker, pin, user="nobody")
    assert proc.returncode == 1 and "not a numeric uid[:gid]" in proc.stderr


# --- weights_manifest ---------------------------------------------------------------------

REV = "0512cce9a02b4cad311a0bed56bb1b8a90f6afd0"


def _hub_dir(tmp_path, tamper=None):
    """A local dir as `hf download` leaves it, plus the hub listing of the revision."""
    files = {"LICENSE": b"licence text\n", "config.json": b"{}\n", "modeling_m3.py": b"print(1)\n",
             "model-00001.safetensors": os.urandom(100_000)}
    wdir = tmp_path / "dl"
    meta = wdir / ".cache" / "huggingface" / "download"
    meta.mkdir(parents=True)
    tree = []
    for name, data in files.items():
        lfs = name.endswith(".safetensors")
        sha = hashlib.sha256(data).hexdigest()
        blob = common.git_blob_sha1(data)
        entry = {"type": "file", "path": name, "size": len(data), "oid": blob}
        if lfs:
            entry["lfs"] = {"oid": sha, "size": len(data), "pointerSize": 132}
        tree.append(entry)
        (wdir / name).write_bytes(tamper(name, data) if tamper else data)
        (meta / (name + ".metadata")).write_text("%s\n%s\n1795976411.7\n" % (REV, sha if lfs else blob))
    tree.append({"type": "directory", "path": "sub", "oid": "c" * 40, "size": 0})
    return wdir, tree, files


def test_listed_files_and_plan(tmp_path):
    wdir, tree, files = _hub_dir(tmp_path)
    entries = manifest_mod.listed_files(tree)
    assert [e["path"] for e in entries] == sorted(files)
    local = {"LICENSE": {"size": len(files["LICENSE"]), "metadata": {"commit": REV, "etag": entries[0]["oid"]}},
             "config.json": {"size": 1, "metadata": {"commit": REV, "etag": entries[1]["oid"]}}}
    out = manifest_mod.plan(entries, REV, local)
    assert out["complete_files"] == ["LICENSE"] and out["mismatched_files"] == []
    assert out["pending_bytes"] == sum(len(v) for k, v in files.items() if k != "LICENSE")
    assert out["total_bytes"] == sum(len(v) for v in files.values())


@pytest.mark.parametrize("tree,needle", [
    ([], "names no files"),
    ([{"type": "file", "path": "x", "size": 1, "oid": "zz"}], "neither"),
    ([{"type": "file", "path": "x", "size": 1, "oid": "a" * 40, "lfs": {"oid": "short"}}], "not a sha256"),
    ([{"type": "file", "path": "../x", "size": 1, "oid": "a" * 40}], "relative"),
])
def test_listed_files_refuses(tree, needle):
    with pytest.raises(common.ManifestError, match=needle):
        manifest_mod.listed_files(tree)


def test_plan_mismatched_etag_is_not_pending():
    e = {"path": "s", "size": 5, "oid": "a" * 40, "lfs_sha256": H1}
    out = manifest_mod.plan([e], REV, {"s": {"size": 5, "metadata": {"commit": REV, "etag": H2}}})
    assert out["mismatched_files"] == ["s"] and out["pending_files"] == [] and out["complete_files"] == []
    out = manifest_mod.plan([e], REV, {"s": {"size": 5, "metadata": {"commit": "f" * 40, "etag": H1}}})
    assert out["pending_files"] == ["s"] and out["pending_bytes"] == 5


def test_anchor_entry_cases():
    data = b"print(1)\n"
    small = {"path": "m.py", "size": len(data), "oid": common.git_blob_sha1(data), "lfs_sha256": None}
    meta = {"commit": REV, "etag": small["oid"]}
    assert manifest_mod.anchor_entry(small, REV, meta, lambda: data) == (hashlib.sha256(data).hexdigest(), "small")
    with pytest.raises(manifest_mod.AnchorError, match="other bytes"):
        manifest_mod.anchor_entry(small, REV, meta, lambda: b"print(2)\n")
    with pytest.raises(manifest_mod.AnchorError, match="not the pinned"):
        manifest_mod.anchor_entry(small, REV, {"commit": "f" * 40, "etag": small["oid"]}, lambda: data)
    with pytest.raises(manifest_mod.AnchorError, match="no download metadata"):
        manifest_mod.anchor_entry(small, REV, None, lambda: data)
    lfs = {"path": "s", "size": 1, "oid": "a" * 40, "lfs_sha256": H1}
    assert manifest_mod.anchor_entry(lfs, REV, {"commit": REV, "etag": H1}, None) == (H1, "lfs")
    with pytest.raises(manifest_mod.AnchorError, match="served other bytes"):
        manifest_mod.anchor_entry(lfs, REV, {"commit": REV, "etag": H2}, None)


def test_parse_metadata():
    assert manifest_mod.parse_metadata('%s\n"%s"\n1.0\n' % (REV.upper(), H1)) == {"commit": REV, "etag": H1}
    assert manifest_mod.parse_metadata("only-one-line") is None


def test_manifest_main_writes_sha256sum_file(tmp_path, capsys):
    wdir, tree, files = _hub_dir(tmp_path)
    (wdir / ".cache" / "huggingface" / "download" / "x.incomplete").write_bytes(b"partial")
    dest = tmp_path / "dl.manifest.sha256"
    args = {"path": str(wdir), "revision": REV, "tree": tree, "dest": str(dest), "repo": "org/m3"}
    _run(manifest_mod, dict(args, state="planned"))
    res = _result(capsys)
    assert res["pending_files"] == [] and res["stale_incomplete"] == ["x.incomplete"] and not res["changed"]
    _run(manifest_mod, args)
    res = _result(capsys)
    assert res["changed"] and res["lfs_files"] == 1 and res["small_files"] == 3
    assert res["license_sha256"] == hashlib.sha256(files["LICENSE"]).hexdigest()
    assert res["manifest_sha256"] == hashlib.sha256(dest.read_bytes()).hexdigest()
    parsed = dict(common.parse_manifest(dest.read_text()))
    assert parsed == {k: hashlib.sha256(v).hexdigest() for k, v in files.items()}
    # the header names what the manifest is of; sha256sum -c skips it (lines starting with #)
    assert dest.read_text().startswith("# repo: org/m3\n# revision: %s\n" % REV)
    _run(manifest_mod, args)
    assert _result(capsys)["changed"] is False


def test_manifest_main_refuses_other_bytes_and_missing_license(tmp_path, capsys):
    wdir, tree, _files = _hub_dir(tmp_path, tamper=lambda n, d: b"# evil\n" if n == "modeling_m3.py" else d)
    args = {"path": str(wdir), "revision": REV, "tree": tree, "dest": str(tmp_path / "m")}
    _run(manifest_mod, args)
    res = _result(capsys)
    assert res["failed"] and "modeling_m3.py" in res["msg"] and not (tmp_path / "m").exists()
    wdir2, tree2, _ = _hub_dir(tmp_path / "two")
    _run(manifest_mod, {"path": str(wdir2), "revision": REV, "tree": tree2, "dest": str(tmp_path / "m"),
                        "license_file": "LICENCE.md"})
    res = _result(capsys)
    assert res["failed"] and "no LICENCE.md" in res["msg"]
    _run(manifest_mod, {"path": str(wdir2), "revision": REV[:7], "tree": tree2, "dest": str(tmp_path / "m")})
    assert "40-hex" in _result(capsys)["msg"]


def test_manifest_main_pending_refused(tmp_path, capsys):
    wdir, tree, _files = _hub_dir(tmp_path)
    (wdir / "model-00001.safetensors").unlink()
    _run(manifest_mod, {"path": str(wdir), "revision": REV, "tree": tree, "dest": str(tmp_path / "m")})
    res = _result(capsys)
    assert res["failed"] and res["pending_files"] == ["model-00001.safetensors"]


def test_provenance_reads_the_license_digest_with_the_manifest_parser():
    """weights_provenance takes the licence's sha256 from the manifest through parse_manifest (one
    parser), in text and binary mode; a file the manifest does not list gives ''."""
    provenance = load_source("weights_provenance_filters", os.path.join(ROOT, "filter_plugins", "weights_provenance.py"))
    text = "# repo: org/tiny\n%s  LICENSE\n%s *sub/LICENSE.md\n" % (H1, H2)
    assert provenance.manifest_digest(text, "LICENSE") == H1
    assert provenance.manifest_digest(text, "sub/LICENSE.md") == H2
    assert provenance.manifest_digest(text, "NOTICE") == ""
    assert provenance.manifest_digest("not a manifest", "LICENSE") == ""
