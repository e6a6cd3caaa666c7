# -*- coding: utf-8 -*-
"""Filters of the `weights_provenance` role: read the verified manifest with the parser the
weights modules use (mm3.shared weights_common.parse_manifest), not with a regex of its own."""
from __future__ import annotations

from ansible_collections.mm3.shared.plugins.module_utils.weights_common import ManifestError, parse_manifest


def manifest_digest(text, path):
    """The sha256 a manifest lists for `path`, or '' when it lists none (or does not parse: the
    role reads the manifest weights_verify accepted, so that means the file is not in it)."""
    try:
        return dict(parse_manifest(str(text or ""))).get(str(path), "")
    except ManifestError:
        return ""


class FilterModule(object):
    """weights_provenance_manifest_digest."""

    def filters(self):
        return {"weights_provenance_manifest_digest": manifest_digest}
