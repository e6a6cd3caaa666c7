# -*- coding: utf-8 -*-
"""Filters of the release history (module release_history, playbooks/status.yml).

Pure functions, unit-tested in tests/unit/test_release_filters.py: what a node runs (the last
entry of its releases.json), whether it answers, and whether the last verification on the
controller (reports/verify/<node>.json) happened while this release served.
"""
from __future__ import annotations

import json

from ansible_collections.mm3.shared.plugins.module_utils import release_signing as rs


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


def release_kept_mismatch(expected, found):
    """The kept files of a release that are missing or changed: the names of `expected`
    ({name: sha256} from the history) whose `found` sha256 ({name: sha256 or ''}) differs. Pure."""
    found = found or {}
    return sorted(name for name, digest in (expected or {}).items() if found.get(name) != digest)


def release_rollback_target(entries, to_id=""):
    """The entry a rollback returns to, or {} when there is none. Pure.

    With to_id (rollout.yml's automatic rollback): the newest entry of that release. Otherwise the
    newest entry before the current one that is another release and was not itself rolled back
    from (an entry followed by a `rollback` entry failed once: going "back" to it would repeat the
    failure), so after an automatic rollback, rollback.yml goes to the release before the bad one."""
    entries = list(entries or [])
    if to_id:
        found = [e for e in entries if e.get("id") == to_id]
        return found[-1] if found else {}
    if len(entries) < 2:
        return {}
    current = entries[-1]["id"]
    for i in range(len(entries) - 2, -1, -1):
        entry = entries[i]
        left_by_rollback = entries[i + 1].get("result") == "rollback"
        if entry["id"] != current and not left_by_rollback:
            return entry
    return {}


def _gb(n):
    return "%.1f GB" % (float(n or 0) / 1e9)


def rollout_problems(nodes, serial, upstreams=0):
    """Why a rollout must not start, as lines naming the fix ([] = go). Pure.

    nodes: one dict per target {node, blockers, changes (what would change: plan-host's list),
    start (its release entry now, {} for none), needs_transfer (the new revision is not verified on
    it yet), free_bytes / need_bytes (free on the weights filesystem / the revision's size plus
    margin), staging_verified (the target revision's marker on staging: True, False, or None when
    there is no staging host)}; serial: the batch size; upstreams: the fleet gateway's upstreams
    (0 when there is no fleet gateway)."""
    problems = []
    try:
        batch = int(serial)
    except (TypeError, ValueError):
        batch = 0
    if batch < 1 or str(serial).strip() != str(batch):
        problems.append("rollout_serial is %r: set a whole number of nodes per batch, at least 1" % (serial,))
    elif upstreams and batch >= int(upstreams):
        problems.append(
            "rollout_serial %d would take every one of the fleet gateway's %d upstreams out at once: "
            "set rollout_serial to at most %d" % (batch, int(upstreams), int(upstreams) - 1))
    for n in nodes:
        for b in n.get("blockers") or []:
            problems.append("%s: %s" % (n["node"], b))
        if n.get("changes") and not n.get("start"):
            problems.append("%s: no release recorded to come back to (run playbooks/serve.yml once; a rollout "
                            "changes a node that serves)" % n["node"])
        if n.get("changes") and n.get("needs_transfer") and int(n.get("free_bytes") or 0) < int(n.get("need_bytes") or 0):
            problems.append(
                "%s: no room for two revisions: %s free on the weights filesystem, the new revision needs %s "
                "beside the one serving; free space there (or prune old revisions with playbooks/weights.yml)"
                % (n["node"], _gb(n.get("free_bytes")), _gb(n.get("need_bytes"))))
        if n.get("changes") and n.get("needs_transfer") and n.get("staging_verified") is False:
            problems.append("%s: the target revision is not verified on staging: run playbooks/weights.yml for it "
                            "(staging downloads, checks it against the pinned manifest and marks it) first" % n["node"])
    if nodes and not problems and not any(n.get("changes") for n in nodes):
        problems.append("nothing to roll out: every target already runs what the inventory says (change the "
                        "revision, image digest, flags, tuning or key first; playbooks/plan.yml shows the difference)")
    return problems


