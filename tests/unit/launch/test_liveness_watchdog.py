"""The hung verdict of `rft run` (launcher/watchdog.py) on a fake clock: nothing is asked before a process
is ready, silence longer than the window with questions unanswered is hung (a supervisor that asked
nothing meanwhile blames nobody), a process that answers is never hung however long it stays on one step
(waiting for its peers), a stale heartbeat in an answer is hung, and 0 turns it off."""

from __future__ import annotations

import pytest

from launcher.watchdog import Answer, Watchdog
from services.common.config import ConfigError, load_config


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


def test_nothing_is_asked_before_a_process_is_ready(clock):
    dog = Watchdog(60, clock)
    clock.now += 10_000  # a ten-minute vLLM start: the ready timeout's business
    assert dog.hung("trainer") is None
    dog.answered("trainer", Answer(0.1))  # an answer before it was watched is ignored
    assert dog.watched == []


def test_silence_longer_than_the_window_is_hung(clock):
    dog = Watchdog(60, clock)
    dog.watch("explorer")
    for _ in range(12):
        clock.now += 5
        dog.unanswered("explorer")
    assert dog.hung("explorer") is None  # at the window: not yet
    clock.now += 0.5
    assert dog.hung("explorer") == "no answer for 60 s"


def test_a_supervisor_that_could_not_ask_blames_nobody(clock):
    """`rft run` itself starved of CPU (or suspended) for longer than the window: one question missed
    is not enough; the next one decides."""
    dog = Watchdog(60, clock)
    dog.watch("trainer")
    dog.answered("trainer", Answer(0.2, "trainer step", 3))
    clock.now += 300
    assert dog.hung("trainer") is None
    dog.unanswered("trainer")
    assert dog.hung("trainer") is None
    dog.answered("trainer", Answer(0.2, "trainer step", 4))  # it was fine all along
    clock.now += 61
    dog.unanswered("trainer")
    dog.unanswered("trainer")
    assert dog.hung("trainer") == "no answer for 61 s (last heard on trainer step 4)"


def test_the_silence_counts_from_the_last_answer_and_names_the_step(clock):
    dog = Watchdog(60, clock)
    dog.watch("trainer")
    clock.now += 50
    dog.answered("trainer", Answer(0.4, "trainer step", 12, 3.0))
    clock.now += 59
    dog.unanswered("trainer")
    dog.unanswered("trainer")
    assert dog.hung("trainer") is None
    clock.now += 2
    assert dog.hung("trainer") == "no answer for 61 s (last heard on trainer step 12)"


def test_an_answering_process_is_never_hung_however_long_it_waits(clock):
    """An explorer waiting for weights from a hung trainer stays on its step; it is not blamed."""
    dog = Watchdog(60, clock)
    dog.watch("explorer")
    for _ in range(100):  # 25 minutes on explore step 7
        clock.now += 15
        moved = clock.now - 1000.0
        dog.answered("explorer", Answer(0.9, "explore step", 7, moved))
        assert dog.hung("explorer") is None


def test_a_stale_heartbeat_is_hung_even_when_it_answers(clock):
    dog = Watchdog(60, clock)
    dog.watch("buffer")
    dog.answered("buffer", Answer(75.0, "requests handled", 3))
    assert dog.hung("buffer") == "its event loop has not run its heartbeat for 75 s"


def test_forget_and_watch_again_restart_the_clock(clock):
    """A restarted process: nothing is asked while it gets ready, then it has a full window again."""
    dog = Watchdog(10, clock)
    dog.watch("synchronizer")
    clock.now += 11
    dog.unanswered("synchronizer")
    dog.unanswered("synchronizer")
    assert dog.hung("synchronizer")
    dog.forget("synchronizer")
    assert dog.hung("synchronizer") is None
    clock.now += 300  # getting ready again
    assert dog.hung("synchronizer") is None
    dog.watch("synchronizer")
    dog.unanswered("synchronizer")
    dog.unanswered("synchronizer")
    clock.now += 9
    assert dog.hung("synchronizer") is None


def test_zero_turns_it_off(clock):
    dog = Watchdog(0, clock)
    assert not dog.enabled
    dog.watch("trainer")
    dog.unanswered("trainer")
    clock.now += 10_000
    assert dog.hung("trainer") is None and dog.watched == []


@pytest.mark.parametrize(("window", "interval", "deadline"), [(120, 5, 10), (8, 2, 8 / 3), (3, 0.75, 1)])
def test_several_probes_fit_in_a_window(window, interval, deadline):
    dog = Watchdog(window)
    assert dog.probe_interval_s == pytest.approx(interval)
    assert dog.probe_deadline_s == pytest.approx(deadline)
    assert dog.probe_interval_s + dog.probe_deadline_s < window


def _services(tmp_path, text: str):
    path = tmp_path / "run.yaml"
    path.write_text(text)
    return load_config(path).services


def test_the_config_key_defaults_to_two_minutes_and_refuses_a_too_short_window(tmp_path):
    assert _services(tmp_path, "{}\n").liveness_timeout == 120.0
    assert _services(tmp_path, "services: {liveness_timeout: 0}\n").liveness_timeout == 0.0
    assert _services(tmp_path, "services: {liveness_timeout: 8}\n").liveness_timeout == 8.0
    with pytest.raises(ConfigError, match=r"services\.liveness_timeout.*0 \(off\) or at least 3"):
        _services(tmp_path, "services: {liveness_timeout: 1}\n")
    with pytest.raises(ConfigError, match=r"services\.liveness_timeout"):
        _services(tmp_path, "services: {liveness_timeout: -5}\n")
    with pytest.raises(ConfigError, match="liveness_timeout"):
        _services(tmp_path, "services: {liveness_timout: 60}\n")
