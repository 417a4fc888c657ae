from rft.v1 import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ServeFeedbackRequest(_message.Message):
    __slots__ = ("session_id", "response_id", "reward", "choice_index")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    RESPONSE_ID_FIELD_NUMBER: _ClassVar[int]
    REWARD_FIELD_NUMBER: _ClassVar[int]
    CHOICE_INDEX_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    response_id: str
    reward: float
    choice_index: int
    def __init__(self, session_id: _Optional[str] = ..., response_id: _Optional[str] = ..., reward: _Optional[float] = ..., choice_index: _Optional[int] = ...) -> None: ...

class ServeFeedbackResponse(_message.Message):
    __slots__ = ("session_id",)
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    def __init__(self, session_id: _Optional[str] = ...) -> None: ...

class ServeCommitRequest(_message.Message):
    __slots__ = ("session_ids",)
    SESSION_IDS_FIELD_NUMBER: _ClassVar[int]
    session_ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, session_ids: _Optional[_Iterable[str]] = ...) -> None: ...

class ServeCommitResponse(_message.Message):
    __slots__ = ("committed", "experiences", "model_versions")
    COMMITTED_FIELD_NUMBER: _ClassVar[int]
    EXPERIENCES_FIELD_NUMBER: _ClassVar[int]
    MODEL_VERSIONS_FIELD_NUMBER: _ClassVar[int]
    committed: _containers.RepeatedScalarFieldContainer[str]
    experiences: int
    model_versions: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, committed: _Optional[_Iterable[str]] = ..., experiences: _Optional[int] = ..., model_versions: _Optional[_Iterable[int]] = ...) -> None: ...

class ExploreRequest(_message.Message):
    __slots__ = ("steps",)
    STEPS_FIELD_NUMBER: _ClassVar[int]
    steps: int
    def __init__(self, steps: _Optional[int] = ...) -> None: ...

class ExploreResponse(_message.Message):
    __slots__ = ("step", "experiences", "metrics", "continue_exploring")
    class MetricsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    STEP_FIELD_NUMBER: _ClassVar[int]
    EXPERIENCES_FIELD_NUMBER: _ClassVar[int]
    METRICS_FIELD_NUMBER: _ClassVar[int]
    CONTINUE_EXPLORING_FIELD_NUMBER: _ClassVar[int]
    step: int
    experiences: int
    metrics: _containers.ScalarMap[str, float]
    continue_exploring: bool
    def __init__(self, step: _Optional[int] = ..., experiences: _Optional[int] = ..., metrics: _Optional[_Mapping[str, float]] = ..., continue_exploring: _Optional[bool] = ...) -> None: ...

class EvalRequest(_message.Message):
    __slots__ = ("tasksets",)
    TASKSETS_FIELD_NUMBER: _ClassVar[int]
    tasksets: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, tasksets: _Optional[_Iterable[str]] = ...) -> None: ...

class EvalResponse(_message.Message):
    __slots__ = ("step", "metrics")
    class MetricsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    STEP_FIELD_NUMBER: _ClassVar[int]
    METRICS_FIELD_NUMBER: _ClassVar[int]
    step: int
    metrics: _containers.ScalarMap[str, float]
    def __init__(self, step: _Optional[int] = ..., metrics: _Optional[_Mapping[str, float]] = ...) -> None: ...

class ExplorerSetupWeightSyncGroupRequest(_message.Message):
    __slots__ = ("group", "rank_offset")
    GROUP_FIELD_NUMBER: _ClassVar[int]
    RANK_OFFSET_FIELD_NUMBER: _ClassVar[int]
    group: _common_pb2.WeightSyncGroupInfo
    rank_offset: int
    def __init__(self, group: _Optional[_Union[_common_pb2.WeightSyncGroupInfo, _Mapping]] = ..., rank_offset: _Optional[int] = ...) -> None: ...

class ExplorerSetupWeightSyncGroupResponse(_message.Message):
    __slots__ = ("ranks",)
    RANKS_FIELD_NUMBER: _ClassVar[int]
    ranks: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, ranks: _Optional[_Iterable[int]] = ...) -> None: ...

class ExplorerTeardownWeightSyncGroupRequest(_message.Message):
    __slots__ = ("generation",)
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    generation: int
    def __init__(self, generation: _Optional[int] = ...) -> None: ...

class ExplorerTeardownWeightSyncGroupResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class LoadWeightsResponse(_message.Message):
    __slots__ = ("version", "bytes")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    BYTES_FIELD_NUMBER: _ClassVar[int]
    version: _common_pb2.ModelVersion
    bytes: int
    def __init__(self, version: _Optional[_Union[_common_pb2.ModelVersion, _Mapping]] = ..., bytes: _Optional[int] = ...) -> None: ...

class ExplorerReceiveWeightsRequest(_message.Message):
    __slots__ = ("version",)
    VERSION_FIELD_NUMBER: _ClassVar[int]
    version: int
    def __init__(self, version: _Optional[int] = ...) -> None: ...

class BenchRequest(_message.Message):
    __slots__ = ("latest_only", "skip_base")
    LATEST_ONLY_FIELD_NUMBER: _ClassVar[int]
    SKIP_BASE_FIELD_NUMBER: _ClassVar[int]
    latest_only: bool
    skip_base: bool
    def __init__(self, latest_only: _Optional[bool] = ..., skip_base: _Optional[bool] = ...) -> None: ...

class BenchResponse(_message.Message):
    __slots__ = ("results",)
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedCompositeFieldContainer[EvalResponse]
    def __init__(self, results: _Optional[_Iterable[_Union[EvalResponse, _Mapping]]] = ...) -> None: ...

class ExplorerStatusRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ExplorerStatus(_message.Message):
    __slots__ = ("explorer_id", "status", "step", "model_version", "rollout_workers", "last_metrics")
    class LastMetricsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    EXPLORER_ID_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    MODEL_VERSION_FIELD_NUMBER: _ClassVar[int]
    ROLLOUT_WORKERS_FIELD_NUMBER: _ClassVar[int]
    LAST_METRICS_FIELD_NUMBER: _ClassVar[int]
    explorer_id: str
    status: _common_pb2.MemberStatus
    step: int
    model_version: _common_pb2.ModelVersion
    rollout_workers: int
    last_metrics: _containers.ScalarMap[str, float]
    def __init__(self, explorer_id: _Optional[str] = ..., status: _Optional[_Union[_common_pb2.MemberStatus, str]] = ..., step: _Optional[int] = ..., model_version: _Optional[_Union[_common_pb2.ModelVersion, _Mapping]] = ..., rollout_workers: _Optional[int] = ..., last_metrics: _Optional[_Mapping[str, float]] = ...) -> None: ...

class ExplorerShutdownRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ExplorerShutdownResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...
