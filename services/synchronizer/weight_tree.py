"""Which peers each explorer pulls a weight version from (the memory method's fan-out tree).

With `synchronizer.fanout: k` (> 0, a pushed method) explorers that serve a relay (they registered a
`relay_address`) form a k-ary tree rooted at the synchronizer (`services.weight_sync.tree.plan`): the answer to
an explorer's `WaitForVersion` names its chain of relays, nearest first (`weight_sources`); it pulls
from the first that delivers and from the synchronizer when they all fail. Explorers without a relay,
and every explorer with `fanout: 0`, pull from the synchronizer (an empty chain: star).

`SynchronizerCore` owns the tree: its `register` notes each member's relay and its `weight_sources`
asks for a chain. The tree is kept over the alive explorers with a relay, in registration order
(`TreeSlots`: a joiner takes the first free slot, a member that left or was lost frees its slot,
nobody else moves), so a membership change moves only the member that changed; an explorer that
registers again keeps its slot. Slots follow the members as they are when a chain is asked for
(`sources` syncs them), so a member that left or was lost frees its slot then, with no call from
the paths that drop it.
"""

from __future__ import annotations

from collections.abc import Iterable

from services.synchronizer.members import Member, Role
from services.weight_sync.tree.plan import ROOT, TreeSlots


class WeightTree:
    def __init__(self, fanout: int):
        self.fanout = fanout
        self._slots = TreeSlots(fanout)
        self._relays: dict[str, str] = {}  # member id -> its relay's address

    def note(self, member_id: str, relay_address: str) -> None:
        """A member (re)registered, serving a relay at `relay_address` ('' = none)."""
        if relay_address:
            self._relays[member_id] = relay_address
        else:
            self._relays.pop(member_id, None)

    def sources(self, members: Iterable[Member], member_id: str) -> tuple[str, ...]:
        """`member_id`'s relays to pull from, nearest first (empty: the synchronizer only)."""
        if self.fanout <= 0 or member_id not in self._relays:
            return ()
        placed = [
            m.member_id
            for m in sorted(members, key=lambda m: m.seq)
            if m.role == Role.EXPLORER and m.alive and m.member_id in self._relays
        ]
        self._slots.sync(placed)
        chain = self._slots.plan().get(member_id, (ROOT,))
        return tuple(self._relays[m] for m in chain if m != ROOT)
