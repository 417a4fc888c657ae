"""`SynchronizerCore` without gRPC: the plan's interleavings, dynamic styles, heartbeats, nccl
handshakes and generations, and timeouts. Coordination is by the core's own conditions and tasks."""

from __future__ import annotations

import asyncio

import pytest
import torch
from prometheus_client import CollectorRegistry, generate_latest

from services.common.config.sync_plan import SyncPlan
from services.synchronizer.core import SynchronizerCore
from services.synchronizer.errors import NotRegistered, WrongState
from services.synchronizer.members import MemberStatus, Role
from services.synchronizer.metrics import SynchronizerCollector
from services.synchronizer.settings import SynchronizerSettings
from services.weight_sync import specs_of, sync_method

SPECS = specs_of({"w": torch.zeros(4, 4), "b": torch.zeros(4)})


def core_of(method="checkpoint", style="fixed", interval=1, offset=0, **kw) -> SynchronizerCore:
    return SynchronizerCore(
        SynchronizerSettings(method=sync_method(method), plan=SyncPlan(style, interval, offset), **kw)
    )


async def nccl_core(*explorers: str) -> SynchronizerCore:
    """An nccl core with the trainer and `explorers` registered and the trainer's specs handed over."""
    core = core_of(method="nccl")
    await core.register("trainer", Role.TRAINER)
    for e in explorers:
        await core.register(e, Role.EXPLORER)
    await core.group_info("trainer", SPECS)
    return core


class Turns:
    """Explicit turns for the pipeline's two loops: the explorer, then the trainer, round after round.

    A loop acts only inside its turn (`await take(name)` ... `end()`); a turn is one step's worth of
    work, so the turns stand for the time steps take. The explorer's turn also ends when it blocks in
    `wait_for_version` (the core shows it waiting for a version not yet published), and it is passed
    over while it stays blocked. So the log is the same whatever order the event loop wakes tasks in.
    """

    def __init__(self, core: SynchronizerCore):
        self.core = core
        self.go = {"explorer": asyncio.Event(), "trainer": asyncio.Event()}
        self.ended = asyncio.Event()
        self.finished: set[str] = set()

    async def take(self, name: str) -> None:
        await self.go[name].wait()
        self.go[name].clear()

    def end(self, finished: str | None = None) -> None:
        if finished:
            self.finished.add(finished)
        self.ended.set()

    def explorer_blocked(self) -> bool:
        m = self.core.members["explorer"]
        return m.status == MemberStatus.REQUIRE_SYNC and self.core.published.version < m.wants_version

    async def turn(self, name: str) -> None:
        if name in self.finished or (name == "explorer" and self.explorer_blocked()):
            return
        self.ended.clear()
        self.go[name].set()
        ends = [asyncio.ensure_future(self.ended.wait())]
        if name == "explorer":
            ends.append(asyncio.ensure_future(self.core.wait_until(self.explorer_blocked, 10)))
        done, pending = await asyncio.wait(ends, return_when=asyncio.FIRST_COMPLETED)
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        for task in done:
            task.result()

    async def direct(self) -> None:
        while len(self.finished) < 2:
            await self.turn("explorer")
            await self.turn("trainer")


