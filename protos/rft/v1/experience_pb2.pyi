from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ExperienceId(_message.Message):
    __slots__ = ("batch_id", "task_id", "run_id", "step", "suffix", "group_id", "explorer_id")
    BATCH_ID_FIELD_NUMBER: _ClassVar[int]
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    SUFFIX_FIELD_NUMBER: _ClassVar[int]
    GROUP_ID_FIELD_NUMBER: _ClassVar[int]
    EXPLORER_ID_FIELD_NUMBER: _ClassVar[int]
    batch_id: str
    task_id: str
    run_id: int
    step: int
    suffix: str
    group_id: str
    explorer_id: str
    def __init__(self, batch_id: _Optional[str] = ..., task_id: _Optional[str] = ..., run_id: _Optional[int] = ..., step: _Optional[int] = ..., suffix: _Optional[str] = ..., group_id: _Optional[str] = ..., explorer_id: _Optional[str] = ...) -> None: ...

class Experience(_message.Message):
    __slots__ = ("eid", "tokens", "prompt_length", "logprobs", "action_mask", "reward", "token_level_rewards", "truncated", "model_version", "metrics", "info", "prompt_text", "response_text", "advantages", "returns", "teacher_logprobs", "use_count", "rejected_tokens", "rejected_prompt_length", "reward_baseline", "token_model_versions")
    class MetricsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    class InfoEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    EID_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    PROMPT_LENGTH_FIELD_NUMBER: _ClassVar[int]
    LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    ACTION_MASK_FIELD_NUMBER: _ClassVar[int]
    REWARD_FIELD_NUMBER: _ClassVar[int]
    TOKEN_LEVEL_REWARDS_FIELD_NUMBER: _ClassVar[int]
    TRUNCATED_FIELD_NUMBER: _ClassVar[int]
    MODEL_VERSION_FIELD_NUMBER: _ClassVar[int]
    METRICS_FIELD_NUMBER: _ClassVar[int]
    INFO_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TEXT_FIELD_NUMBER: _ClassVar[int]
    RESPONSE_TEXT_FIELD_NUMBER: _ClassVar[int]
    ADVANTAGES_FIELD_NUMBER: _ClassVar[int]
    RETURNS_FIELD_NUMBER: _ClassVar[int]
    TEACHER_LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    USE_COUNT_FIELD_NUMBER: _ClassVar[int]
    REJECTED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    REJECTED_PROMPT_LENGTH_FIELD_NUMBER: _ClassVar[int]
    REWARD_BASELINE_FIELD_NUMBER: _ClassVar[int]
    TOKEN_MODEL_VERSIONS_FIELD_NUMBER: _ClassVar[int]
    eid: ExperienceId
    tokens: _containers.RepeatedScalarFieldContainer[int]
    prompt_length: int
    logprobs: _containers.RepeatedScalarFieldContainer[float]
    action_mask: _containers.RepeatedScalarFieldContainer[bool]
    reward: float
    token_level_rewards: _containers.RepeatedScalarFieldContainer[float]
    truncated: bool
    model_version: int
    metrics: _containers.ScalarMap[str, float]
    info: _containers.ScalarMap[str, str]
    prompt_text: str
    response_text: str
    advantages: _containers.RepeatedScalarFieldContainer[float]
    returns: _containers.RepeatedScalarFieldContainer[float]
    teacher_logprobs: _containers.RepeatedScalarFieldContainer[float]
    use_count: int
    rejected_tokens: _containers.RepeatedScalarFieldContainer[int]
    rejected_prompt_length: int
    reward_baseline: float
    token_model_versions: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, eid: _Optional[_Union[ExperienceId, _Mapping]] = ..., tokens: _Optional[_Iterable[int]] = ..., prompt_length: _Optional[int] = ..., logprobs: _Optional[_Iterable[float]] = ..., action_mask: _Optional[_Iterable[bool]] = ..., reward: _Optional[float] = ..., token_level_rewards: _Optional[_Iterable[float]] = ..., truncated: _Optional[bool] = ..., model_version: _Optional[int] = ..., metrics: _Optional[_Mapping[str, float]] = ..., info: _Optional[_Mapping[str, str]] = ..., prompt_text: _Optional[str] = ..., response_text: _Optional[str] = ..., advantages: _Optional[_Iterable[float]] = ..., returns: _Optional[_Iterable[float]] = ..., teacher_logprobs: _Optional[_Iterable[float]] = ..., use_count: _Optional[int] = ..., rejected_tokens: _Optional[_Iterable[int]] = ..., rejected_prompt_length: _Optional[int] = ..., reward_baseline: _Optional[float] = ..., token_model_versions: _Optional[_Iterable[int]] = ...) -> None: ...

class ExperienceBatch(_message.Message):
    __slots__ = ("experiences", "vocab_size", "producer_id")
    EXPERIENCES_FIELD_NUMBER: _ClassVar[int]
    VOCAB_SIZE_FIELD_NUMBER: _ClassVar[int]
    PRODUCER_ID_FIELD_NUMBER: _ClassVar[int]
    experiences: _containers.RepeatedCompositeFieldContainer[Experience]
    vocab_size: int
    producer_id: str
    def __init__(self, experiences: _Optional[_Iterable[_Union[Experience, _Mapping]]] = ..., vocab_size: _Optional[int] = ..., producer_id: _Optional[str] = ...) -> None: ...
