"""Record SGLang's `sglang serve` argument list whole from its source, where no SGLang image or
install is at hand (the project's machines have no GPU image of SGLang).

    python3 -m venv /tmp/rec && /tmp/rec/bin/pip install msgspec pyyaml
    pip download sglang==0.5.23 --no-deps -d /tmp/sgl
    /tmp/rec/bin/python tools/engine_args/record_sglang_source.py /tmp/sgl/sglang-0.5.23-*.whl \
        > roles/serving/files/engine_args/sglang-0.5.23.json

The argument is an SGLang wheel or a source tree holding the `sglang` package (a checkout's
`python/`). Since SGLang 0.5.2x most options are no longer `add_argument` calls but annotated
fields (`A[T, Arg(...)]` in sglang/srt/arg_groups/fields/*.py) that
sglang.srt.arg_groups.arg_utils.add_cli_args_from_dataclass turns into argparse actions, and
ServerArgs is assembled from those namespaces at import time. So this does not re-implement
that translation: it runs SGLang's own declaration code - server_args.py, arg_groups/arg_utils.py,
argparse_actions.py, choices.py, field_order.py, fields/*.py and the parser-name lists - from the
given source, and builds the parser exactly as prepare_server_args does
(argparse.ArgumentParser(prog="sglang serve") + ServerArgs.add_cli_args). Everything else that
server_args.py imports (torch-backed helpers: type parsers such as human_readable_int, platform
checks, environment switches) is a stand-in: a module-level constant that is a literal in its
real file is read from that file (ast.literal_eval); anything else becomes a placeholder callable
named like the original, so a recorded `type` names the real parser function. Environment
switches read as unset. The output lists every stand-in it used (`source.stand_ins`).

The JSON has the same shape as tools/engine_args/dump_parser.py writes from an image (parser,
actions, probes), with a `source` header naming the wheel or tree, its sha256 and the git blob
sha of every file that was executed.
"""
import argparse
import ast
import hashlib
import importlib.abc
import importlib.machinery
import importlib.util
import json
import os
import sys
import tempfile
import types
import zipfile

HERE = os.path.dirname(os.path.abspath(__file__))

# SGLang modules whose real code declares the options (executed from the given source).
DECLARATION_MODULES = (
    "sglang.srt.server_args",
    "sglang.srt.arg_groups.arg_utils",
    "sglang.srt.arg_groups.argparse_actions",
    "sglang.srt.arg_groups.choices",
    "sglang.srt.arg_groups.field_order",
    "sglang.srt.arg_groups.fields",
    "sglang.srt.parser.reasoning_parser_names",
    "sglang.srt.function_call.parser_names",
    "sglang.kernels.ops.kv_canary.consts",
)
DECLARATION_PREFIXES = ("sglang.srt.arg_groups.fields.",)


def git_blob_sha(data):
    """The sha git gives the file's content (git hash-object)."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


class Placeholder:
    """Stands in for a name that only heavy (torch-backed) SGLang code defines."""

    def __init__(self, name, used):
        self.__name__ = self.__qualname__ = name.rsplit(".", 1)[-1]
        self._full = name
        self._used = used

    def __getattr__(self, key):
        if key.startswith("__") and key.endswith("__"):
            raise AttributeError(key)
        self._used.add("%s.%s" % (self._full, key))
        return Placeholder("%s.%s" % (self._full, key), self._used)

    def __call__(self, *args, **kwargs):
        if len(args) == 1 and callable(args[0]) and not kwargs and not isinstance(args[0], Placeholder):
            return args[0]  # used as a decorator
        return Placeholder(self._full + "()", self._used)

    def __mro_entries__(self, bases):
        return (object,)

    def __bool__(self):
        return False  # an environment switch or platform check: off

    def __iter__(self):
        return iter(())

    def __getitem__(self, key):
        return self

    def __or__(self, other):
        return self

    __ror__ = __or__

    def __repr__(self):
        return "<stand-in %s>" % self._full


class StandInModule(types.ModuleType):
    """A heavy module: literal constants read from its real file, placeholders for the rest."""

    def __init__(self, name, path, used):
        super().__init__(name)
        self.__path__ = []
        self._literals = {}
        self._used = used
        if path and os.path.isfile(path):
            with open(path, "rb") as handle:
                tree = ast.parse(handle.read())
            for node in tree.body:
                targets = node.targets if isinstance(node, ast.Assign) else (
                    [node.target] if isinstance(node, ast.AnnAssign) and node.value is not None else [])
                for target in targets:
                    if isinstance(target, ast.Name):
                        try:
                            self._literals[target.id] = ast.literal_eval(node.value)
                        except ValueError:
                            pass

    def __getattr__(self, key):
        if key.startswith("__") and key.endswith("__"):
            raise AttributeError(key)
        if key in self._literals:
            self._used.add("%s.%s (literal from its file)" % (self.__name__, key))
            return self._literals[key]
        self._used.add("%s.%s" % (self.__name__, key))
        return Placeholder("%s.%s" % (self.__name__, key), self._used)


class SourceFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Imports the declaration modules from `root`, every other sglang module as a stand-in,
    packages without running their __init__."""

    def __init__(self, root):
        self.root = root
        self.used = set()
        self.stand_ins = set()
        self.executed = {}

    def _path(self, name):
        base = os.path.join(self.root, *name.split("."))
        if os.path.isfile(base + ".py"):
            return base + ".py", False
        if os.path.isfile(os.path.join(base, "__init__.py")):
            return os.path.join(base, "__init__.py"), True
        return None, os.path.isdir(base)

    def find_spec(self, name, path, target=None):
        top = name.split(".")[0]
        if top != "sglang":
            if importlib.machinery.PathFinder.find_spec(name, path) is not None or name in sys.builtin_module_names:
                return None
            if top in ("msgspec", "yaml"):
                return None  # real dependencies of the declaration code: install them
        file, is_pkg = self._path(name) if top == "sglang" else (None, False)
        declared = name in DECLARATION_MODULES or name.startswith(DECLARATION_PREFIXES)
        if declared and file:
            spec = importlib.util.spec_from_file_location(name, file, submodule_search_locations=(
                [os.path.dirname(file)] if is_pkg else None))
            with open(file, "rb") as handle:
                self.executed[os.path.relpath(file, self.root)] = git_blob_sha(handle.read())
            return spec
        return importlib.machinery.ModuleSpec(name, self, is_package=True, origin=file)

    def create_module(self, spec):
        file, is_pkg = self._path(spec.name)
        if is_pkg and not (spec.name in DECLARATION_MODULES):
            module = types.ModuleType(spec.name)  # a package: its __init__ is not run
            module.__path__ = [os.path.join(self.root, *spec.name.split("."))]
            return module
        self.stand_ins.add(spec.name)
        return StandInModule(spec.name, file, self.used)

    def exec_module(self, module):
        pass


