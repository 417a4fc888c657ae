"""Data-parallel row-wise computation: each rank runs its micro-batches, every rank gets all rows.

Used for the forward-only passes of a step (old log-probs, reference log-probs, critic values):
the rows of the global batch are sharded across ranks (`batching.shard_rows`), each rank runs its
micro-batches, and the ``(rows, response_length)`` results are all-gathered so every rank holds the
global tensor (advantages need whole groups, which may span ranks).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

import torch
import torch.distributed as dist

from services.trainer.batching import shard_rows, split_micro_batches
from services.trainer.collate import StepBatch
from services.trainer.distributed import DistInfo

__all__ = ["MicroBatching", "local_micro_batches", "map_rows"]


@dataclasses.dataclass(frozen=True)
class MicroBatching:
    """Fixed (`micro_batch_size` units) or dynamic (`token_budget` tokens) micro-batches.

    A unit is `unit_rows` consecutive rows that are never split (2 for DPO's (chosen, rejected)
    pairs): ranks, micro-batches and their balancing see units, weighted by their summed length.
    """

    micro_batch_size: int = 8
    token_budget: int | None = None
    unit_rows: int = 1


def local_micro_batches(step: StepBatch, info: DistInfo, how: MicroBatching) -> list[list[int]]:
    """This rank's micro-batches (row indices into `step`); the count is equal on every rank."""
    k = how.unit_rows
    if step.size % k:
        raise ValueError(f"{step.size} rows cannot be split into units of {k} rows (pairs must stay whole)")
    rows = step.seq_lengths
    lengths = [sum(rows[u * k : (u + 1) * k]) for u in range(step.size // k)]
    shards = shard_rows(range(len(lengths)), lengths, info.world_size)
    plan = split_micro_batches(shards, lengths, how.micro_batch_size, how.token_budget)
    return [[u * k + j for u in units for j in range(k)] for units in plan[info.rank]]


def map_rows(
    step: StepBatch,
    info: DistInfo,
    how: MicroBatching,
    fn: Callable[[StepBatch], torch.Tensor],
) -> torch.Tensor:
    """`fn` over this rank's micro-batches, results gathered into ``(bs, response_length)`` on all ranks.

    `fn(micro)` returns ``(len(micro), response_length)`` on any device; the result is on CPU.
    """
    pieces: list[tuple[Sequence[int], torch.Tensor]] = []
    for rows in local_micro_batches(step, info, how):
        pieces.append((rows, fn(step.rows(rows)).detach().float().cpu()))
    if info.world_size > 1:
        gathered: list[list[tuple[Sequence[int], torch.Tensor]] | None] = [None] * info.world_size
        dist.all_gather_object(gathered, pieces)
        pieces = [p for part in gathered for p in (part or [])]
    out = torch.zeros(step.size, step.batch.response_length)
    for rows, values in pieces:
        out[torch.as_tensor(list(rows))] = values
    return out
