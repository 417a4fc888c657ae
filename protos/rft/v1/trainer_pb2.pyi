from rft.v1 import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class GetWeightSyncInfoRequest(_message.Message):
    __slots__ = ("receivers",)
    RECEIVERS_FIELD_NUMBER: _ClassVar[int]
    receivers: int
    def __init__(self, receivers: _Optional[int] = ...) -> None: ...

class SetupWeightSyncGroupRequest(_message.Message):
    __slots__ = ("group",)
    GROUP_FIELD_NUMBER: _ClassVar[int]
    group: _common_pb2.WeightSyncGroupInfo
    def __init__(self, group: _Optional[_Union[_common_pb2.WeightSyncGroupInfo, _Mapping]] = ...) -> None: ...

class SetupWeightSyncGroupResponse(_message.Message):
    __slots__ = ("rank",)
    RANK_FIELD_NUMBER: _ClassVar[int]
    rank: int
    def __init__(self, rank: _Optional[int] = ...) -> None: ...

class TeardownWeightSyncGroupRequest(_message.Message):
    __slots__ = ("generation",)
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    generation: int
    def __init__(self, generation: _Optional[int] = ...) -> None: ...

class TeardownWeightSyncGroupResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class SyncWeightsRequest(_message.Message):
    __slots__ = ("method",)
    METHOD_FIELD_NUMBER: _ClassVar[int]
    method: str
    def __init__(self, method: _Optional[str] = ...) -> None: ...

class SyncWeightsResponse(_message.Message):
    __slots__ = ("version", "seconds", "bytes")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    SECONDS_FIELD_NUMBER: _ClassVar[int]
    BYTES_FIELD_NUMBER: _ClassVar[int]
    version: _common_pb2.ModelVersion
    seconds: float
    bytes: int
    def __init__(self, version: _Optional[_Union[_common_pb2.ModelVersion, _Mapping]] = ..., seconds: _Optional[float] = ..., bytes: _Optional[int] = ...) -> None: ...

class TrainStepRequest(_message.Message):
    __slots__ = ("timeout_ms",)
    TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    timeout_ms: int
    def __init__(self, timeout_ms: _Optional[int] = ...) -> None: ...

class TrainStepResponse(_message.Message):
    __slots__ = ("step", "metrics", "continue_training")
    class MetricsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    STEP_FIELD_NUMBER: _ClassVar[int]
    METRICS_FIELD_NUMBER: _ClassVar[int]
    CONTINUE_TRAINING_FIELD_NUMBER: _ClassVar[int]
    step: int
    metrics: _containers.ScalarMap[str, float]
    continue_training: bool
    def __init__(self, step: _Optional[int] = ..., metrics: _Optional[_Mapping[str, float]] = ..., continue_training: _Optional[bool] = ...) -> None: ...

class SaveCheckpointRequest(_message.Message):
    __slots__ = ("block_until_saved", "save_as_hf")
    BLOCK_UNTIL_SAVED_FIELD_NUMBER: _ClassVar[int]
    SAVE_AS_HF_FIELD_NUMBER: _ClassVar[int]
    block_until_saved: bool
    save_as_hf: bool
    def __init__(self, block_until_saved: _Optional[bool] = ..., save_as_hf: _Optional[bool] = ...) -> None: ...

class SaveCheckpointResponse(_message.Message):
    __slots__ = ("step", "path", "hf_path")
    STEP_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    HF_PATH_FIELD_NUMBER: _ClassVar[int]
    step: int
    path: str
    hf_path: str
    def __init__(self, step: _Optional[int] = ..., path: _Optional[str] = ..., hf_path: _Optional[str] = ...) -> None: ...

class StatusRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class TrainerStatus(_message.Message):
    __slots__ = ("status", "step", "total_steps", "model_version", "world_size", "last_checkpoint", "last_metrics")
    class LastMetricsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    STATUS_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    TOTAL_STEPS_FIELD_NUMBER: _ClassVar[int]
    MODEL_VERSION_FIELD_NUMBER: _ClassVar[int]
    WORLD_SIZE_FIELD_NUMBER: _ClassVar[int]
    LAST_CHECKPOINT_FIELD_NUMBER: _ClassVar[int]
    LAST_METRICS_FIELD_NUMBER: _ClassVar[int]
    status: _common_pb2.MemberStatus
    step: int
    total_steps: int
    model_version: _common_pb2.ModelVersion
    world_size: int
    last_checkpoint: str
    last_metrics: _containers.ScalarMap[str, float]
    def __init__(self, status: _Optional[_Union[_common_pb2.MemberStatus, str]] = ..., step: _Optional[int] = ..., total_steps: _Optional[int] = ..., model_version: _Optional[_Union[_common_pb2.ModelVersion, _Mapping]] = ..., world_size: _Optional[int] = ..., last_checkpoint: _Optional[str] = ..., last_metrics: _Optional[_Mapping[str, float]] = ...) -> None: ...

class IsAliveRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class IsAliveResponse(_message.Message):
    __slots__ = ("alive",)
    ALIVE_FIELD_NUMBER: _ClassVar[int]
    alive: bool
    def __init__(self, alive: _Optional[bool] = ...) -> None: ...

class ShutdownRequest(_message.Message):
    __slots__ = ("wait_for_save",)
    WAIT_FOR_SAVE_FIELD_NUMBER: _ClassVar[int]
    wait_for_save: bool
    def __init__(self, wait_for_save: _Optional[bool] = ...) -> None: ...

class ShutdownResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...
