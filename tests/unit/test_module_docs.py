"""Every custom module in library/ (the folder is the list: a new module is tested here at once):
its documentation renders with ansible-doc (what operators read; one ansible-doc process for all
of them), and its DOCUMENTATION options say what its argument_spec does - names, types, required,
defaults, choices, elements, aliases and suboptions, recursively - so a drifted option fails.

The argument_spec is the one main() really passes: AnsibleModule.__init__ is replaced by one that
records its arguments and stops, and main() runs under patch_module_args with no arguments. So
`choices=SOME_SHARED_CONSTANT` (or any expression) is compared by value, as Ansible sees it.
"""
import os
import re
import subprocess
import sys
from pathlib import Path
from unittest import mock

import pytest
import yaml
from ansible.module_utils import basic
from ansible.module_utils.testing import patch_module_args

from helpers import load_source

ROOT = Path(__file__).resolve().parents[2]
LIBRARY = ROOT / "library"
MODULES = sorted(p.stem for p in LIBRARY.glob("*.py") if not p.name.startswith("_"))


class _Stop(Exception):
    """Raised by the recording AnsibleModule.__init__ once it has the arguments."""


def module_source(name):
    """The module file loaded under a name of its own (not the one other tests give it)."""
    return load_source("_module_docs_" + name, str(LIBRARY / (name + ".py")))


def module_call(name):
    """The keyword arguments main() gives AnsibleModule (argument_spec, supports_check_mode, ...)."""
    module = module_source(name)
    recorded = {}

    def record(self, *args, **kwargs):
        assert not args, "AnsibleModule(...) with positional arguments in %s" % name
        recorded.update(kwargs)
        raise _Stop()

    with mock.patch.object(basic.AnsibleModule, "__init__", record), patch_module_args({}):
        with pytest.raises(_Stop):
            module.main()
    return module, recorded


def documented(name):
    module = module_source(name)
    return module, yaml.safe_load(module.DOCUMENTATION)


def _as_list(value):
    """Choices or aliases in a comparable form (a constant may be a tuple)."""
    return None if value is None else list(value)


def drift(doc_options, spec_options, where="options"):
    """Every difference between DOCUMENTATION options and an argument_spec, as readable lines."""
    doc_options, spec_options = doc_options or {}, spec_options or {}
    problems = []
    for name in sorted(set(doc_options) ^ set(spec_options)):
        problems.append("%s.%s: %s" % (where, name, "documented only" if name in doc_options
                                                     else "in argument_spec only"))
    for name in sorted(set(doc_options) & set(spec_options)):
        doc, spec, at = doc_options[name] or {}, spec_options[name] or {}, "%s.%s" % (where, name)
        facts = {
            "type": (doc.get("type", "str"), spec.get("type", "str")),
            "required": (bool(doc.get("required", False)), bool(spec.get("required", False))),
            "default": (doc.get("default"), spec.get("default")),
            "choices": (_as_list(doc.get("choices")), _as_list(spec.get("choices"))),
            "elements": (doc.get("elements"), spec.get("elements")),
            "aliases": (sorted(doc.get("aliases") or []), sorted(spec.get("aliases") or [])),
        }
        for fact, (in_doc, in_spec) in facts.items():
            if in_doc != in_spec:
                problems.append("%s: %s documented %r, argument_spec %r" % (at, fact, in_doc, in_spec))
        if "suboptions" in doc or "options" in spec:
            problems.extend(drift(doc.get("suboptions"), spec.get("options"), at))
    return problems


def test_library_has_modules():
    assert len(MODULES) >= 5, MODULES


@pytest.fixture(scope="module")
def rendered():
    """ansible-doc's text for every module, one process: {module name: its section}."""
    doc = Path(sys.executable).with_name("ansible-doc")
    proc = subprocess.run([str(doc), "-M", str(LIBRARY)] + MODULES, cwd=ROOT, capture_output=True,
                          text=True, timeout=300, env=dict(os.environ, ANSIBLE_NOCOLOR="1"))
    assert proc.returncode == 0, proc.stderr
    # ansible-doc exits 0 when a module is missing or its documentation cannot be read; it warns
    assert "WARNING" not in proc.stderr and "ERROR" not in proc.stderr, proc.stderr
    sections = re.split(r"^> MODULE ", proc.stdout, flags=re.M)
    return {section.split()[0]: section for section in sections[1:]}


@pytest.mark.parametrize("name", MODULES)
def test_ansible_doc_renders(rendered, name):
    assert name in rendered, sorted(rendered)
    text = rendered[name]
    assert "OPTIONS" in text and "EXAMPLES" in text and "RETURN VALUES" in text, text[:500]


@pytest.mark.parametrize("name", MODULES)
def test_documentation_matches_argument_spec(name):
    module, call = module_call(name)
    doc = yaml.safe_load(module.DOCUMENTATION)
    assert doc["module"] == name
    assert drift(doc["options"], call["argument_spec"]) == []


@pytest.mark.parametrize("name", MODULES)
def test_check_mode_is_documented_as_main_declares_it(name):
    """attributes.check_mode (the style's DOCUMENTATION block) agrees with supports_check_mode."""
    module, call = module_call(name)
    support = yaml.safe_load(module.DOCUMENTATION).get("attributes", {}).get("check_mode", {}).get("support")
    assert support in ("full", "partial", "none"), "%s: DOCUMENTATION has no attributes.check_mode.support" % name
    assert (support != "none") == bool(call.get("supports_check_mode", False)), (support, call.get("supports_check_mode"))


@pytest.mark.parametrize("name", MODULES)
def test_examples_and_return_are_yaml(name):
    module = module_source(name)
    assert yaml.safe_load(module.EXAMPLES)
    assert isinstance(yaml.safe_load(module.RETURN), dict)


# The comparison can fail: each kind of drift is reported (a DOCUMENTATION option edited by hand).
SPEC = {"mode": {"type": "str", "choices": ("a", "b"), "default": "a"},
        "items": {"type": "list", "elements": "dict", "options": {"path": {"type": "path", "required": True}}}}
DOC = {"mode": {"type": "str", "choices": ["a", "b"], "default": "a", "description": "x"},
       "items": {"type": "list", "elements": "dict", "description": "x",
                 "suboptions": {"path": {"type": "path", "required": True, "description": "x"}}}}


def test_identical_options_show_no_drift():
    assert drift(DOC, SPEC) == []


@pytest.mark.parametrize("path,value,needle", [
    (("mode", "type"), "raw", "options.mode: type documented 'raw'"),
    (("mode", "default"), "b", "options.mode: default documented 'b'"),
    (("mode", "choices"), ["a"], "options.mode: choices documented ['a']"),
    (("mode", "aliases"), ["m"], "options.mode: aliases documented ['m']"),
    (("mode", "required"), True, "options.mode: required documented True"),
    (("items", "elements"), "str", "options.items: elements documented 'str'"),
    (("items", "suboptions", "path", "required"), False, "options.items.path: required documented False"),
    (("items", "suboptions", "extra"), {"type": "str"}, "options.items.extra: documented only"),
    (("gone",), {"type": "str"}, "options.gone: documented only"),
])
def test_each_kind_of_drift_is_reported(path, value, needle):
    import copy

    doc = copy.deepcopy(DOC)
    target = doc
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    assert any(line.startswith(needle) for line in drift(doc, SPEC)), drift(doc, SPEC)


def test_an_undocumented_spec_option_is_reported():
    assert drift({"mode": DOC["mode"]}, SPEC) == ["options.items: in argument_spec only"]
