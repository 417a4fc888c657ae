"""LoRA under 2-process FSDP2 (gloo, CPU): the adapter is added before `fully_shard`; one step gives the
1-process step's merged weights, the sharded (DCP) checkpoint restores them, and rank 0 writes the
merged HF export with its `lora_adapter/`.  Ranks are spawned with `RANK`/`WORLD_SIZE` as torchrun
sets them; rank 0 drives the engine through its command channel as the service does."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp
import torch.multiprocessing as mp
from transformers import AutoModelForCausalLM

from launcher.tiny_model import make_tiny_model
from services.trainer.distributed import free_port

pytestmark = pytest.mark.slow


def _config(model_dir: str, root: str):
    from tests.support.trainer_data import make_config

    model = {"model_path": str(model_dir), "lora_configs": [{"lora_rank": 4, "lora_alpha": 8}]}
    algorithm = {"kl_loss_fn": "k3", "optimizer": {"lr": 1e-2, "weight_decay": 0.0}}
    return make_config(Path(model_dir), Path(root), model=model, algorithm=algorithm)


def _step_and_checkpoint(engine, root: str) -> dict:
    from services.trainer.collate import collate
    from tests.support.trainer_data import make_experiences

    metrics = engine.train_step(collate(make_experiences(8, group_size=4, seed=7)))
    folder = engine.save_checkpoint(1, {"global_step": 1}, save_as_hf=True, block=True)
    weights = dict(engine.iter_state_dict())
    engine.train_step(collate(make_experiences(8, group_size=4, seed=8)))  # moves away, then back
    state = engine.load_checkpoint(folder)
    return {
        "metrics": metrics,
        "weights": weights,
        "reloaded": dict(engine.iter_state_dict()),
        "state": state,
    }


def _run(rank: int, world: int, port: int, model_dir: str, root: str, out: str) -> None:
    from tests.support.rank_env import set_rank_env

    set_rank_env(rank, world, port)
    torch.set_num_threads(1)
    from services.trainer.distributed import ensure_process_group, exit_rank, leave_process_group
    from services.trainer.engine import FSDPEngine
    from services.trainer.settings import TrainerSettings

    engine = FSDPEngine(TrainerSettings.from_config(_config(model_dir, root)), ensure_process_group())
    if rank:
        engine.serve_workers()
        engine.worker.wait_for_save()
        leave_process_group(engine.info)
        exit_rank(0)
    result = _step_and_checkpoint(engine, root)
    engine.close()
    torch.save(result, out)
    exit_rank(0)


def test_two_rank_lora_step_equals_one_rank_and_resumes(tmp_path):
    model_dir = make_tiny_model(tmp_path / "tiny")
    from services.trainer.distributed import ensure_process_group
    from services.trainer.engine import FSDPEngine
    from services.trainer.settings import TrainerSettings

    torch.set_num_threads(1)
    single = FSDPEngine(
        TrainerSettings.from_config(_config(model_dir, tmp_path / "one")), ensure_process_group()
    )
    one = _step_and_checkpoint(single, str(tmp_path / "one"))
    out = tmp_path / "two.pt"
    mp.spawn(
        _run, args=(2, free_port(), str(model_dir), str(tmp_path / "two"), str(out)), nprocs=2, join=True
    )
    two = torch.load(out, weights_only=True)

    assert two["metrics"]["actor/grad_norm"] == pytest.approx(one["metrics"]["actor/grad_norm"], rel=1e-4)
    assert two["weights"].keys() == one["weights"].keys()  # merged, under the base names
    for name, w in one["weights"].items():
        torch.testing.assert_close(two["weights"][name], w, atol=2e-5, rtol=0)
    step = tmp_path / "two" / "rft-mesh" / "t" / "global_step_1"
    assert (step / "actor" / "dcp").is_dir() and two["state"]["global_step"] == 1
    saved = dcp.FileSystemReader(str(step / "actor" / "dcp")).read_metadata().state_dict_metadata
    weights = [k for k in saved if k.startswith("model.")]
    assert weights and all(".lora_" in k for k in weights), weights  # the adapter only
    for name, w in two["weights"].items():
        assert torch.equal(two["reloaded"][name], w), name
    assert (step / "huggingface" / "lora_adapter" / "adapter_model.safetensors").is_file()
    hf = AutoModelForCausalLM.from_pretrained(str(step / "huggingface"), dtype=torch.float32)
    for name, w in hf.state_dict().items():
        torch.testing.assert_close(w, two["weights"][name], atol=0, rtol=0)
