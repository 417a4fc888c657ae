"""Progress of the work in flight (services/common/progress.py) on a fake clock with real threads: the
limit sized by the unit's history (a slow step after slow steps is not stuck, the same step after fast
ones is), the stuck thread's real stack, the ranks' progress records (a stopped rank, a wedged one), the
answer that makes `rft run`'s watchdog call the process hung, and the health flip the compose/Kubernetes
probe fails on."""

from __future__ import annotations

import asyncio
import threading
import time

from launcher.watchdog import Answer, Watchdog
from services.common.liveness import Liveness
from services.common.progress import FACTOR, RankBeacon, Tracker, limit_s, rank_reports


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _steps(tracker: Tracker, clock: Clock, kind: str, *durations: float) -> None:
    for d in durations:
        with tracker.work(kind):
            clock.now += d


def test_the_limit_is_the_floor_or_a_multiple_of_the_longest_recent_unit():
    assert limit_s(30, []) == 30
    assert limit_s(30, [2, 5, 3]) == 30
    assert limit_s(30, [4, 25, 9]) == FACTOR * 25


def test_a_slow_step_after_slow_steps_is_not_stuck_the_same_after_fast_ones_is():
    clock = Clock()
    slow, fast = Tracker(30, clock), Tracker(30, clock)
    _steps(slow, clock, "trainer train_step", 40, 45, 50)  # a loaded machine: every step is slow
    _steps(fast, clock, "trainer train_step", 1, 2, 1)
    with slow.work("trainer train_step"), fast.work("trainer train_step"):
        clock.now += 100  # twice the longest slow step: within 3x
        report = slow.report()
        assert (report.work, report.moved_age_s, report.limit_s, report.stuck) == (
            "trainer train_step", 100, 150, ""
        )  # fmt: skip
        stuck = fast.report()
        assert (
            stuck.limit_s == 30 and stuck.stuck == "trainer train_step has not moved for 100 s (limit 30 s)"
        )
    assert slow.report().work == "" and slow.report().stuck == ""  # idle again


def test_a_unit_that_moves_is_not_stuck_and_a_zero_floor_judges_nothing():
    clock = Clock()
    tracker, off = Tracker(10, clock), Tracker(0, clock)
    with tracker.work("generate call"), off.work("generate call"):
        for _ in range(5):
            clock.now += 8
            tracker.moved()  # a token sampled
        assert tracker.report().stuck == "" and tracker.report().age_s == 40
        clock.now += 11
        assert tracker.report().stuck and off.report().stuck == ""


def test_the_stuck_report_carries_the_stack_of_the_thread_blocked_on_a_lock():
    clock, lock, entered = Clock(), threading.Lock(), threading.Event()
    tracker = Tracker(5, clock)

    def generate_blocked_on_the_lock() -> None:
        with tracker.work("generate call"):
            entered.set()
            with lock:
                pass

    lock.acquire()
    thread = threading.Thread(target=generate_blocked_on_the_lock)
    thread.start()
    try:
        assert entered.wait(10)
        clock.now += 6
        report = tracker.report()
        assert report.stuck.startswith("generate call has not moved for 6 s")
        assert "generate_blocked_on_the_lock" in report.stack and "with lock:" in report.stack
    finally:
        lock.release()
        thread.join(10)


def test_rank_records_a_stopped_rank_a_wedged_rank_and_a_missing_one(tmp_path):
    clock = Clock()
    wedged = Tracker(5, clock)
    RankBeacon(tmp_path, 1).write()  # rank 1 wrote a moment ago, idle
    beacon = RankBeacon(tmp_path, 2, tracker=wedged)
    with wedged.work("trainer train_step"):
        clock.now += 9
        beacon.write()
    now = time.time()
    found = rank_reports(tmp_path, range(1, 4), floor_s=20, now=now)  # rank 3: no file (another node)
    assert len(found) == 1 and found[0].startswith("rank 2 (pid ")
    assert (
        "trainer train_step has not moved for 9 s (limit 5 s)" in found[0] and "test_rank_records" in found[0]
    )
    later = rank_reports(tmp_path, range(1, 2), floor_s=20, now=now + 25)  # rank 1 stopped writing
    assert len(later) == 1 and "rank 1" in later[0] and "no progress record for 2" in later[0]
    assert rank_reports(tmp_path, range(1, 2), floor_s=0, now=now + 25) == []  # off


def test_rank_zero_answers_stuck_with_its_own_waiting_thread_and_the_watchdog_calls_it_hung(tmp_path):
    clock, release, entered = Clock(), threading.Event(), threading.Event()
    live = Liveness(clock)
    live.tracker = Tracker(20, clock)
    RankBeacon(tmp_path, 1).write()
    live.watch_ranks(lambda: rank_reports(tmp_path, range(1, 2), 20, now=time.time() + 30))

    def all_reduce_waiting_for_rank_1() -> None:
        with live.tracker.work("trainer train_step"):
            entered.set()
            release.wait(30)

    thread = threading.Thread(target=all_reduce_waiting_for_rank_1)
    thread.start()
    try:
        assert entered.wait(10)
        clock.now += 5  # rank 0's own step is within its limit; rank 1 has written nothing for 30 s
        work = live.snapshot().work
        assert work.stuck.startswith("trainer rank 1 (pid ") and "no progress record for 30 s" in work.stuck
        assert "all_reduce_waiting_for_rank_1" in work.stack
    finally:
        release.set()
        thread.join(10)
    dog = Watchdog(8, clock)
    dog.watch("trainer")
    dog.answered("trainer", Answer(0.5, "trainer step", 3, 40, stuck=work.stuck, stack=work.stack))
    reason = dog.hung("trainer")
    assert reason is not None and reason.startswith(
        "its event loop answers but its work does not move: trainer"
    )
    assert "all_reduce_waiting_for_rank_1" in dog.stack("trainer")
    dog.answered("trainer", Answer(0.5, "trainer step", 4, 0))
    assert dog.hung("trainer") is None


async def test_the_health_the_probe_reads_follows_the_work():
    clock, flips = Clock(), []
    live = Liveness(clock)
    live.tracker = Tracker(10, clock)

    async def on_stuck(stuck: bool) -> None:
        flips.append(stuck)

    task = live.start(on_stuck)
    try:
        with live.tracker.work("weight load"):
            await live._judge()
            clock.now += 11
            await live._judge()
            await live._judge()  # told once
        await live._judge()
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    assert flips == [True, False]
