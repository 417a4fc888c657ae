"""Two FSDP2 (gloo) ranks: deferring the gradient sync to a step's last micro-batch
(`trainer.defer_grad_sync`, `fsdp.accumulate`) gives the weights of syncing every micro-batch, policy
and PPO critic alike, with one reduce-scatter per parameter group per step instead of one per
micro-batch.  Both runs use a chunked LM head of 7 tokens (`trainer.logits_chunk_tokens`) on the
sharded model.

Each rank (a `torch.multiprocessing` spawn with the torchrun environment) runs both settings on the
same batch; rank 0 writes the gathered weights and the reduce-scatter counts for the test to compare.
"""

from __future__ import annotations

import pytest
import torch
import torch.multiprocessing as mp

from launcher.tiny_model import make_tiny_model
from services.trainer.distributed import free_port

pytestmark = pytest.mark.slow


def _run(rank: int, world: int, port: int, model_dir: str, out: str) -> None:
    from pathlib import Path

    import torch.distributed as dist

    from services.trainer.collate import collate
    from services.trainer.distributed import ensure_process_group, exit_rank
    from services.trainer.fsdp import full_state_dict
    from services.trainer.rowwise import local_micro_batches
    from services.trainer.settings import TrainerSettings
    from services.trainer.worker import FSDPWorker
    from tests.support.rank_env import set_rank_env
    from tests.support.trainer_data import make_config, make_experiences

    set_rank_env(rank, world, port)
    torch.set_num_threads(1)
    info = ensure_process_group()
    calls = {"n": 0}
    reduce_scatter = dist.reduce_scatter_single  # what FSDP2 reduces gradients with

    def counted(*args, **kwargs):
        calls["n"] += 1
        return reduce_scatter(*args, **kwargs)

    dist.reduce_scatter_single = counted
    step = collate(make_experiences(8, group_size=1, seed=7))
    ppo = {"algorithm_type": "ppo", "repeat_times": 1, "kl_loss_fn": "none"}
    result: dict = {}
    for defer in (False, True):
        trainer = {"use_dynamic_bsz": False, "micro_batch_size_per_gpu": 2, "logits_chunk_tokens": 7,
                   "defer_grad_sync": defer}  # fmt: skip
        config = make_config(
            Path(model_dir),
            Path(out).parent / str(defer),
            algorithm=ppo,
            buffer={"batch_size": 8},
            trainer=trainer,
        )
        worker = FSDPWorker(TrainerSettings.from_config(config), info)
        assert worker.actor.defer_sync is defer
        assert worker.critic is not None
        before = full_state_dict(worker.policy)
        calls["n"] = 0
        worker.train_step(step)
        result[defer] = {
            "reduce_scatters": calls["n"],
            "micro_batches": len(local_micro_batches(step, info, worker.actor.batching)),
            "weights": full_state_dict(worker.policy),
            "critic": full_state_dict(worker.critic.module),
            "before": before,
        }
    if rank == 0:
        torch.save(result, out)
    exit_rank(0)


def test_deferred_gradient_sync_gives_the_same_step_with_fewer_reduce_scatters(tmp_path):
    model_dir = make_tiny_model(tmp_path / "tiny")
    out = tmp_path / "result.pt"
    mp.spawn(_run, args=(2, free_port(), str(model_dir), str(out)), nprocs=2, join=True)
    every, deferred = (torch.load(out, weights_only=True)[d] for d in (False, True))
    assert every["micro_batches"] == deferred["micro_batches"] > 1  # gradients are accumulated
    assert deferred["reduce_scatters"] > 0
    assert every["reduce_scatters"] == every["micro_batches"] * deferred["reduce_scatters"]
    assert every["weights"].keys() == deferred["weights"].keys()
    for name, w in every["weights"].items():
        torch.testing.assert_close(deferred["weights"][name], w, atol=1e-6, rtol=0, msg=name)
    assert any(not torch.equal(w, every["before"][n]) for n, w in every["weights"].items())  # a real step
    for name, w in every["critic"].items():
        torch.testing.assert_close(deferred["critic"][name], w, atol=1e-6, rtol=0, msg=name)
