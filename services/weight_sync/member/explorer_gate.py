"""The explorer's sync gate: plugs `SyncClient` into the explorer's step loop, for any weight-sync
method: what differs between methods is the method's strategy (`services.weight_sync.method`). The
trainer's side is `trainer_hook.py`.

Explorer (`services.explorer.sync.SyncGate`: `before_step(step, model_version)`, `notify_version`):
    method = settings.sync_method                 # typed once, in ExplorerSettings
    fetch = method.fetch(client, Receiver(core.load_weights, weight_receiver, model_path))
    gate = ExplorerSyncGate(client, fetch, method=method)
`before_step(s)` waits (`wait_for_version(step=s)`) until the plan lets step s run; when the method
wants the answer's version (`SyncMethod.wants`: a newer version exists, or a broadcast is about to
start), it fetches and loads it, reports the outcome
(`report_sync`) and only then returns. The wait gives up only when nothing moves: at the end of each
`timeout_s` window it looks where the trainer stands; while the trainer's step advanced since the end
of the previous window (it catches up after a restart) the wait goes on, so a trainer that stopped
moving is given up on after two windows with `SyncWaitTimeout` naming the version it needs and where
the trainer stands.
`step_metrics()` splits the last `before_step` into the time blocked on the plan
(`time/wait_for_weights`; ~one RPC when the style never waits: trainer_driven, fully_async) and the
time fetching and loading weights (`time/load_weights`).
With fan-out (`tree=tree.notices.tree_wait(client, plan)`) the waits are asked of the parent's relay
and a successful load is not reported (the heartbeats carry the held version): tree/notices.py.
A synchronizer that is away (restarting: UNAVAILABLE; it forgot this member: NOT_FOUND, then the gate
registers again) is waited for within the same window. The end of the run raises `RunFinished`. A broken or stale broadcast group (`GroupBrokenError`,
`StaleGenerationError`: a member died or the group changed mid-sync) is reported and waited out:
the gate asks again and joins the next generation, waiting up to 2 x `timeout_s` from the failure
(the sender needs up to one timeout to notice it, then sends the next version).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

import grpc
from rft.v1 import common_pb2, synchronizer_pb2

from services.common import tracing
from services.weight_sync import GroupBrokenError, StaleGenerationError
from services.weight_sync.member.away import Backoff, is_away, synchronizer_away
from services.weight_sync.member.client import RunFinished, SyncClient, SyncWaitTimeout
from services.weight_sync.method import SyncMethod, WaitAnswer
from services.weight_sync.tree.notices import TreeWait


class ExplorerSyncGate:
    def __init__(
        self,
        client: SyncClient,
        fetch: Callable[[WaitAnswer], Awaitable[int]],
        timeout_s: float | None = None,
        *,
        method: SyncMethod,
        tree: TreeWait | None = None,
    ):
        self.client, self.fetch, self.tree = client, fetch, tree
        self.method = method  # the run's, typed once in its settings record (ExplorerSettings.sync_method)
        self.timeout_s = timeout_s or client.sync_timeout_s
        self.held = client.model_version
        self.waiting_for: int | None = None
        self._report: asyncio.Task[Any] | None = None  # the last successful load's report
        self._waited = self._loading = 0.0  # seconds of the last before_step (see step_metrics)

    async def settle(self) -> None:
        """Wait for the last load's report (sent in the background while a step samples)."""
        report, self._report = self._report, None
        if report is not None:
            await report

    async def _trainer(self) -> tuple[int, str]:
        """(step, description) of the run's trainer as the synchronizer sees it."""
        try:
            state = await self.client.get_run_state()
        except grpc.aio.AioRpcError as exc:
            return -1, f"the synchronizer is unreachable ({exc.code().name})"
        for m in state.members:
            if m.role == synchronizer_pb2.MEMBER_ROLE_TRAINER:
                status = common_pb2.MemberStatus.Name(m.status).removeprefix("MEMBER_STATUS_")
                return int(m.step), f"the trainer (member {m.member_id!r}, {status}) is at step {m.step}"
        return -1, "no trainer has registered with the synchronizer"

    async def _extend_or_give_up(self, step: int, required: int, since: int | None) -> tuple[float, int]:
        """A wait window ended: a new deadline if the trainer moved since `since` (the step seen at the
        end of the previous window; None after the first: no RPC on the hot path), else give up."""
        trainer_step, where = await self._trainer()
        if since is None or trainer_step > since:
            return time.monotonic() + self.timeout_s, trainer_step
        raise SyncWaitTimeout(
            f"explore step {step} needs model version >= {required} from the trainer and holds "
            f"{self.held}; {where} and has not moved for {self.timeout_s:g}s"
        )

    def step_metrics(self) -> dict[str, float]:
        """The last `before_step`: seconds blocked until the plan let the step run (the asking
        included) and seconds fetching + loading new weights."""
        return {"time/wait_for_weights": self._waited, "time/load_weights": self._loading}

    async def before_step(self, step: int, model_version: int) -> None:
        t0 = time.perf_counter()
        self._loading = 0.0
        try:
            await self._before_step(step, model_version)
        finally:
            self._waited = time.perf_counter() - t0 - self._loading

    async def _before_step(self, step: int, model_version: int) -> None:
        await self.settle()  # the synchronizer hears of a load before this explorer asks again
        self.held = max(self.held, model_version)
        deadline = time.monotonic() + self.timeout_s
        trainer_step: int | None = None
        required, backoff = 0, Backoff()
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                deadline, trainer_step = await self._extend_or_give_up(step, required, trainer_step)
                continue
            try:
                if self.tree is not None:  # fan-out: asked of the parent's relay (tree/notices.py)
                    answer = await self.tree.wait(step, self.held, remaining)
                else:
                    answer = await self.client.wait_for_version(step=step, timeout_s=remaining)
            except grpc.aio.AioRpcError as exc:
                await synchronizer_away(exc, self.client.register)
                await backoff.wait(remaining)
                continue
            backoff.reset()
            required = answer.required_version
            if answer.finished:
                raise RunFinished(f"the run finished before explore step {step}")
            if answer.timed_out:
                deadline = time.monotonic()  # the window ended: extend it or give up (above)
                continue
            offered = answer.model_version.version
            # broadcast weights come only in a broadcast; the other methods fetch whatever is newer
            if self.method.wants(answer, self.held):
                self.waiting_for = offered
                t_fetch = time.perf_counter()
                try:
                    with tracing.span("explorer.sync.fetch", {"rft.model_version": offered}):
                        loaded = await self.fetch(answer)
                except Exception as exc:
                    if is_away(exc):
                        # the synchronizer stopped, restarted (it lost the payload) or moved on to a
                        # newer version while this explorer pulled: ask again, as when a wait finds it away
                        await backoff.wait(deadline - time.monotonic())
                        continue
                    await self.client.report_load(
                        offered, False, answer.generation, f"{type(exc).__name__}: {exc}", self.timeout_s
                    )
                    if not isinstance(exc, (GroupBrokenError, StaleGenerationError)):
                        raise
                    # the sender notices the failure within its own timeout, then sends the next
                    # version to a new group generation: wait for up to two timeouts from here
                    deadline = time.monotonic() + 2 * self.timeout_s
                    continue
                finally:
                    self.waiting_for = None
                    self._loading += time.perf_counter() - t_fetch
                self.notify_version(loaded)
                if self.tree is not None:  # the held version reaches the synchronizer with heartbeats
                    self.tree.loaded(step)
                elif self.held >= answer.required_version:
                    # the step may start now: the success report goes out while it samples
                    self._report = asyncio.create_task(
                        self.client.report_load(loaded, True, answer.generation, within_s=self.timeout_s)
                    )
                    return
                else:
                    await self.client.report_load(loaded, True, answer.generation, within_s=self.timeout_s)
            if self.held >= answer.required_version:
                return

    def notify_version(self, model_version: int) -> None:
        self.held = max(self.held, model_version)
        self.client.model_version = max(self.client.model_version, model_version)
