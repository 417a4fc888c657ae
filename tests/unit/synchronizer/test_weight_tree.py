"""`WeightTree`: the chains of relay addresses the synchronizer hands explorers (fanout > 0), over
the alive explorers that serve a relay, in registration order; a lost member's children skip it."""

from __future__ import annotations

from services.synchronizer.members import Member, MemberStatus, Role
from services.synchronizer.weight_tree import WeightTree


def members(n: int) -> list[Member]:
    out = [Member("trainer", Role.TRAINER, MemberStatus.RUNNING, seq=0)]
    out += [Member(f"e{i}", Role.EXPLORER, MemberStatus.RUNNING, seq=i + 1) for i in range(n)]
    return out


def test_chains_follow_registration_order_and_skip_what_has_no_relay():
    tree = WeightTree(fanout=2)
    ms = members(6)
    for m in ms[1:]:
        tree.note(m.member_id, f"relay-{m.member_id}:1")
    tree.note("e5", "")  # registered again without a relay
    assert tree.sources(ms, "e0") == tree.sources(ms, "e1") == ()  # the root's children
    assert tree.sources(ms, "e2") == ("relay-e0:1",)
    assert tree.sources(ms, "e4") == ("relay-e1:1",)
    assert tree.sources(ms, "e5") == () and tree.sources(ms, "trainer") == ()
    assert WeightTree(fanout=0).sources(ms, "e2") == ()  # star


def test_a_lost_parent_is_skipped_and_nobody_else_moves():
    tree = WeightTree(fanout=2)
    ms = members(7)
    for m in ms[1:]:
        tree.note(m.member_id, m.member_id)
    assert tree.sources(ms, "e6") == ("e2", "e0")
    ms[3].status = MemberStatus.LOST  # e2
    assert tree.sources(ms, "e6") == ("e0",) and tree.sources(ms, "e3") == ("e0",)
    ms.append(Member("late", Role.EXPLORER, MemberStatus.RUNNING, seq=9))
    tree.note("late", "late")
    assert tree.sources(ms, "e6") == ("late", "e0")  # the joiner took the free slot
