"""The nccl method's rendezvous over a real synchronizer server, used by a real gloo broadcast among
three local processes (trainer rank 0 + two explorers), the recovery when a receiver dies, and joins
that give up on an instance that can no longer form (its host was killed, the group changed)."""

from __future__ import annotations

import asyncio

import pytest

from services.weight_sync import BroadcastGroup, StaleGenerationError, specs_of
from services.weight_sync.methods.builtin import BroadcastFetch
from tests.support.weight_sync_worker import Worker, digest, make_state_dict


@pytest.fixture(scope="module")
def workers():
    pool = [Worker() for _ in range(3)]
    yield pool
    for w in pool:
        w.stop()


async def _in_thread(fn, *args):
    return await asyncio.to_thread(fn, *args)


async def test_synchronizer_nccl_rendezvous_and_gloo_broadcast(workers, sync_server, sync_clients):
    core, address = await sync_server(method="nccl", sync_timeout=20)
    trainer = await sync_clients(address, "trainer", "trainer", address="127.0.0.1:0")
    e1 = await sync_clients(address, "e1", "explorer", workers=1)
    e2 = await sync_clients(address, "e2", "explorer", workers=1)
    specs = specs_of(make_state_dict(7))
    t_info, t_ranks = await trainer.get_weight_sync_info(specs)
    (i1, r1), (i2, r2) = await e1.get_weight_sync_info(), await e2.get_weight_sync_info()
    assert (t_ranks, r1, r2) == ([0], [1], [2])
    assert t_info == i1 == i2 and t_info.world_size == 3 and t_info.specs == tuple(specs)
    state = await e1.get_run_state()
    assert state.generation == t_info.generation and state.sync_method == "nccl"

    for worker, rank in zip(workers, (0, 1, 2), strict=True):
        worker.call("join", t_info, rank)
    assert [await _in_thread(w.value) for w in workers] == [t_info.generation] * 3

    # both explorers come to their step boundary (step 2 needs version 1); the trainer's handshake returns
    waits = [asyncio.create_task(e.wait_for_version(step=2, timeout_s=20)) for e in (e1, e2)]
    decision = await trainer.request_sync(step=1, timeout_s=20)
    answers = await asyncio.gather(*waits)
    assert decision.accepted and all(a.receive_broadcast and a.model_version.version == 1 for a in answers)

    workers[1].call("receive", 1)
    workers[2].call("receive", 1)
    workers[0].call("send", 1, 7)
    await _in_thread(workers[0].value)
    expected = digest(make_state_dict(7).items())
    assert await _in_thread(workers[1].value) == expected == await _in_thread(workers[2].value)
    for e in (e1, e2):
        await e.report_sync(1, True, decision.generation)
    await trainer.report_sync(1, True, decision.generation)
    state = await trainer.get_run_state()
    assert state.model_version.version == 1 and {m.model_version for m in state.members} == {1}
    for w in workers:
        w.call("close")
        await _in_thread(w.value)


async def test_synchronizer_nccl_member_dies_mid_broadcast_new_generation(sync_server, sync_clients):
    """Receiver e2 is killed while the trainer broadcasts: the send fails within sync_timeout, the
    trainer reports it, a new generation is made, and e2's silence (heartbeats stop with it) marks it LOST."""
    pool = [Worker() for _ in range(3)]
    try:
        core, address = await sync_server(method="nccl", sync_timeout=3, heartbeat_timeout=3.0)
        trainer = await sync_clients(address, "trainer", "trainer")
        e1 = await sync_clients(address, "e1", "explorer")
        e2 = await sync_clients(address, "e2", "explorer")
        await trainer.start(interval_s=0.2)
        await e1.start(interval_s=0.2)
        await e2.start(interval_s=0.2)  # alive until it is killed below
        info, _ = await trainer.get_weight_sync_info(specs_of(make_state_dict(3)))
        for worker, rank in zip(pool, (0, 1, 2), strict=True):
            worker.call("join", info, rank)
        for w in pool:
            await _in_thread(w.value)
        waits = [asyncio.create_task(e.wait_for_version(step=2, timeout_s=10)) for e in (e1, e2)]
        decision = await trainer.request_sync(step=1, timeout_s=10)
        await asyncio.gather(*waits)
        assert decision.accepted
        pool[1].call("receive", 1)
        pool[2].call("receive_then_block", 1, 2)  # takes a few tensors, then hangs until killed
        pool[0].call("send", 1, 3)
        assert await _in_thread(pool[2].value) == "partial"
        pool[2].kill()
        await e2.stop(status=0)  # the killed explorer falls silent
        sent = await _in_thread(pool[0].result, 20)
        assert sent[0] == "err" and sent[1] in ("GroupBrokenError", "WeightSyncError")
        await trainer.report_sync(1, False, decision.generation, sent[2])
        state = await trainer.get_run_state()
        assert state.model_version.version == 0 and state.generation > info.generation
        await core.wait_until(lambda: core.members["e2"].status.name == "LOST", 10)
        assert (await e1.get_weight_sync_info())[0].world_size == 2  # rebuilt without e2
    finally:
        for w in pool:
            w.stop()


