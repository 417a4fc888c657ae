"""gRPC adapter of the buffer: proto in, `BufferCore` call, proto out; domain errors become status codes.

ValidationError -> INVALID_ARGUMENT (the message names the field and index), BufferFull ->
RESOURCE_EXHAUSTED, LeaseError (a lease expired, unknown or settled) -> FAILED_PRECONDITION, FencedError
(a stale epoch, or a lease taken with another one) -> ABORTED, ConsumerNotOpen (an epoch never handed
out) -> NOT_FOUND (the consumer must call OpenConsumer), a store that cannot be reached, or a Redis that
refuses writes because it cannot persist them (MISCONF: its disk is full) -> UNAVAILABLE.
Strings and lists over their bounds were refused before (`services.common.rpc.decode`), and the core
checks them again; no message here echoes more than 64 characters of a client's value.

The wire contract is the generated one; only the (de)serializers differ where it saves copies: put
requests keep each experience's received bytes (`WireBatch`), so they are stored without being
serialized again, and GetBatch answers with response bytes assembled from the stored payloads.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import asdict
from typing import Any

import grpc
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError as RedisResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError
from rft.v1 import buffer_pb2, buffer_pb2_grpc

from services.buffer.core import BufferCore
from services.buffer.records import (
    BufferFull,
    ConsumerNotOpen,
    FencedError,
    LeaseError,
    ValidationError,
    WireBatch,
    encode_batch_response,
    field_slices,
)
from services.common.rpc.errors import ErrorMap, Rule

SERVICE_NAME = "rft.v1.BufferService"


def one_line(text: str, keep: int = 200) -> str:
    text = " ".join(text.split())
    return text if len(text) <= keep else text[:keep] + "..."


def _cannot_write(exc: BaseException) -> str | None:
    """Redis could not write its append-only file (or snapshot): it refuses writes until it can.
    Other Redis replies are not the store being away (None: raised as they are)."""
    if not str(exc).startswith("MISCONF"):
        return None
    return (
        f"buffer store cannot write: Redis refuses writes ({one_line(str(exc))}); nothing of this call "
        "was stored, and it succeeds once Redis can write again (free space on its disk)"
    )


ERRORS = ErrorMap(  # services/common/rpc/errors.py
    Rule(ValidationError, grpc.StatusCode.INVALID_ARGUMENT, names_field=True),
    Rule(BufferFull, grpc.StatusCode.RESOURCE_EXHAUSTED),
    Rule(LeaseError, grpc.StatusCode.FAILED_PRECONDITION),
    Rule(FencedError, grpc.StatusCode.ABORTED),
    Rule(ConsumerNotOpen, grpc.StatusCode.NOT_FOUND),
    Rule(
        (RedisConnectionError, RedisTimeoutError, OSError),
        grpc.StatusCode.UNAVAILABLE,
        lambda exc: f"buffer store unavailable: {exc}",
    ),
    Rule(RedisResponseError, grpc.StatusCode.UNAVAILABLE, _cannot_write),
)
_guard = ERRORS.guard


class BufferServicer(buffer_pb2_grpc.BufferServiceServicer):
    def __init__(self, core: BufferCore):
        self.core = core

    async def PutExperiences(
        self, request_iterator: AsyncIterator[WireBatch], context: grpc.aio.ServicerContext
    ) -> buffer_pb2.PutResponse:
        accepted = batches = 0
        async for batch in request_iterator:
            outcome = await _guard(
                context,
                lambda b=batch: self.core.put(b.message, wire=b.members, wire_bytes=b.size),
                prefix=f"batches[{batches}].",
            )
            accepted += outcome.stored
            batches += 1
        return buffer_pb2.PutResponse(accepted=accepted, batches=batches)

    async def Put(self, request: WireBatch, context: grpc.aio.ServicerContext) -> buffer_pb2.PutResponse:
        outcome = await _guard(
            context,
            lambda: self.core.put(request.message, wire=request.members, wire_bytes=request.size),
        )
        return buffer_pb2.PutResponse(accepted=outcome.stored, batches=1)

    async def PutSequenced(
        self, request: tuple[buffer_pb2.SequencedBatch, list[bytes] | None], context: grpc.aio.ServicerContext
    ) -> buffer_pb2.PutResponse:
        message, wire = request
        outcome = await _guard(
            context,
            lambda: self.core.put(message.batch, sequence=message.sequence, idempotent=True, wire=wire),
        )
        return buffer_pb2.PutResponse(accepted=outcome.stored, batches=1, duplicates=int(outcome.duplicate))

    async def GetBatch(self, request: buffer_pb2.GetBatchRequest, context: grpc.aio.ServicerContext) -> bytes:
        batch = await _guard(
            context,
            lambda: self.core.get_batch(
                size=request.size,
                timeout_ms=request.timeout_ms,
                consumer_group=request.consumer_group,
                consumer=request.consumer,
                min_model_version=request.min_model_version,
                lease_ms=request.lease_ms,
                epoch=request.epoch,
            ),
        )
        return encode_batch_response(
            batch.payloads, batch.lease_id, batch.partial, batch.deadline_ms, batch.dropped_stale
        )

    async def Ack(
        self, request: buffer_pb2.AckRequest, context: grpc.aio.ServicerContext
    ) -> buffer_pb2.AckResponse:
        return buffer_pb2.AckResponse(acked=await self._settle(self.core.ack, request, context))

    async def Nack(
        self, request: buffer_pb2.NackRequest, context: grpc.aio.ServicerContext
    ) -> buffer_pb2.NackResponse:
        return buffer_pb2.NackResponse(returned=await self._settle(self.core.nack, request, context))

    @staticmethod
    async def _settle(
        settle: Callable[[str, str, int, str], Awaitable[int]],
        request: buffer_pb2.AckRequest | buffer_pb2.NackRequest,
        context: grpc.aio.ServicerContext,
    ) -> int:
        """An Ack or Nack request through `settle` (the core's ack or nack)."""
        return await _guard(
            context, lambda: settle(request.lease_id, request.consumer_group, request.epoch, request.consumer)
        )

    async def OpenConsumer(
        self, request: buffer_pb2.OpenConsumerRequest, context: grpc.aio.ServicerContext
    ) -> buffer_pb2.OpenConsumerResponse:
        out = await _guard(
            context,
            lambda: self.core.open_consumer(
                request.consumer_group,
                request.consumer,
                list(request.ack_lease_ids),
                list(request.keep_lease_ids),
            ),
        )
        return buffer_pb2.OpenConsumerResponse(epoch=out.epoch, acked=out.acked, released=out.released)

    async def Stats(
        self, request: buffer_pb2.StatsRequest, context: grpc.aio.ServicerContext
    ) -> buffer_pb2.StatsResponse:
        s = await _guard(context, lambda: self.core.stats(request.consumer_group))
        return buffer_pb2.StatsResponse(**asdict(s))  # StoreStats is StatsResponse, field for field


def _parse_sequenced(data: bytes) -> tuple[buffer_pb2.SequencedBatch, list[bytes] | None]:
    message = buffer_pb2.SequencedBatch.FromString(data)
    inner = field_slices(data, 1)
    # A batch split over several occurrences is merged by protobuf; then re-serialize instead.
    return message, field_slices(inner[0], 1) if len(inner) == 1 else None


def _bytes_or_message(response: bytes | buffer_pb2.GetBatchResponse) -> bytes:
    return response if isinstance(response, bytes) else response.SerializeToString()


def _plain(method: Any, request: Any, response: Any) -> grpc.RpcMethodHandler:
    """A unary handler with the generated serializers of its `request` and `response` messages."""
    return grpc.unary_unary_rpc_method_handler(
        method, request_deserializer=request.FromString, response_serializer=response.SerializeToString
    )


def add_to_server(servicer: BufferServicer, server: grpc.aio.Server) -> None:
    """Like the generated `add_BufferServiceServicer_to_server`, with the serializers described above."""
    put_response = buffer_pb2.PutResponse.SerializeToString
    unary = grpc.unary_unary_rpc_method_handler
    handlers = {
        "PutExperiences": grpc.stream_unary_rpc_method_handler(
            servicer.PutExperiences, request_deserializer=WireBatch.parse, response_serializer=put_response
        ),
        "Put": unary(servicer.Put, request_deserializer=WireBatch.parse, response_serializer=put_response),
        "PutSequenced": unary(
            servicer.PutSequenced, request_deserializer=_parse_sequenced, response_serializer=put_response
        ),
        "GetBatch": unary(
            servicer.GetBatch,
            request_deserializer=buffer_pb2.GetBatchRequest.FromString,
            response_serializer=_bytes_or_message,
        ),
        "Ack": _plain(servicer.Ack, buffer_pb2.AckRequest, buffer_pb2.AckResponse),
        "Nack": _plain(servicer.Nack, buffer_pb2.NackRequest, buffer_pb2.NackResponse),
        "OpenConsumer": _plain(
            servicer.OpenConsumer, buffer_pb2.OpenConsumerRequest, buffer_pb2.OpenConsumerResponse
        ),
        "Stats": _plain(servicer.Stats, buffer_pb2.StatsRequest, buffer_pb2.StatsResponse),
    }
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE_NAME, handlers),))
    server.add_registered_method_handlers(SERVICE_NAME, handlers)


def registration(core: BufferCore) -> tuple:
    """The (add_fn, servicer, name) triple `start_server` takes."""
    return (add_to_server, BufferServicer(core), SERVICE_NAME)