async def run_pipeline(core: SynchronizerCore, steps: int) -> list[tuple]:
    """A trainer and an explorer loop over the core (checkpoint method), in explicit turns (`Turns`);
    returns their event log.

    Explorer step s produces batch s (handed over at its next turn); trainer step t consumes batch t
    and asks to publish at its next turn. `("explore", s, v)`: step s started holding version v;
    `("waited", s)`: the explorer had to wait before step s (logged when that wait returns).
    """
    log: list[tuple] = []
    batches: list[int] = []
    turns = Turns(core)
    await core.register("trainer", Role.TRAINER)
    await core.register("explorer", Role.EXPLORER)

    async def explorer():
        held = 0
        for s in range(1, steps + 1):
            await turns.take("explorer")
            if s > 1:
                batches.append(s - 1)
            waits = sum(e.kind == "wait" for e in core.history)
            answer = await core.wait_for_version("explorer", step=s, timeout=10)
            assert not answer.timed_out
            if sum(e.kind == "wait" for e in core.history) > waits:
                await turns.take("explorer")  # it blocked, which ended its turn: go on in a later one
                log.append(("waited", s))
            if answer.published.version > held:
                held = answer.published.version
                await core.report_sync("explorer", held, ok=True)
            log.append(("explore", s, held))
            turns.end()
        await turns.take("explorer")
        batches.append(steps)
        turns.end(finished="explorer")

    async def trainer():
        for t in range(1, steps + 1):
            await turns.take("trainer")
            if t > 1 and (await core.request_sync("trainer", t - 1)).accepted:
                await core.notify_checkpoint(t - 1, t - 1, f"/ckpt/v{t - 1}")
                log.append(("publish", t - 1))
            while not batches:  # batch t is not there yet: the turn ends, try again in the next
                turns.end()
                await turns.take("trainer")
            assert batches.pop(0) == t
            log.append(("train", t))
            turns.end()
        await turns.take("trainer")
        if (await core.request_sync("trainer", steps)).accepted:
            await core.notify_checkpoint(steps, steps, f"/ckpt/v{steps}")
            log.append(("publish", steps))
        turns.end(finished="trainer")

    await asyncio.wait_for(asyncio.gather(explorer(), trainer(), turns.direct()), 10)
    return log


async def test_synchronizer_fixed_offset0_interval1_is_on_policy():
    log = await run_pipeline(core_of(interval=1, offset=0), 4)
    assert log == [
        ("explore", 1, 0),
        ("train", 1), ("publish", 1), ("waited", 2), ("explore", 2, 1),
        ("train", 2), ("publish", 2), ("waited", 3), ("explore", 3, 2),
        ("train", 3), ("publish", 3), ("waited", 4), ("explore", 4, 3),
        ("train", 4), ("publish", 4),
    ]  # fmt: skip


async def test_synchronizer_fixed_offset1_runs_one_step_ahead():
    log = await run_pipeline(core_of(interval=1, offset=1), 5)
    assert log == [
        ("explore", 1, 0), ("explore", 2, 0),  # step 2 may run one step ahead of version 0
        ("train", 1), ("publish", 1), ("train", 2), ("waited", 3), ("explore", 3, 1),
        ("publish", 2), ("explore", 4, 2), ("train", 3), ("publish", 3),
        ("train", 4), ("waited", 5), ("explore", 5, 3), ("publish", 4),
        ("train", 5), ("publish", 5),
    ]  # fmt: skip
    for s, v in ((e[1], e[2]) for e in log if e[0] == "explore"):
        assert s - 1 - v <= 1  # at most sync_offset steps ahead of the weights it holds


async def test_synchronizer_fixed_interval2_publishes_every_other_step():
    log = await run_pipeline(core_of(interval=2, offset=0), 6)
    assert [e for e in log if e[0] == "publish"] == [("publish", 2), ("publish", 4), ("publish", 6)]
    assert {e[1]: e[2] for e in log if e[0] == "explore"} == {1: 0, 2: 0, 3: 2, 4: 2, 5: 4, 6: 4}
    assert [e[1] for e in log if e[0] == "waited"] == [3, 5]
    assert log.index(("publish", 2)) < log.index(("explore", 3, 2))


async def test_synchronizer_fixed_interval2_offset1():
    log = await run_pipeline(core_of(interval=2, offset=1), 6)
    assert {e[1]: e[2] for e in log if e[0] == "explore"} == {1: 0, 2: 0, 3: 0, 4: 2, 5: 2, 6: 4}
    assert [e[1] for e in log if e[0] == "waited"] == [4, 6]


async def test_synchronizer_explorer_driven_trainer_serves_a_waiting_explorer():
    core = core_of(style="explorer_driven", interval=2)
    await core.register("trainer", Role.TRAINER)
    await core.register("explorer", Role.EXPLORER)
    assert not (await core.request_sync("trainer", 1)).accepted  # nobody asked
    assert not (await core.wait_for_version("explorer", step=2, timeout=1)).timed_out  # 1 step since sync
    waiter = asyncio.create_task(core.wait_for_version("explorer", step=3, timeout=10))
    await core.wait_until(lambda: core.members["explorer"].status == MemberStatus.REQUIRE_SYNC, 5)
    assert core.members["explorer"].wants_version == 1
    assert (await core.request_sync("trainer", 2)).accepted
    await core.notify_checkpoint(2, 2, "/ckpt/v2")
    answer = await asyncio.wait_for(waiter, 5)
    assert answer.published.version == 2 and answer.required == 1
    await core.report_sync("explorer", 2, ok=True)
    assert core.members["explorer"].last_sync_step == 2


