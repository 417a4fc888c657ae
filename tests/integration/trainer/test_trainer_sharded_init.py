"""Sharded loading on 2 FSDP2 (gloo) ranks: each rank builds a meta-device skeleton and receives its
shards of rank 0's weights; the gathered policy and reference equal `from_pretrained`'s bit for bit.
The same run has veRL's `param_offload` / `optimizer_offload` on (FSDP2 `CPUOffloadPolicy` on the
CPU mesh), and its step equals the 1-process step without offload.  Ranks are spawned with
`RANK`/`WORLD_SIZE` as torchrun would; rank 0 drives them through the engine's command channel."""

from __future__ import annotations

import pytest
import torch
import torch.multiprocessing as mp

from launcher.tiny_model import make_tiny_model
from services.trainer.distributed import free_port

pytestmark = pytest.mark.slow
OFFLOAD = {
    "actor_rollout_ref": {
        "actor": {"fsdp_config": {"param_offload": True, "optimizer_offload": True}},
        "ref": {"fsdp_config": {"param_offload": True}},
    }
}


def _config(model_dir, root, offload: bool):
    from pathlib import Path

    from tests.support.trainer_data import make_config

    trainer = {"use_dynamic_bsz": False, "micro_batch_size_per_gpu": 4}
    if offload:
        trainer["trainer_config"] = OFFLOAD
    return make_config(Path(model_dir), Path(root), algorithm={"kl_loss_fn": "k3"}, trainer=trainer)


def _experiences():
    from tests.support.trainer_data import make_experiences

    exps = make_experiences(8, group_size=4, seed=7)
    for i, e in enumerate(exps):
        e.reward = float(i % 3 == 0)
    return exps


def _run(rank: int, world: int, port: int, model_dir: str, root: str, out: str) -> None:
    from tests.support.rank_env import set_rank_env

    set_rank_env(rank, world, port)
    torch.set_num_threads(1)
    from services.trainer.collate import collate
    from services.trainer.distributed import ensure_process_group, exit_rank, leave_process_group
    from services.trainer.engine import FSDPEngine
    from services.trainer.fsdp import full_state_dict
    from services.trainer.settings import TrainerSettings

    engine = FSDPEngine(TrainerSettings.from_config(_config(model_dir, root, True)), ensure_process_group())
    w = engine.worker
    engine.channel.handlers["init_state"] = lambda _=None: {
        "policy": full_state_dict(w.policy),
        "ref": full_state_dict(w.ref.module),
    }
    if rank:
        engine.serve_workers()
        leave_process_group(engine.info)
        exit_rank(0)
    init = engine.channel.run("init_state")
    groups = [m._get_fsdp_state()._fsdp_param_group for m in (w.policy, w.ref.module)]
    offloaded = all(p.offload_to_cpu for g in groups for p in g.fsdp_params)
    metrics = [engine.train_step(collate(_experiences())) for _ in range(2)]
    state_devices = {v.device.type for s in w.actor.optimizer.state.values() for v in s.values()}
    engine.close()
    torch.save(
        {"init": init, "metrics": metrics, "offloaded": offloaded, "state_devices": sorted(state_devices)},
        out,
    )
    exit_rank(0)


def test_two_rank_sharded_init_equals_from_pretrained_and_offloaded_steps_match(tmp_path):
    from services.common.modeling import load_model
    from services.trainer.collate import collate
    from services.trainer.distributed import ensure_process_group
    from services.trainer.engine import FSDPEngine
    from services.trainer.settings import TrainerSettings

    model_dir = make_tiny_model(tmp_path / "tiny")
    out = tmp_path / "two.pt"
    mp.spawn(
        _run, args=(2, free_port(), str(model_dir), str(tmp_path / "two"), str(out)), nprocs=2, join=True
    )
    two = torch.load(out, weights_only=True)
    expected = load_model(str(model_dir), dtype="float32").state_dict()
    for role in ("policy", "ref"):
        state = two["init"][role]
        assert state.keys() == expected.keys(), role
        for name, value in expected.items():
            assert state[name].dtype == value.dtype and torch.equal(state[name], value), (role, name)
    assert two["offloaded"] and two["state_devices"] == ["cpu"]
    torch.set_num_threads(1)
    one = FSDPEngine(
        TrainerSettings.from_config(_config(model_dir, tmp_path / "one", False)), ensure_process_group()
    )
    for got, want in zip(
        two["metrics"], [one.train_step(collate(_experiences())) for _ in range(2)], strict=True
    ):
        for key in ("actor/pg_loss", "actor/entropy", "actor/kl_loss", "actor/grad_norm"):
            assert got[key] == pytest.approx(want[key], rel=1e-4, abs=1e-6), key
    assert two["metrics"][1]["actor/kl_loss"] > 0
