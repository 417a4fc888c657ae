"""Liveness of this service process: a heartbeat task on its event loop and the step it is on, served as
`rft.v1.Liveness/Progress` (protos/rft/v1/liveness.proto) by every service (`services.common.app`).

A process that answers is alive in the sense that matters to its supervisor: the RPC is answered by the
same event loop that runs the service's main task and its other RPCs, and the heavy work (a train step,
generation, a checkpoint save) runs in threads, so a long step does not stop the answers while a stopped
process (SIGSTOP), a blocked loop or a wedged interpreter gives none. `rft run` asks every few seconds
and kills what has not answered for `services.liveness_timeout` seconds (launcher/watchdog.py).

The step is what the service says it is on (`track(unit, read)`: the trainer's global step, the explorer's
step, the synchronizer's published version, the buffer's handled requests), sampled at each heartbeat;
`moved_age_s` says how long it has stayed there. Waiting for peers is legitimate, so that age is reported,
never judged: the heartbeat measures this process's own loop, not the run's progress.

The unit of work in flight is judged (services/common/progress.py): a worker thread stuck past its limit
(`services.progress_timeout`, sized by the unit's history), or on trainer rank 0 another rank stopped or
wedged (`watch_ranks`), is reported as `stuck` with the stuck thread's stack, and the heartbeat flips
the process's standard health check to NOT_SERVING (`on_stuck`), which the compose healthcheck and the
Kubernetes probe (services/common/healthcheck.py) then fail on.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import Callable
from dataclasses import dataclass

from rft.v1 import liveness_pb2, liveness_pb2_grpc

from services.common import progress

SERVICE_NAME = "rft.v1.Liveness"
HEARTBEAT_S = 1.0


@dataclass(frozen=True)
class Snapshot:
    """What `Progress` answers; ages in seconds."""

    heartbeat_age_s: float
    unit: str
    step: int
    moved_age_s: float
    uptime_s: float
    work: progress.Report = progress.Report()


class Liveness:
    """The heartbeat and progress of one process (`clock`: monotonic seconds, replaceable in tests)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic, interval_s: float = HEARTBEAT_S):
        self.clock, self.interval_s = clock, interval_s
        self.started_at = self.beat_at = self.moved_at = clock()
        self.unit, self.step = "", 0
        self._read: Callable[[], int] | None = None
        self.tracker = progress.PROCESS
        self._ranks: Callable[[], list[str]] | None = None
        self._on_stuck: Callable[[bool], object] | None = None
        self._was_stuck = False

    def track(self, unit: str, read: Callable[[], int]) -> None:
        """Report `read()` (cheap, never blocking) as the step the service is on, counted in `unit`."""
        self.unit, self._read = unit, read
        self._sample(self.clock())

    def watch_ranks(self, problems: Callable[[], list[str]]) -> None:
        """Trainer rank 0: `problems()` lists the other ranks found stopped or wedged (progress.rank_reports)."""
        self._ranks = problems

    def work(self) -> progress.Report:
        """This process's unit of work in flight, with the other ranks' problems folded into `stuck`."""
        report = self.tracker.report()
        try:
            ranks = self._ranks() if self._ranks is not None else []
        except Exception:  # an unreadable run folder must never get a service killed
            ranks = []
        if not ranks:
            return report
        why = "; ".join(line.split("\n", 1)[0] for line in ranks)
        stuck = f"{report.stuck}; {why}" if report.stuck else f"trainer {why}"
        # this rank's own thread too, though within its limit: where it waits for the other rank
        stacks = "\n".join([report.stack or self.tracker.stack(), *(line for line in ranks if "\n" in line)])
        return progress.Report(report.work, report.age_s, report.moved_age_s, report.limit_s, stuck, stacks)

    def _sample(self, now: float) -> None:
        if self._read is None:
            return
        try:
            step = int(self._read())
        except Exception:  # a core being torn down: keep the last step
            return
        if step != self.step:
            self.step, self.moved_at = step, now

    def beat(self) -> None:
        """One heartbeat: the loop turned; sample the step."""
        now = self.clock()
        self.beat_at = now
        self._sample(now)

    def snapshot(self) -> Snapshot:
        now = self.clock()
        self._sample(now)
        return Snapshot(
            heartbeat_age_s=max(0.0, now - self.beat_at),
            unit=self.unit,
            step=self.step,
            moved_age_s=max(0.0, now - self.moved_at),
            uptime_s=max(0.0, now - self.started_at),
            work=self.work(),
        )

    async def _judge(self) -> None:
        """Tell `on_stuck` when the work turns stuck or moves again (health NOT_SERVING / SERVING)."""
        if self._on_stuck is None:
            return
        stuck = bool(self.work().stuck)
        if stuck != self._was_stuck:
            self._was_stuck = stuck
            result = self._on_stuck(stuck)
            if asyncio.iscoroutine(result):
                await result

    async def run(self) -> None:
        """Beat every `interval_s` until cancelled."""
        while True:
            self.beat()
            with contextlib.suppress(Exception):  # the health flip is a report, never a reason to stop
                await self._judge()
            await asyncio.sleep(self.interval_s)  # ok-sleep: the heartbeat's period

    def start(self, on_stuck: Callable[[bool], object] | None = None) -> asyncio.Task[None]:
        """Serving from now on: reset the clocks (the step counts as moved now) and start the heartbeat
        on the running loop; `on_stuck(True/False)` when the work turns stuck / moves again."""
        self._on_stuck, self._was_stuck = on_stuck, False
        self.started_at = self.beat_at = self.moved_at = self.clock()
        self._sample(self.started_at)
        return asyncio.get_running_loop().create_task(self.run(), name="liveness-heartbeat")


# The process's own liveness: one per process, as a service process serves one service.
PROCESS = Liveness()


def track(unit: str, read: Callable[[], int]) -> None:
    """Report the step this process is on (see `Liveness.track`)."""
    PROCESS.track(unit, read)


class LivenessServicer(liveness_pb2_grpc.LivenessServicer):
    """`Progress`: the snapshot, as the proto says."""

    def __init__(self, liveness: Liveness):
        self.liveness = liveness

    async def Progress(self, request, context):  # noqa: N802 - gRPC method name
        s = self.liveness.snapshot()
        return liveness_pb2.ServiceProgress(
            heartbeat_age_s=s.heartbeat_age_s,
            unit=s.unit,
            step=s.step,
            moved_age_s=s.moved_age_s,
            uptime_s=s.uptime_s,
            pid=os.getpid(),
            work=s.work.work,
            work_age_s=s.work.age_s,
            work_moved_age_s=s.work.moved_age_s,
            work_limit_s=s.work.limit_s,
            stuck=s.work.stuck,
            stack=s.work.stack,
        )


def registration(liveness: Liveness = PROCESS):
    """The (add function, servicer, name) triple `start_server` takes."""
    return (liveness_pb2_grpc.add_LivenessServicer_to_server, LivenessServicer(liveness), SERVICE_NAME)


async def stop_heartbeat(task: asyncio.Task[None]) -> None:
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
