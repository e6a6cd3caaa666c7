"""Role documentation is the roles' argument specs, and the prose docs link only to what exists.

A role's option reference is its meta/argument_specs.yml, which `ansible-doc -t role -r roles
NAME` renders (docs/ and the README point there instead of repeating it). So every role under
roles/ has one, with an entry point for every way the project enters it: `main` when the role
has tasks/main.yml, and every tasks file that a role or playbook of the project (roles/,
playbooks/, lab/) reaches with `tasks_from`. Each entry point has a short_description, a tasks
file of its own, and a description on every option, recursively through options/suboptions.
Molecule's verify plays also reach into roles' internal task files on purpose (to provoke a
refusal); those are test probes, not entry points, so molecule/ is not read.

ansible-doc runs once for every role (one process: CI's minutes are counted). The last test
checks that every relative link in README.md and docs/ points to a file that exists (and, for a
link into a Markdown file with #anchor, to a heading of it).
"""
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
ROLES_DIR = ROOT / "roles"
ROLES = sorted(p.name for p in ROLES_DIR.iterdir() if p.is_dir())
CALLER_DIRS = ("roles", "playbooks", "lab")
ROLE_KEYS = {"ansible.builtin.include_role", "ansible.builtin.import_role", "include_role", "import_role"}
DOC_FILES = [ROOT / "README.md"] + sorted((ROOT / "docs").rglob("*.md"))


class _Loader(yaml.SafeLoader):
    """SafeLoader that reads tagged values (!vault, !unsafe) as plain data."""


_Loader.add_multi_constructor("!", lambda loader, suffix, node: (
    loader.construct_scalar(node) if isinstance(node, yaml.ScalarNode) else None))


# --- pure helpers: what is wrong with one spec, where roles are entered ------------------------

def _blank(text):
    if isinstance(text, list):
        return not any(str(line).strip() for line in text)
    return not str(text or "").strip()


def option_problems(options, path):
    """Every option under `path` without a description, recursively through options/suboptions."""
    problems = []
    for name, option in (options or {}).items():
        where = f"{path}.{name}"
        if not isinstance(option, dict):
            problems.append(f"{where}: not a mapping")
            continue
        if _blank(option.get("description")):
            problems.append(f"{where}: no description")
        for key in ("options", "suboptions"):
            if option.get(key):
                problems.extend(option_problems(option[key], f"{where}.{key}"))
    return problems


def spec_problems(spec, required_entry_points, task_files):
    """Problems of one role's parsed argument_specs.yml: missing entry points, an entry point with
    no tasks file, no short_description, an option with no description."""
    specs = (spec or {}).get("argument_specs")
    if not isinstance(specs, dict) or not specs:
        return ["no argument_specs entry point at all"]
    problems = [f"no entry point {name!r} (callers use it: add it to meta/argument_specs.yml)"
                for name in sorted(set(required_entry_points) - set(specs))]
    for name, entry in specs.items():
        if name not in task_files:
            problems.append(f"{name}: entry point without tasks/{name}.yml")
        if not isinstance(entry, dict):
            problems.append(f"{name}: not a mapping")
            continue
        if _blank(entry.get("short_description")):
            problems.append(f"{name}: no short_description")
        problems.extend(option_problems(entry.get("options"), name))
    return problems


def _role_calls(node):
    """(role, tasks_from) of every include_role/import_role with tasks_from inside a YAML tree."""
    if isinstance(node, list):
        for item in node:
            yield from _role_calls(item)
    elif isinstance(node, dict):
        for key, value in node.items():
            if key in ROLE_KEYS and isinstance(value, dict) and value.get("tasks_from"):
                yield str(value.get("name", "")), re.sub(r"\.ya?ml$", "", str(value["tasks_from"]))
            yield from _role_calls(value)


