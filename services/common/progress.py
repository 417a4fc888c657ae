"""Progress of this process's work, beside its liveness: is the unit of work in flight moving?

A unit (`work("trainer train_step")`: a trainer step on any rank, a generate call, a weight load, a
buffer commit) is opened by the thread that does it, records when it started and when it last moved
(`moved()`), and closes when done. The event loop's heartbeat (services/common/liveness.py) keeps
answering while a worker thread is stuck in a collective or on a lock, so the loop's liveness says
nothing about that thread; this does. A unit is stuck when it has not moved for its limit: the larger of
the floor (`services.progress_timeout`) and `FACTOR` x the longest of the recent units of its kind, so a
slow step on a loaded machine, whose history is slow too, is not called stuck. A stuck unit is reported
with the Python stack of the thread that holds it (`sys._current_frames`).

Trainer ranks > 0 serve no RPC: each rank writes its own record into `<job_dir>/progress/rank<N>.json`
once a second from a thread of its own (`RankBeacon`), never over a collective (a blocked collective is
what this must find). Rank 0 reads them (`rank_reports`): a file not rewritten for the floor is a stopped
rank, a record whose unit is stuck is a wedged one.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import threading
import time
import traceback
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

FACTOR = 3.0  # a unit may take this many times the longest recent one of its kind
HISTORY = 16  # recent durations kept per kind
BEACON_S = 1.0


def limit_s(floor_s: float, recent_s: list[float] | tuple[float, ...] | deque[float]) -> float:
    """How long a unit may stay without moving: max(floor, FACTOR x the longest recent duration)."""
    return max(floor_s, FACTOR * max(recent_s, default=0.0))


@dataclass(frozen=True)
class Report:
    """The unit in flight (`work` empty when idle); ages in seconds; `stuck` says why it is stuck."""

    work: str = ""
    age_s: float = 0.0
    moved_age_s: float = 0.0
    limit_s: float = 0.0
    stuck: str = ""
    stack: str = ""


@dataclass
class _Unit:
    kind: str
    thread_id: int
    started_at: float
    moved_at: float


def thread_stack(thread_id: int) -> str:
    """The Python stack of thread `thread_id` of this process, innermost call last ('' when gone)."""
    frame = sys._current_frames().get(thread_id)
    return "".join(traceback.format_stack(frame)) if frame is not None else ""


class Tracker:
    """The units of work in flight in one process (`clock`: monotonic seconds, replaceable in tests).
    `floor_s` 0 turns the verdict off (units are still reported)."""

    def __init__(self, floor_s: float = 0.0, clock: Callable[[], float] = time.monotonic):
        self.floor_s, self.clock = floor_s, clock
        self._units: dict[int, _Unit] = {}
        self._history: dict[str, deque[float]] = {}
        self._lock = threading.Lock()

    @contextlib.contextmanager
    def work(self, kind: str) -> Iterator[None]:
        """One unit of `kind` done by the calling thread (nested units: the innermost counts)."""
        now, key = self.clock(), object()
        unit = _Unit(kind, threading.get_ident(), now, now)
        with self._lock:
            self._units[id(key)] = unit
        try:
            yield
        finally:
            end = self.clock()
            with self._lock:
                self._units.pop(id(key), None)
                self._history.setdefault(kind, deque(maxlen=HISTORY)).append(end - unit.started_at)

    def moved(self) -> None:
        """The calling thread's units moved (a micro-batch done, a token batch generated)."""
        now, me = self.clock(), threading.get_ident()
        with self._lock:
            for unit in self._units.values():
                if unit.thread_id == me:
                    unit.moved_at = now

    def stack(self) -> str:
        """The stack of the thread whose unit has gone longest without moving ('' when idle)."""
        with self._lock:
            units = list(self._units.values())
        return thread_stack(min(units, key=lambda u: u.moved_at).thread_id) if units else ""

    def report(self) -> Report:
        """The unit that has gone longest without moving, judged against its limit."""
        now = self.clock()
        with self._lock:
            units = list(self._units.values())
            history = {kind: tuple(d) for kind, d in self._history.items()}
        if not units:
            return Report()
        unit = min(units, key=lambda u: u.moved_at)
        limit = limit_s(self.floor_s, history.get(unit.kind, ()))
        still = now - unit.moved_at
        report = Report(unit.kind, now - unit.started_at, still, limit)
        if self.floor_s > 0 and still > limit:
            stuck = f"{unit.kind} has not moved for {still:.0f} s (limit {limit:.0f} s)"
            return Report(**{**asdict(report), "stuck": stuck, "stack": thread_stack(unit.thread_id)})
        return report


# The process's own tracker: a service process serves one service (`configure` sets the floor).
PROCESS = Tracker()


def configure(floor_s: float) -> None:
    PROCESS.floor_s = float(floor_s)


def work(kind: str) -> contextlib.AbstractContextManager[None]:
    return PROCESS.work(kind)


def moved() -> None:
    PROCESS.moved()


# ---------------------------------------------------------------------------------------- ranks


def rank_file(folder: Path, rank: int) -> Path:
    return Path(folder) / f"rank{rank}.json"


class RankBeacon:
    """A daemon thread writing this rank's `Report` (and the wall-clock time) to its file every second."""

    def __init__(self, folder: Path, rank: int, tracker: Tracker = PROCESS, interval_s: float = BEACON_S):
        self.path, self.rank, self.tracker, self.interval_s = (
            rank_file(folder, rank),
            rank,
            tracker,
            interval_s,
        )
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name=f"progress-rank{rank}", daemon=True)

    def write(self) -> None:
        record = {"rank": self.rank, "pid": os.getpid(), "at": time.time(), **asdict(self.tracker.report())}
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(record))
        os.replace(tmp, self.path)

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            with contextlib.suppress(OSError):
                self.write()

    def start(self) -> RankBeacon:
        self.write()
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()


def rank_reports(folder: Path, ranks: range, floor_s: float, now: float | None = None) -> list[str]:
    """What is wrong with the other ranks ('rank 1 (pid 42): no progress record for 31 s'), one line
    each, with the stuck thread's stack for a wedged one. A missing file (another node) says nothing."""
    now = time.time() if now is None else now
    problems = []
    for rank in ranks:
        try:
            record = json.loads(rank_file(folder, rank).read_text())
        except (OSError, ValueError):
            continue
        who = f"rank {rank} (pid {record.get('pid')})"
        silent = now - float(record.get("at", now))
        if floor_s > 0 and silent > floor_s:
            problems.append(f"{who}: no progress record for {silent:.0f} s (stopped or frozen)")
        elif record.get("stuck"):
            problems.append(f"{who}: {record['stuck']}\n{record.get('stack', '')}".rstrip())
    return problems
