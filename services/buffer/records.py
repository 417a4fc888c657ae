"""What the buffer stores and hands out, independent of the store: group records, leases, stats, errors.

The buffer never decodes experiences into tensors. A `GroupRecord` holds one GRPO group (the experiences
of one batch that share `eid.group_id`) as ready-to-send wire bytes: each member is encoded as field 2
of `GetBatchResponse` (tag + length + serialized `Experience`), so a batch is served by concatenating
payloads. Stores keep records opaque; the core only needs the group's size, versions and bytes.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from rft.v1 import experience_pb2

from services.common.lineage import experience_uid
from services.common.protowire import encode_varint, iter_fields
from services.common.rpc.bounds import shown

# Tag of `repeated Experience experiences = 2` in GetBatchResponse (field 2, wire type 2).
EXPERIENCE_TAG = b"\x12"


class BufferError(Exception):
    """Base of the buffer's domain errors; the servicer maps each to a gRPC status."""


class ValidationError(BufferError):
    """A batch is malformed; `field` names the offending field, e.g. `experiences[3].logprobs`."""

    def __init__(self, field_path: str, message: str):
        super().__init__(f"{field_path}: {message}")
        self.field = field_path


class BufferFull(BufferError):
    """Storing the batch would exceed `capacity` experiences."""


class LeaseError(BufferError):
    """Ack/Nack of a lease that is unknown, already acked, or expired (its batch was redelivered)."""


class FencedError(BufferError):
    """A call carries an epoch older than its consumer's current one: a newer consumer took over."""


class ConsumerNotOpen(BufferError):
    """A call carries an epoch the store has never handed out (e.g. a memory store that restarted, or
    an epoch above the consumer's current one): the consumer must call OpenConsumer again."""


def check_epoch(current: int, epoch: int, group: str, consumer: str, *, must_be_open: bool = True) -> None:
    """Refuse `epoch` given the consumer's `current` one (0: never opened here). 0 is unfenced and always
    passes. An older epoch is stale (`FencedError`: a newer consumer took over); a newer one was never
    handed out (`ConsumerNotOpen`); with `must_be_open`, so is any epoch of a consumer never opened."""
    if not epoch or epoch == current:
        return
    who = f"consumer {shown(consumer)} of group {shown(group)}"
    if current == 0:
        if must_be_open:
            raise ConsumerNotOpen(f"{who} was never opened here (epoch {epoch}); call OpenConsumer")
        return
    if epoch < current:
        raise FencedError(f"{who}: epoch {epoch} is stale; a newer consumer took over with epoch {current}")
    raise ConsumerNotOpen(
        f"{who}: epoch {epoch} was never handed out (the current epoch is {current}); call OpenConsumer"
    )


def lease_epoch_error(lease_id: str, group: str, taken: int, epoch: int) -> FencedError:
    """A lease held under epoch `taken` settled with another `epoch` (ABORTED either way)."""
    why = "a newer consumer took it over" if epoch < taken else "it is not held under the caller's epoch"
    return FencedError(
        f"lease {shown(lease_id)} of consumer group {shown(group)} was taken with epoch {taken}, not {epoch}: {why}"
    )


def lease_gone_error(lease_id: str, group: str, expired: bool) -> LeaseError:
    """Ack/Nack of a lease that is no longer held: it expired, or it is unknown or already settled."""
    where = f"lease {shown(lease_id)} of consumer group {shown(group)}"
    if expired:
        return LeaseError(f"{where} expired; its experiences were given back for redelivery")
    return LeaseError(
        f"{where} is unknown, already nacked, or already acked (only a repeated Ack is answered)"
    )


def encode_member(exp: experience_pb2.Experience | bytes) -> bytes:
    """One experience (a message, or its wire bytes) as a length-delimited field-2 entry of GetBatchResponse."""
    data = exp if isinstance(exp, bytes) else exp.SerializeToString()
    return EXPERIENCE_TAG + encode_varint(len(data)) + data


def field_slices(data: bytes, field_number: int) -> list[bytes]:
    """Wire bytes of every occurrence of length-delimited `field_number` at the top level of a message.

    Used to keep each experience's bytes as received (no re-serialization): for `ExperienceBatch`,
    field 1 occurrences are exactly its experiences, in order.
    """
    return [
        data[pos : pos + length]
        for field, wire, length, pos in iter_fields(data)
        if wire == 2 and field == field_number
    ]


@dataclass(frozen=True)
class WireBatch:
    """A received `ExperienceBatch` with each experience's wire bytes kept beside the parsed message."""

    message: experience_pb2.ExperienceBatch
    members: list[bytes]
    size: int  # bytes received

    @classmethod
    def parse(cls, data: bytes) -> WireBatch:
        return cls(experience_pb2.ExperienceBatch.FromString(data), field_slices(data, 1), len(data))


def encode_batch_response(
    payloads: Sequence[bytes], lease_id: str, partial: bool, deadline_ms: int, dropped_stale: int
) -> bytes:
    """GetBatchResponse wire bytes built from stored payloads without parsing them."""
    head = bytearray()
    if lease_id:
        raw = lease_id.encode()
        head += b"\x0a" + encode_varint(len(raw)) + raw
    if partial:
        head += b"\x18\x01"
    if deadline_ms:
        head += b"\x20" + encode_varint(deadline_ms)
    if dropped_stale:
        head += b"\x28" + encode_varint(dropped_stale)
    return bytes(head) + b"".join(payloads)


