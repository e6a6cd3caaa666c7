# -*- coding: utf-8 -*-
"""Jinja tests of the project's pins, for the roles' assert tasks: the checks of the shared
validation module (collection mm3.shared), so a role's `that:` never carries its own regex.

    weights_sync_revision is mm3_git_commit         a full 40-hex commit
    weights_sync_manifest_sha256 is mm3_sha256      64 lower-case hex digits
    image_carry_image_id is mm3_image_id            sha256:<64 hex>
    'org/name/<commit>' is mm3_revision_path        a revision directory under a weights root
    weights_stage_endpoint is mm3_protected_endpoint  https://, or http:// to a loopback host
"""
from __future__ import annotations

from ansible_collections.mm3.shared.plugins.module_utils import validation


class TestModule(object):
    """mm3_git_commit, mm3_sha256, mm3_image_id, mm3_revision_path, mm3_protected_endpoint."""

    def tests(self):
        return {
            "mm3_git_commit": validation.is_git_commit,
            "mm3_sha256": validation.is_sha256,
            "mm3_image_id": validation.is_image_id,
            "mm3_revision_path": validation.is_revision_path,
            "mm3_protected_endpoint": validation.is_protected_endpoint,
        }
