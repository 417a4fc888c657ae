from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class DType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    DTYPE_UNSPECIFIED: _ClassVar[DType]
    DTYPE_FLOAT32: _ClassVar[DType]
    DTYPE_FLOAT16: _ClassVar[DType]
    DTYPE_BFLOAT16: _ClassVar[DType]
    DTYPE_FLOAT64: _ClassVar[DType]
    DTYPE_INT64: _ClassVar[DType]
    DTYPE_INT32: _ClassVar[DType]
    DTYPE_INT8: _ClassVar[DType]
    DTYPE_UINT8: _ClassVar[DType]
    DTYPE_BOOL: _ClassVar[DType]

class MemberStatus(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    MEMBER_STATUS_UNSPECIFIED: _ClassVar[MemberStatus]
    MEMBER_STATUS_STARTING: _ClassVar[MemberStatus]
    MEMBER_STATUS_RUNNING: _ClassVar[MemberStatus]
    MEMBER_STATUS_REQUIRE_SYNC: _ClassVar[MemberStatus]
    MEMBER_STATUS_WAITING_SYNC: _ClassVar[MemberStatus]
    MEMBER_STATUS_SYNCING: _ClassVar[MemberStatus]
    MEMBER_STATUS_STOPPED: _ClassVar[MemberStatus]
    MEMBER_STATUS_FAILED: _ClassVar[MemberStatus]
    MEMBER_STATUS_LOST: _ClassVar[MemberStatus]
DTYPE_UNSPECIFIED: DType
DTYPE_FLOAT32: DType
DTYPE_FLOAT16: DType
DTYPE_BFLOAT16: DType
DTYPE_FLOAT64: DType
DTYPE_INT64: DType
DTYPE_INT32: DType
DTYPE_INT8: DType
DTYPE_UINT8: DType
DTYPE_BOOL: DType
MEMBER_STATUS_UNSPECIFIED: MemberStatus
MEMBER_STATUS_STARTING: MemberStatus
MEMBER_STATUS_RUNNING: MemberStatus
MEMBER_STATUS_REQUIRE_SYNC: MemberStatus
MEMBER_STATUS_WAITING_SYNC: MemberStatus
MEMBER_STATUS_SYNCING: MemberStatus
MEMBER_STATUS_STOPPED: MemberStatus
MEMBER_STATUS_FAILED: MemberStatus
MEMBER_STATUS_LOST: MemberStatus

class TensorMeta(_message.Message):
    __slots__ = ("name", "dtype", "shape")
    NAME_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    SHAPE_FIELD_NUMBER: _ClassVar[int]
    name: str
    dtype: DType
    shape: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, name: _Optional[str] = ..., dtype: _Optional[_Union[DType, str]] = ..., shape: _Optional[_Iterable[int]] = ...) -> None: ...

class ModelVersion(_message.Message):
    __slots__ = ("version", "step", "checkpoint_path")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_PATH_FIELD_NUMBER: _ClassVar[int]
    version: int
    step: int
    checkpoint_path: str
    def __init__(self, version: _Optional[int] = ..., step: _Optional[int] = ..., checkpoint_path: _Optional[str] = ...) -> None: ...

class WeightSyncGroupInfo(_message.Message):
    __slots__ = ("master_address", "master_port", "world_size", "group_name", "backend", "timeout_s", "tensors", "bucket_bytes", "generation")
    MASTER_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    MASTER_PORT_FIELD_NUMBER: _ClassVar[int]
    WORLD_SIZE_FIELD_NUMBER: _ClassVar[int]
    GROUP_NAME_FIELD_NUMBER: _ClassVar[int]
    BACKEND_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_S_FIELD_NUMBER: _ClassVar[int]
    TENSORS_FIELD_NUMBER: _ClassVar[int]
    BUCKET_BYTES_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    master_address: str
    master_port: int
    world_size: int
    group_name: str
    backend: str
    timeout_s: int
    tensors: _containers.RepeatedCompositeFieldContainer[TensorMeta]
    bucket_bytes: int
    generation: int
    def __init__(self, master_address: _Optional[str] = ..., master_port: _Optional[int] = ..., world_size: _Optional[int] = ..., group_name: _Optional[str] = ..., backend: _Optional[str] = ..., timeout_s: _Optional[int] = ..., tensors: _Optional[_Iterable[_Union[TensorMeta, _Mapping]]] = ..., bucket_bytes: _Optional[int] = ..., generation: _Optional[int] = ...) -> None: ...

class WeightChunk(_message.Message):
    __slots__ = ("version", "index", "total", "data", "total_bytes", "delta", "delta_base_version")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    INDEX_FIELD_NUMBER: _ClassVar[int]
    TOTAL_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    TOTAL_BYTES_FIELD_NUMBER: _ClassVar[int]
    DELTA_FIELD_NUMBER: _ClassVar[int]
    DELTA_BASE_VERSION_FIELD_NUMBER: _ClassVar[int]
    version: ModelVersion
    index: int
    total: int
    data: bytes
    total_bytes: int
    delta: bool
    delta_base_version: int
    def __init__(self, version: _Optional[_Union[ModelVersion, _Mapping]] = ..., index: _Optional[int] = ..., total: _Optional[int] = ..., data: _Optional[bytes] = ..., total_bytes: _Optional[int] = ..., delta: _Optional[bool] = ..., delta_base_version: _Optional[int] = ...) -> None: ...

class Metric(_message.Message):
    __slots__ = ("name", "value")
    NAME_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    name: str
    value: float
    def __init__(self, name: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
