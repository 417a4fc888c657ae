"""Version notices down the fan-out tree: an explorer asks its parent's relay, not the synchronizer,
whether the version its next step needs is published.

With `synchronizer.fanout: k` the weights travel a k-ary tree of relays (`server.py`), but each
explorer would still ask the synchronizer `WaitForVersion` and tell it `ReportSync` every step, so the
synchronizer's work per step would grow with the fleet. Here the questions travel the tree too:

- A relay answers `/rft.v1.SynchronizerService/WaitForVersion` (the synchronizer's own method and
  messages) from its `Notices`: what it knows of the run (the newest published version, whether the
  run finished), learned from every answer its own explorer got and from its own upstream waits. A
  child's `min_version` that it has not seen published yet starts one wait upstream (its own chain:
  its parent's relay, ..., the synchronizer; the next one when a source fails), shared by every child
  that waits for that version. So the synchronizer hears one wait per child of the root per version,
  whatever N. A relay answers `step` 0 only: the plan's requirement is the explorer's to apply.
- An explorer (`TreeWait`, used by the sync gate when the plan makes explorers wait) works out the
  version its step needs with the run's `SyncPlan` (as the synchronizer does for it), asks its
  parent's relay for it (`ask_s` at a time, asked again while the parent answers "not yet"), and asks
  the synchronizer when it has no parent (a child of the root, or before its first answer named one)
  or when the parent does not answer (dead, or hung past the deadline: the synchronizer's answer
  names the chain again). A relay gives up on a source up its chain that hangs the same way. What
  it holds and its step reach the synchronizer with its heartbeats (`SyncClient.heartbeat` carries
  `model_version`), so a successful load is not reported each step; a failed one still is.

Styles that never wait (`trainer_driven`, `fully_async`) keep asking the synchronizer: their question
is "what is published now", which only the synchronizer knows without a wait.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Any

import grpc
from rft.v1 import common_pb2, synchronizer_pb2

from services.common.log import get_logger
from services.weight_sync.tree.plan import ROOT

__all__ = ["Notices", "NoticeUnavailable", "TreeWait", "tree_wait"]

log = get_logger("weight_sync.tree.notices")

WAIT = "/rft.v1.SynchronizerService/WaitForVersion"


class NoticeUnavailable(Exception):
    """No source up the relay's chain answered its wait."""


async def _ask(
    channel: grpc.aio.Channel, member_id: str, min_version: int, timeout_s: float, slack_s: float, ready: bool
) -> synchronizer_pb2.WaitForVersionResponse:
    """One `WaitForVersion(min_version)` over `channel`, given up on `slack_s` past its own timeout;
    `ready`: wait for the channel to connect (the synchronizer) instead of failing at once (a peer)."""
    wait = channel.unary_unary(
        WAIT,
        request_serializer=synchronizer_pb2.WaitForVersionRequest.SerializeToString,
        response_deserializer=synchronizer_pb2.WaitForVersionResponse.FromString,
    )
    req = synchronizer_pb2.WaitForVersionRequest(
        member_id=member_id, min_version=min_version, timeout_ms=max(1, int(timeout_s * 1000))
    )
    return await wait(req, timeout=timeout_s + slack_s, wait_for_ready=ready)


