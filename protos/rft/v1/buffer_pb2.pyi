from rft.v1 import experience_pb2 as _experience_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class PutResponse(_message.Message):
    __slots__ = ("accepted", "batches", "duplicates")
    ACCEPTED_FIELD_NUMBER: _ClassVar[int]
    BATCHES_FIELD_NUMBER: _ClassVar[int]
    DUPLICATES_FIELD_NUMBER: _ClassVar[int]
    accepted: int
    batches: int
    duplicates: int
    def __init__(self, accepted: _Optional[int] = ..., batches: _Optional[int] = ..., duplicates: _Optional[int] = ...) -> None: ...

class SequencedBatch(_message.Message):
    __slots__ = ("batch", "sequence")
    BATCH_FIELD_NUMBER: _ClassVar[int]
    SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    batch: _experience_pb2.ExperienceBatch
    sequence: int
    def __init__(self, batch: _Optional[_Union[_experience_pb2.ExperienceBatch, _Mapping]] = ..., sequence: _Optional[int] = ...) -> None: ...

class GetBatchRequest(_message.Message):
    __slots__ = ("consumer_group", "consumer", "size", "timeout_ms", "min_model_version", "lease_ms", "epoch")
    CONSUMER_GROUP_FIELD_NUMBER: _ClassVar[int]
    CONSUMER_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    MIN_MODEL_VERSION_FIELD_NUMBER: _ClassVar[int]
    LEASE_MS_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    consumer_group: str
    consumer: str
    size: int
    timeout_ms: int
    min_model_version: int
    lease_ms: int
    epoch: int
    def __init__(self, consumer_group: _Optional[str] = ..., consumer: _Optional[str] = ..., size: _Optional[int] = ..., timeout_ms: _Optional[int] = ..., min_model_version: _Optional[int] = ..., lease_ms: _Optional[int] = ..., epoch: _Optional[int] = ...) -> None: ...

class GetBatchResponse(_message.Message):
    __slots__ = ("lease_id", "experiences", "partial", "lease_deadline_ms", "dropped_stale")
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    EXPERIENCES_FIELD_NUMBER: _ClassVar[int]
    PARTIAL_FIELD_NUMBER: _ClassVar[int]
    LEASE_DEADLINE_MS_FIELD_NUMBER: _ClassVar[int]
    DROPPED_STALE_FIELD_NUMBER: _ClassVar[int]
    lease_id: str
    experiences: _containers.RepeatedCompositeFieldContainer[_experience_pb2.Experience]
    partial: bool
    lease_deadline_ms: int
    dropped_stale: int
    def __init__(self, lease_id: _Optional[str] = ..., experiences: _Optional[_Iterable[_Union[_experience_pb2.Experience, _Mapping]]] = ..., partial: _Optional[bool] = ..., lease_deadline_ms: _Optional[int] = ..., dropped_stale: _Optional[int] = ...) -> None: ...

class AckRequest(_message.Message):
    __slots__ = ("lease_id", "consumer_group", "epoch", "consumer")
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    CONSUMER_GROUP_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    CONSUMER_FIELD_NUMBER: _ClassVar[int]
    lease_id: str
    consumer_group: str
    epoch: int
    consumer: str
    def __init__(self, lease_id: _Optional[str] = ..., consumer_group: _Optional[str] = ..., epoch: _Optional[int] = ..., consumer: _Optional[str] = ...) -> None: ...

class AckResponse(_message.Message):
    __slots__ = ("acked",)
    ACKED_FIELD_NUMBER: _ClassVar[int]
    acked: int
    def __init__(self, acked: _Optional[int] = ...) -> None: ...

class NackRequest(_message.Message):
    __slots__ = ("lease_id", "consumer_group", "epoch", "consumer")
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    CONSUMER_GROUP_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    CONSUMER_FIELD_NUMBER: _ClassVar[int]
    lease_id: str
    consumer_group: str
    epoch: int
    consumer: str
    def __init__(self, lease_id: _Optional[str] = ..., consumer_group: _Optional[str] = ..., epoch: _Optional[int] = ..., consumer: _Optional[str] = ...) -> None: ...

