"""How rows are split: across data-parallel ranks, into mini-batches and into micro-batches.

Every rank holds the whole (global) step batch and computes the same deterministic split, so no
rank needs to ask another how many micro-batches it will run: FSDP2 needs every rank to run the
same number of forward/backward passes, and here that holds by construction.

- DP shards: equal row counts, balanced by tokens (longest-first greedy into the lightest shard).
- Fixed micro-batches: consecutive chunks of `micro_batch_size` rows of a rank's shard.
- Dynamic micro-batches (veRL `use_dynamic_bsz`): k = ceil(tokens / budget) per rank, the max over
  ranks, then the rows are balanced into k micro-batches by tokens (greedy longest-first, the
  same quality as Karmarkar-Karp for these sizes at a fraction of the code).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

__all__ = ["balanced_partition", "split_micro_batches", "shard_rows"]


def balanced_partition(
    items: Sequence[int], weights: Sequence[int], k: int, equal_size: bool = False
) -> list[list[int]]:
    """Split `items` into `k` lists with near-equal total weight (each list keeps item order).

    With `equal_size`, every list gets len(items)/k items (which must divide evenly).
    """
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    n = len(items)
    if equal_size and n % k:
        raise ValueError(f"{n} rows cannot be split into {k} equal parts")
    cap = n // k if equal_size else n
    bins: list[list[int]] = [[] for _ in range(k)]
    loads = [0] * k
    order = sorted(range(n), key=lambda j: (-weights[j], j))
    for j in order:
        open_bins = [b for b in range(k) if len(bins[b]) < cap]
        b = min(open_bins, key=lambda b: (loads[b], len(bins[b]), b))
        bins[b].append(j)
        loads[b] += weights[j]
    return [[items[j] for j in sorted(b)] for b in bins]


def shard_rows(rows: Sequence[int], lengths: Sequence[int], world_size: int) -> list[list[int]]:
    """Rows of each DP rank: equal counts, balanced tokens. `lengths[i]` is the length of row i."""
    return balanced_partition(list(rows), [lengths[r] for r in rows], world_size, equal_size=True)


def split_micro_batches(
    shards: Sequence[Sequence[int]],
    lengths: Sequence[int],
    micro_batch_size: int | None,
    token_budget: int | None,
) -> list[list[list[int]]]:
    """Micro-batches (lists of rows) of every rank; all ranks get the same number of them.

    Dynamic batching when `token_budget` is set, otherwise fixed chunks of `micro_batch_size`.
    """
    if token_budget is not None:
        ks = [
            min(max(1, math.ceil(sum(lengths[r] for r in shard) / token_budget)), max(len(shard), 1))
            for shard in shards
        ]
        k = min(max(ks), min(len(s) for s in shards))
        return [
            [mb for mb in balanced_partition(list(shard), [lengths[r] for r in shard], max(k, 1)) if mb]
            for shard in shards
        ]
    if not micro_batch_size or micro_batch_size < 1:
        raise ValueError("micro_batch_size must be >= 1 when dynamic batching is off")
    return [
        [list(shard[i : i + micro_batch_size]) for i in range(0, len(shard), micro_batch_size)]
        for shard in shards
    ]
