"""A bytecode cache for code imported from zip archives: on the lab's and CI's test hosts, and in
the controller's .venv (scripts/bootstrap.sh), never on a node.

Every Ansible module task starts a new Python that imports the module and ansible.module_utils
from the task's AnsiballZ zip. zipimport keeps no bytecode, so each task compiles the same
sources again: about a third of the host CPU a module task costs on a test host (359 ms without
this cache, 244 ms with it, bench/module_task_bench.py). A real node pays that too; CI pays it
for thousands of tasks on two cores. This hook, loaded at interpreter start by
mm3-zipimport-cache.pth (images/debian-systemd/Dockerfile), keeps what zipimport compiles: the key is the sha256 of the
interpreter's cache tag and the source bytes, the entry the marshalled code object; a hit is
loaded and its file names are pointed at the current archive, as importlib does for a .pyc.
What runs is what the compiler makes of the same source, so no module behaves differently.

Off when the directory does not exist or MM3_ZIPIMPORT_CACHE=off is in the environment. The
directory is root's (0755): only root writes entries, anyone reads them, so no user can plant
code that root's tasks run. Any error reading or writing an entry falls back to compiling.
"""
import os
import sys
import zipimport

CACHE_DIR = "/var/cache/mm3-zipimport-pyc"
_compile_source = getattr(zipimport, "_compile_source", None)


def entry_key(source):
    """The cache key of `source` (bytes) for this interpreter: sha256 hex of tag NUL source."""
    import hashlib

    tag = (sys.implementation.cache_tag or "").encode()
    return hashlib.sha256(tag + b"\0" + source).hexdigest()


def load(entry, pathname):
    """The code object cached in the file `entry`, its file names set to `pathname`; None on a
    miss or an entry that does not load."""
    import _imp
    import marshal
    import types

    try:
        with open(entry, "rb") as f:
            code = marshal.loads(f.read())
    except (OSError, EOFError, ValueError, TypeError):
        return None
    if not isinstance(code, types.CodeType):
        return None
    _imp._fix_co_filename(code, pathname)
    return code


def store(entry, code):
    """Write `code` to the file `entry` (a temporary file renamed into place, so a reader never
    sees half an entry); nothing happens where the directory is not writable."""
    import marshal

    tmp = "%s.%d.tmp" % (entry, os.getpid())
    try:
        with open(tmp, "wb") as f:
            f.write(marshal.dumps(code))
        os.replace(tmp, entry)
    except OSError:
        try:
            os.unlink(tmp)
        except OSError:
            pass


def cached_compile(directory):
    """A replacement for zipimport._compile_source that reads and fills `directory`."""

    def compile_source(pathname, source):
        entry = os.path.join(directory, entry_key(source))
        code = load(entry, pathname)
        if code is None:
            code = _compile_source(pathname, source)
            store(entry, code)
        return code

    return compile_source


def install(directory=CACHE_DIR):
    """Route zipimport's compiles through the cache in `directory`; True when installed."""
    if _compile_source is None or os.environ.get("MM3_ZIPIMPORT_CACHE") == "off":
        return False
    if not os.path.isdir(directory):
        return False
    zipimport._compile_source = cached_compile(directory)
    return True