class OpenConsumerRequest(_message.Message):
    __slots__ = ("consumer_group", "consumer", "ack_lease_ids", "keep_lease_ids")
    CONSUMER_GROUP_FIELD_NUMBER: _ClassVar[int]
    CONSUMER_FIELD_NUMBER: _ClassVar[int]
    ACK_LEASE_IDS_FIELD_NUMBER: _ClassVar[int]
    KEEP_LEASE_IDS_FIELD_NUMBER: _ClassVar[int]
    consumer_group: str
    consumer: str
    ack_lease_ids: _containers.RepeatedScalarFieldContainer[str]
    keep_lease_ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, consumer_group: _Optional[str] = ..., consumer: _Optional[str] = ..., ack_lease_ids: _Optional[_Iterable[str]] = ..., keep_lease_ids: _Optional[_Iterable[str]] = ...) -> None: ...

class OpenConsumerResponse(_message.Message):
    __slots__ = ("epoch", "acked", "released")
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    ACKED_FIELD_NUMBER: _ClassVar[int]
    RELEASED_FIELD_NUMBER: _ClassVar[int]
    epoch: int
    acked: int
    released: int
    def __init__(self, epoch: _Optional[int] = ..., acked: _Optional[int] = ..., released: _Optional[int] = ...) -> None: ...

class NackResponse(_message.Message):
    __slots__ = ("returned",)
    RETURNED_FIELD_NUMBER: _ClassVar[int]
    returned: int
    def __init__(self, returned: _Optional[int] = ...) -> None: ...

class StatsRequest(_message.Message):
    __slots__ = ("consumer_group",)
    CONSUMER_GROUP_FIELD_NUMBER: _ClassVar[int]
    consumer_group: str
    def __init__(self, consumer_group: _Optional[str] = ...) -> None: ...

class StatsResponse(_message.Message):
    __slots__ = ("size", "capacity", "pending_leases", "pending_experiences", "accepted", "rejected", "dropped_stale", "redelivered", "acked", "per_model_version", "store", "oldest_lease_age_s")
    class PerModelVersionEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: int
        value: int
        def __init__(self, key: _Optional[int] = ..., value: _Optional[int] = ...) -> None: ...
    SIZE_FIELD_NUMBER: _ClassVar[int]
    CAPACITY_FIELD_NUMBER: _ClassVar[int]
    PENDING_LEASES_FIELD_NUMBER: _ClassVar[int]
    PENDING_EXPERIENCES_FIELD_NUMBER: _ClassVar[int]
    ACCEPTED_FIELD_NUMBER: _ClassVar[int]
    REJECTED_FIELD_NUMBER: _ClassVar[int]
    DROPPED_STALE_FIELD_NUMBER: _ClassVar[int]
    REDELIVERED_FIELD_NUMBER: _ClassVar[int]
    ACKED_FIELD_NUMBER: _ClassVar[int]
    PER_MODEL_VERSION_FIELD_NUMBER: _ClassVar[int]
    STORE_FIELD_NUMBER: _ClassVar[int]
    OLDEST_LEASE_AGE_S_FIELD_NUMBER: _ClassVar[int]
    size: int
    capacity: int
    pending_leases: int
    pending_experiences: int
    accepted: int
    rejected: int
    dropped_stale: int
    redelivered: int
    acked: int
    per_model_version: _containers.ScalarMap[int, int]
    store: str
    oldest_lease_age_s: float
    def __init__(self, size: _Optional[int] = ..., capacity: _Optional[int] = ..., pending_leases: _Optional[int] = ..., pending_experiences: _Optional[int] = ..., accepted: _Optional[int] = ..., rejected: _Optional[int] = ..., dropped_stale: _Optional[int] = ..., redelivered: _Optional[int] = ..., acked: _Optional[int] = ..., per_model_version: _Optional[_Mapping[int, int]] = ..., store: _Optional[str] = ..., oldest_lease_age_s: _Optional[float] = ...) -> None: ...
