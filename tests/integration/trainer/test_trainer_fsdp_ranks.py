"""A 2-process FSDP2 (gloo) step equals the 1-process step; sharded (DCP) checkpoints resume.

The 1-process run happens in the test process; the 2-process run is a `torch.multiprocessing` spawn with `RANK`/`WORLD_SIZE` set as torchrun would;
rank 0 drives the step through the engine's command channel exactly as the service does, and
writes its results to a file the test compares.
"""

from __future__ import annotations

import pytest
import torch
import torch.multiprocessing as mp

from launcher.tiny_model import make_tiny_model
from services.trainer.distributed import free_port

pytestmark = pytest.mark.slow


def _config(model_dir, root):
    from pathlib import Path

    from tests.support.trainer_data import make_config

    return make_config(
        Path(model_dir),
        Path(root),
        algorithm={"kl_loss_fn": "k3", "loss_agg_mode": "token-mean"},
        trainer={"use_dynamic_bsz": True, "max_token_len_per_gpu": 40},
    )


def _step_and_checkpoint(engine, root) -> dict:
    """Rank 0: one step, the gathered gradients, a blocking save and a reload."""
    from pathlib import Path

    from torch.distributed.tensor import DTensor

    from services.trainer.collate import collate
    from tests.support.trainer_data import make_experiences

    def grads(_=None):
        out = {}
        for name, p in engine.worker.policy.named_parameters():
            out[name] = p.grad.full_tensor() if isinstance(p.grad, DTensor) else p.grad.clone()
        return out

    engine.channel.handlers["grads"] = grads
    metrics = engine.train_step(collate(make_experiences(8, group_size=4, seed=7)))
    g = engine.channel.run("grads")
    engine.save_checkpoint(1, {"global_step": 1}, save_as_hf=False, block=True)
    weights = dict(engine.iter_state_dict())
    loaded = engine.load_checkpoint(str(Path(root) / "rft-mesh" / "t" / "global_step_1"))
    reloaded = dict(engine.iter_state_dict())
    return {"metrics": metrics, "grads": g, "weights": weights, "reloaded": reloaded, "state": loaded}


def _run(rank: int, world: int, port: int, model_dir: str, root: str, out: str) -> None:
    from tests.support.rank_env import set_rank_env

    set_rank_env(rank, world, port)
    torch.set_num_threads(1)
    from torch.distributed.tensor import DTensor

    from services.trainer.distributed import ensure_process_group, exit_rank, leave_process_group
    from services.trainer.engine import FSDPEngine
    from services.trainer.settings import TrainerSettings

    engine = FSDPEngine(TrainerSettings.from_config(_config(model_dir, root)), ensure_process_group())
    if rank:
        engine.channel.handlers["grads"] = lambda _=None: {
            n: p.grad.full_tensor()
            for n, p in engine.worker.policy.named_parameters()
            if isinstance(p.grad, DTensor)
        }
        engine.serve_workers()
        engine.worker.wait_for_save()
        leave_process_group(engine.info)
        exit_rank(0)
    result = _step_and_checkpoint(engine, root)
    engine.close()
    torch.save(result, out)
    exit_rank(0)


def _spawn(world: int, model_dir, root, out) -> dict:
    mp.spawn(_run, args=(world, free_port(), str(model_dir), str(root), str(out)), nprocs=world, join=True)
    return torch.load(out, weights_only=True)


def test_two_rank_step_equals_one_rank_step(tmp_path):
    model_dir = make_tiny_model(tmp_path / "tiny")
    from services.trainer.distributed import ensure_process_group
    from services.trainer.engine import FSDPEngine
    from services.trainer.settings import TrainerSettings

    torch.set_num_threads(1)
    reference = FSDPEngine(
        TrainerSettings.from_config(_config(model_dir, tmp_path / "one")), ensure_process_group()
    )
    one = _step_and_checkpoint(reference, tmp_path / "one")  # world size 1, in this process
    two = _spawn(2, model_dir, tmp_path / "two", tmp_path / "two.pt")
    for name, g in one["grads"].items():
        torch.testing.assert_close(two["grads"][name], g, atol=1e-5, rtol=0)
    for key in ("actor/pg_loss", "actor/entropy", "actor/kl_loss", "actor/grad_norm"):
        assert two["metrics"][key] == pytest.approx(one["metrics"][key], rel=1e-4, abs=1e-6)
    for name, w in one["weights"].items():
        torch.testing.assert_close(two["weights"][name], w, atol=2e-5, rtol=0)
    # world size 2 saves torch.distributed.checkpoint shards; loading them restores the weights
    assert (tmp_path / "two" / "rft-mesh" / "t" / "global_step_1" / "actor" / "dcp").is_dir()
    assert two["state"]["global_step"] == 1
    for name, w in two["weights"].items():
        assert torch.equal(two["reloaded"][name], w)
