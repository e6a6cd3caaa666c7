# -*- coding: utf-8 -*-
"""Filters of the release history (module release_history, playbooks/status.yml).

Pure functions, unit-tested in tests/unit/test_release_filters.py: what a node runs (the last
entry of its releases.json), whether it answers, and whether the last verification on the
controller (reports/verify/<node>.json) happened while this release served.
"""
from __future__ import annotations

import json


def _short(value, n=12):
    value = str(value or "")
    if "@sha256:" in value:
        return value.split("@sha256:", 1)[1][:n]
    return value[:n]


def release_entries(text):
    """The entries of a releases.json text (slurped or read); [] for none or a broken file."""
    try:
        data = json.loads(text) if str(text or "").strip() else {}
    except ValueError:
        return []
    entries = data.get("releases") if isinstance(data, dict) else None
    return [e for e in entries if isinstance(e, dict) and e.get("id")] if isinstance(entries, list) else []


def release_status(node, entries, health_status, report=None, wanted_revision=None):
    """One node's status: {node, release, previous, health, verification, drift, line}.

    entries: the node's history; health_status: the HTTP status of the engine's health path (0 or
    None when it did not answer); report: the controller's last serving_verify report of the node
    (or {}); wanted_revision: the revision the inventory names now."""
    current = entries[-1] if entries else None
    previous = entries[-2] if len(entries) > 1 else None
    health = "ok (HTTP %s)" % health_status if health_status == 200 else (
        "DOWN (HTTP %s)" % health_status if health_status else "DOWN (no answer)")
    verification = "none on record"
    report = report or {}
    if report.get("started_at"):
        summary = report.get("summary") or {}
        verdict = "%d passed, %d failed" % (summary.get("passed", 0), summary.get("failed", 0))
        if report.get("error"):
            verdict = "ERROR"
        when = report["started_at"]
        this = bool(current) and when >= (current.get("from") or "")
        verification = "%s at %s (%s)" % (verdict, when, "this release" if this else "an earlier release")
    drift = None
    if current is None:
        release = "no release recorded (run playbooks/serve.yml)"
    else:
        rel = current.get("release") or {}
        release = "%s: revision %s, image %s, since %s by %s" % (
            current["id"], _short(rel.get("revision")), _short(rel.get("image")) or "?",
            current.get("from"), current.get("by"))
        if wanted_revision and rel.get("revision") and rel["revision"] != wanted_revision:
            drift = ("the inventory names revision %s, the node serves %s: playbooks/rollout.yml moves it, "
                     "or set serving_weights_revision back" % (_short(wanted_revision), _short(rel["revision"])))
    line = "%s: release %s; health %s; last verification %s; previous %s%s" % (
        node, release, health, verification, previous["id"] if previous else "none",
        ("; DRIFT: " + drift) if drift else "")
    return {"node": node, "release": current, "previous": previous, "health": health,
            "health_status": health_status or 0, "verification": verification, "drift": drift, "line": line}


class FilterModule(object):
    """release_entries, release_status."""

    def filters(self):
        return {"release_entries": release_entries, "release_status": release_status}
