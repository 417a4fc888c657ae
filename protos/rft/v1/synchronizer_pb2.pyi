from rft.v1 import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class MemberRole(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    MEMBER_ROLE_UNSPECIFIED: _ClassVar[MemberRole]
    MEMBER_ROLE_TRAINER: _ClassVar[MemberRole]
    MEMBER_ROLE_EXPLORER: _ClassVar[MemberRole]
MEMBER_ROLE_UNSPECIFIED: MemberRole
MEMBER_ROLE_TRAINER: MemberRole
MEMBER_ROLE_EXPLORER: MemberRole

class Member(_message.Message):
    __slots__ = ("member_id", "role", "status", "step", "model_version", "address", "workers", "last_heartbeat_ms", "weight_sync_port", "relay_address")
    MEMBER_ID_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    MODEL_VERSION_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    WORKERS_FIELD_NUMBER: _ClassVar[int]
    LAST_HEARTBEAT_MS_FIELD_NUMBER: _ClassVar[int]
    WEIGHT_SYNC_PORT_FIELD_NUMBER: _ClassVar[int]
    RELAY_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    member_id: str
    role: MemberRole
    status: _common_pb2.MemberStatus
    step: int
    model_version: int
    address: str
    workers: int
    last_heartbeat_ms: int
    weight_sync_port: int
    relay_address: str
    def __init__(self, member_id: _Optional[str] = ..., role: _Optional[_Union[MemberRole, str]] = ..., status: _Optional[_Union[_common_pb2.MemberStatus, str]] = ..., step: _Optional[int] = ..., model_version: _Optional[int] = ..., address: _Optional[str] = ..., workers: _Optional[int] = ..., last_heartbeat_ms: _Optional[int] = ..., weight_sync_port: _Optional[int] = ..., relay_address: _Optional[str] = ...) -> None: ...

class RegisterRequest(_message.Message):
    __slots__ = ("member",)
    MEMBER_FIELD_NUMBER: _ClassVar[int]
    member: Member
    def __init__(self, member: _Optional[_Union[Member, _Mapping]] = ...) -> None: ...

class RegisterResponse(_message.Message):
    __slots__ = ("model_version", "heartbeat_timeout_s", "sync_method")
    MODEL_VERSION_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_TIMEOUT_S_FIELD_NUMBER: _ClassVar[int]
    SYNC_METHOD_FIELD_NUMBER: _ClassVar[int]
    model_version: _common_pb2.ModelVersion
    heartbeat_timeout_s: int
    sync_method: str
    def __init__(self, model_version: _Optional[_Union[_common_pb2.ModelVersion, _Mapping]] = ..., heartbeat_timeout_s: _Optional[int] = ..., sync_method: _Optional[str] = ...) -> None: ...

class HeartbeatRequest(_message.Message):
    __slots__ = ("member_id", "status", "step", "model_version")
    MEMBER_ID_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    MODEL_VERSION_FIELD_NUMBER: _ClassVar[int]
    member_id: str
    status: _common_pb2.MemberStatus
    step: int
    model_version: int
    def __init__(self, member_id: _Optional[str] = ..., status: _Optional[_Union[_common_pb2.MemberStatus, str]] = ..., step: _Optional[int] = ..., model_version: _Optional[int] = ...) -> None: ...

class HeartbeatResponse(_message.Message):
    __slots__ = ("model_version", "sync_pending", "generation", "broadcast_generation")
    MODEL_VERSION_FIELD_NUMBER: _ClassVar[int]
    SYNC_PENDING_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    BROADCAST_GENERATION_FIELD_NUMBER: _ClassVar[int]
    model_version: _common_pb2.ModelVersion
    sync_pending: bool
    generation: int
    broadcast_generation: int
    def __init__(self, model_version: _Optional[_Union[_common_pb2.ModelVersion, _Mapping]] = ..., sync_pending: _Optional[bool] = ..., generation: _Optional[int] = ..., broadcast_generation: _Optional[int] = ...) -> None: ...

class GetRunStateRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class RunState(_message.Message):
    __slots__ = ("members", "model_version", "trainer_step", "explorer_step", "sync_method", "sync_style", "sync_interval", "sync_offset", "sync_in_progress", "finished", "generation", "pending_version", "status_counts", "weight_bytes_full", "weight_bytes_delta", "weight_deltas_computed")
    class StatusCountsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    MEMBERS_FIELD_NUMBER: _ClassVar[int]
    MODEL_VERSION_FIELD_NUMBER: _ClassVar[int]
    TRAINER_STEP_FIELD_NUMBER: _ClassVar[int]
    EXPLORER_STEP_FIELD_NUMBER: _ClassVar[int]
    SYNC_METHOD_FIELD_NUMBER: _ClassVar[int]
    SYNC_STYLE_FIELD_NUMBER: _ClassVar[int]
    SYNC_INTERVAL_FIELD_NUMBER: _ClassVar[int]
    SYNC_OFFSET_FIELD_NUMBER: _ClassVar[int]
    SYNC_IN_PROGRESS_FIELD_NUMBER: _ClassVar[int]
    FINISHED_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    PENDING_VERSION_FIELD_NUMBER: _ClassVar[int]
    STATUS_COUNTS_FIELD_NUMBER: _ClassVar[int]
    WEIGHT_BYTES_FULL_FIELD_NUMBER: _ClassVar[int]
    WEIGHT_BYTES_DELTA_FIELD_NUMBER: _ClassVar[int]
    WEIGHT_DELTAS_COMPUTED_FIELD_NUMBER: _ClassVar[int]
    members: _containers.RepeatedCompositeFieldContainer[Member]
    model_version: _common_pb2.ModelVersion
    trainer_step: int
    explorer_step: int
    sync_method: str
    sync_style: str
    sync_interval: int
    sync_offset: int
    sync_in_progress: bool
    finished: bool
    generation: int
    pending_version: int
    status_counts: _containers.ScalarMap[str, int]
    weight_bytes_full: int
    weight_bytes_delta: int
    weight_deltas_computed: int
    def __init__(self, members: _Optional[_Iterable[_Union[Member, _Mapping]]] = ..., model_version: _Optional[_Union[_common_pb2.ModelVersion, _Mapping]] = ..., trainer_step: _Optional[int] = ..., explorer_step: _Optional[int] = ..., sync_method: _Optional[str] = ..., sync_style: _Optional[str] = ..., sync_interval: _Optional[int] = ..., sync_offset: _Optional[int] = ..., sync_in_progress: _Optional[bool] = ..., finished: _Optional[bool] = ..., generation: _Optional[int] = ..., pending_version: _Optional[int] = ..., status_counts: _Optional[_Mapping[str, int]] = ..., weight_bytes_full: _Optional[int] = ..., weight_bytes_delta: _Optional[int] = ..., weight_deltas_computed: _Optional[int] = ...) -> None: ...

class RequestSyncRequest(_message.Message):
    __slots__ = ("member_id", "step", "version", "timeout_ms")
    MEMBER_ID_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    member_id: str
    step: int
    version: int
    timeout_ms: int
    def __init__(self, member_id: _Optional[str] = ..., step: _Optional[int] = ..., version: _Optional[int] = ..., timeout_ms: _Optional[int] = ...) -> None: ...

class RequestSyncResponse(_message.Message):
    __slots__ = ("accepted", "model_version", "generation", "reason")
    ACCEPTED_FIELD_NUMBER: _ClassVar[int]
    MODEL_VERSION_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    accepted: bool
    model_version: _common_pb2.ModelVersion
    generation: int
    reason: str
    def __init__(self, accepted: _Optional[bool] = ..., model_version: _Optional[_Union[_common_pb2.ModelVersion, _Mapping]] = ..., generation: _Optional[int] = ..., reason: _Optional[str] = ...) -> None: ...

class WaitForVersionRequest(_message.Message):
    __slots__ = ("member_id", "min_version", "timeout_ms", "step")
    MEMBER_ID_FIELD_NUMBER: _ClassVar[int]
    MIN_VERSION_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    member_id: str
    min_version: int
    timeout_ms: int
    step: int
    def __init__(self, member_id: _Optional[str] = ..., min_version: _Optional[int] = ..., timeout_ms: _Optional[int] = ..., step: _Optional[int] = ...) -> None: ...

class WaitForVersionResponse(_message.Message):
    __slots__ = ("model_version", "timed_out", "required_version", "receive_broadcast", "generation", "sync_method", "finished", "weight_sources")
    MODEL_VERSION_FIELD_NUMBER: _ClassVar[int]
    TIMED_OUT_FIELD_NUMBER: _ClassVar[int]
    REQUIRED_VERSION_FIELD_NUMBER: _ClassVar[int]
    RECEIVE_BROADCAST_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    SYNC_METHOD_FIELD_NUMBER: _ClassVar[int]
    FINISHED_FIELD_NUMBER: _ClassVar[int]
    WEIGHT_SOURCES_FIELD_NUMBER: _ClassVar[int]
    model_version: _common_pb2.ModelVersion
    timed_out: bool
    required_version: int
    receive_broadcast: bool
    generation: int
    sync_method: str
    finished: bool
    weight_sources: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, model_version: _Optional[_Union[_common_pb2.ModelVersion, _Mapping]] = ..., timed_out: _Optional[bool] = ..., required_version: _Optional[int] = ..., receive_broadcast: _Optional[bool] = ..., generation: _Optional[int] = ..., sync_method: _Optional[str] = ..., finished: _Optional[bool] = ..., weight_sources: _Optional[_Iterable[str]] = ...) -> None: ...

