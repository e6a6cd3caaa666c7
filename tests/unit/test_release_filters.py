"""Unit tests of filter_plugins/release.py (playbooks/status.yml's lines)."""
from __future__ import annotations

import json
import os

from helpers import load_source

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
rel = load_source("release_filters", os.path.join(ROOT, "filter_plugins", "release.py"))

R1 = "8c694d849af242f2a47cb386aa89e1ad40fc6122"
R2 = "1f2e3d4c5b6a79881f2e3d4c5b6a79881f2e3d4c"
IMG = "localhost:5000/mm3-lab/vllm-cpu@sha256:" + "ab" * 32
HISTORY = json.dumps({"releases": [
    {"id": "aaaa000011112222", "from": "2026-12-01T10:00:00Z", "until": "2026-12-02T09:00:00Z", "by": "alice",
     "release": {"revision": R1, "image": IMG}},
    {"id": "bbbb000011112222", "from": "2026-12-02T09:00:00Z", "until": None, "by": "bob",
     "release": {"revision": R2, "image": IMG}},
]})


def test_entries_of_a_history_and_of_nothing():
    assert [e["id"] for e in rel.release_entries(HISTORY)] == ["aaaa000011112222", "bbbb000011112222"]
    assert rel.release_entries("") == [] and rel.release_entries("{broken") == []
    assert rel.release_entries('{"releases": [{"no": "id"}]}') == []


def test_a_healthy_node_verified_on_this_release():
    report = {"started_at": "2026-12-02T09:05:00Z", "summary": {"passed": 13, "failed": 0}}
    st = rel.release_status("node1", rel.release_entries(HISTORY), 200, report, R2)
    assert st["health"] == "ok (HTTP 200)" and st["drift"] is None
    assert st["verification"] == "13 passed, 0 failed at 2026-12-02T09:05:00Z (this release)"
    assert "bbbb000011112222: revision 1f2e3d4c5b6a, image abababababab, since 2026-12-02T09:00:00Z by bob" in st["line"]
    assert st["line"].endswith("previous aaaa000011112222")


def test_a_verification_older_than_the_release_and_a_down_engine():
    report = {"started_at": "2026-12-01T11:00:00Z", "summary": {"passed": 13, "failed": 0}}
    st = rel.release_status("node1", rel.release_entries(HISTORY), None, report, R2)
    assert st["health"] == "DOWN (no answer)" and "(an earlier release)" in st["verification"]
    assert rel.release_status("n", [], 503)["health"] == "DOWN (HTTP 503)"


def test_drift_after_a_rollback_names_both_ways_out():
    st = rel.release_status("node2", rel.release_entries(HISTORY)[:1], 200, {}, R2)
    assert "the inventory names revision 1f2e3d4c5b6a, the node serves 8c694d849af2" in st["drift"]
    assert st["verification"] == "none on record" and "previous none" in st["line"]


def test_no_history():
    st = rel.release_status("node3", [], 0)
    assert st["release"] is None and "no release recorded" in st["line"]
