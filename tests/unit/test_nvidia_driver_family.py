"""The driver's whole package family installs at exactly the pinned version, resolved by the real apt.

The repository is built from RECORDED sources, never from the role's variables:
- tests/standin/fixtures/ubuntu-nvidia-driver/control.<version>: Ubuntu's packaging of the driver
  (canonical/nvidia-graphics-drivers, debian/control, whole) at two releases of branches 580 and 570,
  every binary package of each for amd64 and arm64 (NVIDIA's `sbsa` repository);
- tests/standin/fixtures/nvidia-cuda-repo.Packages: the fabric packages of NVIDIA's repository.
The repository holds a newer release beside the pinned one, as NVIDIA's does (580.105.08 beside
580.95.05). The role's install list (vars/Ubuntu-22.04.yml, filter nvidia_driver_install_list), its
pins (filter nvidia_driver_pins with the family of vars/main.yml) rendered by roles/apt_repository's
own template, then `apt-get --simulate install` in a private apt root: every package of the family
must come at the pinned version, and without the family pin apt refuses the install as on a real node
("Depends: libnvidia-gl-580 (= 580.95.05-0ubuntu1) but 580.105.08-0ubuntu1 is to be installed").
"""
import os
import re
import shutil
import subprocess

import jinja2
import pytest
import yaml

from helpers import ROOT, load_source

nvd = load_source("mm3_nvidia_driver_filters_family", os.path.join(ROOT, "filter_plugins", "nvidia_driver.py"))
CONTROLS = os.path.join(ROOT, "tests", "standin", "fixtures", "ubuntu-nvidia-driver")
FABRIC_INDEX = os.path.join(ROOT, "tests", "standin", "fixtures", "nvidia-cuda-repo.Packages")
PREF_TEMPLATE = os.path.join(ROOT, "roles", "apt_repository", "templates", "apt.pref.j2")
# The revision NVIDIA's Ubuntu repositories give these releases (the fixture's README: the
# repository's own file names, cuda-drivers-580_580.95.05-0ubuntu1 / 580.105.08-0ubuntu1, and
# "libnvidia-compute-570 (= 570.124.06-0ubuntu1)" in NVIDIA/nvidia-installer#33); Ubuntu's archive
# builds the same control as -0ubuntu0.22.04.N.
NVIDIA_REVISION = "-0ubuntu1"
RELATIONS = ("Pre-Depends", "Depends", "Provides", "Conflicts", "Breaks", "Replaces")
# (branch, the pinned release, the newer one the repository also holds, fabric pieces)
CASES = [("580", "580.95.05", "580.105.08", ["fabricmanager", "nscq"]),
         ("570", "570.153.02", "570.172.08", [])]


def paragraphs(text):
    for block in re.split(r"\n\s*\n", text):
        fields, key = {}, None
        for line in block.splitlines():
            if line.startswith("#"):
                continue
            if line[:1] in (" ", "\t") and key:
                fields[key] += "\n" + line.strip()
            elif ":" in line:
                key, value = line.split(":", 1)
                fields[key] = value.strip()
        if fields:
            yield fields


def relation(value, arch, version):
    """A control relation field as the binary package built for `arch` carries it: substitution
    variables set (the versions) or dropped (shlibs/misc: the distribution's own libraries), each
    architecture restriction ([!i386], [amd64]) applied."""
    out = []
    for item in value.replace("\n", " ").split(","):
        item = item.strip().replace("${binary:Version}", version).replace("${source:Version}", version)
        restriction = re.search(r"\[([^\]]*)\]", item)
        if restriction:
            arches = restriction.group(1).split()
            negated = all(a.startswith("!") for a in arches)
            if (arch in [a.lstrip("!") for a in arches]) == negated:
                continue
            item = item[:restriction.start()].strip()
        if item and "${" not in item:
            out.append(item)
    return ", ".join(out)


