"""gRPC adapter of the buffer: proto in, `BufferCore` call, proto out; domain errors become status codes.

ValidationError -> INVALID_ARGUMENT (the message names the field and index), BufferFull ->
RESOURCE_EXHAUSTED, LeaseError -> FAILED_PRECONDITION, a store that cannot be reached -> UNAVAILABLE.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TypeVar

import grpc
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError
from rft.v1 import buffer_pb2, buffer_pb2_grpc, experience_pb2

from services.buffer.core import BufferCore
from services.buffer.records import BufferFull, LeaseError, ValidationError

T = TypeVar("T")

SERVICE_NAME = "rft.v1.BufferService"


async def _guard(context: grpc.aio.ServicerContext, call: Callable[[], Awaitable[T]], prefix: str = "") -> T:
    try:
        return await call()
    except ValidationError as exc:
        await context.abort(grpc.StatusCode.INVALID_ARGUMENT, prefix + str(exc))
    except BufferFull as exc:
        await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, str(exc))
    except LeaseError as exc:
        await context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(exc))
    except (RedisConnectionError, RedisTimeoutError, OSError) as exc:
        await context.abort(grpc.StatusCode.UNAVAILABLE, f"buffer store unavailable: {exc}")
    raise AssertionError("unreachable")  # context.abort raises


class BufferServicer(buffer_pb2_grpc.BufferServiceServicer):
    def __init__(self, core: BufferCore):
        self.core = core

    async def PutExperiences(
        self,
        request_iterator: AsyncIterator[experience_pb2.ExperienceBatch],
        context: grpc.aio.ServicerContext,
    ) -> buffer_pb2.PutResponse:
        accepted = batches = 0
        async for batch in request_iterator:
            outcome = await _guard(context, lambda b=batch: self.core.put(b), prefix=f"batches[{batches}].")
            accepted += outcome.stored
            batches += 1
        return buffer_pb2.PutResponse(accepted=accepted, batches=batches)

    async def Put(
        self, request: experience_pb2.ExperienceBatch, context: grpc.aio.ServicerContext
    ) -> buffer_pb2.PutResponse:
        outcome = await _guard(context, lambda: self.core.put(request))
        return buffer_pb2.PutResponse(accepted=outcome.stored, batches=1)

    async def PutSequenced(
        self, request: buffer_pb2.SequencedBatch, context: grpc.aio.ServicerContext
    ) -> buffer_pb2.PutResponse:
        outcome = await _guard(
            context, lambda: self.core.put(request.batch, sequence=request.sequence, idempotent=True)
        )
        return buffer_pb2.PutResponse(accepted=outcome.stored, batches=1, duplicates=int(outcome.duplicate))

    async def GetBatch(
        self, request: buffer_pb2.GetBatchRequest, context: grpc.aio.ServicerContext
    ) -> buffer_pb2.GetBatchResponse:
        batch = await _guard(
            context,
            lambda: self.core.get_batch(
                size=request.size,
                timeout_ms=request.timeout_ms,
                consumer_group=request.consumer_group,
                consumer=request.consumer,
                min_model_version=request.min_model_version,
                lease_ms=request.lease_ms,
            ),
        )
        # Payloads are already field-2 wire bytes: one parse builds the whole response.
        response = buffer_pb2.GetBatchResponse.FromString(b"".join(batch.payloads))
        response.lease_id = batch.lease_id
        response.partial = batch.partial
        response.lease_deadline_ms = batch.deadline_ms
        response.dropped_stale = batch.dropped_stale
        return response

    async def Ack(
        self, request: buffer_pb2.AckRequest, context: grpc.aio.ServicerContext
    ) -> buffer_pb2.AckResponse:
        n = await _guard(context, lambda: self.core.ack(request.lease_id, request.consumer_group))
        return buffer_pb2.AckResponse(acked=n)

    async def Nack(
        self, request: buffer_pb2.NackRequest, context: grpc.aio.ServicerContext
    ) -> buffer_pb2.NackResponse:
        n = await _guard(context, lambda: self.core.nack(request.lease_id, request.consumer_group))
        return buffer_pb2.NackResponse(returned=n)

    async def Stats(
        self, request: buffer_pb2.StatsRequest, context: grpc.aio.ServicerContext
    ) -> buffer_pb2.StatsResponse:
        s = await _guard(context, lambda: self.core.stats(request.consumer_group))
        return buffer_pb2.StatsResponse(
            size=s.size,
            capacity=s.capacity,
            pending_leases=s.pending_leases,
            pending_experiences=s.pending_experiences,
            accepted=s.accepted,
            rejected=s.rejected,
            dropped_stale=s.dropped_stale,
            redelivered=s.redelivered,
            acked=s.acked,
            per_model_version=s.per_model_version,
            store=s.store,
        )


def registration(core: BufferCore) -> tuple:
    """The (add_fn, servicer, name) triple `start_server` takes."""
    return (buffer_pb2_grpc.add_BufferServiceServicer_to_server, BufferServicer(core), SERVICE_NAME)
