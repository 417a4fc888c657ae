"""The memory method's fan-out tree: who each explorer pulls a weight version from.

With `fanout = 0` (star) every explorer pulls from the synchronizer, so the synchronizer sends N
copies of each version and the time for a version to reach all N grows like N. With `fanout = k`
the members form a k-ary tree rooted at the synchronizer: the synchronizer sends k copies, each
explorer relays what it receives to at most k children as the chunks arrive
(`services.weight_sync.tree.store`), and a version reaches all N after about log_k(N) hops.

Members sit in slots, in heap order: slot p's parent is slot `p // k - 1`, or the root for the first
k slots (the root is node 0 of a k-ary heap, slot p is node p + 1). `plan_tree` is a pure function of
the slot list; `TreeSlots` keeps that list as members join and leave so the tree moves little: a
joining member takes the first free slot (a leaf, or a slot left by a member that left), a leaving
member's slot is left free until someone joins (its children pull from their grandparent meanwhile,
as they do when a parent dies: each member gets its whole chain of ancestors up to the root, nearest
first, and falls back along it). Nobody else moves: joins and leaves change only the leaver's slot.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

ROOT = ""  # the synchronizer, in a member's chain of sources


def plan_tree(slots: Sequence[str | None], fanout: int) -> dict[str, tuple[str, ...]]:
    """Each member's sources, nearest first: its parent, grandparent, ..., and `ROOT` last.

    `slots[p]` is the member in slot p or None for a free slot (skipped: its children's chain goes on
    at the free slot's parent). `fanout` 0 = star: every member pulls from the root only."""
    if fanout < 0:
        raise ValueError(f"fanout must be >= 0 (0 = star), got {fanout}")
    plan: dict[str, tuple[str, ...]] = {}
    for p, member in enumerate(slots):
        if member is None:
            continue
        if member in plan:
            raise ValueError(f"member {member!r} is in two slots")
        chain: list[str] = []
        node = p
        while fanout and node >= fanout:
            node = node // fanout - 1
            above = slots[node]
            if above is not None:
                chain.append(above)
        plan[member] = (*chain, ROOT)
    return plan


def depth(n: int, fanout: int) -> int:
    """Hops from the root to the deepest of n members (star: 1)."""
    if n <= 0:
        return 0
    if fanout <= 0:
        return 1
    d, last = 1, fanout  # slots 0..last-1 are at depth d
    while last < n:
        d, last = d + 1, last + fanout ** (d + 1)
    return d


class TreeSlots:
    """The slot list behind `plan_tree`, kept as members join and leave (see the module docstring)."""

    def __init__(self, fanout: int):
        if fanout < 0:
            raise ValueError(f"fanout must be >= 0 (0 = star), got {fanout}")
        self.fanout = fanout
        self._slots: list[str | None] = []
        self._where: dict[str, int] = {}

    def join(self, member: str) -> int:
        """Place `member` (no-op if placed) in the first free slot, else a new leaf; returns its slot."""
        if member in self._where:
            return self._where[member]
        try:
            slot = self._slots.index(None)
            self._slots[slot] = member
        except ValueError:
            slot = len(self._slots)
            self._slots.append(member)
        self._where[member] = slot
        return slot

    def leave(self, member: str) -> None:
        slot = self._where.pop(member, None)
        if slot is None:
            return
        self._slots[slot] = None
        while self._slots and self._slots[-1] is None:
            self._slots.pop()

    def sync(self, members: Sequence[str]) -> None:
        """Make the placed members exactly `members` (those gone leave, new ones join in order)."""
        wanted = dict.fromkeys(members)
        for member in [m for m in self._where if m not in wanted]:
            self.leave(member)
        for member in wanted:
            self.join(member)

    @property
    def slots(self) -> tuple[str | None, ...]:
        return tuple(self._slots)

    def plan(self) -> Mapping[str, tuple[str, ...]]:
        return plan_tree(self._slots, self.fanout)
