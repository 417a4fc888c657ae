"""The trainer's sync hook: plugs `SyncClient` into the trainer's step loop, for any weight-sync
method: what differs between methods is the method's strategy (`services.weight_sync.method`). The
explorer's side is `explorer_gate.py`.

Trainer (`services.trainer.core.SyncHook`: `after_step(step) -> metrics`):
    hook = TrainerSyncHook(client, settings.sync_method, sync=weight_sync.sync, specs=weight_sync.specs,
                           join_group=weight_sync.join)     # specs/join_group: broadcast methods
`after_step(N)` asks the synchronizer whether to publish after step N (`request_sync`; for a broadcast
method it returns once every explorer is ready), runs `sync()` (whose result has `version`, `step`,
`checkpoint_path`, like the trainer's `SyncResult`) and then lets the method complete the publish
(`SyncMethod.published`: memory - the push inside `sync` already published; checkpoint -
`notify_checkpoint(path)`; nccl - `report_sync(ok)`), or report a failure (`SyncMethod.failed`: a
failed join or broadcast starts a new group generation), then re-raises. A broadcast method first
hands the trainer's tensor specs over and (re)joins the group when a new generation is announced.
Pipelined (`snapshot=weight_sync.snapshot, pipeline_every=sync_interval`, used with `sync_offset` >= 1
and with `fully_async`): after a step due for a sync, the hook only snapshots the weights (private
copies, under the core's lock) and runs all of the above in the background with that snapshot, so
the next step trains while they are sent; at most one sync is in flight (the next `after_step`, or
`flush()`, waits for it and returns its metrics, tagged `sync/pipelined`, or raises its error).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

import grpc

from services.common import tracing
from services.weight_sync import TensorSpec
from services.weight_sync.member.client import SyncClient
from services.weight_sync.member.superseded import (
    broadcast_unless_called_off,
    check_generation,
    join_unless_superseded,
)
from services.weight_sync.method import Published, SyncMethod


class TrainerSyncHook:
    def __init__(
        self,
        client: SyncClient,
        method: SyncMethod,
        sync: Callable[[], Awaitable[Published]],
        *,
        specs: Callable[[], Awaitable[Sequence[TensorSpec]]] | None = None,
        join_group: Callable[..., Awaitable[Any]] | None = None,
        abandon: Callable[[], None] | None = None,
        snapshot: Callable[[], Awaitable[Any]] | None = None,
        pipeline_every: int = 0,
    ):
        self.method = method  # the run's, typed once in its settings record (TrainerSettings.sync_method)
        self.snapshot, self.pipeline_every = snapshot, pipeline_every
        self._inflight: asyncio.Task[Mapping[str, float]] | None = None
        self._pipelined_step = 0
        if self.method.broadcast and (specs is None or join_group is None):
            raise ValueError(f"the {self.method.name} method needs `specs` and `join_group`")
        self.client, self.sync = client, sync
        self.specs, self.join_group, self.abandon = specs, join_group, abandon
        self.joined_generation = 0
        self._specs_sent = False

    async def _prepare_group(self) -> None:
        """Hand the tensor specs over once (kept even when no explorer holds a rank yet)."""
        assert self.specs is not None
        try:
            await self.client.get_weight_sync_info(await self.specs())
        except grpc.aio.AioRpcError as exc:
            if exc.code() != grpc.StatusCode.FAILED_PRECONDITION:
                raise
        self._specs_sent = True

    async def _join(self, generation: int) -> None:
        """Join the generation the broadcast was accepted in (not a newer one: its members will not
        come for this broadcast), giving up when the synchronizer moves past it while joining."""
        if generation != self.joined_generation:
            join_group = self.join_group
            assert join_group is not None
            info, ranks = await self.client.get_weight_sync_info()
            check_generation(info, generation, "the trainer")
            await join_unless_superseded(
                self.client, info, lambda abandon: join_group(info, ranks[0], abandon=abandon)
            )
            self.joined_generation = info.generation

    async def after_step(self, step: int) -> Mapping[str, float]:
        """Publish after step `step` if the plan says so. Pipelined, the previous step's sync is
        settled (its metrics returned, its error raised, after this step's sync has started) and this
        step's weights are snapshot now and sent in the background."""
        if not self.pipeline_every or self.snapshot is None:
            return await self._publish(step, None)
        due = step % self.pipeline_every == 0 and step > self._pipelined_step
        try:
            metrics = dict(await self.flush())
        finally:
            if due:  # also after a failed previous sync: this step's weights go out regardless
                self._pipelined_step = step
                snap = await self.snapshot()
                self._inflight = asyncio.create_task(self._publish(step, snap), name=f"sync-step-{step}")
        return metrics if due else {**metrics, **await self._publish(step, None)}

    async def flush(self) -> Mapping[str, float]:
        """Wait for the sync in flight (pipelined); its metrics, or its error raised."""
        task, self._inflight = self._inflight, None
        if task is None:
            return {}
        return {**await task, "sync/pipelined": 1.0}

    async def _publish(self, step: int, snapshot: Any) -> Mapping[str, float]:
        with tracing.span("trainer.publish", {"rft.step": step}):
            return await self._publish_traced(step, snapshot)

    async def _publish_traced(self, step: int, snapshot: Any) -> Mapping[str, float]:
        t0 = time.perf_counter()
        if self.method.broadcast and not self._specs_sent:
            await self._prepare_group()
        decision = await self.client.request_sync(step)
        if not decision.accepted:
            return {}
        t1 = time.perf_counter()
        try:
            if self.method.broadcast:
                await self._join(decision.generation)
            transfer = self.sync() if snapshot is None else self.sync(snapshot)
            if self.method.broadcast and self.abandon is not None:
                # a receiver that stalls or is restarted mid-broadcast: the synchronizer calls it off
                transfer = broadcast_unless_called_off(
                    self.client, decision.generation, transfer, self.abandon
                )
            with tracing.span("trainer.sync.push", {"rft.sync_method": self.method.name}):
                result = await transfer
            t2 = time.perf_counter()
        except Exception as exc:
            await self.method.failed(self.client, decision.generation, exc)
            self.joined_generation = 0
            raise
        await self.method.published(self.client, result, decision.generation)
        end = time.perf_counter()
        return {
            "timing_s/sync_weights": end - t0,
            "timing_s/sync_request": t1 - t0,  # asking (nccl: until every explorer is ready)
            "timing_s/sync_transfer": t2 - t1,  # gather + send (memory: push to the synchronizer)
            "timing_s/sync_report": end - t2,
            "sync/model_version": float(result.version),
        }
