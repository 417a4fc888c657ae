"""The fan-out tree planner (`weight_sync.tree.plan`): parents in heap order, chains to the root, depth,
and slots that move only the member that joins or leaves."""

from __future__ import annotations

import pytest

from services.weight_sync.tree.plan import ROOT, TreeSlots, depth, plan_tree


def test_plan_tree_binary_heap_chains_end_at_the_root():
    plan = plan_tree([f"e{i}" for i in range(7)], fanout=2)
    assert plan["e0"] == plan["e1"] == (ROOT,)
    assert plan["e2"] == plan["e3"] == ("e0", ROOT)
    assert plan["e4"] == plan["e5"] == ("e1", ROOT)
    assert plan["e6"] == ("e2", "e0", ROOT)


def test_star_and_fanout_limits():
    assert set(plan_tree(["a", "b", "c"], fanout=0).values()) == {(ROOT,)}
    plan = plan_tree([f"e{i}" for i in range(64)], fanout=4)
    children: dict[str, int] = {}
    for chain in plan.values():
        children[chain[0]] = children.get(chain[0], 0) + 1
    assert max(children.values()) == 4  # nobody (the root included) serves more than k children
    assert max(len(chain) for chain in plan.values()) == depth(64, 4) == 3
    with pytest.raises(ValueError, match="fanout"):
        plan_tree(["a"], fanout=-1)
    with pytest.raises(ValueError, match="two slots"):
        plan_tree(["a", "a"], fanout=2)


@pytest.mark.parametrize(
    ("n", "k", "want"),
    [(0, 2, 0), (1, 2, 1), (2, 2, 1), (3, 2, 2), (6, 2, 2), (7, 2, 3), (64, 0, 1), (64, 2, 6), (16, 4, 2)],
)
def test_depth_matches_the_plan(n, k, want):
    assert depth(n, k) == want
    if n and k:
        assert max(len(c) for c in plan_tree([str(i) for i in range(n)], k).values()) == want


def test_free_slot_children_go_to_the_grandparent_and_a_joiner_fills_it():
    slots = TreeSlots(fanout=2)
    slots.sync([f"e{i}" for i in range(7)])
    before = slots.plan()
    slots.leave("e2")
    after = slots.plan()
    assert "e2" not in after and after["e6"] == ("e0", ROOT)  # e2's child falls back to e0
    assert {m: c for m, c in after.items() if m != "e6"} == {
        m: c for m, c in before.items() if m not in ("e2", "e6")
    }
    assert slots.join("late") == 2  # the free slot, so nobody else moves
    assert slots.plan()["e6"] == ("late", "e0", ROOT)
    assert slots.join("late") == 2  # joining twice is a no-op
    slots.sync(["e0", "e1"])
    assert slots.slots == ("e0", "e1")  # trailing free slots are trimmed