def control_stanzas(upstream, arch):
    version = upstream + NVIDIA_REVISION
    with open(os.path.join(CONTROLS, "control." + upstream)) as handle:
        text = handle.read()
    for fields in paragraphs(text):
        if "Package" not in fields:
            continue  # the Source paragraph
        arches = fields["Architecture"].split()
        if arch not in arches and "all" not in arches:
            continue
        stanza = {"Package": fields["Package"], "Version": version,
                  "Architecture": "all" if "all" in arches else arch}
        for key in RELATIONS:
            if key in fields:
                value = relation(fields[key], arch, version)
                if value:
                    stanza[key] = value
        yield stanza


def fabric_stanzas(upstream, arch):
    with open(FABRIC_INDEX) as handle:
        for fields in paragraphs(handle.read()):
            if fields.get("Architecture") == arch and fields["Version"].startswith(upstream + "-") \
                    and "X-Distribution" not in fields:
                yield {k: v for k, v in fields.items() if k in ("Package", "Version", "Architecture") + RELATIONS}


def role_install_names(branch, version, arch, fabric):
    """What the role asks apt for: vars/Ubuntu-22.04.yml's driver packages (templated with the
    branch) at the version and revision of the role's table, plus the fabric rows."""
    with open(os.path.join(ROOT, "roles", "nvidia_driver", "vars", "Ubuntu-22.04.yml")) as handle:
        distro = yaml.safe_load(handle)
    with open(os.path.join(ROOT, "roles", "nvidia_driver", "vars", "main.yml")) as handle:
        common = yaml.safe_load(handle)
    names = [jinja2.Template(n).render(nvidia_driver_branch=branch) for n in distro["__nvidia_driver_packages"]]
    revision = nvd.revision(version, distro["__nvidia_driver_revisions"])
    rows = [{"package": n, "version": version + revision, "service": ""} for n in names]
    rows += nvd.install_list(common["__nvidia_driver_components"], fabric, branch, version, arch)["packages"]
    return rows, common


def render_pref(pins):
    with open(PREF_TEMPLATE) as handle:
        template = jinja2.Template(handle.read(), trim_blocks=True)
    entry = {"preferences": pins, "preferences_comment": ["the test's copy"]}
    return template.render(apt_repository_caller="nvidia_driver", __apt_repository_entry=entry)


def apt_root(tmp_path, stanzas, pref):
    """A private apt root (its own sources, lists, preferences and dpkg status): a flat file:
    repository of the stanzas, and, as installed, every package they need that the family does not
    carry (dkms, adduser, libnvidia-egl-wayland1: the distribution's own)."""
    repo = tmp_path / "repo"
    repo.mkdir()
    provided = {s["Package"] for s in stanzas}
    for s in stanzas:
        provided.update(p.split()[0] for p in s.get("Provides", "").split(", ") if p)
    needed = set()
    for s in stanzas:
        for key in ("Depends", "Pre-Depends"):
            for group in s.get(key, "").split(", "):
                for alternative in group.split("|"):
                    name = alternative.strip().split(" ")[0].split(":")[0]
                    if name and name not in provided:
                        needed.add(name)
    lines = []
    for s in stanzas:
        lines += ["%s: %s" % (k, v) for k, v in s.items()]
        lines += ["Filename: ./%s_%s_%s.deb" % (s["Package"], s["Version"], s["Architecture"]),
                  "Size: 1", "MD5sum: " + "0" * 32, ""]
    (repo / "Packages").write_text("\n".join(lines))
    status = []
    for name in sorted(needed):
        status += ["Package: " + name, "Status: install ok installed", "Version: 1", "Architecture: all",
                   "Maintainer: stand-in", "Description: present on the node", ""]
    (tmp_path / "status").write_text("\n".join(status))
    for d in ("lists/partial", "cache/archives/partial", "preferences.d"):
        (tmp_path / d).mkdir(parents=True)
    (tmp_path / "preferences.d" / "nvidia-driver.pref").write_text(pref)
    (tmp_path / "sources.list").write_text("deb [trusted=yes] file:%s ./\n" % repo)
    return tmp_path


