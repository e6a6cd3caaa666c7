# -*- coding: utf-8 -*-
"""Weights fan-out in waves: which node pulls a revision from which source, wave after wave.

In a star every node pulls from staging: N nodes cost N transfers through staging's one link.
In waves, a node that has *verified* the revision serves it (a read-only rsync module, like
staging's) to the next wave, so the sources double every wave: the number of sequential
transfer times grows like log2(N), and staging serves only the first wave (`staging_slots`
nodes), again only if none of them verified.

Pure functions (tests/unit/test_weights_fanout.py; bench/weights_fanout_bench.py drives real
rsync daemons with them):
  fanout_next_wave  the next wave from the sources that exist *now* (staging and the nodes that
                    verified): the only way a source is chosen, so a node that failed its
                    verification, or has not finished, is never one;
  fanout_plan       every wave, assuming each pull verifies (what an operator reviews; the run
                    re-plans each wave from what really verified);
  fanout_problems   refusals of the inputs, each naming the fix;
  fanout_groups     the racks (or fabrics) the inventory names, as the groups the others take.

Role weights_sync (tasks/fanout.yml, tasks/wave.yml) runs the waves with them when
weights_sync_fanout is on.
"""
from __future__ import annotations

import re

from ansible.errors import AnsibleFilterError

STAGING = "staging"
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,252}$")


def fanout_problems(nodes, staging_slots, node_slots, groups=None):
    """Reasons the fan-out cannot be planned as asked; empty when it can."""
    problems = []
    if not isinstance(nodes, list) or any(not isinstance(n, str) or not _NAME.match(n) for n in nodes):
        problems.append("the nodes to sync must be a list of inventory host names (got %r)." % (nodes,))
    elif len(set(nodes)) != len(nodes):
        problems.append("a node is listed twice in the nodes to sync: %s." % sorted(
            n for n in set(nodes) if nodes.count(n) > 1))
    for name, value, low in (("weights_sync_fanout_staging_slots", staging_slots, 1),
                             ("weights_sync_fanout_node_slots", node_slots, 1)):
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= 64:
            problems.append("%s is %r: set an integer from %d to 64 (transfers one source serves "
                            "at once)." % (name, value, low))
    if groups is not None:
        if not isinstance(groups, dict) or any(not isinstance(v, list) for v in groups.values()):
            problems.append("weights_sync_fanout_groups must map a group name (a rack, a fabric) to "
                            "a list of its nodes (got %r)." % (groups,))
        else:
            seen = {}
            for group, members in groups.items():
                for member in members:
                    if member in seen:
                        problems.append("node %s is in weights_sync_fanout_groups %s and %s: put it "
                                        "in one." % (member, seen[member], group))
                    seen[member] = group
    return problems


def _group_of(groups):
    return {member: group for group, members in (groups or {}).items() for member in members}


def fanout_next_wave(sources, pending, staging_slots=2, node_slots=1, groups=None):
    """[(node, source), ...]: who pulls in the next wave, and from where.

    sources: the nodes that hold a verified copy now (staging is always one, with
    staging_slots); pending: the nodes still without one, in inventory order. Each node source
    serves node_slots pulls per wave; staging serves staging_slots, and only while no node holds
    a verified copy (the first wave). A source in the puller's own group (rack, fabric) is
    preferred; the first node of a group that has no verified member yet is served first, so
    every group gets its own source as early as possible. A node not in `sources` is never
    chosen: that is how a node whose verification failed is never a source.
    """
    group_of = _group_of(groups)
    node_sources = [s for s in sources if s != STAGING]
    capacity = {s: node_slots for s in node_sources}
    # staging only while no node holds a verified copy (the first wave, or every pull failed)
    capacity[STAGING] = 0 if node_sources else staging_slots
    have = {group_of.get(s) for s in node_sources}
    chosen = {}

    def take(node, candidates):
        for source in candidates:
            if capacity.get(source, 0) > 0:
                capacity[source] -= 1
                chosen[node] = source
                return True
        return False

    # 1. one seed for every group without a verified member: from any node, else staging
    seeded = set()
    for node in pending:
        group = group_of.get(node)
        if group is not None and group not in have and group not in seeded:
            if take(node, node_sources + [STAGING]):
                seeded.add(group)
    # 2. the rest of the groups that have a source: a source in the same group first
    for node in pending:
        group = group_of.get(node)
        if node not in chosen and group in have and group is not None:
            take(node, [s for s in node_sources if group_of.get(s) == group])
    # 3. whoever is left (ungrouped nodes, full local sources), from any source; a group still
    #    without a verified member waits for its seed
    for node in pending:
        group = group_of.get(node)
        if node not in chosen and (group is None or group in have):
            take(node, node_sources + [STAGING])
    wave = [(node, chosen[node]) for node in pending if node in chosen]
    if pending and not wave:
        raise AnsibleFilterError("no source can serve %s: set weights_sync_fanout_staging_slots to "
                                 "at least 1." % ", ".join(pending))
    return wave


def fanout_plan(nodes, staging_slots=2, node_slots=1, groups=None):
    """Every wave as [[{node, source}, ...], ...], assuming each pull verifies. Refused
    (AnsibleFilterError) when fanout_problems finds anything."""
    problems = fanout_problems(nodes, staging_slots, node_slots, groups)
    if problems:
        raise AnsibleFilterError("refusing to plan the weights fan-out: " + " ".join(problems))
    sources, pending, waves = [STAGING], list(nodes), []
    while pending:
        wave = fanout_next_wave(sources, pending, staging_slots, node_slots, groups)
        waves.append([{"node": node, "source": source} for node, source in wave])
        pulled = {node for node, _ in wave}
        pending = [n for n in pending if n not in pulled]
        sources += [node for node, _ in wave]
    return waves


def fanout_groups(racks):
    """{rack: [nodes]} from [[node, rack], ...] (each node's weights_sync_fanout_rack, in
    inventory order); a node with an empty rack is in no group. None when no node names one."""
    groups = {}
    for node, rack in racks:
        if rack not in (None, ""):
            groups.setdefault(str(rack), []).append(node)
    return groups or None


def fanout_staging_pulls(waves):
    """How many pulls staging serves in a plan."""
    return sum(1 for wave in waves for pull in wave if pull["source"] == STAGING)


class FilterModule(object):
    """weights_fanout_plan, weights_fanout_next_wave, weights_fanout_problems, weights_fanout_groups,
    weights_fanout_staging_pulls."""

    def filters(self):
        return {
            "weights_fanout_plan": fanout_plan,
            "weights_fanout_next_wave": fanout_next_wave,
            "weights_fanout_problems": fanout_problems,
            "weights_fanout_groups": fanout_groups,
            "weights_fanout_staging_pulls": fanout_staging_pulls,
        }
