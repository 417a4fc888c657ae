"""Test helpers for the trainer: configs on the tiny model, seeded experiences, an in-order batch source.

`OrderedBuffer` implements the trainer's `BatchSource` protocol with the buffer's lease semantics
(a leased batch is invisible until acked or given back; `restart()` gives back every open lease,
as a buffer does when a trainer dies) but always serves the oldest batch first, so a resumed run
sees exactly the batches a straight run sees. Like the buffer, it drops (and counts in the lease's
`dropped_stale`) batches older than a lease's `min_model_version`.  Tests against the real buffer service live in
tests/integration/trainer.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
from pathlib import Path
from typing import Any

import torch

from services.common.config import RFTConfig
from services.common.experience import Experience, ExperienceId


def make_config(model_dir: Path, root: Path, **sections: Any) -> RFTConfig:
    """A run config on `model_dir` with checkpoints under `root`; `sections` are merged in."""
    tree: dict[str, Any] = {
        "name": "t",
        "checkpoint_root_dir": str(root),
        "model": {"model_path": str(model_dir)},
        "algorithm": {
            "algorithm_type": "grpo",
            "repeat_times": 4,
            "optimizer": {"lr": 1e-3, "weight_decay": 0.0},
            "kl_loss_fn": "none",
        },
        "buffer": {"batch_size": 2},
        "trainer": {"use_dynamic_bsz": False, "micro_batch_size_per_gpu": 8},
        "monitor": {"monitor_type": "none"},
    }
    for key, value in sections.items():
        if isinstance(value, dict) and isinstance(tree.get(key), dict):
            tree[key] = {**tree[key], **value}
        else:
            tree[key] = value
    return RFTConfig.model_validate(tree)


def make_experiences(
    n: int, group_size: int = 4, seed: int = 0, vocab: int = 500, prompt: int = 4, max_response: int = 12
) -> list[Experience]:
    """`n` experiences in groups of `group_size` with varied lengths and 0/1 rewards."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        r = int(torch.randint(2, max_response + 1, (1,), generator=g))
        tokens = torch.randint(3, vocab, (prompt + r,), generator=g)
        out.append(
            Experience(
                tokens=tokens,
                prompt_length=prompt,
                reward=float(torch.rand(1, generator=g) > 0.5),
                eid=ExperienceId(
                    group_id=f"s{seed}g{i // group_size}", run_id=i % group_size, task_id=str(i)
                ),
            )
        )
    return out


def make_pairs(n: int, seed: int = 0, vocab: int = 500) -> list[Experience]:
    """`n` DPO pair experiences: a prompt, chosen and rejected responses of different lengths."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        prompt = torch.randint(3, vocab, (4,), generator=g)
        chosen = torch.randint(3, vocab, (int(torch.randint(2, 9, (1,), generator=g)),), generator=g)
        rejected = torch.randint(3, vocab, (int(torch.randint(2, 9, (1,), generator=g)),), generator=g)
        out.append(Experience(tokens=torch.cat([prompt, chosen]), prompt_length=4, reward=0.0,
                              rejected_tokens=torch.cat([prompt, rejected]), rejected_prompt_length=4,
                              eid=ExperienceId(group_id=f"pair{i}", task_id=str(i))))  # fmt: skip
    return out


@dataclasses.dataclass
class Lease:
    lease_id: str
    experiences: list[Experience]
    partial: bool = False
    dropped_stale: int = 0

    def decoded(self) -> list[Experience]:
        return list(self.experiences)


class OrderedBuffer:
    """An in-memory `BatchSource`: batches served oldest first, leased until ack/nack/restart."""

    def __init__(self, batches: list[list[Experience]]):
        self._queue: list[tuple[int, list[Experience]]] = list(enumerate(batches))
        self._leased: dict[str, tuple[int, list[Experience]]] = {}
        self._ids = itertools.count()
        self.acked: list[int] = []
        self.dropped: list[int] = []  # batches dropped by the staleness bound
        self.changed = asyncio.Event()

    async def get_batch(
        self, size: int, *, timeout_ms: int = 0, min_model_version: int = 0, lease_ms: int = 0
    ):
        # the staleness bound: batches holding experiences older than min_model_version are dropped
        stale = [item for item in self._queue if min(e.model_version for e in item[1]) < min_model_version]
        self._queue = [item for item in self._queue if all(item is not s for s in stale)]
        self.dropped.extend(index for index, _ in stale)
        dropped = sum(len(exps) for _, exps in stale)
        if not self._queue:
            return Lease("", [], True, dropped)
        self._queue.sort(key=lambda item: item[0])
        index, exps = self._queue.pop(0)
        lease_id = f"lease-{next(self._ids)}"
        self._leased[lease_id] = (index, exps)
        return Lease(lease_id, exps, len(exps) < size, dropped)

    async def ack(self, lease_id: str) -> int:
        index, exps = self._leased.pop(lease_id)
        self.acked.append(index)
        return len(exps)

    async def nack(self, lease_id: str) -> int:
        item = self._leased.pop(lease_id)
        self._queue.append(item)
        return len(item[1])

    def restart(self) -> None:
        """Give back every open lease (the consumer died)."""
        self._queue.extend(self._leased.values())
        self._leased.clear()

    async def open_consumer(self, ack_lease_ids=()):
        """A trainer (re)starts: ack the leases its checkpoint holds, give every other one back."""
        for lease_id in [lid for lid in ack_lease_ids if lid in self._leased]:
            await self.ack(lease_id)
        self.restart()
