"""Publishing a training client's weights as the run's next version, through the synchronizer.

`Publisher` joins the synchronizer as the run's trainer member (`tinker` by default), keeps its
heartbeats on an event loop thread of its own, and publishes a state dict as version
`published + 1` with the run's sync method, as the trainer does (services/weight_sync: the
`SyncClient` and the method objects): it asks `RequestSync` for that version, then `memory` pushes the
weights (`PushWeights`: the push publishes) and `checkpoint` writes them under `sync_dir` and announces
the file (`NotifyCheckpoint`). A broadcast method (`nccl`) needs a trainer inside a weight-sync group
and is refused at start. Closing stops the heartbeats without leaving: a trainer that leaves STOPPED
ends the run, so the synchronizer marks this member lost instead and it may register again.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Coroutine, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import torch

from services.common.rpc import create_channel
from services.weight_sync import sync_method
from services.weight_sync.member.client import SyncClient
from services.weight_sync.method import Sender
from services.weight_sync.transport import TransportOptions

T = TypeVar("T")


class PublishError(RuntimeError):
    """The synchronizer did not take a version (or cannot be published to by this server)."""


@dataclass(frozen=True)
class _Sent:
    """What `SyncMethod.published` reads of a send (the trainer's `SyncResult` fields)."""

    version: int
    step: int
    checkpoint_path: str


class Publisher:
    """The tinker server's trainer member of one run: publishes state dicts as the next version."""

    def __init__(
        self,
        target: str,
        sync_dir: Path,
        *,
        auth_token: str | None = None,
        member_id: str = "tinker",
        timeout_s: float = 30.0,
        sync_timeout_s: float = 600.0,
    ):
        self.target, self.member_id = target, member_id
        self.options = TransportOptions(timeout_s=sync_timeout_s, checkpoint_dir=str(sync_dir))
        self.version = 0  # the run's published version, as of this member's last publish or register
        self.last_publish_s = 0.0  # seconds the last publish took (request, send, announce)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="tinker-sync", daemon=True)
        self._thread.start()
        channel = self._call(_channel(target, auth_token, timeout_s))
        self.client = SyncClient(
            channel, member_id, "trainer", timeout_s=timeout_s, sync_timeout_s=sync_timeout_s,
            owns_channel=True, delta_pulls=False,
        )  # fmt: skip
        try:
            self._call(self._join())
        except BaseException:
            self.close()
            raise

    def _call(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout)

    async def _join(self) -> None:
        try:
            published = await self.client.register()
            state = await self.client.get_run_state()
        except Exception as exc:  # grpc's AioRpcError: unreachable, or another trainer is alive
            raise PublishError(
                f"--synchronizer {self.target}: cannot join the run as trainer {self.member_id!r} "
                f"({_why(exc)}); check the address, and that no other trainer runs with it"
            ) from exc
        self.method = sync_method(state.sync_method)
        if self.method.broadcast:
            raise PublishError(
                f"--synchronizer {self.target}: the run's sync_method {state.sync_method!r} broadcasts "
                "from a trainer inside its weight-sync group; run the synchronizer with "
                "synchronizer.sync_method: memory or checkpoint for rft serve tinker"
            )
        self.version = int(published.version)
        self.style, self.interval = state.sync_style, state.sync_interval
        await self.client.start()

    def publish(self, state: Mapping[str, torch.Tensor]) -> int:
        """Publish `state` (HF names, a LoRA adapter merged in) as the next version; returns it."""
        return self._call(self._publish(state))

    async def _publish(self, state: Mapping[str, torch.Tensor]) -> int:
        start = time.perf_counter()
        version = self.version + 1
        decision = await self.client.request_sync(version, version)
        if not decision.accepted and decision.model_version.version >= version:
            version = int(decision.model_version.version) + 1  # published by an earlier process
            decision = await self.client.request_sync(version, version)
        if not decision.accepted:
            raise PublishError(
                f"the synchronizer did not take version {version}: {decision.reason} (its plan: "
                f"{self.style}, sync_interval {self.interval}); run it with synchronizer.sync_style: fixed "
                "and sync_interval: 1 so that every save_weights_for_sampler publishes"
            )
        push = self.client.push_chunks if self.method.pushed else None
        try:
            delivery = await self.method.send(Sender(self.options, None, push), version, version, dict(state))
        except Exception as exc:
            await self.method.failed(self.client, 0, exc)
            raise PublishError(f"publishing version {version} by {self.method.name} failed: {exc}") from exc
        await self.method.published(self.client, _Sent(version, version, delivery.path), 0)
        self.version = version
        self.last_publish_s = time.perf_counter() - start
        return version

    def close(self) -> None:
        """Stop heartbeats (without leaving the run) and the loop thread."""
        if self._loop.is_closed():
            return
        client = getattr(self, "client", None)
        if client is not None:
            with contextlib.suppress(Exception):  # closing on the way out must not raise
                self._call(client.close(), timeout=10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
        self._loop.close()


async def _channel(target: str, auth_token: str | None, timeout_s: float) -> Any:
    return create_channel(target, auth_token=auth_token, timeout_s=timeout_s)


def _why(exc: BaseException) -> str:
    details = getattr(exc, "details", None)
    return details() if callable(details) else f"{type(exc).__name__}: {exc}"
