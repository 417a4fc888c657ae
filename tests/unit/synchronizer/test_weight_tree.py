"""`WeightTree`: the chains of relay addresses the synchronizer hands explorers (fanout > 0), over
the alive explorers that serve a relay, in registration order; a lost member's children skip it.
The core keeps it: registering notes the relay, leaving or being lost frees the slot."""

from __future__ import annotations

import pytest

from services.synchronizer.core import SynchronizerCore
from services.synchronizer.errors import InvalidArgument
from services.synchronizer.members import Member, MemberStatus, Role
from services.synchronizer.settings import SynchronizerSettings
from services.synchronizer.weight_tree import WeightTree
from services.weight_sync import sync_method


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


async def test_the_core_notes_relays_at_registration_and_frees_the_slots_of_members_gone():
    now = [0.0]
    settings = SynchronizerSettings(method=sync_method("memory"), heartbeat_timeout=5, fanout=2)
    core = SynchronizerCore(settings, clock=lambda: now[0])
    await core.register("trainer", Role.TRAINER)
    for i in range(5):
        await core.register(f"e{i}", Role.EXPLORER, relay_address=f"r{i}")
    await core.register("e5", Role.EXPLORER)  # serves no relay: pulls from the synchronizer
    chains = {m: core.weight_sources(m) for m in ("trainer", "e0", "e1", "e2", "e3", "e4", "e5")}
    assert chains == {
        "trainer": (),
        "e0": (),
        "e1": (),
        "e2": ("r0",),
        "e3": ("r0",),
        "e4": ("r1",),
        "e5": (),
    }
    with pytest.raises(InvalidArgument):  # a refused registration leaves the tree as it was
        await core.register("e3", Role.TRAINER)
    assert core.weight_sources("e3") == ("r0",)

    await core.heartbeat("e0", MemberStatus.STOPPED)  # left: its children pull from the synchronizer
    assert core.weight_sources("e2") == core.weight_sources("e3") == ()
    now[0] = 6.0
    for m in ("trainer", "e2", "e3", "e4", "e5"):
        await core.heartbeat(m)
    assert await core.check_lost() == ["e1"]
    assert core.weight_sources("e4") == ()  # e1's slot is free, nobody else moved
    await core.register("late", Role.EXPLORER, relay_address="rl")
    await core.register("e1", Role.EXPLORER, relay_address="r1b")  # a restarted process, a new relay
    assert core.weight_sources("e2") == ("rl",)  # the joiner took e0's slot
    assert core.weight_sources("e4") == ("r1b",)
    assert SynchronizerCore(SynchronizerSettings(method=sync_method("nccl"), fanout=2)).tree.fanout == 0
