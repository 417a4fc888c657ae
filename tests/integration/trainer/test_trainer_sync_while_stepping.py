"""The pipelined weight sync (`sync_offset` >= 1) on real threads and real gloo groups: trainer rank 0
sends step k's snapshot over the weight-sync group while step k+1 trains, and the collectives of the
two never run at the same time (`services.common.collective_lock`), with the same weights trained
and received as without any sync."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest
import torch

from launcher.tiny_model import make_tiny_model
from services.common.collective_lock import collective_lock, issuing_collectives
from services.trainer.core import TrainerCore
from services.trainer.distributed import ensure_process_group
from services.trainer.engine import FSDPEngine
from services.trainer.settings import TrainerSettings
from services.trainer.weight_sync import WeightSync
from services.weight_sync import BroadcastGroup, TransportOptions
from tests.support.trainer_data import OrderedBuffer, make_config, make_experiences

torch.set_num_threads(1)
STEPS = 3
WAIT_S = 60  # bound of every wait below (a failure, never a pause)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return make_tiny_model(tmp_path_factory.mktemp("tiny"))


def make_core(model_dir, root) -> TrainerCore:
    config = make_config(model_dir, root, buffer={"batch_size": 2, "total_steps": STEPS})
    settings = TrainerSettings.from_config(config)
    batches = [make_experiences(8, group_size=4, seed=300 + i) for i in range(STEPS)]
    return TrainerCore(settings, FSDPEngine(settings, ensure_process_group()), OrderedBuffer(batches))


def test_one_lock_per_device_reentrant_in_its_thread():
    assert collective_lock("cpu") is collective_lock(torch.device("cpu"))
    assert collective_lock("cpu") is not collective_lock("cuda:7")
    with issuing_collectives("cpu"), issuing_collectives("cpu"):  # a nested section does not deadlock
        got: list[bool] = []
        other = threading.Thread(target=lambda: got.append(collective_lock("cpu").acquire(timeout=0.05)))
        other.start()
        other.join(WAIT_S)
    assert got == [False]  # another thread could not take it meanwhile


async def test_pipelined_send_never_issues_collectives_beside_the_step(model_dir, tmp_path):
    reference = make_core(model_dir, tmp_path / "reference")  # the same steps, no sync at all
    await reference.prepare()
    trained = []
    for _ in range(STEPS):
        await reference.train_step(1000)
        trained.append({k: v.clone() for k, v in reference.engine.iter_state_dict()})
    await reference.shutdown()

    core = make_core(model_dir, tmp_path / "pipelined")
    await core.prepare()
    ws = WeightSync(core, options=TransportOptions(checkpoint_dir=str(tmp_path / "sd"), timeout_s=WAIT_S))
    info = await ws.get_info(receivers=1)
    received: dict[int, dict[str, torch.Tensor]] = {}

    def receiver() -> None:
        with BroadcastGroup.join(info, rank=1) as group:
            for version in range(1, STEPS + 1):
                received[version] = {k: v.clone() for k, v in group.receive(version)}

    thread = threading.Thread(target=receiver, name="explorer")
    thread.start()
    await ws.setup(info.to_proto())

    # the recorder: (what, thread, start, end) of every step and of every weight-sync collective,
    # from its launch to the end of its wait
    spans: list[tuple[str, int, float, float]] = []
    send_entered = threading.Event()  # a send was called (before it asks for the lock)
    senders: list[int] = []  # the thread of each send
    beside: list[tuple[int, int]] = []  # (step's thread, send's thread) of a send called during a step
    send_pending = False
    conn = ws.nccl.group._conn
    launch, wait, send = conn.launch, conn.wait, ws.nccl.group.send
    launched: dict[int, float] = {}

    def recorded_launch(start, what):
        t0 = time.perf_counter()
        work = launch(start, what)
        launched[id(work)] = t0
        return work

    def recorded_wait(work, what):
        wait(work, what)
        spans.append(("sync", threading.get_ident(), launched.pop(id(work)), time.perf_counter()))

    def recorded_send(*args):
        senders.append(threading.get_ident())
        send_entered.set()
        return send(*args)

    step_handler = core.engine.channel.handlers["train_step"]

    def recorded_step(batch):
        t0 = time.perf_counter()
        if send_pending:  # the send was called while this step runs: it must wait for the step
            assert send_entered.wait(WAIT_S)
            send_entered.clear()
            beside.append((threading.get_ident(), senders[-1]))
        metrics = step_handler(batch)
        spans.append(("step", threading.get_ident(), t0, time.perf_counter()))
        return metrics

    conn.launch, conn.wait, ws.nccl.group.send = recorded_launch, recorded_wait, recorded_send
    core.engine.channel.handlers["train_step"] = recorded_step

    snapshots, results, inflight = [], [], None
    for _ in range(STEPS):
        send_pending = inflight is not None
        await core.train_step(1000)  # step k+1 trains while step k's snapshot is sent
        if inflight is not None:
            results.append(await asyncio.wait_for(inflight, WAIT_S))
        snapshots.append(await ws.snapshot())
        inflight = asyncio.ensure_future(ws.sync(snapshot=snapshots[-1]))
    send_pending = False
    results.append(await asyncio.wait_for(inflight, WAIT_S))
    await asyncio.to_thread(thread.join, WAIT_S)
    await ws.close()
    await core.shutdown()

    assert [r.version for r in results] == list(range(1, STEPS + 1))
    steps = [s for s in spans if s[0] == "step"]
    syncs = [s for s in spans if s[0] == "sync"]
    assert len(steps) == STEPS and len(syncs) >= 3 * STEPS  # header, shm-ready, ack per send
    assert len(beside) == STEPS - 1 and all(a != b for a, b in beside)  # two threads, at once
    overlaps = [(a, b) for a in steps for b in syncs if a[2] < b[3] and b[2] < a[3]]
    assert overlaps == []
    for version, snap in enumerate(snapshots, start=1):
        assert snap.version == version
        for name, tensor in trained[version - 1].items():
            assert torch.equal(snap.state[name], tensor), (version, name)  # training unchanged
            assert torch.equal(received[version][name], tensor), (version, name)  # and sent as trained
