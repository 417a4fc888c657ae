"""The buffer suite's connection and helpers: a `BufferService` stub with the token, experiences with
ids of this run only, and `drain`, which empties the suite's consumer group before a check.

Isolation. The suite reads only through its own consumer group (`--group`, default `conformance`; the
server must declare it in `services.buffer.consumer_groups`, since a client cannot create one), its
consumer names and producer id carry a random run tag, and its experiences' `eid.explorer_id` is
`conformance-<tag>`. What the protocol does not let it isolate: a put is seen by every declared group,
so against a live stack the other groups' consumers (a trainer) also receive the suite's few small
experiences; and another producer writing during the run interleaves with the suite's groups, which a
check reports as a failure saying so.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field

import grpc
from rft.v1 import buffer_pb2, buffer_pb2_grpc, experience_pb2

from launcher.conformance.harness import (
    CALL_TIMEOUT_S,
    CheckFailed,
    Connected,
    SetupError,
    one_line,
    require,
    setup_error,
)

DRAIN_BATCH = 4096
DRAIN_ROUNDS = 1000


@dataclass
class BufferContext(Connected):
    address: str
    group: str
    auth_token: str | None = None
    tag: str = field(default_factory=lambda: uuid.uuid4().hex[:8])

    def __post_init__(self) -> None:
        self.stub = buffer_pb2_grpc.BufferServiceStub(self.connect())
        self.producer = f"conformance-{self.tag}"
        self._groups = 0
        self._sequence = 0

    async def preflight(self) -> None:
        """Stats of the suite's group: reachable, authorised, and the group declared; else SetupError."""
        try:
            await self.stub.Stats(buffer_pb2.StatsRequest(consumer_group=self.group), timeout=CALL_TIMEOUT_S)
        except grpc.aio.AioRpcError as exc:
            if exc.code() == grpc.StatusCode.INVALID_ARGUMENT:
                raise SetupError(
                    f"consumer group {self.group!r} is refused ({one_line(exc.details())}); declare it in the "
                    "server's services.buffer.consumer_groups or pass --group with a declared one",
                    2,
                ) from None
            raise setup_error(exc, "buffer", self.address) from None

    # --- experiences of this run -------------------------------------------------------------------
    def new_group(self, n: int, label: str = "g") -> list[experience_pb2.Experience]:
        """`n` small valid experiences sharing a group id no other run uses (prompt 2, response 2)."""
        self._groups += 1
        group_id = f"cf-{self.tag}-{label}-{self._groups}"
        return [
            experience_pb2.Experience(
                eid=experience_pb2.ExperienceId(
                    group_id=group_id, suffix=str(i), explorer_id=self.producer, task_id=label
                ),
                tokens=[1, 2, 3, 4],
                prompt_length=2,
                logprobs=[-0.5, -0.25],
                action_mask=[True, True],
                reward=1.0,
            )
            for i in range(n)
        ]

    def batch(self, *groups: Sequence[experience_pb2.Experience]) -> experience_pb2.ExperienceBatch:
        return experience_pb2.ExperienceBatch(experiences=[e for g in groups for e in g])

    def next_sequence(self) -> int:
        self._sequence += 1
        return self._sequence

    async def put(self, *groups: Sequence[experience_pb2.Experience]) -> None:
        want = sum(len(g) for g in groups)
        reply = await self.stub.Put(self.batch(*groups), timeout=CALL_TIMEOUT_S)
        require(reply.accepted == want, f"Put of {want} experiences answered accepted={reply.accepted}")

    # --- leasing -----------------------------------------------------------------------------------
    def consumer(self, label: str) -> str:
        return f"cf-{self.tag}-{label}"

    async def get(self, size: int, timeout_ms: int = 0, **fields) -> buffer_pb2.GetBatchResponse:
        request = buffer_pb2.GetBatchRequest(
            consumer_group=self.group, size=size, timeout_ms=timeout_ms, **fields
        )
        return await self.stub.GetBatch(request, timeout=CALL_TIMEOUT_S + timeout_ms / 1000)

    async def ack(self, lease_id: str, **fields) -> int:
        request = buffer_pb2.AckRequest(lease_id=lease_id, consumer_group=self.group, **fields)
        return (await self.stub.Ack(request, timeout=CALL_TIMEOUT_S)).acked

    async def nack(self, lease_id: str, **fields) -> int:
        request = buffer_pb2.NackRequest(lease_id=lease_id, consumer_group=self.group, **fields)
        return (await self.stub.Nack(request, timeout=CALL_TIMEOUT_S)).returned

    async def drain(self) -> int:
        """Lease and ack everything the suite's group has not consumed yet (earlier runs, other
        producers), so that a check's GetBatch sees its own experiences first; the number acked."""
        total = 0
        consumer = self.consumer("drain")
        for _ in range(DRAIN_ROUNDS):
            reply = await self.get(DRAIN_BATCH, consumer=consumer)
            if not reply.lease_id:
                return total
            total += await self.ack(reply.lease_id, consumer=consumer)
        raise CheckFailed(f"the group {self.group!r} still had experiences after {DRAIN_ROUNDS} drain rounds")

    def own(self, reply: buffer_pb2.GetBatchResponse) -> list[str]:
        """The leased experiences as `group_id/suffix`, failing when another producer's are mixed in."""
        foreign = [e for e in reply.experiences if e.eid.explorer_id != self.producer]
        if foreign:
            raise CheckFailed(
                f"the lease holds {len(foreign)} experiences of another producer (group "
                f"{one_line(foreign[0].eid.group_id, 40)!r}): run the suite while no producer writes"
            )
        return [f"{e.eid.group_id}/{e.eid.suffix}" for e in reply.experiences]


def ids(*groups: Sequence[experience_pb2.Experience]) -> list[str]:
    return [f"{e.eid.group_id}/{e.eid.suffix}" for g in groups for e in g]
