from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from typing import ClassVar as _ClassVar, Optional as _Optional

DESCRIPTOR: _descriptor.FileDescriptor

class ProgressRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ServiceProgress(_message.Message):
    __slots__ = ("heartbeat_age_s", "unit", "step", "moved_age_s", "uptime_s", "pid", "work", "work_age_s", "work_moved_age_s", "work_limit_s", "stuck", "stack")
    HEARTBEAT_AGE_S_FIELD_NUMBER: _ClassVar[int]
    UNIT_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    MOVED_AGE_S_FIELD_NUMBER: _ClassVar[int]
    UPTIME_S_FIELD_NUMBER: _ClassVar[int]
    PID_FIELD_NUMBER: _ClassVar[int]
    WORK_FIELD_NUMBER: _ClassVar[int]
    WORK_AGE_S_FIELD_NUMBER: _ClassVar[int]
    WORK_MOVED_AGE_S_FIELD_NUMBER: _ClassVar[int]
    WORK_LIMIT_S_FIELD_NUMBER: _ClassVar[int]
    STUCK_FIELD_NUMBER: _ClassVar[int]
    STACK_FIELD_NUMBER: _ClassVar[int]
    heartbeat_age_s: float
    unit: str
    step: int
    moved_age_s: float
    uptime_s: float
    pid: int
    work: str
    work_age_s: float
    work_moved_age_s: float
    work_limit_s: float
    stuck: str
    stack: str
    def __init__(self, heartbeat_age_s: _Optional[float] = ..., unit: _Optional[str] = ..., step: _Optional[int] = ..., moved_age_s: _Optional[float] = ..., uptime_s: _Optional[float] = ..., pid: _Optional[int] = ..., work: _Optional[str] = ..., work_age_s: _Optional[float] = ..., work_moved_age_s: _Optional[float] = ..., work_limit_s: _Optional[float] = ..., stuck: _Optional[str] = ..., stack: _Optional[str] = ...) -> None: ...