def apt(root, arch, *args):
    options = ["-o", "Dir::Etc::sourcelist=%s/sources.list" % root, "-o", "Dir::Etc::sourceparts=-",
               "-o", "Dir::Etc::preferences=%s/none" % root, "-o", "Dir::Etc::preferencesparts=%s/preferences.d" % root,
               "-o", "Dir::State::Lists=%s/lists" % root, "-o", "Dir::Cache=%s/cache" % root,
               "-o", "Dir::State::status=%s/status" % root, "-o", "APT::Architecture=%s" % arch,
               "-o", "APT::Architectures::=%s" % arch, "-o", "Debug::NoLocking=1"]
    return subprocess.run(["apt-get"] + options + list(args), capture_output=True, text=True, check=False)


def simulate(tmp_path, branch, version, newer, arch, fabric, family=True):
    rows, common = role_install_names(branch, version, arch, fabric)
    pins = nvd.pins(rows, 1001, common["__nvidia_driver_family"] if family else [])
    stanzas = [s for v in (version, newer) for s in list(control_stanzas(v, arch)) + list(fabric_stanzas(v, arch))]
    root = apt_root(tmp_path, stanzas, render_pref(pins))
    update = apt(root, arch, "update")
    assert update.returncode == 0, update.stdout + update.stderr
    return apt(root, arch, "--simulate", "--no-install-recommends", "install", *nvd.apt_names(rows)), stanzas


needs_apt = pytest.mark.skipif(not shutil.which("apt-get"), reason="needs apt-get (Debian/Ubuntu)")


@needs_apt
@pytest.mark.parametrize("arch", ["amd64", "arm64"])
@pytest.mark.parametrize("branch, version, newer, fabric", CASES)
def test_the_whole_family_installs_at_the_pinned_version(tmp_path, branch, version, newer, fabric, arch):
    result, stanzas = simulate(tmp_path, branch, version, newer, arch, fabric)
    assert result.returncode == 0, result.stdout + result.stderr
    installed = dict(re.findall(r"^Inst (\S+) \((\S+)", result.stdout, re.M))
    family = {s["Package"] for s in stanzas}
    assert len(installed) >= 15, installed  # the driver's siblings came with it, not only the five named
    assert set(installed) <= family
    assert {name: v for name, v in installed.items() if not v.startswith(version + "-")} == {}


@needs_apt
@pytest.mark.parametrize("branch, version, newer, fabric", CASES)
def test_without_the_family_pin_apt_refuses_the_install(tmp_path, branch, version, newer, fabric):
    """The protection: pinning only the named packages (what the role did before) leaves each
    sibling's candidate at the newer release, and the named packages' (= version) cannot be met."""
    result, _ = simulate(tmp_path, branch, version, newer, "amd64", fabric, family=False)
    assert result.returncode != 0
    assert re.search(r"Depends: \S+-%s\S* \(= %s-0ubuntu1\) but %s-0ubuntu1 is to be installed"
                     % (branch, re.escape(version), re.escape(newer)), result.stdout + result.stderr), \
        result.stdout + result.stderr


def test_the_pins_hold_the_named_packages_and_the_family_at_each_version():
    rows = [{"package": "nvidia-driver-580-open", "version": "580.95.05-0ubuntu1"},
            {"package": "nvidia-fabricmanager", "version": "580.95.05-1"},
            {"package": "nvlsm", "version": None}]
    assert nvd.pins(rows, 1001, ["/nvidia/"]) == [
        {"packages": ["nvidia-driver-580-open", "/nvidia/"], "pin": "version 580.95.05-0ubuntu1", "priority": 1001},
        {"packages": ["nvidia-fabricmanager", "/nvidia/"], "pin": "version 580.95.05-1", "priority": 1001}]