class SyncGroupRequest(_message.Message):
    __slots__ = ("member_id", "tensors")
    MEMBER_ID_FIELD_NUMBER: _ClassVar[int]
    TENSORS_FIELD_NUMBER: _ClassVar[int]
    member_id: str
    tensors: _containers.RepeatedCompositeFieldContainer[_common_pb2.TensorMeta]
    def __init__(self, member_id: _Optional[str] = ..., tensors: _Optional[_Iterable[_Union[_common_pb2.TensorMeta, _Mapping]]] = ...) -> None: ...

class SyncGroupResponse(_message.Message):
    __slots__ = ("group", "ranks")
    GROUP_FIELD_NUMBER: _ClassVar[int]
    RANKS_FIELD_NUMBER: _ClassVar[int]
    group: _common_pb2.WeightSyncGroupInfo
    ranks: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, group: _Optional[_Union[_common_pb2.WeightSyncGroupInfo, _Mapping]] = ..., ranks: _Optional[_Iterable[int]] = ...) -> None: ...

class PushWeightsResponse(_message.Message):
    __slots__ = ("model_version", "bytes")
    MODEL_VERSION_FIELD_NUMBER: _ClassVar[int]
    BYTES_FIELD_NUMBER: _ClassVar[int]
    model_version: _common_pb2.ModelVersion
    bytes: int
    def __init__(self, model_version: _Optional[_Union[_common_pb2.ModelVersion, _Mapping]] = ..., bytes: _Optional[int] = ...) -> None: ...

