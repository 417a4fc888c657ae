"""A broadcast the synchronizer calls off, over a real synchronizer server and real gloo groups.

The members of a broadcast may never hear from the network that it is over: in a ring all-reduce
(the acknowledgement) only the killed trainer's two neighbours see its connections close, the rank
between them waits on a live peer; a stalled member sends nothing. Here the silent peers are a
worker process stopped with SIGSTOP (its sockets stay open) and the far side of a 4-rank ring whose
rank 0 was SIGKILLed. The group's timeout (`sync_timeout`) is 10 minutes, so only the synchronizer's
word can end the wait: a restarted trainer registering, a member marked LOST or a member reporting a
failed receive calls the broadcast off, the heartbeats of the members blocked in it say so, and
their transfer gives up within seconds.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time

import pytest

from services.weight_sync import BroadcastGroup, StaleGenerationError, specs_of
from services.weight_sync.member.superseded import broadcast_unless_called_off
from services.weight_sync.methods.builtin import BroadcastFetch
from tests.support.weight_sync_worker import Worker, make_state_dict

SYNC_TIMEOUT_S = 600.0  # the group's own timeout: never reached by these tests
GIVE_UP_S = 20.0  # two 1 s heartbeat polls and a 1 s wait slice, on a loaded machine


@pytest.fixture
def worker():
    w = Worker()
    yield w
    if w.proc.is_alive():
        os.kill(w.proc.pid, signal.SIGCONT)
    w.stop()


async def _joined(worker: Worker, info, rank: int) -> BroadcastGroup:
    """`worker` joins as `rank` 0 (sender) or 1 while this process joins as the other rank."""
    worker.call("join", info, 1 - rank)
    group = await asyncio.to_thread(BroadcastGroup.join, info, rank)
    assert await asyncio.to_thread(worker.value) == info.generation
    return group


async def _close(group: BroadcastGroup) -> None:
    """Leaving an abandoned group returns at once (its pending collective is let go, not waited for)."""
    await asyncio.wait_for(asyncio.to_thread(group.close), 10)


async def test_a_receiver_gives_up_a_broadcast_whose_silent_sender_registered_again(
    worker, sync_server, sync_clients
):
    core, address = await sync_server(method="nccl", sync_timeout=SYNC_TIMEOUT_S)
    trainer = await sync_clients(address, "trainer", "trainer", address="127.0.0.1:0")
    e1 = await sync_clients(address, "e1", "explorer")
    state = make_state_dict(5)
    await trainer.get_weight_sync_info(specs_of(state))
    wait = asyncio.create_task(e1.wait_for_version(step=2, timeout_s=20))
    decision = await trainer.request_sync(step=1, timeout_s=20)
    answer = await wait
    assert decision.accepted and answer.receive_broadcast

    groups: list[BroadcastGroup] = []
    receiving = asyncio.Event()

    async def setup(info, rank, abandon=None):
        groups.append(await _joined(worker, info, rank))  # the worker is rank 0, the trainer's part
        return [rank]

    async def receive(version):
        receiving.set()
        return await asyncio.to_thread(lambda: list(groups[0].receive(version)))

    fetch = asyncio.create_task(BroadcastFetch(e1, setup, receive, lambda: groups[0].abandon())(answer))
    await receiving.wait()
    os.kill(worker.proc.pid, signal.SIGSTOP)  # the sender falls silent; its connections stay open
    assert core.broadcast_generation == decision.generation
    await sync_clients(address, "trainer", "trainer", address="127.0.0.1:0")  # restarted, registers
    assert core.broadcast_generation == 0
    called_off = time.monotonic()
    with pytest.raises(StaleGenerationError, match="called this broadcast off"):
        await asyncio.wait_for(fetch, GIVE_UP_S + 10)
    assert time.monotonic() - called_off < GIVE_UP_S
    assert [e.detail for e in core.history if e.kind == "called off"] == [
        f"generation {decision.generation}: trainer registered again"
    ]
    await _close(groups[0])


async def test_a_sender_gives_up_a_broadcast_whose_stalled_receiver_was_marked_lost(
    worker, sync_server, sync_clients
):
    core, address = await sync_server(method="nccl", sync_timeout=SYNC_TIMEOUT_S, heartbeat_timeout=2.0)
    trainer = await sync_clients(address, "trainer", "trainer", address="127.0.0.1:0")
    e1 = await sync_clients(address, "e1", "explorer")
    state = make_state_dict(6)
    info, _ = await trainer.get_weight_sync_info(specs_of(state))
    wait = asyncio.create_task(e1.wait_for_version(step=2, timeout_s=20))
    decision = await trainer.request_sync(step=1, timeout_s=20)
    assert decision.accepted and (await wait).receive_broadcast
    group = await _joined(worker, info, 0)
    os.kill(worker.proc.pid, signal.SIGSTOP)  # the receiver stalls; e1 sends no more heartbeats
    send = asyncio.to_thread(group.send, 1, state)
    with pytest.raises(StaleGenerationError, match="called this broadcast off"):
        await asyncio.wait_for(
            broadcast_unless_called_off(trainer, decision.generation, send, group.abandon), 60
        )
    assert any(e.kind == "lost" and e.member_id == "e1" for e in core.history)
    assert [e.detail for e in core.history if e.kind == "called off"] == [
        f"generation {decision.generation}: e1 was marked LOST"
    ]
    await _close(group)


async def test_a_broadcast_in_progress_is_not_called_off_by_a_new_explorer(sync_server, sync_clients):
    """Scaling out mid-broadcast starts a new generation for the next sync; the accepted broadcast
    goes on, and its members' heartbeats still name its generation."""
    core, address = await sync_server(method="nccl", sync_timeout=SYNC_TIMEOUT_S)
    trainer = await sync_clients(address, "trainer", "trainer", address="127.0.0.1:0")
    e1 = await sync_clients(address, "e1", "explorer")
    await trainer.get_weight_sync_info(specs_of(make_state_dict(1)))
    wait = asyncio.create_task(e1.wait_for_version(step=2, timeout_s=20))
    decision = await trainer.request_sync(step=1, timeout_s=20)
    await wait
    await sync_clients(address, "e2", "explorer")
    await e1.heartbeat()
    assert core.rendezvous.generation > decision.generation
    assert e1.broadcast_generation == decision.generation == core.broadcast_generation
    await trainer.report_sync(1, True, decision.generation)
    await e1.heartbeat()
    assert e1.broadcast_generation == 0 and core.published.version == 1