def tasks_from_uses():
    """{role: {entry point: [files that enter it with tasks_from]}} over roles/, playbooks/, lab/."""
    uses = {}
    for top in CALLER_DIRS:
        for path in sorted((ROOT / top).rglob("*.y*ml")):
            if path.suffix not in (".yml", ".yaml") or {"templates", "files"} & set(path.parts):
                continue
            tree = yaml.load(path.read_text(encoding="utf-8"), Loader=_Loader)  # noqa: S506 - SafeLoader subclass
            for role, entry in _role_calls(tree):
                files = uses.setdefault(role, {}).setdefault(entry, [])
                if str(path.relative_to(ROOT)) not in files:
                    files.append(str(path.relative_to(ROOT)))
    return uses


USES = tasks_from_uses()


# --- the checker can fail ------------------------------------------------------------------------

GOOD = {"argument_specs": {"main": {"short_description": "Does one thing", "options": {
    "x_a": {"type": "dict", "description": "A.", "options": {
        "b": {"type": "list", "description": ["B."], "suboptions": {"c": {"description": "C."}}}}}}}}}


def _without(spec, *path):
    """A deep copy of spec with the key at path removed."""
    import copy
    spec = copy.deepcopy(spec)
    node = spec
    for key in path[:-1]:
        node = node[key]
    del node[path[-1]]
    return spec


@pytest.mark.parametrize("spec, required, expected", [
    (GOOD, ["main"], []),
    (_without(GOOD, "argument_specs", "main", "short_description"), ["main"], ["main: no short_description"]),
    (_without(GOOD, "argument_specs", "main", "options", "x_a", "description"), ["main"],
     ["main.x_a: no description"]),
    (_without(GOOD, "argument_specs", "main", "options", "x_a", "options", "b", "suboptions", "c", "description"),
     ["main"], ["main.x_a.options.b.suboptions.c: no description"]),
    (GOOD, ["main", "render"], ["no entry point 'render' (callers use it: add it to meta/argument_specs.yml)"]),
    ({"argument_specs": {}}, ["main"], ["no argument_specs entry point at all"]),
], ids=["complete", "short_description", "option", "suboption", "entry_point", "empty"])
def test_the_spec_check_names_each_gap(spec, required, expected):
    assert spec_problems(spec, required, {"main", "render"}) == expected


def test_a_blank_description_counts_as_missing():
    spec = {"argument_specs": {"main": {"short_description": "S", "options": {
        "x_a": {"description": ["", "  "]}, "x_b": {"description": " "}}}}}
    assert spec_problems(spec, ["main"], {"main"}) == ["main.x_a: no description", "main.x_b: no description"]


def test_an_entry_point_needs_its_tasks_file():
    assert spec_problems(GOOD, ["main"], set()) == ["main: entry point without tasks/main.yml"]


def test_tasks_from_calls_are_found_in_nested_blocks():
    tree = [{"block": [{"ansible.builtin.include_role": {"name": "r", "tasks_from": "x.yml"}}]},
            {"rescue": [{"import_role": {"name": "s", "tasks_from": "y"}}]},
            {"ansible.builtin.include_role": {"name": "t"}}]
    assert list(_role_calls(tree)) == [("r", "x"), ("s", "y")]


# --- every role of the project ---------------------------------------------------------------------

@pytest.mark.parametrize("role", ROLES)
def test_role_spec_documents_every_entry_point_and_option(role):
    spec_file = ROLES_DIR / role / "meta" / "argument_specs.yml"
    assert spec_file.is_file(), f"roles/{role} has no meta/argument_specs.yml: every role input is documented there"
    task_files = {p.stem for p in (ROLES_DIR / role / "tasks").glob("*.yml")}
    required = ({"main"} & task_files) | set(USES.get(role, {}))
    spec = yaml.safe_load(spec_file.read_text(encoding="utf-8"))
    problems = spec_problems(spec, required, task_files)
    callers = {entry: files for entry, files in USES.get(role, {}).items()}
    assert not problems, (f"roles/{role}/meta/argument_specs.yml:\n  " + "\n  ".join(problems)
                          + f"\n(tasks_from callers: {callers})")


def test_every_role_called_with_tasks_from_exists():
    assert not set(USES) - set(ROLES), {role: USES[role] for role in set(USES) - set(ROLES)}