def unpack(source):
    """A source tree for `source`: the directory itself, or a wheel unpacked into a temporary one."""
    if os.path.isdir(source):
        return source, None
    target = tempfile.mkdtemp(prefix="sglang-src-")
    with zipfile.ZipFile(source) as wheel:
        for member in wheel.namelist():
            if member.startswith("sglang/") and member.endswith(".py"):
                wheel.extract(member, target)
        info = wheel.getinfo("sglang/srt/server_args.py")
    with open(source, "rb") as handle:
        digest = hashlib.sha256(handle.read()).hexdigest()
    return target, {"sha256": digest, "server_args_py_date": "%04d-%02d-%02d" % info.date_time[:3]}


def literal_version(root):
    path = os.path.join(root, "sglang", "_version.py")
    if not os.path.isfile(path):
        return None, None
    found = {}
    with open(path) as handle:
        for node in ast.parse(handle.read()).body:
            if isinstance(node, ast.Assign):
                for target in node.targets:
                    if isinstance(target, ast.Name):
                        try:
                            found[target.id] = ast.literal_eval(node.value)
                        except ValueError:
                            pass
    return found.get("__version__"), found.get("__commit_id__")


def main():
    cli = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    cli.add_argument("source", help="an SGLang wheel, or a directory holding the sglang package")
    cli.add_argument("--origin", default=None, help="where the wheel or tree came from (recorded as is)")
    options = cli.parse_args()
    root, wheel = unpack(options.source)
    version, commit = literal_version(root)

    sys.path.insert(0, HERE)
    import dump_parser  # the same record shape as from an image

    finder = SourceFinder(root)
    sys.meta_path.insert(0, finder)
    os.environ.pop("SGLANG_KV_CANARY_ENABLE_TOKEN_ORACLE", None)
    server_args = importlib.import_module("sglang.srt.server_args")
    parser = argparse.ArgumentParser(prog="sglang serve")
    server_args.ServerArgs.add_cli_args(parser)
    record = dump_parser.parser_record(parser)
    probes = dump_parser.sglang_probes(parser)

    with open(os.path.join(root, "sglang", "srt", "server_args.py"), "rb") as handle:
        server_args_blob = git_blob_sha(handle.read())
    header = {
        "engine": "sglang",
        "version": version,
        "python": sys.version.split()[0],
        "recorded_from": "SGLang's own declaration code, executed from its source "
                         "(tools/engine_args/record_sglang_source.py)",
        "source": os.path.basename(options.source),
        "source_sha256": (wheel or {}).get("sha256"),
        "server_args_py_date_in_wheel": (wheel or {}).get("server_args_py_date"),
        "origin": options.origin,
        "commit_id_in_source": commit,
        "server_args_py_blob_sha": server_args_blob,
        "executed_files": dict(sorted(finder.executed.items())),
        "stand_ins": sorted(finder.used),
        "recorded_with": "tools/engine_args/record_sglang_source.py (tools/engine_args/dump_parser.py)",
    }
    out = {"source": header}
    out.update(record)
    out["command"] = ["sglang", "serve"]
    out["probes"] = probes
    json.dump(out, sys.stdout, indent=1)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
