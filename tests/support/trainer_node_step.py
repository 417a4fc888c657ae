"""One trainer rank under torchrun for the multi-node tests: `python -m torch.distributed.run ... -m
tests.support.trainer_node_step MODEL_DIR ROOT OUT [FIFO]`.

Every rank builds the FSDP2 engine on the tiny model; rank 0 trains one step on a fixed batch and writes
its metrics and the updated weights to OUT. With FIFO, rank 0 then blocks reading that named pipe (the
test writes to it once it has killed another node) and tries a second step, writing to OUT.second how
it failed and how long it took.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import torch


def main(model_dir: str, root: str, out: str, fifo: str | None = None) -> None:
    torch.set_num_threads(1)
    from services.trainer.collate import collate
    from services.trainer.distributed import ensure_process_group, exit_rank, leave_process_group
    from services.trainer.engine import FSDPEngine
    from services.trainer.settings import TrainerSettings
    from tests.support.trainer_data import make_config, make_experiences

    config = make_config(Path(model_dir), Path(root), algorithm={"loss_agg_mode": "token-mean"})
    engine = FSDPEngine(TrainerSettings.from_config(config), ensure_process_group())
    if engine.info.rank:
        engine.serve_workers()
        leave_process_group(engine.info)
        exit_rank(0)
    metrics = engine.train_step(collate(make_experiences(8, group_size=4, seed=7)))
    weights = dict(engine.iter_state_dict())
    torch.save({"metrics": metrics, "weights": weights, "world": engine.info.world_size}, out)
    if fifo is None:
        engine.close()
        exit_rank(0)
    with open(fifo) as pipe:  # the test has killed a node once it writes here
        pipe.read()
    start = time.monotonic()
    try:
        engine.train_step(collate(make_experiences(8, group_size=4, seed=8)))
        outcome = "trained"
    except Exception as exc:  # what rank 0 of a group that lost a node sees
        outcome = f"{type(exc).__name__}: {exc}"
    Path(out + ".second").write_text(f"{time.monotonic() - start:.3f}\n{outcome}")
    exit_rank(1)


if __name__ == "__main__":
    main(*sys.argv[1:])