def test_ansible_doc_renders_every_role_in_one_run():
    doc = Path(sys.executable).with_name("ansible-doc")
    proc = subprocess.run([str(doc), "-t", "role", "-r", str(ROLES_DIR), *ROLES], cwd=ROOT,
                          capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, ANSIBLE_NOCOLOR="1", ANSIBLE_FORCE_COLOR="0"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    # "> ROLE: *name* (path)" then "ENTRY POINT: *entry* - short description" (the stars are
    # ansible-doc's bold without colour)
    rendered = {}
    for block in re.split(r"^(?=> ROLE: )", proc.stdout, flags=re.M):
        role = re.match(r"> ROLE: \*?([\w.-]+?)\*? \(", block)
        if role:
            rendered[role.group(1)] = set(re.findall(r"^ENTRY POINT: \*?([\w.-]+?)\*? - ", block, re.M))
    assert set(rendered) == set(ROLES), f"not rendered: {sorted(set(ROLES) - set(rendered))}\n{proc.stderr[-3000:]}"
    for role in ROLES:
        spec = yaml.safe_load((ROLES_DIR / role / "meta" / "argument_specs.yml").read_text(encoding="utf-8"))
        assert rendered[role] == set(spec["argument_specs"]), role


# --- links in README.md and docs/ ------------------------------------------------------------------

def _slug(heading):
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[`*]|\[([^\]]*)\]\([^)]*\)", lambda m: m.group(1) or "", heading.strip().lower())
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def _anchors(path):
    anchors, seen = set(), {}
    text = re.sub(r"^```.*?^```", "", path.read_text(encoding="utf-8"), flags=re.M | re.S)
    for heading in re.findall(r"^#{1,6}\s+(.+?)\s*#*\s*$", text, re.M):
        slug = _slug(heading)
        anchors.add(slug if slug not in seen else f"{slug}-{seen[slug]}")
        seen[slug] = seen.get(slug, 0) + 1
    return anchors


def relative_links(path):
    """Targets of the Markdown links and images of a file, outside code blocks and code spans."""
    text = re.sub(r"^```.*?^```", "", path.read_text(encoding="utf-8"), flags=re.M | re.S)
    text = re.sub(r"`[^`\n]*`", "", text)
    links = re.findall(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)", text)
    links += re.findall(r"^\s*\[[^\]]+\]:\s*(\S+)", text, re.M)
    return [link for link in links if not re.match(r"[a-z][a-z0-9+.-]*:", link, re.I)]


def test_docs_exist():
    assert (ROOT / "docs").is_dir() and len(DOC_FILES) > 1


def broken_links(doc):
    """Each relative link of a Markdown file whose file, or whose heading (#anchor of a .md), is
    missing."""
    broken = []
    for link in relative_links(doc):
        target, _, anchor = link.partition("#")
        dest = (doc.parent / target).resolve() if target else doc
        if not dest.exists():
            broken.append(f"{link}: no such file")
        elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
            broken.append(f"{link}: no heading #{anchor} in {dest.name}")
    return broken


@pytest.mark.parametrize("doc", DOC_FILES, ids=[str(p.relative_to(ROOT)) for p in DOC_FILES])
def test_every_relative_link_points_to_something_that_exists(doc):
    broken = broken_links(doc)
    assert not broken, f"{doc.relative_to(ROOT)}:\n  " + "\n  ".join(broken)


def test_the_link_check_can_fail(tmp_path):
    (tmp_path / "there.md").write_text("# A heading: with `code_name`\n\n## Twice\n\n## Twice\n")
    doc = tmp_path / "doc.md"
    doc.write_text("[ok](there.md#a-heading-with-code_name) [gone](missing.md) `[code](nowhere.md)`\n"
                   "```\n[fenced](nowhere.md)\n```\n[web](https://example.org) [bad](there.md#nope)\n"
                   "[second](there.md#twice-1) [self](#nothing-here)\n")
    assert _anchors(tmp_path / "there.md") == {"a-heading-with-code_name", "twice", "twice-1"}
    assert broken_links(doc) == ["missing.md: no such file", "there.md#nope: no heading #nope in there.md",
                                 "#nothing-here: no heading #nothing-here in doc.md"]
