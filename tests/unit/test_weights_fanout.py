"""Unit tests of the weights fan-out planner (filter_plugins/weights_fanout.py): waves grow the
sources like powers of two, staging serves only the first wave, groups (racks) get their own
seed first and then pull inside the group, a node that has not verified is never a source, and
bad inputs are refused naming the fix. bench/weights_fanout_bench.py runs the same planner
against real rsync daemons."""
import math
import pathlib
import sys

import pytest
from ansible.errors import AnsibleFilterError

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "filter_plugins"))

import weights_fanout as wf  # noqa: E402


def nodes(n):
    return ["gpu%02d" % i for i in range(n)]


def test_filters_registered():
    assert set(wf.FilterModule().filters()) == {
        "weights_fanout_plan", "weights_fanout_next_wave", "weights_fanout_problems", "weights_fanout_groups",
        "weights_fanout_staging_pulls"}


@pytest.mark.parametrize("n,waves", [(1, 1), (2, 1), (4, 2), (8, 3), (16, 4), (64, 6), (100, 7)])
def test_sequential_transfers_grow_like_log2(n, waves):
    plan = wf.fanout_plan(nodes(n), staging_slots=2, node_slots=1)
    assert len(plan) == waves
    assert len(plan) <= math.ceil(math.log2(max(n, 2))) + 1
    assert sorted(p["node"] for wave in plan for p in wave) == nodes(n)  # everyone, once


@pytest.mark.parametrize("n", [1, 2, 8, 100])
def test_staging_serves_only_the_first_wave(n):
    plan = wf.fanout_plan(nodes(n), staging_slots=2, node_slots=1)
    assert wf.fanout_staging_pulls(plan) == min(n, 2)
    assert all(p["source"] == wf.STAGING for p in plan[0])
    assert all(p["source"] != wf.STAGING for wave in plan[1:] for p in wave)


def test_every_source_verified_in_an_earlier_wave_and_serves_within_its_slots():
    plan = wf.fanout_plan(nodes(50), staging_slots=2, node_slots=2)
    done = {wf.STAGING}
    for wave in plan:
        load = {}
        for pull in wave:
            assert pull["source"] in done
            load[pull["source"]] = load.get(pull["source"], 0) + 1
        assert all(count <= 2 for count in load.values())  # both slot counts are 2 here
        done |= {p["node"] for p in wave}


def test_a_node_that_did_not_verify_is_never_a_source():
    """The run plans each wave from what really verified: gpu01 failed, so it serves nobody;
    it pulls again, from a node that verified."""
    wave = wf.fanout_next_wave([wf.STAGING, "gpu00"], ["gpu01", "gpu02", "gpu03"], 2, 1)
    assert wave == [("gpu01", "gpu00")]
    assert all(source in (wf.STAGING, "gpu00") for _, source in wave)
    # nothing verified yet (or every first pull failed): staging again, within its slots
    assert wf.fanout_next_wave([wf.STAGING], ["gpu01", "gpu02", "gpu03"], 2, 1) == [
        ("gpu01", wf.STAGING), ("gpu02", wf.STAGING)]


def test_racks_get_a_seed_first_then_pull_inside_the_rack():
    racks = {"rack-a": ["a1", "a2", "a3", "a4"], "rack-b": ["b1", "b2", "b3", "b4"]}
    plan = wf.fanout_plan(["a1", "a2", "a3", "a4", "b1", "b2", "b3", "b4"], staging_slots=1,
                          node_slots=1, groups=racks)
    rack = {m: r for r, ms in racks.items() for m in ms}
    assert plan[0] == [{"node": "a1", "source": wf.STAGING}]
    assert plan[1] == [{"node": "b1", "source": "a1"}]  # rack-b's seed crosses racks once
    for wave in plan[2:]:
        assert all(rack[p["node"]] == rack[p["source"]] for p in wave), wave
    assert wf.fanout_staging_pulls(plan) == 1


@pytest.mark.parametrize("args,expected", [
    ((["gpu01", "gpu01"], 2, 1), "a node is listed twice"),
    (("gpu01", 2, 1), "must be a list of inventory host names"),
    ((["gpu 01"], 2, 1), "must be a list of inventory host names"),
    ((["gpu01"], 0, 1), "weights_sync_fanout_staging_slots is 0"),
    ((["gpu01"], 2, 0), "weights_sync_fanout_node_slots is 0"),
    ((["gpu01"], True, 1), "weights_sync_fanout_staging_slots is True"),
    ((["gpu01"], 2, 65), "weights_sync_fanout_node_slots is 65"),
])
def test_bad_inputs_are_refused_with_the_fix(args, expected):
    assert any(expected in p for p in wf.fanout_problems(*args)), wf.fanout_problems(*args)
    with pytest.raises(AnsibleFilterError, match="refusing to plan the weights fan-out"):
        wf.fanout_plan(*args)


def test_a_node_in_two_racks_is_refused():
    problems = wf.fanout_problems(["a1"], 2, 1, {"rack-a": ["a1"], "rack-b": ["a1"]})
    assert problems == ["node a1 is in weights_sync_fanout_groups rack-a and rack-b: put it in one."]
    assert "must map a group name" in wf.fanout_problems(["a1"], 2, 1, {"rack-a": "a1"})[0]


def test_groups_from_the_inventory_racks():
    racks = [["n1", "r1"], ["n2", ""], ["n3", "r2"], ["n4", "r1"], ["n5", None]]
    assert wf.fanout_groups(racks) == {"r1": ["n1", "n4"], "r2": ["n3"]}


def test_no_rack_named_is_no_grouping():
    assert wf.fanout_groups([["n1", ""], ["n2", None]]) is None
    assert wf.fanout_plan(["n1", "n2"], 1, 1, wf.fanout_groups([["n1", ""], ["n2", ""]])) == \
        wf.fanout_plan(["n1", "n2"], 1, 1)
