"""A checkpoint written by R trainer ranks resumes on R' ranks with the exact same state (1 -> 2, 2 -> 1, 2 -> 4).

Each side is a `torch.multiprocessing` spawn of FSDP2 ranks on gloo, with `RANK`/`WORLD_SIZE` set as torchrun
would. The writer trains two steps (so Adam has moments and a step count), saves blocking, and gathers its
full state; the reader builds a fresh engine on another number of ranks, loads that folder and gathers its
full state. Model weights, every optimizer tensor, the learning-rate schedule and the trainer state must be
bit-for-bit equal; then the reader trains a third step, which must equal the writer's third step to within
the reduction-order noise of a different world size.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp

from launcher.tiny_model import make_tiny_model
from services.trainer.distributed import free_port

pytestmark = pytest.mark.slow


def _config(model_dir: str, root: str):
    from tests.support.trainer_data import make_config

    return make_config(Path(model_dir), Path(root), algorithm={"loss_agg_mode": "token-mean"})


def _batch(seed: int):
    from services.trainer.collate import collate
    from tests.support.trainer_data import make_experiences

    return collate(make_experiences(8, group_size=4, seed=seed))


def _full_state(engine) -> dict:
    """Every rank: the unsharded model and optimizer state (a collective); rank 0's copy is returned."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

    from services.trainer.fsdp import full_state_dict

    worker = engine.worker
    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    optim = get_optimizer_state_dict(worker.policy, worker.actor.optimizer, options=options)
    return {
        "weights": {k: v.clone() for k, v in full_state_dict(worker.policy).items()},
        # rank 0 holds the full state (other ranks get {}); on one rank the tensors may be the live ones
        "optim_state": _clone(optim.get("state")),
        "optim_groups": optim.get("param_groups"),
        "lr_schedule": _clone(worker.actor_scheduler.state_dict()),
    }


def _clone(tree):
    if torch.is_tensor(tree):
        return tree.detach().clone()
    if isinstance(tree, dict):
        return {k: _clone(v) for k, v in tree.items()}
    return tree


def _groups(groups: list[dict]) -> list[dict]:
    """Param groups as comparable values (a group loaded from a checkpoint holds lists where tuples were)."""
    return [{k: tuple(v) if isinstance(v, list | tuple) else v for k, v in g.items()} for g in groups]


def _run(rank: int, world: int, port: int, model_dir: str, root: str, mode: str, out: str) -> None:
    from tests.support.rank_env import set_rank_env

    set_rank_env(rank, world, port)
    torch.set_num_threads(1)
    from services.trainer.distributed import ensure_process_group, exit_rank, leave_process_group
    from services.trainer.engine import FSDPEngine
    from services.trainer.settings import TrainerSettings

    engine = FSDPEngine(TrainerSettings.from_config(_config(model_dir, root)), ensure_process_group())
    engine.channel.handlers["full_state"] = lambda _=None: _full_state(engine)
    if rank:
        engine.serve_workers()
        engine.worker.wait_for_save()
        leave_process_group(engine.info)
        exit_rank(0)
    result: dict = {}
    if mode == "write":
        for step in (1, 2):
            engine.train_step(_batch(seed=step))
        engine.save_checkpoint(2, {"global_step": 2, "data_position": 16}, save_as_hf=False, block=True)
    else:
        result["trainer_state"] = engine.load_checkpoint(str(Path(root) / "rft-mesh" / "t" / "global_step_2"))
    result["state"] = engine.channel.run("full_state")
    result["step3"] = engine.train_step(_batch(seed=3))
    result["after3"] = dict(engine.iter_state_dict())
    engine.close()
    torch.save(result, out)
    exit_rank(0)


def _spawn(world: int, model_dir: Path, root: Path, mode: str, out: Path) -> dict:
    args = (world, free_port(), str(model_dir), str(root), mode, str(out))
    mp.spawn(_run, args=args, nprocs=world, join=True)
    return torch.load(out, weights_only=True)


def _assert_equal_state(written: dict, read: dict) -> None:
    assert written["weights"].keys() == read["weights"].keys()
    for name, w in written["weights"].items():
        assert torch.equal(read["weights"][name], w), name
    assert written["optim_state"].keys() == read["optim_state"].keys()
    for name, slots in written["optim_state"].items():
        assert slots.keys() == read["optim_state"][name].keys(), name
        for slot, value in slots.items():
            got = read["optim_state"][name][slot]
            assert torch.is_tensor(got) == torch.is_tensor(value), (name, slot)
            assert torch.equal(got, value) if torch.is_tensor(value) else got == value, (name, slot)
    assert _groups(read["optim_groups"]) == _groups(written["optim_groups"])
    assert read["lr_schedule"] == written["lr_schedule"]


@pytest.mark.parametrize(("writers", "readers"), [(1, (2,)), (2, (1, 4))])
def test_checkpoint_resumes_bit_exact_on_another_number_of_ranks(tmp_path, writers, readers):
    """One writer run, then a reader run per number of ranks (a reader loads and steps, it saves nothing)."""
    model_dir = make_tiny_model(tmp_path / "tiny")
    written = _spawn(writers, model_dir, tmp_path / "job", "write", tmp_path / "written.pt")
    folder = tmp_path / "job" / "rft-mesh" / "t" / "global_step_2" / "actor"
    assert (folder / "dcp").is_dir() == (writers > 1)  # one rank writes a plain safetensors file
    for world in readers:
        read = _spawn(world, model_dir, tmp_path / "job", "read", tmp_path / f"read{world}.pt")
        _assert_resumed(written, read)


def _assert_resumed(written: dict, read: dict) -> None:
    assert read["trainer_state"]["global_step"] == 2 and read["trainer_state"]["data_position"] == 16
    _assert_equal_state(written["state"], read["state"])
    slots = read["state"]["optim_state"].values()
    assert all(float(s["step"]) == 2 for s in slots)  # Adam after two steps, not a fresh optimizer
    assert all(torch.count_nonzero(s["exp_avg_sq"]) for s in slots)
    # the resumed run goes on as the writer did: same loss and update, up to reduction order
    for key in ("actor/pg_loss", "actor/grad_norm"):
        assert read["step3"][key] == pytest.approx(written["step3"][key], rel=1e-4, abs=1e-6), key
    for name, w in written["after3"].items():
        torch.testing.assert_close(read["after3"][name], w, atol=2e-5, rtol=0)
