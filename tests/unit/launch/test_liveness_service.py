"""A service's own liveness record (services/common/liveness.py) on a fake clock: the heartbeat's age,
the step it tracks and how long it has stayed there, sampled at each beat and each question."""

from __future__ import annotations

from services.common.liveness import Liveness


class Clock:
    def __init__(self) -> None:
        self.now = 50.0

    def __call__(self) -> float:
        return self.now


def test_the_heartbeat_age_grows_until_the_next_beat():
    clock = Clock()
    live = Liveness(clock)
    clock.now += 4
    assert live.snapshot().heartbeat_age_s == 4
    live.beat()
    clock.now += 0.5
    snap = live.snapshot()
    assert snap.heartbeat_age_s == 0.5 and snap.uptime_s == 4.5


def test_the_step_and_when_it_last_moved():
    clock = Clock()
    live = Liveness(clock)
    step = [0]
    live.track("trainer step", lambda: step[0])
    clock.now += 10
    live.beat()
    assert (live.snapshot().step, live.snapshot().moved_age_s) == (0, 10)
    step[0] = 3
    clock.now += 1
    live.beat()
    clock.now += 2
    snap = live.snapshot()
    assert (snap.unit, snap.step, snap.moved_age_s) == ("trainer step", 3, 2)


def test_a_reader_that_fails_keeps_the_last_step():
    clock = Clock()
    live = Liveness(clock)
    value = {"v": 5}
    live.track("model version", lambda: value["v"])
    del value["v"]
    live.beat()
    assert live.snapshot().step == 5


def test_nothing_tracked_reports_an_empty_unit():
    live = Liveness(Clock())
    snap = live.snapshot()
    assert (snap.unit, snap.step) == ("", 0)
