# -*- coding: utf-8 -*-
"""Filters of the `gpu_kernel` role: which kernel packages DKMS needs, and what apt can install.
Pure functions; tests/unit/test_gpu_kernel.py replays a recorded `apt-cache policy`
(tests/fixtures/apt-cache) from a Debian 12 machine whose archive no longer holds an older
kernel's headers."""
from __future__ import annotations

import re

from ansible.errors import AnsibleFilterError

# apt-cache policy (apt 2.6): "<name>:" at column 0, then "  Installed: <v>|(none)" and
# "  Candidate: <v>|(none)"; a name apt does not know prints nothing at all.
_NAME = re.compile(r"^(\S+):$")
_FIELD = re.compile(r"^  (Installed|Candidate): (\S+)$")
# Debian policy 5.6.1: package names are [a-z0-9][a-z0-9+.-]+. A kernel release outside that (a
# custom build's upper case) names no package apt could hold: install_plan() reports it missing.
_PACKAGE = re.compile(r"[a-z0-9][a-z0-9+.-]+")
_RELEASE = re.compile(r"[0-9A-Za-z][0-9A-Za-z+._~-]*")


def packages(boot, running, optional_prefixes=()):
    """The packages DKMS needs to build a module for `boot` (the kernel that boots next), and those
    worth having when the archive still holds them: {required: [linux-headers-<boot>], optional:
    [the running kernel's headers when it is another kernel, then each optional prefix (such as
    Ubuntu's linux-modules-extra-) for the boot and the running kernel]}.

    Only the boot kernel's headers are required: the module is loaded after the reboot into it, and
    a superseded running kernel's headers are often gone from the archive (Debian keeps only its
    current ABIs)."""
    for name, value in (("boot kernel", boot), ("running kernel", running)):
        if not isinstance(value, str) or not _RELEASE.fullmatch(value):
            raise AnsibleFilterError("gpu_kernel_packages: the %s %r is not a kernel release" % (name, value))
    if isinstance(optional_prefixes, str) or not all(
            isinstance(prefix, str) and prefix.endswith("-") and _PACKAGE.fullmatch(prefix + "0")
            for prefix in optional_prefixes):
        raise AnsibleFilterError("gpu_kernel_optional_prefixes (amd_rocm passes amd_rocm_kernel_extra_prefixes for the"
                                 " node's distribution) must be a list of package name prefixes ending in '-', such"
                                 " as [linux-modules-extra-], not %r" % (optional_prefixes,))
    required = ["linux-headers-" + boot]
    optional = []
    for name in (["linux-headers-" + running]
                 + [prefix + kernel for prefix in optional_prefixes for kernel in (boot, running)]):
        if name not in required and name not in optional:
            optional.append(name)
    return {"required": required, "optional": optional}


def apt_policy(text):
    """`apt-cache policy NAME...` as {name: {installed, candidate}} (None for "(none)"). A name
    apt does not know is absent: apt prints nothing for it."""
    found = {}
    current = None
    for line in (text or "").splitlines():
        name = _NAME.match(line)
        if name:
            current = found.setdefault(name.group(1), {"installed": None, "candidate": None})
            continue
        field = _FIELD.match(line)
        if field and current is not None:
            current[field.group(1).lower()] = None if field.group(2) == "(none)" else field.group(2)
    return found


def install_plan(wanted, policy):
    """What to install from `packages()`'s answer given `apt_policy()`'s: {install: the required
    ones and the optional ones apt has a version of (installed or a candidate), missing: required
    ones apt has no version of, skipped: optional ones apt has no version of}."""
    def has(name):
        row = policy.get(name) or {}
        return bool(row.get("installed") or row.get("candidate"))

    required, optional = list(wanted.get("required", [])), list(wanted.get("optional", []))
    return {"install": required + [name for name in optional if has(name)],
            "missing": [name for name in required if not has(name)],
            "skipped": [name for name in optional if not has(name)]}


class FilterModule(object):
    def filters(self):
        return {
            "gpu_kernel_packages": packages,
            "gpu_kernel_apt_policy": apt_policy,
            "gpu_kernel_install_plan": install_plan,
        }