async def test_synchronizer_trainer_driven_publishes_on_its_interval_and_explorer_never_blocks():
    core = core_of(style="trainer_driven", interval=2)
    await core.register("trainer", Role.TRAINER)
    await core.register("explorer", Role.EXPLORER)
    decisions = [(await core.request_sync("trainer", t)).accepted for t in (1, 2)]
    assert decisions == [False, True]
    await core.notify_checkpoint(2, 2, "/ckpt/v2")
    assert [(await core.request_sync("trainer", t)).accepted for t in (3, 4)] == [False, True]
    answer = await core.wait_for_version("explorer", step=9, timeout=1)
    assert (answer.required, answer.published.version, answer.timed_out) == (0, 2, False)
    _, pending, _ = await core.heartbeat("explorer")
    assert pending  # a newer version than the explorer holds


async def test_synchronizer_heartbeat_silence_marks_lost_and_rejoin():
    now = [0.0]
    core = SynchronizerCore(
        SynchronizerSettings(method=sync_method("nccl"), heartbeat_timeout=5), clock=lambda: now[0]
    )
    await core.register("trainer", Role.TRAINER)
    await core.register("e1", Role.EXPLORER)
    gen = core.rendezvous.generation
    now[0] = 4.0
    await core.heartbeat("trainer")
    now[0] = 6.0
    assert await core.check_lost() == ["e1"]
    assert core.members["e1"].status == MemberStatus.LOST and core.rendezvous.generation == gen + 1
    with pytest.raises(NotRegistered, match="LOST"):
        await core.heartbeat("e1")
    await core.register("e1", Role.EXPLORER)
    assert core.members["e1"].status == MemberStatus.RUNNING and core.rendezvous.generation == gen + 2


async def test_synchronizer_watchdog_marks_lost():
    core = SynchronizerCore(SynchronizerSettings(method=sync_method("memory"), heartbeat_timeout=0.1))
    await core.start()
    try:
        await core.register("e1", Role.EXPLORER)
        await core.wait_until(lambda: core.members["e1"].status == MemberStatus.LOST, 5)
        assert any(e.kind == "lost" and e.member_id == "e1" for e in core.history)
    finally:
        await core.close()


async def test_synchronizer_explorer_join_and_leave_bump_generation_and_ranks():
    core = core_of(method="nccl")
    await core.register("trainer", Role.TRAINER, address="127.0.0.1:5000")
    await core.register("e1", Role.EXPLORER, workers=2)
    await core.register("e2", Role.EXPLORER, workers=1)
    t = await core.group_info("trainer", SPECS)
    a1, a2 = await core.group_info("e1"), await core.group_info("e2")
    assert (t.ranks, a1.ranks, a2.ranks) == ((0,), (1, 2), (3,))
    assert t.info == a1.info == a2.info and t.info.world_size == 4 and t.info.specs == tuple(SPECS)
    gen = t.info.generation
    await core.heartbeat("e1", MemberStatus.STOPPED)
    after = await core.group_info("e2")
    assert after.info.generation == gen + 1 and after.ranks == (1,) and after.info.world_size == 2
    with pytest.raises(WrongState, match="no rank"):
        await core.group_info("e1")


async def test_synchronizer_nccl_handshake_waits_for_every_explorer():
    core = await nccl_core("e1", "e2")
    gen = core.rendezvous.generation
    w1 = asyncio.create_task(core.wait_for_version("e1", step=2, timeout=10))  # needs version 1
    await core.wait_until(lambda: core.members["e1"].status == MemberStatus.REQUIRE_SYNC, 5)
    decision = asyncio.create_task(core.request_sync("trainer", 1, timeout=10))
    a1 = await asyncio.wait_for(w1, 5)
    assert a1.receive_broadcast and a1.published.version == 1 and a1.generation == gen
    assert not decision.done()  # e2 has not come to a step boundary yet
    a2 = await core.wait_for_version("e2", step=1, timeout=5)  # e2 needs nothing but joins the broadcast
    assert a2.receive_broadcast
    d = await asyncio.wait_for(decision, 5)
    assert d.accepted and d.generation == gen and core.published.version == 0
    await core.report_sync("e1", 1, ok=True)
    await core.report_sync("e2", 1, ok=True)
    await core.report_sync("trainer", 1, ok=True)
    assert core.published.version == 1 and core.rendezvous.generation == gen
    assert {m.model_version for m in core.members.values()} == {1}


