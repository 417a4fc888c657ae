"""The torchrun environment of one rank on loopback, for tests that start ranks as subprocesses."""

from __future__ import annotations

import os


def set_rank_env(rank: int, world: int, port: int, local_rank: int | None = None) -> None:
    """Set RANK, WORLD_SIZE, LOCAL_RANK (default: `rank`) and MASTER_ADDR/PORT (127.0.0.1:`port`)."""
    os.environ.update(
        RANK=str(rank),
        WORLD_SIZE=str(world),
        LOCAL_RANK=str(rank if local_rank is None else local_rank),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
    )
