"""The trainer's model memory on CUDA (gpu tier; one GPU, a world-size-1 group in this process):
sharded loading allocates about one fp32 copy of the policy (never the full model and its shards
together), the reference model is bf16, and veRL's `param_offload` / `optimizer_offload` give the
step of the run without them (within bf16 tolerance) while the shards and the optimizer state sit
on the CPU between steps, through a checkpoint save and load too."""

from __future__ import annotations

import pytest
import torch
from torch.distributed.tensor import DTensor

from launcher.tiny_model import make_tiny_model
from services.trainer.collate import collate
from services.trainer.distributed import ensure_process_group
from services.trainer.engine import FSDPEngine
from services.trainer.settings import TrainerSettings
from services.trainer.worker import FSDPWorker
from tests.support.trainer_data import make_config, make_experiences

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]
KL = {"kl_loss_fn": "k3"}


def offload(param: bool, optimizer: bool) -> dict:
    actor = {"fsdp_config": {"param_offload": param, "optimizer_offload": optimizer}}
    ref = {"fsdp_config": {"param_offload": param}}
    return {"trainer_config": {"actor_rollout_ref": {"actor": actor, "ref": ref}}}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return make_tiny_model(tmp_path_factory.mktemp("small"), size="small")


def experiences():
    exps = make_experiences(8, group_size=4, seed=7)
    for i, e in enumerate(exps):
        e.reward = float(i % 3 == 0)
    return exps


def local_devices(tensors) -> set[str]:
    return {(t.to_local() if isinstance(t, DTensor) else t).device.type for t in tensors}


def moments(engine: FSDPEngine) -> list[torch.Tensor]:
    """AdamW's moments, in parameter order."""
    optimizer = engine.worker.actor.optimizer
    params = [p for group in optimizer.param_groups for p in group["params"]]
    state = [optimizer.state[p] for p in params if p in optimizer.state]
    return [s[k] for s in state for k in ("exp_avg", "exp_avg_sq")]


def local(t: torch.Tensor) -> torch.Tensor:
    """The rank's own values (world size 1: all of them)."""
    return (t.to_local() if isinstance(t, DTensor) else t).detach().cpu().clone()


def test_sharded_init_allocates_about_one_fp32_copy_of_the_policy(model_dir, tmp_path):
    info = ensure_process_group()
    settings = TrainerSettings.from_config(make_config(model_dir, tmp_path))  # no KL: the policy alone
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    w = FSDPWorker(settings, info)
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - base
    params = list(w.policy.parameters())
    param_bytes = sum(p.numel() * p.element_size() for p in params)
    print(f"init peak {peak / 2**20:.1f} MiB for {param_bytes / 2**20:.1f} MiB of fp32 parameters")
    assert w.ref is None and all(p.dtype == torch.float32 for p in params)
    assert local_devices(params) == {"cuda"}
    # loading whole and then sharding held the full model and its shards at once (2x and more)
    assert peak <= 1.25 * param_bytes, (peak, param_bytes)


def test_the_reference_model_is_bf16_and_gives_the_policys_log_probs_at_init(model_dir, tmp_path):
    info = ensure_process_group()
    w = FSDPWorker(TrainerSettings.from_config(make_config(model_dir, tmp_path, algorithm=KL)), info)
    assert w.ref is not None
    assert all(p.dtype == torch.bfloat16 for p in w.ref.module.parameters())
    assert all(p.dtype == torch.float32 for p in w.policy.parameters())
    assert local_devices(w.ref.module.parameters()) == {"cuda"}
    step = collate(experiences())
    # the policy computes in bf16 from its fp32 master: the same rounded weights as the reference
    torch.testing.assert_close(
        w.ref.compute_log_prob(step), w.actor.compute_log_prob(step), atol=2e-2, rtol=0
    )


def test_steps_with_offload_match_steps_without_and_keep_the_state_on_the_cpu(model_dir, tmp_path):
    info = ensure_process_group()
    runs = {}
    for name, (param, optimizer) in {
        "none": (False, False),
        "optimizer": (False, True),
        "both": (True, True),
    }.items():
        config = make_config(model_dir, tmp_path / name, algorithm=KL, trainer=offload(param, optimizer))
        engine = FSDPEngine(TrainerSettings.from_config(config), info)
        metrics = []
        for _ in range(2):
            metrics.append(engine.train_step(collate(experiences())))
            runs.setdefault(name, {"between": []})["between"].append(local_devices(moments(engine)))
        runs[name] |= {"engine": engine, "metrics": metrics}
    assert runs["none"]["between"] == [{"cuda"}, {"cuda"}]
    for name in ("optimizer", "both"):
        assert runs[name]["between"] == [{"cpu"}, {"cpu"}], name
        for got, want in zip(runs[name]["metrics"], runs["none"]["metrics"], strict=True):
            for key in ("actor/pg_loss", "actor/kl_loss"):
                assert got[key] == pytest.approx(want[key], abs=2e-3), (name, key)
            for key in ("actor/entropy", "actor/grad_norm"):
                assert got[key] == pytest.approx(want[key], rel=2e-2), (name, key)
    assert runs["none"]["metrics"][1]["actor/kl_loss"] > 0
    both = runs["both"]["engine"].worker
    assert local_devices(both.policy.parameters()) == {"cpu"}
    assert local_devices(both.ref.module.parameters()) == {"cpu"}
    assert local_devices(runs["optimizer"]["engine"].worker.policy.parameters()) == {"cuda"}


@pytest.mark.parametrize("param", [False, True], ids=["optimizer_offload", "param_and_optimizer_offload"])
def test_a_checkpoint_round_trip_keeps_the_offloaded_state(model_dir, tmp_path, param):
    info = ensure_process_group()
    config = make_config(model_dir, tmp_path, algorithm=KL, trainer=offload(param, True))
    engine = FSDPEngine(TrainerSettings.from_config(config), info)
    engine.train_step(collate(experiences()))
    before = [local(t) for t in moments(engine)]
    folder = engine.save_checkpoint(1, {"global_step": 1}, save_as_hf=False, block=True)
    engine.train_step(collate(experiences()))
    assert engine.load_checkpoint(folder)["global_step"] == 1
    after = moments(engine)
    assert local_devices(after) == {"cpu"}
    assert len(after) == len(before) > 0
    for a, b in zip(after, before, strict=True):
        assert torch.equal(local(a), b)
    assert engine.train_step(collate(experiences()))["actor/grad_norm"] > 0
