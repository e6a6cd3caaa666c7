#!/usr/bin/python
# -*- coding: utf-8 -*-
# Fetch an apt repository's signing key and trust it only if its primary keys are pinned.
"""Ansible module apt_signing_key."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: apt_signing_key
short_description: Install an apt repository's signing key only if its fingerprints are pinned
description:
  - Downloads the OpenPGP public key file of an apt repository (armored or binary), reads the
    fingerprints of its primary keys without gpg, and writes its key to O(dest) (for C(Signed-By))
    only if every primary key is in O(fingerprints). Trust ends at the pinned fingerprint, never
    at whatever the mirror serves. A key file with another key, or with an extra key beside the
    pinned one, is refused and O(dest) is left as it was.
  - Every byte of the file must belong to the checked key, since apt's own reading is laxer than
    the check, so a second armored block under another label or a BEGIN line with a trailing blank
    is refused, as is text outside the blocks or a packet that no public key file holds.
  - O(dest) receives the checked packets armored again, never the bytes as served, atomically and
    only when they differ from what O(dest) holds.
version_added: "1.0.0"
options:
  url:
    description: Where the key file is served (the vendor's or a mirror's copy).
    type: str
    required: true
  dest:
    description: The keyring file apt's C(Signed-By) names.
    type: path
    required: true
  fingerprints:
    description:
      - The pinned fingerprints (40 hex digits for a v4 key, 64 for v6; spaces and a C(0x) prefix
        are ignored). Every primary key in the file must be one of them.
    type: list
    elements: str
    required: true
  name:
    description: The inventory variable that pins them, named in a refusal so that it names the fix.
    type: str
    default: fingerprints
  timeout:
    description: Seconds to wait for the server.
    type: int
    default: 30
  validate_certs:
    description: Verify the server's TLS certificate.
    type: bool
    default: true
attributes:
  check_mode:
    support: full
    details: Downloads and checks the key; writes nothing.
  diff_mode:
    support: none
author:
  - MiniMax-M3 self-hosting project
"""

EXAMPLES = r"""
- name: Trust Docker's repository key (pinned fingerprint, from docs.docker.com)
  apt_signing_key:
    url: https://download.docker.com/linux/ubuntu/gpg
    dest: /etc/apt/keyrings/docker-engine.asc
    fingerprints: [9DC858229FC7DD38854AE2D88D81803C0EBFCD88]
    name: docker_engine_apt_repository.key_fingerprints
"""

RETURN = r"""
fingerprints:
  description: The primary key fingerprints found in the file.
  type: list
  elements: str
  returned: when the file could be read
  sample: [9DC858229FC7DD38854AE2D88D81803C0EBFCD88]
sha256:
  description: sha256 of the key file as served.
  type: str
  returned: when the file could be downloaded
"""

import hashlib
import os
import tempfile

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.mm3.shared.plugins.module_utils.openpgp import KeyFileError, armor, checked_key, normalise_fingerprint, pin_problem
from ansible.module_utils.urls import fetch_url


def decide(data, pinned, url, name):
    """(fingerprints, refusal or None, keyring) for the bytes `data` served at `url`: the keyring
    is the checked packets, armored again, never the bytes as served (apt would also trust a key
    the check did not read)."""
    try:
        checked, found = checked_key(data)
    except KeyFileError as exc:
        return [], ("%s does not serve an OpenPGP public key file and nothing else (%s): fetch the "
                    "vendor's key file unchanged, or fix key_url." % (url, exc)), None
    problem = pin_problem(found, pinned)
    if problem:
        return found, ("The signing key served at %s is not trusted: %s. Nothing was written. If the "
                       "vendor rotated its key, check the new fingerprint against the vendor's own "
                       "documentation and add it to %s; otherwise the mirror serves another key "
                       "(fix the mirror or key_url)." % (url, problem, name)), None
    return found, None, armor(checked)


def main():
    module = AnsibleModule(
        argument_spec=dict(
            url=dict(type="str", required=True),
            dest=dict(type="path", required=True),
            fingerprints=dict(type="list", elements="str", required=True),
            name=dict(type="str", default="fingerprints"),
            timeout=dict(type="int", default=30),
            validate_certs=dict(type="bool", default=True),
        ),
        supports_check_mode=True,
    )
    p = module.params
    try:
        pinned = [normalise_fingerprint(f) for f in p["fingerprints"]]
    except KeyFileError as exc:
        module.fail_json(msg="%s: %s" % (p["name"], exc))
    if not pinned:
        module.fail_json(msg="%s is empty: pin the repository key's fingerprint." % p["name"])
    resp, info = fetch_url(module, p["url"], timeout=p["timeout"])
    if info.get("status") != 200 or resp is None:
        module.fail_json(msg="Could not fetch the signing key %s (HTTP %s: %s): check key_url and the "
                             "route to the mirror." % (p["url"], info.get("status"), info.get("msg", "")))
    data = resp.read()
    found, refusal, keyring = decide(data, pinned, p["url"], p["name"])
    digest = hashlib.sha256(data).hexdigest()
    if refusal:
        module.fail_json(msg=refusal, fingerprints=found, sha256=digest)
    try:
        with open(p["dest"], "rb") as f:
            changed = f.read() != keyring
    except OSError:
        changed = True
    if changed and not module.check_mode:
        fd, tmp = tempfile.mkstemp(dir=os.path.dirname(p["dest"]) or ".", prefix=".apt-signing-key.")
        with os.fdopen(fd, "wb") as f:
            f.write(keyring)
        os.chmod(tmp, 0o644)
        module.atomic_move(tmp, p["dest"])
    module.exit_json(changed=changed, fingerprints=found, sha256=digest)


if __name__ == "__main__":
    main()