class Notices:
    """One relay's knowledge of the run, and its one upstream wait at a time (per version wanted).

    `channel(address)` gives the channel to a source (`ROOT` = the synchronizer); `chain()` the
    relay's own sources, nearest first, `ROOT` last."""

    def __init__(
        self,
        member_id: str,
        channel: Callable[[str], grpc.aio.Channel],
        chain: Callable[[], Sequence[str]],
        slack_s: float = 5.0,
    ):
        self.member_id, self.channel, self.chain = member_id, channel, chain
        self.slack_s = slack_s  # past the wait's own timeout: a source that hangs is given up on
        self.published = common_pb2.ModelVersion()
        self.finished = False
        self.sync_method, self.generation = "", 0
        self.upstream_waits = 0  # waits this relay sent up its chain (one per version its children wanted)
        self._changed = asyncio.Condition()
        self._task: asyncio.Task[str | None] | None = None
        self._target = 0

    def note(self, answer: Any) -> None:
        """What a `WaitForVersion` answer says of the run (from upstream or from the own explorer's)."""
        changed = False
        if answer.model_version.version > self.published.version:
            self.published.CopyFrom(answer.model_version)
            changed = True
        if answer.finished and not self.finished:
            self.finished = changed = True
        self.sync_method = answer.sync_method or self.sync_method
        self.generation = answer.generation or self.generation
        if changed:
            asyncio.ensure_future(self._notify())

    async def _notify(self) -> None:
        async with self._changed:
            self._changed.notify_all()

    def _response(self, required: int, timed_out: bool = False) -> synchronizer_pb2.WaitForVersionResponse:
        return synchronizer_pb2.WaitForVersionResponse(
            model_version=self.published, timed_out=timed_out, required_version=required,
            generation=self.generation, sync_method=self.sync_method, finished=self.finished,
        )  # fmt: skip

    async def answer(self, min_version: int, timeout_s: float) -> synchronizer_pb2.WaitForVersionResponse:
        """Once `min_version` is published (or the run finished), or timed out after `timeout_s`;
        raises `NoticeUnavailable` when no source up the chain answers."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while True:
            if self.finished or self.published.version >= min_version:
                return self._response(min_version)
            remaining = deadline - loop.time()
            if remaining <= 0:
                return self._response(min_version, timed_out=True)
            task = self._upstream(min_version, remaining)

            def settled(task: asyncio.Task[str | None] = task) -> bool:
                return self.finished or self.published.version >= min_version or task.done()

            async with self._changed:
                try:
                    await asyncio.wait_for(self._changed.wait_for(settled), remaining)
                except TimeoutError:
                    continue
            failed = task.result() if task.done() else None
            if failed is not None and not self.finished and self.published.version < min_version:
                raise NoticeUnavailable(failed)

    def _upstream(self, min_version: int, timeout_s: float) -> asyncio.Task[str | None]:
        """The upstream wait that brings `min_version`: the one in flight when it wants as much."""
        task = self._task
        if task is None or task.done() or self._target < min_version:
            self._target = min_version
            task = self._task = asyncio.ensure_future(self._ask_upstream(min_version, timeout_s))
        return task

    async def close(self) -> None:
        """Cancel the upstream wait in flight (the relay is closing)."""
        task, self._task = self._task, None
        if task is not None and not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    async def _ask_upstream(self, min_version: int, timeout_s: float) -> str | None:
        """One wait up the chain (the next source when one fails); what failed, or None."""
        self.upstream_waits += 1
        errors = []
        try:
            for address in self.chain():
                try:  # a dead peer fails at once (the chain goes on); the synchronizer is waited for
                    answer = await _ask(
                        self.channel(address),
                        self.member_id,
                        min_version,
                        timeout_s,
                        self.slack_s,
                        address == ROOT,
                    )
                except grpc.aio.AioRpcError as exc:
                    errors.append(f"{address or 'synchronizer'}: {exc.code().name} {exc.details()}"[:300])
                    continue
                self.note(answer)
                return None
            return "; ".join(errors) or "the relay has no source"
        finally:
            await self._notify()


class TreeWait:
    """An explorer's waits, asked of its parent's relay (see the module's docstring).

    `wait(step, held, timeout_s)` returns a `WaitForVersionResponse` as `SyncClient.wait_for_version`
    does (`weight_sources`: the chain the synchronizer last named); `loaded(step)` records a load before
    step `step` (the plan's `last_sync_step`)."""

    def __init__(self, client: Any, plan: Any, node: Any, *, ask_s: float = 10.0, slack_s: float = 5.0):
        self.client, self.plan, self.node = client, plan, node  # node: this explorer's `RelayNode`
        self.ask_s, self.slack_s = ask_s, slack_s
        self.chain: tuple[str, ...] = ()  # the relays the synchronizer's last answer named, parent first
        self.last_sync_step = client.step
        self.via_parent = self.via_synchronizer = 0  # waits answered by the parent's relay / the synchronizer

    def loaded(self, step: int) -> None:
        self.last_sync_step = step - 1

    async def wait(self, step: int, held: int, timeout_s: float) -> synchronizer_pb2.WaitForVersionResponse:
        required = self.plan.explorer_required_version(step, held, self.last_sync_step)
        if step:
            self.client.step = max(self.client.step, step - 1)  # heartbeats carry it
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while self.chain:
            # asked for at most `ask_s` at a time: a parent that is alive answers timed_out and is asked
            # again; one that hangs (stopped, not dead) misses the deadline and the synchronizer is asked
            bound = max(min(deadline - loop.time(), self.ask_s), 0.001)
            try:
                channel = self.node.peers.channel(self.chain[0])
                answer = await _ask(channel, self.client.member_id, required, bound, self.slack_s, False)
            except grpc.aio.AioRpcError as exc:
                log.info("parent relay did not answer; asking the synchronizer", parent=self.chain[0],
                         code=exc.code().name)  # fmt: skip
                self.chain = ()
                break
            if answer.timed_out and not answer.finished and deadline - loop.time() > 0:
                continue
            if not self.via_parent:
                log.info("version notices from the parent relay", parent=self.chain[0])
            self.via_parent += 1
            answer.required_version = required
            answer.weight_sources.extend(self.chain)
            self.node.notices.note(answer)
            return answer
        timeout_s = max(deadline - loop.time(), 0.001)
        # the synchronizer applies the plan to what it last heard of this explorer; the explorer's own
        # requirement (from what it holds now) goes with it as min_version
        answer = await self.client.wait_for_version(step=step, min_version=required, timeout_s=timeout_s)
        self.via_synchronizer += 1
        self.chain = tuple(answer.weight_sources)
        self.node.chain = (*self.chain, ROOT)  # this relay's own waits go the same way
        self.node.notices.note(answer)
        return answer


def tree_wait(client: Any, plan: Any) -> TreeWait | None:
    """The explorer's `TreeWait` when it serves a relay (`client.relay`, fan-out) and the plan makes
    explorers wait; None otherwise (every wait goes to the synchronizer)."""
    relay = getattr(client, "relay", None)
    if relay is None or not plan.explorer_waits():
        return None
    return TreeWait(client, plan, relay.node)