async def test_synchronizer_failed_broadcast_rebuilds_and_nothing_is_published():
    core = await nccl_core("e1")
    gen = core.rendezvous.generation
    waiter = asyncio.create_task(core.wait_for_version("e1", step=2, timeout=10))
    assert (await core.request_sync("trainer", 1, timeout=10)).accepted
    assert (await waiter).receive_broadcast
    await core.report_sync("e1", 1, ok=False, generation=gen, message="peer died")
    await core.report_sync("trainer", 1, ok=False, message="GroupBrokenError")
    assert core.published.version == 0 and core.rendezvous.generation > gen


async def test_synchronizer_a_handshake_whose_trainer_went_away_starts_a_new_generation():
    """The trainer's RequestSync is cancelled (the trainer was killed) after e1 was told to join the
    broadcast and before e2 came: nobody will host that group, so the broadcast is dropped and a new
    generation sends e1 (joining) elsewhere; e2 is not told to join the dead broadcast."""
    core = await nccl_core("e1", "e2")
    gen = core.rendezvous.generation
    w1 = asyncio.create_task(core.wait_for_version("e1", step=2, timeout=10))
    await core.wait_until(lambda: core.members["e1"].status == MemberStatus.REQUIRE_SYNC, 5)
    decision = asyncio.create_task(core.request_sync("trainer", 1, timeout=10))
    assert (await asyncio.wait_for(w1, 5)).receive_broadcast
    decision.cancel()
    with pytest.raises(asyncio.CancelledError):
        await decision
    assert core.rendezvous.generation > gen and core.run_state().pending_version == 0
    assert core.members["trainer"].status == MemberStatus.RUNNING
    a2 = await core.wait_for_version("e2", step=1, timeout=5)
    assert not a2.receive_broadcast and not a2.timed_out


async def test_synchronizer_waits_time_out_cleanly():
    core = await nccl_core("e1")
    answer = await core.wait_for_version("e1", step=2, timeout=0.05)
    assert answer.timed_out and answer.required == 1
    assert core.members["e1"].status == MemberStatus.RUNNING
    gen = core.rendezvous.generation
    decision = await core.request_sync("trainer", 1, timeout=0.05)  # e1 never comes to receive
    assert not decision.accepted and "e1" in decision.reason and "not ready" in decision.reason
    assert core.run_state().pending_version == 0 and core.rendezvous.generation == gen + 1


async def test_synchronizer_versions_are_monotonic_and_finish_releases_waiters():
    core = core_of(method="checkpoint")
    await core.register("trainer", Role.TRAINER)
    await core.register("e1", Role.EXPLORER)
    await core.notify_checkpoint(3, 3, "/ckpt/v3")
    with pytest.raises(WrongState, match="not newer"):
        await core.notify_checkpoint(2, 2, "/ckpt/v2")
    waiter = asyncio.create_task(core.wait_for_version("e1", min_version=9, timeout=10))
    await core.wait_until(lambda: core.members["e1"].status == MemberStatus.REQUIRE_SYNC, 5)
    await core.heartbeat("trainer", MemberStatus.STOPPED)
    assert (await asyncio.wait_for(waiter, 5)).finished
    assert core.run_state().finished


async def test_synchronizer_metrics_are_read_on_the_loop_from_the_scrape_thread():
    """The collector, scraped from another thread as prometheus_client does, reads the core on its loop:
    the members and the counted events."""
    core = core_of(method="memory")
    collector = SynchronizerCollector(core, asyncio.get_running_loop())
    core.on_event = collector.count
    await core.register("e1", Role.EXPLORER)
    registry = CollectorRegistry()
    registry.register(collector)
    text = (await asyncio.to_thread(generate_latest, registry)).decode()
    assert 'rft_synchronizer_member_up{member="e1",role="explorer"} 1.0' in text
    assert 'rft_synchronizer_events_total{kind="register"} 1.0' in text
    await core.close()
