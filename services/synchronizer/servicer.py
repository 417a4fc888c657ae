"""gRPC adapter of the synchronizer: proto in, `SynchronizerCore` call, proto out; it keeps no state
(the members, the published version, the kept weights and the fan-out tree are the core's).

Errors: NotRegistered -> NOT_FOUND (register again), NotKept -> NOT_FOUND (weights not pushed or not
the latest), WrongState -> FAILED_PRECONDITION, InvalidArgument and malformed chunk streams ->
INVALID_ARGUMENT. Weights (memory method) never get
decoded here: `PushWeights` reads each received `WeightChunk`'s fields straight from its wire bytes
(`parse_raw_chunk`, the data is never copied) and keeps those bytes, and
`PullWeights` streams those bytes back unchanged (custom (de)serializers in `add_to_server`), so
chunks go out exactly as the trainer cut them (`PullWeightsRequest.chunk_bytes` is not applied),
or, for a receiver whose `have_version` is kept, the chunks of the cached delta (`core.pull_weights`).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc
from google.protobuf import message_factory
from rft.v1 import common_pb2, synchronizer_pb2, synchronizer_pb2_grpc

from services.common.rpc.errors import ErrorMap, Rule
from services.synchronizer.core import SynchronizerCore
from services.synchronizer.errors import InvalidArgument, NotKept, NotRegistered, WrongState
from services.synchronizer.members import MemberStatus, Role
from services.synchronizer.records import Published
from services.synchronizer.weights import PushAssembly
from services.weight_sync import MissingChunkError, specs_from_proto
from services.weight_sync.wire.chunks import parse_raw_chunk

SERVICE_NAME = "rft.v1.SynchronizerService"
RawChunk = tuple[Any, bytes]  # (the parsed fields, the wire bytes)


ERRORS = ErrorMap(  # services/common/rpc/errors.py
    Rule((NotRegistered, NotKept), grpc.StatusCode.NOT_FOUND),
    Rule(WrongState, grpc.StatusCode.FAILED_PRECONDITION),
    Rule((InvalidArgument, MissingChunkError, ValueError), grpc.StatusCode.INVALID_ARGUMENT),
)
_guard = ERRORS.guard


def _version(p: Published) -> common_pb2.ModelVersion:
    return common_pb2.ModelVersion(version=p.version, step=p.step, checkpoint_path=p.checkpoint_path)


def _status(value: int) -> MemberStatus | None:
    return MemberStatus(value) if value else None


def _timeout_s(request) -> float | None:
    """The request's `timeout_ms` in seconds; 0 (unset) or less: None, the core's `sync_timeout`."""
    return request.timeout_ms / 1000 if request.timeout_ms > 0 else None


def _role(value: int) -> Role:
    try:
        return Role(value)
    except ValueError:
        raise InvalidArgument(f"member.role must be TRAINER or EXPLORER, got {value}") from None


class SynchronizerServicer(synchronizer_pb2_grpc.SynchronizerServiceServicer):
    def __init__(self, core: SynchronizerCore, on_shutdown: Callable[[], None] | None = None):
        self.core = core
        self.on_shutdown = on_shutdown

    async def Register(self, request, context):
        m = request.member

        async def call():
            return await self.core.register(
                m.member_id, _role(m.role), address=m.address, workers=m.workers, step=m.step,
                model_version=m.model_version, weight_sync_port=m.weight_sync_port,
                relay_address=m.relay_address,
            )  # fmt: skip

        published = await _guard(context, call)
        s = self.core.settings
        return synchronizer_pb2.RegisterResponse(
            model_version=_version(published),
            heartbeat_timeout_s=max(1, round(s.heartbeat_timeout)),
            sync_method=s.method.name,
        )

    async def Heartbeat(self, request, context):
        published, pending, gen = await _guard(
            context,
            lambda: self.core.heartbeat(
                request.member_id,
                _status(request.status),
                request.step or None,
                request.model_version or None,
            ),
        )
        return synchronizer_pb2.HeartbeatResponse(
            model_version=_version(published), sync_pending=pending, generation=gen,
            broadcast_generation=self.core.broadcast_generation,
        )  # fmt: skip

    async def GetRunState(self, request, context):
        st = self.core.run_state()
        counts: dict[str, int] = {}
        members = []
        for m in st.members:
            name = common_pb2.MemberStatus.Name(int(m.status))
            counts[name] = counts.get(name, 0) + 1
            members.append(
                synchronizer_pb2.Member(
                    member_id=m.member_id,
                    role=int(m.role),
                    status=int(m.status),
                    step=m.step,
                    model_version=m.model_version,
                    address=m.address,
                    workers=m.workers,
                    weight_sync_port=m.weight_sync_port,
                )  # fmt: skip
            )
        s, deltas = st.settings, self.core.weight_deltas
        return synchronizer_pb2.RunState(
            members=members, model_version=_version(st.published), trainer_step=st.trainer_step,
            explorer_step=st.explorer_step, sync_method=s.method.name, sync_style=s.plan.style,
            sync_interval=s.plan.interval, sync_offset=s.plan.offset, sync_in_progress=st.sync_in_progress,
            finished=st.finished, generation=st.generation, pending_version=st.pending_version,
            status_counts=counts, weight_bytes_full=deltas.bytes_full, weight_bytes_delta=deltas.bytes_delta,
            weight_deltas_computed=deltas.deltas_computed,
        )  # fmt: skip

    async def RequestSync(self, request, context):
        timeout = _timeout_s(request)
        d = await _guard(
            context,
            lambda: self.core.request_sync(request.member_id, request.step, request.version, timeout),
        )
        return synchronizer_pb2.RequestSyncResponse(
            accepted=d.accepted, model_version=_version(d.published), generation=d.generation, reason=d.reason
        )

    async def WaitForVersion(self, request, context):
        timeout = _timeout_s(request)
        r = await _guard(
            context,
            lambda: self.core.wait_for_version(request.member_id, request.min_version, request.step, timeout),
        )
        return synchronizer_pb2.WaitForVersionResponse(
            model_version=_version(r.published), timed_out=r.timed_out, required_version=r.required,
            receive_broadcast=r.receive_broadcast, generation=r.generation,
            sync_method=self.core.settings.method.name, finished=r.finished,
            weight_sources=self.core.weight_sources(request.member_id),
        )  # fmt: skip

    async def GetWeightSyncInfo(self, request, context):
        a = await _guard(
            context, lambda: self.core.group_info(request.member_id, specs_from_proto(request.tensors))
        )
        return synchronizer_pb2.SyncGroupResponse(group=a.info.to_proto(), ranks=list(a.ranks))

    async def PushWeights(self, request_iterator: AsyncIterator[RawChunk], context):
        assembly = PushAssembly()

        async def call():
            async for chunk, raw in request_iterator:
                v = chunk.version
                assembly.add(
                    version=v.version, step=v.step, index=chunk.index, total=chunk.total,
                    total_bytes=chunk.total_bytes, nbytes=len(chunk.data), raw=raw,
                )  # fmt: skip
            return await self.core.publish_memory(assembly.finish())

        published = await _guard(context, call)
        return synchronizer_pb2.PushWeightsResponse(
            model_version=_version(published), bytes=assembly.total_bytes
        )

    async def PullWeights(self, request, context):
        have = request.have_version if request.HasField("have_version") else None
        chunks = await _guard(context, lambda: self.core.pull_weights(request.version, have))
        for raw in chunks:
            yield raw

    async def NotifyCheckpoint(self, request, context):
        published = await _guard(
            context,
            lambda: self.core.notify_checkpoint(request.version, request.step, request.checkpoint_path),
        )
        return synchronizer_pb2.NotifyCheckpointResponse(model_version=_version(published))

    async def ReportSync(self, request, context):
        published, gen = await _guard(
            context,
            lambda: self.core.report_sync(
                request.member_id, request.version, request.ok, request.generation, request.message
            ),
        )
        return synchronizer_pb2.ReportSyncResponse(model_version=_version(published), generation=gen)

    async def Shutdown(self, request, context):
        await self.core.shutdown()
        if self.on_shutdown is not None:
            self.on_shutdown()
        return synchronizer_pb2.SynchronizerShutdownResponse()


def _raw_chunk(data: bytes) -> RawChunk:
    """The chunk's fields read from the wire bytes (its data stays a view: nothing is copied)."""
    return parse_raw_chunk(data), data


