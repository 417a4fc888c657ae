"""Checkpoints and exact resume: 6 steps straight == 3 steps + crash + resume + 3 steps."""

from __future__ import annotations

import json

import pytest
import torch
from transformers import AutoModelForCausalLM

from services.common.modeling import load_tokenizer
from services.common.tiny_model import make_tiny_model
from services.trainer.checkpoint import MARKER, find_latest
from services.trainer.core import NoBatchError, PreconditionError, TrainerCore, TrainerState
from services.trainer.distributed import ensure_process_group
from services.trainer.engine import FSDPEngine
from services.trainer.settings import TrainerSettings
from tests.support.trainer_data import OrderedBuffer, make_config, make_experiences

torch.set_num_threads(1)
VOLATILE = ("timing_s/", "perf/")  # wall-clock figures differ between any two runs


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return make_tiny_model(tmp_path_factory.mktemp("tiny"))


def make_core(model_dir, root, source, **trainer) -> TrainerCore:
    config = make_config(
        model_dir,
        root,
        buffer={"batch_size": 2, "total_steps": 6},
        algorithm={
            "kl_loss_fn": "k3",
            "optimizer": {
                "lr": 1e-3,
                "lr_warmup_steps": 2,
                "lr_scheduler_type": "cosine",
                "weight_decay": 0.01,
            },
        },
        trainer={"save_interval": 3, "micro_batch_size_per_gpu": 4, **trainer},
    )
    settings = TrainerSettings.from_config(config)
    return TrainerCore(settings, FSDPEngine(settings, ensure_process_group()), source)


def batches() -> list[list]:
    return [make_experiences(8, group_size=4, seed=100 + i) for i in range(6)]


def stable(metrics: dict[str, float]) -> dict[str, float]:
    return {k: v for k, v in metrics.items() if not k.startswith(VOLATILE)}


async def test_resume_after_a_crash_gives_identical_weights_and_metrics(model_dir, tmp_path):
    straight_buffer = OrderedBuffer(batches())
    straight = make_core(model_dir, tmp_path / "straight", straight_buffer)
    await straight.prepare()
    straight_metrics = [stable((await straight.train_step(1000)).metrics) for _ in range(6)]
    assert straight.finished
    await straight.shutdown()
    assert straight_buffer.acked == [0, 1, 2, 3, 4, 5]

    buffer = OrderedBuffer(batches())
    first = make_core(model_dir, tmp_path / "resumed", buffer)
    await first.prepare()
    for _ in range(3):
        await first.train_step(1000)
    await first.wait_for_save()
    await buffer.get_batch(8)  # step 4 leased, then the trainer dies before acking it
    del first
    buffer.restart()

    second = make_core(model_dir, tmp_path / "resumed", buffer)
    await second.prepare()
    assert second.global_step == 3 and second.consumed_samples == 24
    resumed_metrics = [stable((await second.train_step(1000)).metrics) for _ in range(3)]
    await second.shutdown()
    assert buffer.acked == [0, 1, 2, 3, 4, 5]
    assert resumed_metrics == straight_metrics[3:]

    a = dict(straight.engine.iter_state_dict())
    b = dict(second.engine.iter_state_dict())
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


async def test_checkpoint_layout_keep_limit_and_hf_export(model_dir, tmp_path):
    buffer = OrderedBuffer(batches())
    core = make_core(model_dir, tmp_path, buffer, save_interval=2, max_checkpoints_to_keep=2)
    await core.prepare()
    while (await core.train_step(1000)).continue_training:
        pass
    await core.shutdown()
    job = core.settings.job_dir
    assert (job / MARKER).read_text() == "6"
    assert sorted(p.name for p in job.glob("global_step_*")) == ["global_step_4", "global_step_6"]
    folder = find_latest(job)
    assert folder is not None
    state = json.loads((folder / "trainer_state.json").read_text())
    assert state["global_step"] == 6 and state["consumed_samples"] == 48
    for name in ("model.safetensors", "optim.pt", "extra_state_rank_0.pt"):
        assert (folder / "actor" / name).is_file()
    assert not (job / "global_step_4" / "huggingface").exists()  # save_hf_checkpoint: last
    hf = folder / "huggingface"
    model = AutoModelForCausalLM.from_pretrained(hf)
    tokenizer = load_tokenizer(hf)
    ids = torch.tensor([tokenizer.encode("12+34=46")])
    trained = dict(core.engine.iter_state_dict())
    reference = AutoModelForCausalLM.from_pretrained(model_dir)
    reference.load_state_dict(trained)
    torch.testing.assert_close(model(ids).logits, reference(ids).logits)


async def test_core_states_and_preconditions(model_dir, tmp_path):
    core = make_core(model_dir, tmp_path, OrderedBuffer([]))
    with pytest.raises(PreconditionError):
        await core.train_step(10)
    await core.prepare()
    assert core.state is TrainerState.READY
    with pytest.raises(NoBatchError):
        await core.train_step(10)
    step, path, hf = await core.save_checkpoint(block_until_saved=True, save_as_hf=True)
    assert (
        step == 0 and (tmp_path / "rft-mesh" / "t" / MARKER).read_text() == "0" and hf.endswith("huggingface")
    )
    await core.shutdown()
    with pytest.raises(PreconditionError):
        await core.train_step(10)