async def test_a_join_whose_host_was_killed_gives_up_when_the_trainer_registers_again(
    sync_server, sync_clients
):
    """The trainer is killed after its broadcast was accepted and before it hosted the group: the told
    explorer's join of that generation gives up as soon as the restarted trainer registers (a new
    generation), instead of waiting out `sync_timeout` (10 minutes here) for a host that never comes."""
    core, address = await sync_server(method="nccl", sync_timeout=600)
    trainer = await sync_clients(address, "trainer", "trainer", address="127.0.0.1:0")
    e1 = await sync_clients(address, "e1", "explorer")
    await trainer.get_weight_sync_info(specs_of(make_state_dict(3)))
    wait = asyncio.create_task(e1.wait_for_version(step=2, timeout_s=20))
    decision = await trainer.request_sync(step=1, timeout_s=20)
    answer = await wait
    assert decision.accepted and answer.receive_broadcast and answer.generation == decision.generation

    joining = asyncio.Event()

    async def setup(info, rank, abandon=None):
        joining.set()
        return await asyncio.to_thread(BroadcastGroup.join, info, rank, "cpu", abandon)

    async def receive(version):
        raise AssertionError("nothing can be received from a group that never formed")

    fetch = asyncio.create_task(BroadcastFetch(e1, setup, receive)(answer))
    await joining.wait()  # e1 is joining the generation of the accepted broadcast; its host is dead
    restarted = await sync_clients(address, "trainer", "trainer", address="127.0.0.1:0")
    assert (await restarted.get_run_state()).generation > decision.generation
    with pytest.raises(StaleGenerationError, match="newer generation"):
        await asyncio.wait_for(fetch, 60)


async def test_an_explorer_never_joins_a_generation_other_than_the_announced_one(sync_server, sync_clients):
    """A rebuild between the announcement and the join (an explorer registered): the told explorer
    refuses the newer instance at once; nobody would come to it for this broadcast."""
    core, address = await sync_server(method="nccl", sync_timeout=600)
    trainer = await sync_clients(address, "trainer", "trainer", address="127.0.0.1:0")
    e1 = await sync_clients(address, "e1", "explorer")
    await trainer.get_weight_sync_info(specs_of(make_state_dict(3)))
    wait = asyncio.create_task(e1.wait_for_version(step=2, timeout_s=20))
    await trainer.request_sync(step=1, timeout_s=20)
    answer = await wait
    await sync_clients(address, "e2", "explorer")  # a new member: generation + 1

    async def setup(info, rank, abandon=None):
        raise AssertionError(f"joined generation {info.generation}, told {answer.generation}")

    with pytest.raises(StaleGenerationError, match=f"told to join generation {answer.generation}"):
        await BroadcastFetch(e1, setup, setup)(answer)


async def test_a_trainer_gone_mid_handshake_sends_the_told_explorers_to_a_new_generation(
    sync_server, sync_clients
):
    """The trainer's connection closes while its RequestSync waits for e2 (as when it is killed): the
    server drops the broadcast and starts a new generation, so e1, told to join, gives up on it."""
    core, address = await sync_server(method="nccl", sync_timeout=600)
    trainer = await sync_clients(address, "trainer", "trainer", address="127.0.0.1:0")
    e1 = await sync_clients(address, "e1", "explorer")
    await sync_clients(address, "e2", "explorer")
    await trainer.get_weight_sync_info(specs_of(make_state_dict(3)))
    gen = core.rendezvous.generation
    wait = asyncio.create_task(e1.wait_for_version(step=2, timeout_s=20))
    handshake = asyncio.create_task(trainer.request_sync(step=1, timeout_s=600))
    assert (await wait).receive_broadcast  # e1 is told; e2 never comes, so the trainer waits
    await trainer.channel.close()  # the trainer's process is gone
    await asyncio.gather(handshake, return_exceptions=True)
    await core.wait_until(lambda: core.rendezvous.generation > gen, 20)
    assert core.run_state().pending_version == 0
    assert any(e.kind == "abandoned" for e in core.history)
