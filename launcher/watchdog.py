"""Tells a hung service from a busy or waiting one, for `rft run`'s supervisor (`services.liveness_timeout`).

The supervisor asks each ready process `rft.v1.Liveness/Progress` every `probe_interval_s` with a deadline
of `probe_deadline_s` and reports each outcome here (`answered`, `unanswered`). The answer comes from the
service's event loop, which runs its main task and its RPCs while the heavy work runs in threads: a
stopped (SIGSTOP), wedged or loop-blocked process does not answer, a busy one does. A process is hung when
no answer came for `timeout_s` seconds and at least `MIN_MISSES` questions in a row went unanswered (so a
supervisor that was itself starved of CPU for a while does not blame the services it could not ask), or
when it answers that its heartbeat has not run for `timeout_s`.

Only the process's own liveness is judged. Its step and how long it has stayed there are kept for the
message, never held against it: an explorer waiting for weights, a trainer waiting for data and an idle
buffer stay on one step while their loops turn, and a healthy service waiting on a hung peer is not blamed.
Its work is judged, by the process itself (services/common/progress.py, `services.progress_timeout`): an
answer that says `stuck` (a unit of work in flight has not moved for its limit, e.g. a thread blocked in
a collective whose peer rank is stopped, or a trainer rank > 0 stopped) makes the process hung too, its
loop's answers notwithstanding; `stack` keeps the stuck thread's Python stack for the supervisor's log.
Nothing is asked before a process is first ready (`watch` starts the clock): a long model load or vLLM
start is the ready timeout's to judge, and so is a restarted process until it is ready again.

Pure logic over a clock (`time.monotonic` by default), so its tests run on a fake one.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

MIN_MISSES = 2


@dataclass(frozen=True)
class Answer:
    """What a process said (rft.v1.ServiceProgress): its heartbeat's age and the step it is on."""

    heartbeat_age_s: float
    unit: str = ""
    step: int = 0
    moved_age_s: float = 0.0
    stuck: str = ""  # why its work in flight is stuck; empty while it moves
    stack: str = ""  # the stuck thread's Python stack

    @property
    def where(self) -> str:
        """'trainer step 12', or '' when the process tracks nothing."""
        return f"{self.unit} {self.step}" if self.unit else ""


@dataclass
class _Watch:
    since: float  # when it was ready: the silence is counted from here before the first answer
    answered_at: float | None = None
    answer: Answer | None = None
    misses: int = 0  # questions unanswered since the last answer


class Watchdog:
    """Hung verdicts for named processes; `timeout_s` 0 turns it off (nothing is ever hung)."""

    def __init__(self, timeout_s: float, clock: Callable[[], float] = time.monotonic):
        self.timeout_s, self.clock = float(timeout_s), clock
        self._watched: dict[str, _Watch] = {}

    @property
    def enabled(self) -> bool:
        return self.timeout_s > 0

    @property
    def probe_interval_s(self) -> float:
        """How often to ask: several times per window, at most every 5 s."""
        return min(5.0, max(0.5, self.timeout_s / 4))

    @property
    def probe_deadline_s(self) -> float:
        """How long one question may wait for its answer (a busy machine answers late, not never)."""
        return min(10.0, max(1.0, self.timeout_s / 3))

    def watch(self, name: str) -> None:
        """`name` is ready (first, or after a restart): from now on it must answer."""
        if self.enabled:
            self._watched[name] = _Watch(since=self.clock())

    def forget(self, name: str) -> None:
        """`name` exited, or is being restarted: nothing is asked of it until it is ready again."""
        self._watched.pop(name, None)

    @property
    def watched(self) -> list[str]:
        return list(self._watched)

    def answered(self, name: str, answer: Answer) -> None:
        watch = self._watched.get(name)
        if watch is not None:
            watch.answered_at, watch.answer, watch.misses = self.clock(), answer, 0

    def unanswered(self, name: str) -> None:
        """A question to `name` got no answer within its deadline."""
        watch = self._watched.get(name)
        if watch is not None:
            watch.misses += 1

    def hung(self, name: str) -> str | None:
        """Why `name` is hung ('no answer for 60 s (last heard on trainer step 12)'), or None."""
        watch = self._watched.get(name)
        if watch is None:
            return None
        now = self.clock()
        silent = now - (watch.answered_at if watch.answered_at is not None else watch.since)
        if silent > self.timeout_s and watch.misses >= MIN_MISSES:
            where = watch.answer.where if watch.answer is not None else ""
            return f"no answer for {silent:.0f} s" + (f" (last heard on {where})" if where else "")
        answer = watch.answer
        if answer is not None and answer.heartbeat_age_s > self.timeout_s:
            return f"its event loop has not run its heartbeat for {answer.heartbeat_age_s:.0f} s"
        if answer is not None and answer.stuck:
            return f"its event loop answers but its work does not move: {answer.stuck}"
        return None

    def stack(self, name: str) -> str:
        """The stuck thread's stack `name` last reported ('' when none)."""
        watch = self._watched.get(name)
        return watch.answer.stack if watch is not None and watch.answer is not None else ""
