"""The test hosts' zipimport bytecode cache (images/debian-systemd/mm3_zipimport_cache.py).

Each case runs a real Python in a subprocess that installs the hook on a cache directory and
imports a package from a real zip archive, as an AnsiballZ payload does: the first import fills
the cache, a second process loads from it, and whatever is wrong with an entry (another source,
a broken entry, an unwritable directory, the off switch) ends in the compiler's own result.
"""
import os
import pathlib
import subprocess
import sys
import zipfile

import pytest
from helpers import load_source

ROOT = pathlib.Path(__file__).resolve().parents[2]
HOOK_DIR = ROOT / "images" / "debian-systemd"
# This source, not the copy bootstrap.sh put into the venv (a .pth imported that one at start).
mm3_zipimport_cache = load_source("mm3_zipimport_cache_under_test", str(HOOK_DIR / "mm3_zipimport_cache.py"))

V1 = "def answer():\n    return 'v1'\n\ndef where():\n    raise RuntimeError('here')\n"
V2 = "def answer():\n    return 'v2'\n\ndef where():\n    raise RuntimeError('here')\n"
PROBE = """
import sys, traceback
sys.path.insert(0, {hook!r})
import mm3_zipimport_cache
installed = mm3_zipimport_cache.install({cache!r})
sys.path.insert(0, {archive!r})
from payload import mod
try:
    mod.where()
except RuntimeError:
    frame = traceback.extract_tb(sys.exc_info()[2])[-1]
print(installed, mod.answer(), frame.filename)
"""


def make_archive(path, source):
    """A zip holding package `payload` with module `mod` of `source` (no bytecode in it)."""
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("payload/__init__.py", "")
        z.writestr("payload/mod.py", source)
    return str(path)


def probe(archive, cache, env=None):
    """Import payload.mod from `archive` with the hook on `cache`: (installed, answer, file).
    -S: no site-packages, so the process runs this source of the hook, not the copy bootstrap.sh
    put into the venv (which a .pth loads at start)."""
    out = subprocess.run([sys.executable, "-S", "-c", PROBE.format(hook=str(HOOK_DIR), cache=str(cache),
                                                             archive=archive)],
                         capture_output=True, text=True, check=True,
                         env=dict(os.environ, **(env or {})))
    installed, answer, filename = out.stdout.split()
    return installed == "True", answer, filename


def entries(cache):
    return sorted(p.name for p in pathlib.Path(cache).iterdir())


@pytest.fixture
def cache(tmp_path):
    path = tmp_path / "cache"
    path.mkdir()
    return path


def test_the_first_import_fills_the_cache_and_a_second_process_runs_the_cached_code(tmp_path, cache):
    archive = make_archive(tmp_path / "a.zip", V1)
    assert probe(archive, cache) == (True, "v1", archive + "/payload/mod.py")
    keys = {mm3_zipimport_cache.entry_key(b""), mm3_zipimport_cache.entry_key(V1.encode())}
    assert set(entries(cache)) == keys
    # The second process takes the entry, not the source: an entry replaced by V2's code (what
    # only the cache can give) answers v2 from V1's archive.
    v2 = compile(V2, "elsewhere.py", "exec", dont_inherit=True)
    mm3_zipimport_cache.store(str(cache / mm3_zipimport_cache.entry_key(V1.encode())), v2)
    assert probe(archive, cache)[1] == "v2"


def test_a_cached_entry_names_the_archive_it_is_imported_from_now(tmp_path, cache):
    first = make_archive(tmp_path / "first.zip", V1)
    probe(first, cache)
    second = make_archive(tmp_path / "second.zip", V1)
    installed, answer, filename = probe(second, cache)
    assert (installed, answer) == (True, "v1")
    assert filename == second + "/payload/mod.py"


def test_a_changed_source_is_compiled_not_served_from_the_old_entry(tmp_path, cache):
    probe(make_archive(tmp_path / "a.zip", V1), cache)
    assert probe(make_archive(tmp_path / "b.zip", V2), cache)[1] == "v2"
    assert mm3_zipimport_cache.entry_key(V2.encode()) in entries(cache)


@pytest.mark.parametrize("content", [b"", b"\x00garbage", b"N"], ids=["empty", "garbage", "not code"])
def test_an_entry_that_does_not_load_falls_back_to_the_compiler(tmp_path, cache, content):
    (cache / mm3_zipimport_cache.entry_key(V1.encode())).write_bytes(content)
    assert probe(make_archive(tmp_path / "a.zip", V1), cache)[1] == "v1"


def test_off_when_switched_off_or_without_the_directory(tmp_path, cache):
    archive = make_archive(tmp_path / "a.zip", V1)
    assert probe(archive, cache, {"MM3_ZIPIMPORT_CACHE": "off"})[:2] == (False, "v1")
    assert entries(cache) == []
    assert probe(archive, tmp_path / "missing")[:2] == (False, "v1")
    assert not (tmp_path / "missing").exists()


def test_store_leaves_no_partial_entry_where_the_write_fails(tmp_path):
    missing = tmp_path / "missing"
    mm3_zipimport_cache.store(str(missing / "entry"), compile("x = 1\n", "m.py", "exec"))
    assert not missing.exists()