@dataclass(frozen=True)
class GroupRecord:
    """One group of experiences, stored and handed out whole.

    `versions` maps model_version -> number of members; the staleness filter uses `min_version`.
    """

    group_id: str
    n: int
    payload: bytes
    versions: Mapping[int, int]
    # `experience_uid` of each member, recorded in the store's accepted log (lineage audits).
    uids: tuple[str, ...] = ()

    @property
    def min_version(self) -> int:
        return min(self.versions)

    @property
    def versions_text(self) -> str:
        """Compact `ver:count,ver:count` form stored beside the payload (Redis keeps it as a field)."""
        return ",".join(f"{v}:{c}" for v, c in sorted(self.versions.items()))

    @staticmethod
    def parse_versions(text: str) -> dict[int, int]:
        out: dict[int, int] = {}
        for part in text.split(","):
            if part:
                v, c = part.split(":")
                out[int(v)] = int(c)
        return out


def group_records(
    experiences: Sequence[experience_pb2.Experience], wire: Sequence[bytes] | None = None
) -> list[GroupRecord]:
    """Split a (validated) batch into groups by `eid.group_id`, in order of first appearance.

    An experience with an empty group_id is a group of its own. `wire`, when given, holds each
    experience's received bytes, stored as they are instead of serializing the message again.
    """
    # group key -> (group_id, payload parts, versions, uids); one pass over the batch
    groups: dict[str, tuple[str, list[bytes], dict[int, int], list[str]]] = {}
    singles = 0
    for i, exp in enumerate(experiences):
        eid = exp.eid
        gid = key = eid.group_id
        if not gid:
            key = f"\x00single{singles}"
            singles += 1
        entry = groups.get(key)
        if entry is None:
            entry = groups[key] = (gid, [], {}, [])
        data = wire[i] if wire is not None else exp.SerializeToString()
        entry[1].extend((EXPERIENCE_TAG, encode_varint(len(data)), data))
        versions = entry[2]
        version = exp.model_version
        versions[version] = versions.get(version, 0) + 1
        entry[3].append(experience_uid(eid))
    records = [
        GroupRecord(group_id=gid, n=len(uids), payload=b"".join(parts), versions=versions, uids=tuple(uids))
        for gid, parts, versions, uids in groups.values()
    ]
    return records


@dataclass(frozen=True)
class LeaseRequest:
    consumer_group: str
    consumer: str
    size: int
    min_model_version: int
    lease_ms: int
    # At the end of the wait: lease whatever is there. Otherwise lease only a full batch.
    allow_partial: bool
    # The consumer's epoch (OpenConsumer); 0 = unfenced, the lease expires after `lease_ms`.
    epoch: int = 0


@dataclass
class LeaseOutcome:
    """What a store answers to a lease attempt.

    `committed` is False when no lease was made (not enough whole groups and `allow_partial` unset, or
    nothing at all); `available` then tells how many experiences are ready.
    """

    committed: bool
    lease_id: str = ""
    payloads: list[bytes] = field(default_factory=list)
    n: int = 0
    deadline_ms: int = 0
    dropped_stale: int = 0
    redelivered: int = 0
    available: int = 0


@dataclass(frozen=True)
class OpenRequest:
    """A consumer (re)starting (`Store.open_consumer`): the leases it names to ack or to keep."""

    consumer_group: str
    consumer: str
    ack_lease_ids: Sequence[str] = ()
    keep_lease_ids: Sequence[str] = ()


@dataclass(frozen=True)
class OpenOutcome:
    epoch: int
    acked: int = 0  # experiences acked from the named leases
    released: int = 0  # experiences of the consumer's other leases, queued for redelivery


@dataclass(frozen=True)
class PutOutcome:
    stored: int  # experiences stored (0 for a duplicate)
    duplicate: bool = False


@dataclass
class StoreStats:
    size: int = 0
    capacity: int = 0
    pending_leases: int = 0
    pending_experiences: int = 0
    accepted: int = 0
    rejected: int = 0
    dropped_stale: int = 0
    redelivered: int = 0
    acked: int = 0
    per_model_version: dict[int, int] = field(default_factory=dict)
    store: str = ""
    oldest_lease_age_s: float = 0.0  # the group's oldest lease now held (0: none)


def add_versions(total: dict[int, int], versions: Iterable[tuple[int, int]], sign: int = 1) -> None:
    for v, c in versions:
        total[v] = total.get(v, 0) + sign * c
        if total[v] == 0:
            del total[v]


class AdmittingStore:
    """The in-process stores' `put`: idempotent per producer (a batch whose sequence this producer
    already stored is a duplicate), all or nothing against the capacity (`BufferFull`). The store
    keeps each record (`_keep`) and counts what it accepted (`_count_accepted`)."""

    capacity: int
    _size: int
    _producers: dict[str, int]
    _versions: dict[int, int]

    def _keep(self, record: GroupRecord) -> None:
        raise NotImplementedError

    def _count_accepted(self, n: int) -> None:
        raise NotImplementedError

    async def put(
        self, groups: Sequence[GroupRecord], *, producer: str = "", sequence: int = 0
    ) -> PutOutcome:
        if producer and sequence and self._producers.get(producer, 0) >= sequence:
            return PutOutcome(stored=0, duplicate=True)
        size, total = self._size, sum(g.n for g in groups)
        if size + total > self.capacity:
            raise BufferFull(
                f"buffer full: {size} stored + {total} new > capacity {self.capacity} experiences"
            )
        for record in groups:
            self._keep(record)
            add_versions(self._versions, record.versions.items())
        if producer and sequence:
            self._producers[producer] = sequence
        self._size += total
        self._count_accepted(total)
        return PutOutcome(stored=total)