class PullWeightsRequest(_message.Message):
    __slots__ = ("member_id", "version", "chunk_bytes", "have_version")
    MEMBER_ID_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    CHUNK_BYTES_FIELD_NUMBER: _ClassVar[int]
    HAVE_VERSION_FIELD_NUMBER: _ClassVar[int]
    member_id: str
    version: int
    chunk_bytes: int
    have_version: int
    def __init__(self, member_id: _Optional[str] = ..., version: _Optional[int] = ..., chunk_bytes: _Optional[int] = ..., have_version: _Optional[int] = ...) -> None: ...

class NotifyCheckpointResponse(_message.Message):
    __slots__ = ("model_version",)
    MODEL_VERSION_FIELD_NUMBER: _ClassVar[int]
    model_version: _common_pb2.ModelVersion
    def __init__(self, model_version: _Optional[_Union[_common_pb2.ModelVersion, _Mapping]] = ...) -> None: ...

class SynchronizerShutdownRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class SynchronizerShutdownResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ReportSyncRequest(_message.Message):
    __slots__ = ("member_id", "version", "ok", "generation", "message")
    MEMBER_ID_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    OK_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    member_id: str
    version: int
    ok: bool
    generation: int
    message: str
    def __init__(self, member_id: _Optional[str] = ..., version: _Optional[int] = ..., ok: _Optional[bool] = ..., generation: _Optional[int] = ..., message: _Optional[str] = ...) -> None: ...

class ReportSyncResponse(_message.Message):
    __slots__ = ("model_version", "generation")
    MODEL_VERSION_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    model_version: _common_pb2.ModelVersion
    generation: int
    def __init__(self, model_version: _Optional[_Union[_common_pb2.ModelVersion, _Mapping]] = ..., generation: _Optional[int] = ...) -> None: ...