def _identity(data: bytes) -> bytes:
    return data


def add_to_server(servicer: SynchronizerServicer, server: grpc.aio.Server) -> None:
    """The generated handlers, except PushWeights/PullWeights, which keep and send chunk bytes as they are."""
    service = synchronizer_pb2.DESCRIPTOR.services_by_name["SynchronizerService"]
    handlers = {}
    for method in service.methods:
        in_cls = _message_class(method.input_type)
        out_cls = _message_class(method.output_type)
        fn = getattr(servicer, method.name)
        if method.name == "PushWeights":
            handlers[method.name] = grpc.stream_unary_rpc_method_handler(
                fn, request_deserializer=_raw_chunk, response_serializer=out_cls.SerializeToString
            )
        elif method.name == "PullWeights":
            handlers[method.name] = grpc.unary_stream_rpc_method_handler(
                fn, request_deserializer=in_cls.FromString, response_serializer=_identity
            )
        else:
            handlers[method.name] = grpc.unary_unary_rpc_method_handler(
                fn, request_deserializer=in_cls.FromString, response_serializer=out_cls.SerializeToString
            )
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE_NAME, handlers),))
    server.add_registered_method_handlers(SERVICE_NAME, handlers)


def _message_class(descriptor):
    return message_factory.GetMessageClass(descriptor)


def registration(core: SynchronizerCore, on_shutdown: Callable[[], None] | None = None) -> tuple:
    """The (add_fn, servicer, name) triple `start_server` takes."""
    return (add_to_server, SynchronizerServicer(core, on_shutdown), SERVICE_NAME)