async def test_a_trainer_killed_in_the_acknowledgement_frees_every_receiver_of_the_ring(
    worker, sync_server, sync_clients
):
    """Trainer rank 0 + three explorers; the trainer is SIGKILLed in the acknowledgement, a ring
    all-reduce. Its ring neighbours fail at once, but the rank between them waits on a live peer
    and hears of nothing (gloo keeps a failed member's connections open). Once a neighbour reports
    its failure, the synchronizer calls the broadcast off and that rank gives up too."""
    core, address = await sync_server(method="nccl", sync_timeout=SYNC_TIMEOUT_S)
    trainer = await sync_clients(address, "trainer", "trainer", address="127.0.0.1:0")
    explorers = [await sync_clients(address, f"e{i}", "explorer") for i in (1, 2, 3)]
    info, _ = await trainer.get_weight_sync_info(specs_of(make_state_dict(8)))
    waits = [asyncio.create_task(e.wait_for_version(step=2, timeout_s=20)) for e in explorers]
    decision = await trainer.request_sync(step=1, timeout_s=20)
    answers = await asyncio.gather(*waits)
    assert decision.accepted and info.world_size == 4

    worker.call("join", info, 0)
    joins = [asyncio.to_thread(BroadcastGroup.join, info, rank) for rank in (1, 2, 3)]
    groups = await asyncio.gather(*joins)
    assert await asyncio.to_thread(worker.value) == info.generation

    async def fetch(client, group, answer):
        """What the explorer's sync gate does: receive; report a failure to the synchronizer."""

        async def setup(info, rank, abandon=None):
            return [group.rank]

        async def receive(version):
            return await asyncio.to_thread(lambda: list(group.receive(version)))

        try:
            await BroadcastFetch(client, setup, receive, group.abandon)(answer)
        except Exception as exc:
            await client.report_sync(1, False, answer.generation, f"{type(exc).__name__}: {exc}")
            return type(exc).__name__
        return "received"

    fetches = [
        asyncio.create_task(fetch(c, g, a)) for c, g, a in zip(explorers, groups, answers, strict=True)
    ]
    worker.call("send_then_die_at_ack", 1, 8)
    assert await asyncio.to_thread(worker.value) == "acking"
    worker.kill()
    outcomes = await asyncio.wait_for(asyncio.gather(*fetches), GIVE_UP_S + 10)
    assert sorted(outcomes) == ["GroupBrokenError", "GroupBrokenError", "StaleGenerationError"], outcomes
    called_off = [e for e in core.history if e.kind == "called off"]
    assert len(called_off) == 1 and "failed to receive version 1" in called_off[0].detail
    for group in groups:
        await _close(group)
