"""DPO on 2 FSDP2 ranks (gloo) equals DPO on one: pairs split across ranks stay whole, the loss's
metrics (chosen/rejected rewards, accuracy) are reduced over ranks, and the gradients agree."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp

from launcher.tiny_model import make_tiny_model
from services.trainer.distributed import free_port

pytestmark = pytest.mark.slow

KEYS = (
    "actor/dpo_loss",
    "actor/chosen_reward",
    "actor/rejected_reward",
    "actor/accuracy_mean",
    "actor/grad_norm",
)


def _engine(model_dir: str, root: str):
    from services.trainer.distributed import ensure_process_group
    from services.trainer.engine import FSDPEngine
    from services.trainer.settings import TrainerSettings
    from tests.support.trainer_data import make_config

    config = make_config(
        Path(model_dir), Path(root), algorithm={"algorithm_type": "dpo", "repeat_times": 1, "kl_loss_fn": "k3"},
        buffer={"batch_size": 4}, trainer={"use_dynamic_bsz": True, "max_token_len_per_gpu": 30},
    )  # fmt: skip
    return FSDPEngine(TrainerSettings.from_config(config), ensure_process_group())


def _step(engine) -> dict:
    from torch.distributed.tensor import DTensor

    from services.trainer.collate import collate
    from tests.support.trainer_data import make_pairs

    def grads(_=None):
        return {n: p.grad.full_tensor() if isinstance(p.grad, DTensor) else p.grad.clone()
                for n, p in engine.worker.policy.named_parameters()}  # fmt: skip

    engine.channel.handlers["grads"] = grads
    metrics = engine.train_step(collate(make_pairs(4, seed=3)))
    return {"metrics": metrics, "grads": engine.channel.run("grads")}


def _run(rank: int, world: int, port: int, model_dir: str, root: str, out: str) -> None:
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank),
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))  # fmt: skip
    torch.set_num_threads(1)
    from services.trainer.distributed import exit_rank, leave_process_group

    engine = _engine(model_dir, root)
    if rank:
        from torch.distributed.tensor import DTensor

        engine.channel.handlers["grads"] = lambda _=None: {
            n: p.grad.full_tensor()
            for n, p in engine.worker.policy.named_parameters()
            if isinstance(p.grad, DTensor)
        }
        engine.serve_workers()
        leave_process_group(engine.info)
        exit_rank(0)
    result = _step(engine)
    engine.close()
    torch.save(result, out)
    exit_rank(0)


def test_two_rank_dpo_step_equals_one_rank_step(tmp_path):
    torch.set_num_threads(1)
    model_dir = make_tiny_model(tmp_path / "tiny")
    one = _step(_engine(str(model_dir), str(tmp_path / "one")))
    out = tmp_path / "two.pt"
    mp.spawn(
        _run, args=(2, free_port(), str(model_dir), str(tmp_path / "two"), str(out)), nprocs=2, join=True
    )
    two = torch.load(out, weights_only=True)
    for name, g in one["grads"].items():
        torch.testing.assert_close(two["grads"][name], g, atol=1e-5, rtol=0)
    for key in KEYS:
        assert two["metrics"][key] == pytest.approx(one["metrics"][key], rel=1e-4, abs=1e-6), key
