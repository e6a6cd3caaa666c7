"""Unit tests of filter_plugins/release.py (playbooks/status.yml's lines)."""
from __future__ import annotations

import json
import os

import pytest

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


GOOD = {"node": "node1", "blockers": [], "changes": ["the unit"], "start": {"id": "aaaa"},
        "needs_transfer": True, "free_bytes": 10**12, "need_bytes": 5 * 10**11, "staging_verified": True}


def test_a_rollout_with_a_change_goes():
    assert rel.rollout_problems([GOOD, dict(GOOD, node="node2", changes=[])], 1, upstreams=2) == []


def test_a_rollout_with_no_change_is_refused():
    probs = rel.rollout_problems([dict(GOOD, changes=[]), dict(GOOD, node="node2", changes=[])], 1)
    assert len(probs) == 1 and probs[0].startswith("nothing to roll out") and "playbooks/plan.yml" in probs[0]


def test_a_batch_that_empties_the_gateway_pool_is_refused():
    probs = rel.rollout_problems([GOOD], 2, upstreams=2)
    assert probs == ["rollout_serial 2 would take every one of the fleet gateway's 2 upstreams out at once: "
                     "set rollout_serial to at most 1"]
    assert rel.rollout_problems([GOOD], 2, upstreams=0) == []     # no fleet gateway: no pool to empty


@pytest.mark.parametrize("serial", [0, -1, "two", "1.5", None])
def test_a_batch_size_that_is_not_a_whole_number_is_refused(serial):
    assert "set a whole number of nodes per batch" in rel.rollout_problems([GOOD], serial)[0]


def test_no_room_for_two_revisions_is_refused_with_the_numbers():
    probs = rel.rollout_problems([dict(GOOD, free_bytes=2 * 10**11)], 1)
    assert probs == ["node1: no room for two revisions: 200.0 GB free on the weights filesystem, the new revision "
                     "needs 500.0 GB beside the one serving; free space there (or prune old revisions with "
                     "playbooks/weights.yml)"]
    # already on the node (verified): no transfer, no room needed
    assert rel.rollout_problems([dict(GOOD, free_bytes=0, needs_transfer=False)], 1) == []


def test_a_revision_not_verified_on_staging_is_refused():
    probs = rel.rollout_problems([dict(GOOD, staging_verified=False)], 1)
    assert len(probs) == 1 and "not verified on staging" in probs[0]
    assert rel.rollout_problems([dict(GOOD, staging_verified=None)], 1) == []   # no staging host in the inventory


def test_a_node_without_a_release_or_with_a_blocker_is_refused():
    probs = rel.rollout_problems([dict(GOOD, start={}), dict(GOOD, node="node2", blockers=["bad port"])], 1)
    assert probs == ["node1: no release recorded to come back to (run playbooks/serve.yml once; a rollout changes "
                     "a node that serves)", "node2: bad port"]


def test_kept_files_missing_or_changed_are_named():
    expected = {"minimax-m3.service": "1" * 64, "docker-run.cmd": "2" * 64, "engine.yaml": "3" * 64}
    assert rel.release_kept_mismatch(expected, dict(expected)) == []
    assert rel.release_kept_mismatch(expected, {"minimax-m3.service": "1" * 64, "docker-run.cmd": "9" * 64,
                                                "engine.yaml": ""}) == ["docker-run.cmd", "engine.yaml"]
    assert rel.release_kept_mismatch(expected, {}) == sorted(expected)


def _e(i, result="serving"):
    return {"id": i, "result": result}


def test_rollback_target_is_the_newest_earlier_release_not_rolled_back_from():
    t = rel.release_rollback_target
    assert t([]) == {} and t([_e("a")]) == {}
    assert t([_e("a"), _e("b")])["id"] == "a"
    assert t([_e("a"), _e("b"), _e("a")])["id"] == "b"
    # after an automatic rollback from "bad": back to the release before the one restored
    assert t([_e("orig"), _e("good"), _e("bad"), _e("good", "rollback")])["id"] == "orig"
    assert t([_e("a"), _e("b", "rollback")]) == {}   # "a" was the release rolled back from
    # the release of a rollout's start, by id: its newest entry
    hist = [_e("a"), _e("b"), _e("a"), _e("c")]
    assert t(hist, "a") is hist[2] and t(hist, "zzz") == {}


# --- the evaluation set a signed release names (issue 33) ----------------------------------------

def _eval_set(path="evals/lab-tiny-m3.yml"):
    import yaml
    with open(os.path.join(ROOT, path)) as handle:
        return yaml.safe_load(handle)


def test_a_release_names_the_evaluation_set_by_the_digest_of_its_content():
    data = _eval_set()
    summary = rel.release_eval_set(data)
    assert (summary["name"], summary["version"], summary["cases"]) == (data["name"], data["version"], len(data["cases"]))
    assert summary["pass_threshold"] == data["pass_threshold"]
    # the digest is the content's: the same set, keys in another order, is the same set ...
    assert rel.release_eval_set(json.loads(json.dumps(data), object_pairs_hook=lambda p: dict(reversed(p))))[
        "sha256"] == summary["sha256"]
    # ... and one expected result changed, or the threshold lowered, is another
    weaker = json.loads(json.dumps(data))
    weaker["cases"][0]["expect"] = {"non_empty": True}
    assert rel.release_eval_set(weaker)["sha256"] != summary["sha256"]
    lower = dict(data, pass_threshold=0.1)
    assert rel.release_eval_set(lower)["sha256"] != summary["sha256"]
    assert rel.release_eval_set(None) is None
    # the two sets the project ships are two sets
    assert rel.release_eval_set(_eval_set("evals/minimax-m3.yml"))["sha256"] != summary["sha256"]


def test_only_the_set_a_signed_release_names_may_judge_it():
    signed_set = rel.release_eval_set(_eval_set())
    release = {"key": "lab-release", "digest": "e" * 64, "eval_set": signed_set}
    assert rel.release_eval_set_problem(release, signed_set, "evals/lab-tiny-m3.yml") == ""
    # unsigned: nothing to compare
    assert rel.release_eval_set_problem(None, rel.release_eval_set(_eval_set("evals/minimax-m3.yml"))) == ""
    other = rel.release_eval_set(_eval_set("evals/minimax-m3.yml"))
    msg = rel.release_eval_set_problem(release, other, "evals/minimax-m3.yml")
    assert msg.startswith("the evaluation set evals/minimax-m3.yml (minimax-m3-core, sha256 %s) is not the one "
                          "the signed release eeeeeeeeeeeeeeee (key 'lab-release') names (%s, sha256 %s)"
                          % (other["sha256"][:16], signed_set["name"], signed_set["sha256"][:16])), msg
    assert "point serving_verify_eval_set_file at the signed set" in msg
    weaker = json.loads(json.dumps(_eval_set()))
    weaker["pass_threshold"] = 0.1
    assert "is not the one the signed release" in rel.release_eval_set_problem(release, rel.release_eval_set(weaker))
    # a release signed before releases named their set (version 1), or without one: refused, naming the fix
    for old in ({"key": "k", "digest": "d" * 64}, dict(release, eval_set=None)):
        assert "names no evaluation set" in rel.release_eval_set_problem(old, signed_set)
    assert "is not the one" in rel.release_eval_set_problem(release, None)
