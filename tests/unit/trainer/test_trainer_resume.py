"""Checkpoints and exact resume: 6 steps straight == 3 steps + crash + resume + 3 steps."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import threading

import pytest
import torch
from transformers import AutoModelForCausalLM

from launcher.tiny_model import make_tiny_model
from services.common.lineage import experience_uid, read_lineage
from services.common.modeling import load_tokenizer
from services.trainer.checkpoint import MARKER, find_latest
from services.trainer.core import NoBatchError, PreconditionError, TrainerCore, TrainerState
from services.trainer.distributed import ensure_process_group
from services.trainer.engine import FSDPEngine
from services.trainer.replay_record import read_record, record_steps, tensor_digests
from services.trainer.settings import TrainerSettings
from tests.support.trainer_data import OrderedBuffer, make_config, make_experiences

torch.set_num_threads(1)
VOLATILE = ("timing_s/", "perf/", "trainer/unacked_steps")  # wall clock; ack timing


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
    assert buffer.acked == []  # step 3's checkpoint is durable, but its acks go out with the next step
    await buffer.get_batch(8)  # step 4 leased, then the trainer dies
    del first

    second = make_core(model_dir, tmp_path / "resumed", buffer)
    await second.prepare()  # takes the consumer over: acks steps 1-3 (durable), gives step 4 back
    assert buffer.acked == [0, 1, 2]
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


async def test_acks_wait_for_a_durable_checkpoint_and_lineage_records_every_step(model_dir, tmp_path):
    buffer = OrderedBuffer(batches())
    core = make_core(model_dir, tmp_path, buffer, save_interval=4)
    await core.prepare()
    for _ in range(3):
        await core.train_step(1000)
    assert buffer.acked == []  # trained, but no checkpoint holds the steps yet
    await core.train_step(1000)  # step 4: saved in the background
    await core.wait_for_save()
    await core.train_step(1000)  # step 5 starts by acking what the durable step 4 holds
    await core._settle_ack()
    assert buffer.acked == [0, 1, 2, 3]
    await core.shutdown()  # a stop saves step 5 and acks it
    assert buffer.acked == [0, 1, 2, 3, 4]
    job = core.settings.job_dir
    assert (job / MARKER).read_text() == "5"
    lineage = read_lineage(find_latest(job))
    assert [s.step for s in lineage] == [1, 2, 3, 4, 5]
    expected = [tuple(experience_uid(e.eid) for e in b) for b in batches()[:5]]
    assert [s.uids for s in lineage] == expected
    state = json.loads((find_latest(job) / "trainer_state.json").read_text())
    assert len(state["unacked_leases"]) == 1  # step 5's lease, acked right after the save


async def test_resume_discards_folders_after_the_durable_step(model_dir, tmp_path):
    buffer = OrderedBuffer(batches())
    core = make_core(model_dir, tmp_path, buffer, save_interval=2)
    await core.prepare()
    for _ in range(2):
        await core.train_step(1000)
    await core.wait_for_save()
    job = core.settings.job_dir
    (job / "global_step_3" / "actor").mkdir(parents=True)  # a save cut short by a crash
    del core
    again = make_core(model_dir, tmp_path, buffer, save_interval=2)
    await again.prepare()
    assert again.global_step == 2 and not (job / "global_step_3").exists()
    assert buffer.acked == [0, 1]
    await again.shutdown()


class _GatedEngine:
    """The real engine, with its train step held at the start until the test lets it go."""

    def __init__(self, engine):
        self.engine = engine
        self.entered, self.go = threading.Event(), threading.Event()

    def __getattr__(self, name):
        return getattr(self.engine, name)

    def train_step(self, step):
        self.entered.set()
        self.go.wait(30)
        return self.engine.train_step(step)


async def test_a_cancelled_step_commits_before_the_stop_and_the_stop_saves_it(model_dir, tmp_path):
    buffer = OrderedBuffer(batches())
    core = make_core(model_dir, tmp_path, buffer, save_interval=100)
    gated = _GatedEngine(core.engine)
    core.engine = gated
    await core.prepare()
    await core.train_step(1000)
    step = asyncio.create_task(core.train_step(1000))
    await asyncio.to_thread(gated.entered.wait, 30)  # the update of step 2 is running in its thread
    step.cancel()
    gated.go.set()
    with pytest.raises(asyncio.CancelledError):
        await step
    assert core.global_step == 2 and core.state is TrainerState.READY  # the update was committed
    await core.shutdown()  # SIGTERM's path: saves the last step, acks what it holds
    assert (core.settings.job_dir / MARKER).read_text() == "2"
    assert buffer.acked == [0, 1]


async def test_a_crowded_buffer_makes_the_trainer_save_before_save_interval(model_dir, tmp_path):
    buffer = OrderedBuffer(batches())
    core = make_core(model_dir, tmp_path, buffer, save_interval=100)
    core.settings = dataclasses.replace(core.settings, buffer_capacity=4 * 8)  # room for 4 batches
    await core.prepare()
    await core.train_step(1000)  # holds 1 batch: 1 + 1 more fits in half the room
    assert core._saved_step < 1
    await core.train_step(1000)  # holds 2: a third would not fit in half -> saves
    await core.wait_for_save()
    assert (core.settings.job_dir / MARKER).read_text() == "2"
    await core.shutdown()
    assert buffer.acked == [0, 1]


async def test_replay_records_keep_the_newest_steps_and_a_resume_drops_the_untrained(model_dir, tmp_path):
    buffer = OrderedBuffer(batches())
    core = make_core(model_dir, tmp_path, buffer, save_interval=2, replay_keep_steps=2)
    await core.prepare()
    metrics = [(await core.train_step(1000)).metrics for _ in range(3)]
    job = core.settings.job_dir
    assert record_steps(job) == [2, 3] and "timing_s/replay_record" in metrics[-1]
    record = read_record(job, 3)
    assert record is not None and record.uids == tuple(experience_uid(e.eid) for e in batches()[2])
    assert record.weights == tensor_digests(core.engine.iter_state_dict())  # the weights after step 3
    engine_metrics = {k: v for k, v in stable(metrics[2]).items() if k in record.metrics}
    assert len(engine_metrics) > 5 and all(record.metrics[k] == v for k, v in engine_metrics.items())
    await core.wait_for_save()
    del core
    again = make_core(model_dir, tmp_path, buffer, save_interval=2, replay_keep_steps=2)
    await again.prepare()  # back at step 2: step 3 is trained again, its record goes
    assert again.global_step == 2 and record_steps(job) == [2]
    await again.shutdown()
