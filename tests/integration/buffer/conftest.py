"""Fixtures of the buffer tests: a redis-server per module (skipped loudly if the binary is missing),
and a fresh store of each kind per test (a Redis store gets its own key prefix). Store-level tests lease
as consumer group "g", so that is the group a store is started with unless a test declares others."""

from __future__ import annotations

import uuid

import pytest

from services.buffer.in_process_store import InProcessStore
from services.buffer.redis_store import RedisStore
from tests.support.redis_server import RedisServer, require_redis_server


@pytest.fixture(scope="module")
def redis_server():
    require_redis_server()
    with RedisServer.start() as server:
        yield server


def make_store(kind: str, request: pytest.FixtureRequest, capacity: int):
    if kind == "memory":
        return InProcessStore(capacity=capacity)
    server = request.getfixturevalue("redis_server")
    return RedisStore(server.url, capacity=capacity, prefix=f"t-{uuid.uuid4().hex[:8]}")


@pytest.fixture(params=["memory", "redis"])
async def store_factory(request):
    """`await store_factory(capacity=..., consumer_groups=...)` -> a started store of the parametrised kind
    with those consumer groups declared, closed after the test."""
    made = []

    async def factory(capacity: int = 100_000, consumer_groups: tuple[str, ...] = ("g",)):
        store = make_store(request.param, request, capacity)
        await store.start(consumer_groups)
        made.append(store)
        return store

    yield factory
    for store in made:
        await store.close()


@pytest.fixture
async def store(store_factory):
    return await store_factory()
