# -*- coding: utf-8 -*-
"""Filters of the `apt_repository` role: resolve a caller's repository entries for one node and
refuse what cannot work, each refusal naming the caller's inventory variable and the fix.

Pure functions (tests/unit/test_apt_repository_filters.py; the role's refusals through Ansible:
tests/roles/test_apt_repository.py). The checks of single values (a URL, a one-line word) are
the shared validation module's.
"""
from __future__ import annotations

import json
import re

from ansible_collections.mm3.shared.plugins.module_utils import validation as v

# The kernel's architecture name (ansible_facts.architecture) -> Debian's (dpkg), which
# repository paths and package architectures use.
DEBIAN_ARCHITECTURES = {"x86_64": "amd64", "aarch64": "arm64"}
# A file name stem under /etc/apt/{sources.list.d,keyrings,preferences.d}.
_NAME = re.compile(r"[a-z0-9][a-z0-9._-]*")
_PRIORITY = re.compile(r"-?[0-9]+")


def debian_architecture(kernel_architecture):
    """dpkg's name of a node's architecture (amd64, arm64; any other passes through)."""
    return DEBIAN_ARCHITECTURES.get(str(kernel_architecture), str(kernel_architecture))


def _json(value):
    return json.dumps(value)


def _resolve_entry(entry, arch, timeout, keyring_dir):
    given = entry.get("url") or ""
    url = (given.get(arch) or "") if isinstance(given, dict) else given
    suite = str(entry.get("suite") or "/")
    key_url = entry.get("key_url") or ""
    signed_by = entry.get("signed_by") or ""
    base = url.rstrip("/") if isinstance(url, str) else ""
    flat = suite.endswith("/")
    return {
        "name": entry.get("name"), "variable": entry.get("variable") or "", "given": given, "url": url,
        "suite": suite, "components": entry.get("components") or [],
        "key_url": key_url, "signed_by": signed_by,
        "key_fingerprints": entry.get("key_fingerprints") or entry.get("default_key_fingerprints") or [],
        "keyring": "%s/%s.asc" % (keyring_dir, entry.get("name")) if key_url else signed_by,
        # a flat repository (suite ends with '/', sources.list(5)) keeps its Release beside its path
        "release_url": (base + "/" + suite.lstrip("/") + "Release") if flat
        else "%s/dists/%s/Release" % (base, suite),
        "flat": flat,
        "timeout": int(entry.get("timeout") or timeout),
        "preferences": entry.get("preferences") or [],
        "preferences_name": entry.get("preferences_name") or entry.get("name"),
        "preferences_comment": entry.get("preferences_comment") or [],
    }


def _entry_problems(e, arch):
    var = e["variable"]
    problems = []
    if not isinstance(e["name"], str) or not _NAME.fullmatch(e["name"]):
        problems.append("The entry for %s is named %s, not a file name ([a-z0-9._-]): fix the calling role."
                        % (var, _json(e["name"])))
    if isinstance(e["given"], dict) and e["url"] == "":
        problems.append("%s.url names no repository for this node's architecture %s (it names %s): add "
                        "%s: <url of a mirror for %s> to it." % (var, arch, ", ".join(e["given"]), arch, arch))
    elif not v.is_http_url(e["url"]):
        problems.append("%s needs an http(s) `url` with no spaces or line breaks, or a mapping of them per "
                        "architecture (amd64, arm64) (got %s): set %s.url." % (var, _json(e["url"]), var))
    if not v.is_word(e["suite"]) or not all(v.is_word(c) for c in e["components"]):
        problems.append("%s.suite and .components must be single words (got suite %s, components %s): fix "
                        "them." % (var, _json(e["suite"]), _json(e["components"])))
    elif e["flat"] and e["components"]:
        problems.append("%s.suite %s is a flat repository's path, which has no components (got %s): drop "
                        "them, or name a suite." % (var, _json(e["suite"]), _json(e["components"])))
    if e["key_url"] == "" and e["signed_by"] == "":
        problems.append("%s needs either `key_url` (the http(s) URL of the repository's signing key, trusted "
                        "only at a pinned fingerprint) or `signed_by` (the path of a keyring already on the "
                        "host)." % var)
    elif e["key_url"] and not v.is_http_url(e["key_url"]):
        problems.append("%s.key_url must be an http(s) URL with no spaces (got %s): fix it."
                        % (var, _json(e["key_url"])))
    elif not e["key_url"] and not (v.is_word(e["signed_by"]) and e["signed_by"].startswith("/")
                                   and len(e["signed_by"]) > 1):
        problems.append("%s.signed_by must be the absolute path of a keyring on the host (got %s): fix it."
                        % (var, _json(e["signed_by"])))
    for pin in e["preferences"]:
        pin_map = pin if isinstance(pin, dict) else {}
        packages = pin_map.get("packages")
        line = str(pin_map.get("pin", ""))
        priority = str(pin_map.get("priority", ""))
        if (not isinstance(packages, list) or not packages or not all(v.is_word(p) for p in packages)
                or not line or v.has_control(line) or not _PRIORITY.fullmatch(priority)):
            problems.append("The apt pin %s for %s needs packages (words), one line of pin and an integer "
                            "priority: fix the calling role." % (_json(pin), var))
    return problems


def resolve(entries, kernel_architecture, timeout, keyring_dir):
    """{arch, entries, problems}: every entry resolved for a node of `kernel_architecture` (the
    url of its Debian architecture, its keyring, the Release file the probe reads), and one
    problem per value that could not work, each naming the caller's variable and the fix."""
    arch = debian_architecture(kernel_architecture)
    resolved = [_resolve_entry(dict(e or {}), arch, timeout, keyring_dir) for e in entries or []]
    problems = [p for e in resolved for p in _entry_problems(e, arch)]
    return {"arch": arch, "entries": resolved, "problems": problems}


class FilterModule(object):
    """apt_repository_resolve, apt_repository_debian_arch."""

    def filters(self):
        return {
            "apt_repository_resolve": resolve,
            "apt_repository_debian_arch": debian_architecture,
        }
