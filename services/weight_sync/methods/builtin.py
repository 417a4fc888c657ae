"""The built-in weight-sync methods (`SyncMethod` strategies, see `method.py`).

- `nccl` (alias `online`): a bucketed broadcast through a stateless torch.distributed group (nccl on
  CUDA, gloo on CPU, same-host shared memory when every member shares the host), coordinated by the
  synchronizer: the trainer joins the generation it announces, sends, and reports the outcome, which
  publishes; explorers (re)join on a new generation and receive while the trainer sends.
- `memory`: safetensors chunks pushed to the synchronizer (`PushWeights`; the push publishes);
  explorers pull the latest version (`PullWeights`).
- `checkpoint` (alias `offline`): an atomically published safetensors file under the run's
  `state_dicts/` folder; the trainer notifies the synchronizer of its path; explorers read it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

import torch

from services.weight_sync.errors import WeightSyncError
from services.weight_sync.member.superseded import (
    broadcast_unless_called_off,
    check_generation,
    join_unless_superseded,
)
from services.weight_sync.method import (
    Fetch,
    Load,
    Published,
    Receiver,
    Sender,
    SyncMethod,
    WaitAnswer,
    register_method,
)
from services.weight_sync.transport import (
    CheckpointTransport,
    Delivery,
    MemoryTransport,
    NcclTransport,
)
from services.weight_sync.wire.codec import decode_state_dict
from services.weight_sync.wire.files import read_payload

__all__ = [
    "BroadcastFetch",
    "BroadcastMethod",
    "CheckpointFetch",
    "CheckpointMethod",
    "MemoryFetch",
    "MemoryMethod",
]


@register_method
class BroadcastMethod(SyncMethod):
    name = "nccl"
    aliases = ("online",)
    broadcast = True
    transport = NcclTransport

    def check_sender(self, sender: Sender) -> None:
        if sender.group is None:
            raise WeightSyncError("nccl sync needs a weight-sync group first (SetupWeightSyncGroup)")

    async def send(
        self, sender: Sender, version: int, step: int, state: Mapping[str, torch.Tensor]
    ) -> Delivery:
        self.check_sender(sender)
        assert sender.group is not None
        return await asyncio.to_thread(sender.group.send, version, self.encode(state), step)

    async def published(self, client: Any, result: Published, generation: int) -> None:
        await client.report_sync(result.version, True, generation)

    async def failed(self, client: Any, generation: int, error: BaseException) -> None:
        # a failed join or broadcast is reported, so the synchronizer starts a new group generation
        await client.report_sync(0, False, generation, f"{type(error).__name__}: {error}")

    def fetch(self, client: Any, receiver: Receiver) -> Fetch:
        if receiver.group is None:
            raise WeightSyncError("the nccl method needs the explorer's weight receiver (a group member)")
        group = receiver.group
        return BroadcastFetch(client, group.setup, group.receive, getattr(group, "abandon", None))


@register_method
class MemoryMethod(SyncMethod):
    name = "memory"
    pushed = True
    transport = MemoryTransport

    def check_sender(self, sender: Sender) -> None:
        if sender.push is None:
            raise WeightSyncError("memory sync needs a synchronizer to push to (services.synchronizer)")

    async def send(
        self, sender: Sender, version: int, step: int, state: Mapping[str, torch.Tensor]
    ) -> Delivery:
        self.check_sender(sender)
        assert sender.push is not None
        delivery = self.make_transport(sender.options).send(version, self.encode(state), step)
        await sender.push(delivery.chunks)  # complete: the synchronizer publishes
        return delivery

    def fetch(self, client: Any, receiver: Receiver) -> Fetch:
        return MemoryFetch(client, receiver.load)


@register_method
class CheckpointMethod(SyncMethod):
    name = "checkpoint"
    aliases = ("offline",)
    checkpoint = True
    transport = CheckpointTransport

    async def send(
        self, sender: Sender, version: int, step: int, state: Mapping[str, torch.Tensor]
    ) -> Delivery:
        transport = self.make_transport(sender.options)
        return await asyncio.to_thread(transport.send, version, self.encode(state), step)

    async def published(self, client: Any, result: Published, generation: int) -> None:
        await client.notify_checkpoint(result.version, result.step, result.checkpoint_path)

    def fetch(self, client: Any, receiver: Receiver) -> Fetch:
        return CheckpointFetch(receiver.load, delta=getattr(client, "delta_pulls", False))


class MemoryFetch:
    """memory: pull the latest version from the synchronizer and load it (after the first pull, a
    delta from the version the client holds when the synchronizer can give one: `SyncClient.pull_weights`)."""

    def __init__(self, client: Any, load: Load, device: str | torch.device = "cpu"):
        self.client, self.load, self.device = client, load, device

    async def __call__(self, answer: WaitAnswer) -> int:
        version, state_dict = await self.client.pull_weights(0, self.device)
        await self.load(state_dict.items(), int(version.version))
        return int(version.version)


class CheckpointFetch:
    """checkpoint: read the published file named in the answer and load it. With `delta` the payload
    read is kept, and the next version is read as the delta from it when the trainer wrote one
    (`checkpoint.read_payload`); `bytes_full` / `bytes_delta` count what was read."""

    def __init__(self, load: Load, device: str | torch.device = "cpu", delta: bool = False):
        self.load, self.device, self.delta = load, device, delta
        self.held: tuple[int, bytearray] | None = None
        self.bytes_full = self.bytes_delta = 0

    async def __call__(self, answer: WaitAnswer) -> int:
        mv = answer.model_version
        payload, nbytes, from_delta = await asyncio.to_thread(read_payload, mv.checkpoint_path, self.held)
        if from_delta:
            self.bytes_delta += nbytes
        else:
            self.bytes_full += nbytes
        state_dict, _ = await asyncio.to_thread(decode_state_dict, payload, self.device)
        await self.load(state_dict.items(), int(mv.version))
        self.held = (int(mv.version), payload) if self.delta else None
        return int(mv.version)


class BroadcastFetch:
    """nccl: (re)join the group when its generation changed, then receive the broadcast.

    `setup(info, first_rank)`, `receive(version)` and `abandon()` fit the explorer's `WeightReceiver`;
    given `abandon`, a receive the synchronizer calls off (its sender was restarted, a member is gone)
    is given up (`superseded.broadcast_unless_called_off`) instead of waiting out the group's timeout.
    """

    def __init__(self, client: Any, setup: Any, receive: Any, abandon: Any = None):
        self.client, self.setup, self.receive, self.abandon = client, setup, receive, abandon
        self.joined_generation = 0

    async def __call__(self, answer: WaitAnswer) -> int:
        if not answer.receive_broadcast:
            raise WeightSyncError("nccl weights arrive only by broadcast; none is pending")
        if answer.generation != self.joined_generation:
            info, ranks = await self.client.get_weight_sync_info()
            check_generation(info, answer.generation, "this explorer")
            await join_unless_superseded(
                self.client, info, lambda abandon: self.setup(info, ranks[0], abandon=abandon)
            )
            self.joined_generation = info.generation
        version = int(answer.model_version.version)
        try:
            if self.abandon is None:
                await self.receive(version)
            else:
                await broadcast_unless_called_off(
                    self.client, self.joined_generation, self.receive(version), self.abandon
                )
        except Exception:
            self.joined_generation = 0
            raise
        return version
