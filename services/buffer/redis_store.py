"""Redis Streams store (production): one stream entry per group (its payload in a hash beside the stream),
a consumer group per trainer group, leases and redelivery kept in Redis by atomic Lua scripts (see
`redis_scripts` for the layout).

State lives entirely in Redis, so a restarted buffer service picks up where the old one stopped: leases
still within their deadline can be acked, expired ones are redelivered, and `start()` runs a recovery
sweep (XAUTOCLAIM) that queues any pending entry no lease owns. With AOF persistence (`appendonly yes`)
this survives a Redis restart too. `redis://`, `rediss://` (TLS) and `unix://` URLs with an optional
password are accepted, as redis-py parses them.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence

import redis.asyncio as aioredis

from services.buffer import redis_scripts
from services.buffer.records import (
    BufferFull,
    GroupRecord,
    LeaseOutcome,
    LeaseRequest,
    OpenOutcome,
    OpenRequest,
    PutOutcome,
    StoreStats,
    check_epoch,
    lease_epoch_error,
    lease_gone_error,
)
from services.buffer.store import DEFAULT_CONSUMER_GROUP, STORES
from services.common.log import get_logger

log = get_logger("buffer.redis")

# How long an acked lease is remembered so a retried Ack is answered with the same count (an expired
# lease is remembered as long, in redis_scripts' EXPIRED_KEPT_MS, so that Ack/Nack says it expired).
ACKED_KEPT_MS = 24 * 3600 * 1000


def _int_map(flat: list[bytes]) -> dict[str, int]:
    return {flat[i].decode(): int(flat[i + 1]) for i in range(0, len(flat), 2)}


class RedisStore:
    """A `Store` on Redis Streams at `url`, keys under `prefix`."""

    name = "redis"

    def __init__(self, url: str, capacity: int, prefix: str = "rft", client: aioredis.Redis | None = None):
        self.capacity = capacity
        self.prefix = prefix
        self._url = url
        self._client = client
        self._scripts: dict[str, object] = {}

    @property
    def client(self) -> aioredis.Redis:
        if self._client is None:
            self._client = aioredis.from_url(self._url, decode_responses=False)
        return self._client

    def _key(self, name: str) -> str:
        return f"{self.prefix}:{name}"

    def _group_keys(self, group: str) -> list[str]:
        base = [self._key("stream"), self._key("meta"), self._key("versions")]
        parts = ("leases", "deadlines", "requeue", "stats", "epochs", "expired")
        group_keys = [self._key(f"g:{group}:{part}") for part in parts]
        return base + group_keys + [self._key("data"), self._key(f"g:{group}:taken")]

    async def _run(self, script: str, keys: list[str], args: list[object]) -> object:
        handle = self._scripts.get(script)
        if handle is None:
            handle = self.client.register_script(getattr(redis_scripts, script))
            self._scripts[script] = handle
        return await handle(keys=keys, args=args)  # type: ignore[operator]

    async def start(self, consumer_groups: Sequence[str] = (DEFAULT_CONSUMER_GROUP,)) -> None:
        await self.client.ping()
        for name in consumer_groups:  # from id 0: a new group sees every entry still stored
            try:
                await self.client.xgroup_create(self._key("stream"), name, id="0", mkstream=True)
            except aioredis.ResponseError as exc:
                if "BUSYGROUP" not in str(exc):
                    raise
        try:
            groups = await self.client.xinfo_groups(self._key("stream"))
        except aioredis.ResponseError:  # no stream (no group declared)
            groups = []
        for info in groups:
            name = info["name"].decode() if isinstance(info["name"], bytes) else info["name"]
            if name not in consumer_groups:
                log.warning(
                    "consumer group exists but is not declared in services.buffer.consumer_groups; "
                    "it holds back retention until it is deleted (XGROUP DESTROY)",
                    consumer_group=name,
                    declared=list(consumer_groups),
                )
            orphaned = await self._run("RECOVER", self._group_keys(name), [name])
            if orphaned:
                log.warning("recovered orphaned pending entries", consumer_group=name, experiences=orphaned)

    async def close(self) -> None:
        if self._client is not None:
            await self._client.aclose()
            self._client = None

    async def put(
        self, groups: Sequence[GroupRecord], *, producer: str = "", sequence: int = 0
    ) -> PutOutcome:
        total = sum(g.n for g in groups)
        args: list[object] = [self.capacity, total, producer, sequence]
        for g in groups:
            args += [g.group_id, g.n, g.min_version, g.versions_text, g.payload, "\n".join(g.uids)]
        keys = [self._key(k) for k in ("stream", "meta", "versions", "producers", "accepted", "data")]
        status, size = await self._run("PUT", keys, args)  # type: ignore[misc]
        if status == -1:
            raise BufferFull(
                f"buffer full: {size} stored + {total} new > capacity {self.capacity} experiences"
            )
        if status == 0:
            return PutOutcome(stored=0, duplicate=True)
        return PutOutcome(stored=total)

    async def lease(self, request: LeaseRequest) -> LeaseOutcome:

        lease_id = uuid.uuid4().hex
        args = [
            request.consumer_group,
            request.consumer or "trainer",
            lease_id,
            request.size,
            request.min_model_version,
            request.lease_ms,
            1 if request.allow_partial else 0,
            request.epoch,
        ]
        res = await self._run("LEASE", self._group_keys(request.consumer_group), args)
        if res[0] < 0:  # type: ignore[index,operator]
            _raise_epoch(res, request.consumer_group, request.consumer or "trainer", request.epoch)
        if res[0] == 0:  # type: ignore[index]
            return LeaseOutcome(committed=False, available=int(res[1]), dropped_stale=int(res[2]))  # type: ignore[index]
        _, deadline, n, dropped, redelivered, *payloads = res  # type: ignore[misc]
        return LeaseOutcome(
            committed=True,
            lease_id=lease_id,
            payloads=payloads,
            n=int(n),
            deadline_ms=int(deadline),
            dropped_stale=int(dropped),
            redelivered=int(redelivered),
        )

    async def _settle(self, consumer_group: str, lease_id: str, mode: str, epoch: int, consumer: str) -> int:
        keys = self._group_keys(consumer_group) + [self._key(f"g:{consumer_group}:acked:{lease_id}")]
        res = await self._run(
            "SETTLE", keys, [consumer_group, lease_id, mode, ACKED_KEPT_MS, epoch, consumer]
        )
        code = int(res[0])  # type: ignore[index]
        if code in (-3, -5):
            _raise_epoch(res, consumer_group, consumer, epoch)
        if code == -6:
            raise lease_epoch_error(lease_id, consumer_group, int(res[1]), epoch)  # type: ignore[index]
        if code in (-1, -2):
            raise lease_gone_error(lease_id, consumer_group, expired=code == -2)
        return int(res[1])  # type: ignore[index]

    async def ack(self, consumer_group: str, lease_id: str, epoch: int = 0, consumer: str = "") -> int:
        return await self._settle(consumer_group, lease_id, "ack", epoch, consumer)

    async def nack(self, consumer_group: str, lease_id: str, epoch: int = 0, consumer: str = "") -> int:
        return await self._settle(consumer_group, lease_id, "nack", epoch, consumer)

    async def open_consumer(self, request: OpenRequest) -> OpenOutcome:
        ack, keep = request.ack_lease_ids, request.keep_lease_ids
        args = [request.consumer_group, request.consumer, len(ack), *ack, *keep]
        res = await self._run("OPEN", self._group_keys(request.consumer_group), args)
        epoch, acked, released = (int(x) for x in res)  # type: ignore[union-attr]
        return OpenOutcome(epoch=epoch, acked=acked, released=released)

    async def accepted_uids(self, start: int = 0, count: int = -1) -> list[str]:
        """The accepted log: uids of every accepted experience, in order (`count` -1: to the end)."""
        end = -1 if count < 0 else start + count - 1
        return [u.decode() for u in await self.client.lrange(self._key("accepted"), start, end)]

    async def count_rejected(self, n: int) -> None:
        await self.client.hincrby(self._key("meta"), "rejected", n)

    async def stats(self, consumer_group: str) -> StoreStats:
        meta, versions, gstats, leases, oldest_ms = await self._run(
            "STATS", self._group_keys(consumer_group), [consumer_group]
        )  # type: ignore[misc]
        m, g = _int_map(meta), _int_map(gstats)
        return StoreStats(
            size=m.get("size", 0),
            capacity=self.capacity,
            pending_leases=int(leases),
            oldest_lease_age_s=int(oldest_ms) / 1000,
            pending_experiences=g.get("pending_n", 0),
            accepted=m.get("accepted", 0),
            rejected=m.get("rejected", 0),
            dropped_stale=g.get("dropped_stale", 0),
            redelivered=g.get("redelivered", 0),
            acked=g.get("acked", 0),
            per_model_version={int(k): v for k, v in _int_map(versions).items()},
            store=self.name,
        )


def _raise_epoch(res: list, group: str, consumer: str, epoch: int) -> None:
    """Raise what a script's {code, current epoch} answer means (`check_epoch` codes -3, -4, -5)."""
    current = int(res[1]) if len(res) > 1 else 0
    check_epoch(current, epoch, group, consumer)
    raise AssertionError(f"epoch check code {res[0]} for epoch {epoch}, current {current}")


@STORES.register("redis")
def _redis_store(endpoint, buffer) -> RedisStore:  # noqa: ANN001 - config sections
    return RedisStore(endpoint.redis_url, capacity=buffer.capacity, prefix=endpoint.stream_prefix)