def release_signature_problem(entry, release_keys=None, revoked=None, today=None):
    """Why a node may not go back to the kept release `entry` (a releases.json entry) while release
    keys are listed, or '' when it may: it was deployed unsigned, its key is no longer listed, or
    its key or the release is revoked or outside its validity on `today` (YYYY-MM-DD; the same
    check as a bundle's, rs.standing). The history records the key id and the release digest
    (entry.release.signed) when the release is deployed; without keys nothing is checked."""
    if not release_keys:
        return ""
    entry = entry if isinstance(entry, dict) else {}
    rid = entry.get("id", "?")
    signed = (entry.get("release") or {}).get("signed") if isinstance(entry.get("release"), dict) else None
    if not isinstance(signed, dict) or not signed.get("key_id"):
        return ("release %s was deployed without a signed release, and serving_release_keys lists release keys: "
                "roll out a signed release with playbooks/rollout.yml instead" % rid)
    try:
        key = next((k for k in rs.trusted_keys(release_keys) if k["id"] == signed["key_id"]), None)
        if key is None:
            return ("release %s is signed by key '%s' (%s), which is no longer in serving_release_keys: roll out "
                    "a release signed by a listed key with playbooks/rollout.yml instead"
                    % (rid, signed.get("key"), str(signed["key_id"])[:16]))
        rs.standing(key, signed.get("digest"), revoked if isinstance(revoked, list) else [], today)
    except (rs.ReleaseError, ValueError) as error:
        return "release %s: %s" % (rid, str(error).rstrip("."))
    return ""


def release_eval_set(eval_set):
    """What a release signs of the evaluation set that verify.yml judges it by (the parsed file of
    serving_verify_eval_set_file): {name, version, pass_threshold, cases (how many), sha256
    (rs.document_digest of the whole set: every prompt and expected result)}; None for no set.
    The first four are for the reviewer; the digest is what binds."""
    if eval_set is None:
        return None
    data = eval_set if isinstance(eval_set, dict) else {}
    cases = data.get("cases")
    return {"name": data.get("name"), "version": data.get("version"), "pass_threshold": data.get("pass_threshold"),
            "cases": len(cases) if isinstance(cases, list) else None, "sha256": rs.document_digest(eval_set)}


def release_eval_set_problem(release, eval_set, path=""):
    """Why the evaluation set about to run may not judge the node's signed release, or '' when it
    may. release: serving_spec.release (None for an unsigned deployment: nothing to compare);
    eval_set: release_eval_set of the set that would run; path: its file, named in the message."""
    if not isinstance(release, dict) or not release:
        return ""
    signed = release.get("eval_set")
    rid = "%s (key '%s')" % (str(release.get("digest") or "?")[:16], release.get("key"))
    if not isinstance(signed, dict) or not signed.get("sha256"):
        return ("the signed release %s names no evaluation set, so nothing says which results approve it: plan "
                "again (release-part.json names the set in eval_set) and have the release signed again" % rid)
    if not isinstance(eval_set, dict) or eval_set.get("sha256") != signed["sha256"]:
        return ("the evaluation set %s (%s, sha256 %s) is not the one the signed release %s names (%s, sha256 %s): "
                "point serving_verify_eval_set_file at the signed set, or plan with this set and have the release "
                "signed again" % (path or "given", (eval_set or {}).get("name"), str((eval_set or {}).get("sha256"))[:16],
                                  rid, signed.get("name"), str(signed["sha256"])[:16]))
    return ""


class FilterModule(object):
    """release_entries, release_status, release_kept_mismatch, release_rollback_target,
    release_signature_problem, rollout_problems, release_eval_set, release_eval_set_problem."""

    def filters(self):
        return {"release_entries": release_entries, "release_status": release_status,
                "release_kept_mismatch": release_kept_mismatch, "release_rollback_target": release_rollback_target,
                "release_signature_problem": release_signature_problem, "rollout_problems": rollout_problems,
                "release_eval_set": release_eval_set, "release_eval_set_problem": release_eval_set_problem}
