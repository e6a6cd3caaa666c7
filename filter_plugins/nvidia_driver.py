# -*- coding: utf-8 -*-
"""Filters of the `nvidia_driver` role: the exact package names and versions for the driver
branch and the node's architecture, as NVIDIA's CUDA repository names them (which fabric pieces a
node gets is hardware_fabric_plan, filter_plugins/hardware.py).

Pure functions; tests/unit/test_nvidia_driver_filters.py resolves the install list against the
recorded index of NVIDIA's repository (tests/standin/fixtures/nvidia-cuda-repo.Packages) for
branches 570 and 580, amd64 and arm64.
"""
from __future__ import annotations


from ansible.errors import AnsibleFilterError
from ansible_collections.mm3.shared.plugins.module_utils.validation import ip_address


def package_name(component, branch):
    """The package's name for a driver branch: NVIDIA's repository carries the branch in the name
    up to 575 (nvidia-fabricmanager-570) and not from 580 on (nvidia-fabricmanager, which only
    Provides nvidia-fabricmanager-580: a virtual name cannot be pinned with =version)."""
    name = str(component["package"])
    below = component.get("branch_named_below")
    if below is not None and int(branch) < int(below):
        return "%s-%s" % (name, branch)
    return name


def install_list(table, chosen, branch, version, arch):
    """Every chosen component as {component, package, version (None: not pinned), service}, or a
    blocker for one that NVIDIA does not build for this architecture (libnvsdm has no arm64)."""
    rows, blockers = [], []
    for key in chosen:
        if key not in table:
            raise AnsibleFilterError("nvidia_driver: no package data for component %r" % (key,))
        component = table[key]
        arches = component.get("arches")
        if arches and arch not in arches:
            if component.get("optional_on_other_arches"):
                continue
            blockers.append("%s is not built for %s (only %s)" % (package_name(component, branch), arch,
                                                                    ", ".join(arches)))
            continue
        pinned = bool(component.get("same_version"))
        rows.append({
            "component": key,
            "package": package_name(component, branch),
            "version": ("%s%s" % (version, component.get("revision", "-1"))) if pinned else None,
            "service": component.get("service") or "",
        })
    return {"packages": rows, "blockers": blockers}


def apt_names(rows):
    """apt's name=version (or the bare name for an unpinned package)."""
    return ["%s=%s" % (row["package"], row["version"]) if row.get("version") else row["package"] for row in rows]


def pins(rows, priority, family):
    """apt's pins for the install list (the preferences roles/apt_repository writes): one per
    pinned version, holding the named packages and every package of the driver's family at exactly
    that version. `family` is apt's regular expressions for the family's names (apt_preferences(5):
    a /regex/ in Package: expands to every package whose name matches; a version pin under
    `Package: *` is not understood). The named package's Depends ask for its siblings at
    `(= version)`, and apt otherwise picks each sibling's newest version, so the install stops
    ("Depends: libnvidia-compute-580 (= 580.95.05-0ubuntu1) but 580.159.04-1ubuntu1 is to be
    installed") as soon as the repository holds a newer release, and a later apt upgrade splits the
    family. The version must match exactly, so a name the pattern also matches is pinned only at
    the driver's own version: nothing else is pulled in or held."""
    family = [str(pattern) for pattern in family or []]
    grouped = {}
    for row in rows:
        if row.get("version"):
            grouped.setdefault(str(row["version"]), []).append(str(row["package"]))
    return [{"packages": grouped[version] + family, "pin": "version " + version, "priority": priority}
            for version in sorted(grouped)]


