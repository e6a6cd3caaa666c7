# -*- coding: utf-8 -*-
"""Filters of the `preflight` role: the one formula of the disk a node needs for a revision,
used by the plan's requirements (tasks/requirements.yml, nothing on the node yet) and by the
node's disk check (tasks/host.yml, what is already there counted); tests/unit/test_preflight_filters.py."""
from __future__ import annotations


def disk_need(size_gb, image_gb, margin_gb, have_gb=0):
    """The free space (GB, one decimal) the weights filesystem needs for one revision:
    {weights_gb: what is still to arrive (the revision's size less what is already there),
     need_gb: weights_gb + the image + the margin,
     change_gb: need_gb + the size of one more revision (a revision change keeps the old one
                until the new one serves)}."""
    size = float(size_gb or 0)
    weights = round(max(size - float(have_gb or 0), 0.0), 1)
    need = round(weights + float(image_gb or 0) + float(margin_gb or 0), 1)
    return {"weights_gb": weights, "need_gb": need, "change_gb": round(need + size, 1)}


class FilterModule(object):
    """preflight_disk_need."""

    def filters(self):
        return {"preflight_disk_need": disk_need}