def persistenced_exec(unit_text, fallback):
    """The ExecStart= of nvidia-persistenced in persistence mode, from the unit its package installed:
    the package's own command line (its --user and --group: nvidia-persistenced on Ubuntu's
    packages, nvpd on Debian's, whose postinst creates that user, none in NVIDIA's own Ubuntu
    packaging; tests/standin/fixtures/nvidia-persistenced) with --no-persistence-mode
    dropped and --persistence-mode added. `fallback` (the distribution's documented line) only
    where no unit is installed yet (a check run ahead of the packages). Refuses a unit whose last
    ExecStart= does not run nvidia-persistenced or holds what a drop-in's one line cannot carry."""
    text = str(unit_text or "")
    if not text.strip():
        return str(fallback)
    section, line = None, None
    for raw in text.splitlines():
        stripped = raw.strip()
        if stripped.startswith("[") and stripped.endswith("]"):
            section = stripped
        elif section == "[Service]" and stripped.startswith("ExecStart="):
            line = stripped[len("ExecStart="):].strip() or None  # an empty ExecStart= resets the list
    tokens = line.split() if line else []
    # systemd's prefixes (-, @, :, +, !) go with the program; only a plain path is carried over
    program = tokens[0].lstrip("-@:+!") if tokens else ""
    if not program.endswith("/nvidia-persistenced") or any('"' in t or "'" in t or "\\" in t for t in tokens):
        raise AnsibleFilterError(
            "nvidia_driver cannot read the persistence daemon's command from its installed unit (ExecStart=%s): "
            "it must run /usr/bin/nvidia-persistenced with plain options. Reinstall the nvidia-persistenced "
            "package, or remove a local unit that replaces it." % (line or "",))
    args = [t for t in tokens[1:] if t != "--no-persistence-mode"]
    if "--persistence-mode" not in args:
        args.append("--persistence-mode")
    return " ".join([program] + args)


def imex_nodes(addresses, hosts=None):
    """IMEX's nodes_config.cfg lines: one IP address per node of the NVLink domain ("Before starting
    the service, an administrator ... must populate the IP address information of all involved
    nodes in nodes_config.cfg", NVIDIA IMEX guide, deployment). Refuses what IMEX cannot use: a
    name, a missing address, a duplicate, an empty list."""
    hosts = list(hosts or [])
    lines, problems, seen = [], [], set()
    for index, address in enumerate(addresses or []):
        who = hosts[index] if index < len(hosts) else "entry %d" % (index + 1)
        ip = ip_address(str(address).strip())
        if ip is None:
            problems.append("%s: %r is not an IP address" % (who, address))
            continue
        if str(ip) in seen:
            problems.append("%s: %s is listed twice" % (who, ip))
        seen.add(str(ip))
        lines.append(str(ip))
    if not lines and not problems:
        problems.append("no node address at all")
    if problems:
        raise AnsibleFilterError(
            "nvidia_driver refuses the IMEX node list (%s). Set nvidia_driver_imex_nodes to the IP address of "
            "every node of this NVLink domain (one compute tray each), or give each node a default IPv4 "
            "address (ansible_facts.default_ipv4)." % "; ".join(problems))
    return lines


def _version_key(version):
    return [int(part) for part in str(version).split(".") if part.isdigit()]


def revision(version, table):
    """The Debian revision NVIDIA's repository gives the driver packages at this version: the last
    entry of table ([{from, revision}], ascending) whose `from` the version reaches. NVIDIA's Ubuntu
    repositories changed it within branch 580 (580.105.08-0ubuntu1, then 580.126.09-1ubuntu1);
    Debian's is -1."""
    chosen = None
    for row in table:
        if _version_key(version) >= _version_key(row["from"]):
            chosen = row["revision"]
    if chosen is None:
        raise AnsibleFilterError("nvidia_driver: no driver package revision is known for %r" % (version,))
    return chosen


class FilterModule(object):
    def filters(self):
        return {
            "nvidia_driver_install_list": install_list,
            "nvidia_driver_apt_names": apt_names,
            "nvidia_driver_pins": pins,
            "nvidia_driver_persistenced_exec": persistenced_exec,
            "nvidia_driver_imex_nodes": imex_nodes,
            "nvidia_driver_revision": revision,
        }
