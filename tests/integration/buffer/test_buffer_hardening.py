"""The buffer service built from a run config (`build_core`) on a real grpc.aio server, both stores:
undecodable request bytes, undeclared consumer groups, an absurd `min_model_version` and token ids
outside the model's vocabulary are INVALID_ARGUMENT naming the field, and change nothing; declared
consumer groups exist from the start; a second buffer on a port in use exits with a clear error."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sys
import uuid
from pathlib import Path

import grpc
import pytest
from rft.v1 import buffer_pb2, buffer_pb2_grpc
from structlog.testing import capture_logs

from services.buffer.redis_store import RedisStore
from services.buffer.service import build_core
from services.buffer.servicer import registration
from services.common.config import load_config
from services.common.rpc import create_channel, start_server
from tests.support.buffer_data import batch, group

ROOT = Path(__file__).resolve().parents[3]
SERVICE = "rft.v1.BufferService"


def _config(tmp_path: Path, request: pytest.FixtureRequest, kind: str = "memory", *, groups=None, model=""):
    buffer: dict = {"store": kind}
    if groups is not None:
        buffer["consumer_groups"] = groups
    if kind == "redis":
        server = request.getfixturevalue("redis_server")
        buffer |= {"redis_url": server.url, "stream_prefix": f"t-{uuid.uuid4().hex[:8]}"}
    return load_config(text=json.dumps({"services": {"buffer": buffer}, "model": {"model_path": model}}))


@contextlib.asynccontextmanager
async def _served(config):
    core = build_core(config)
    await core.start()
    handle = await start_server([registration(core)])
    channel = create_channel(handle.address, timeout_s=10)
    try:
        yield core, buffer_pb2_grpc.BufferServiceStub(channel), channel
    finally:
        await channel.close()
        await handle.stop(0)
        await core.close()


async def _refused(call, *fields: str) -> str:
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await call
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT, err.value.details()
    for text in fields:
        assert text in err.value.details()
    return err.value.details()


def _model_folder(tmp_path: Path, vocab_size: int) -> str:
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "qwen2", "vocab_size": vocab_size}))
    return str(folder)


@pytest.fixture(params=["memory", "redis"])
def kind(request):
    return request.param


async def test_undecodable_requests_are_invalid_argument_and_store_nothing(tmp_path, request, kind):
    async with _served(_config(tmp_path, request, kind)) as (_, stub, channel):

        def raw(method: str):
            return channel.unary_unary(
                f"/{SERVICE}/{method}", request_serializer=None, response_deserializer=None
            )

        garbage = b"\xff\xff\xff"
        await _refused(raw("Put")(garbage), "request: cannot decode rft.v1.ExperienceBatch")
        # protobuf accepts an unknown group field; the buffer's own wire parser (WireBatch.parse) does not
        await _refused(raw("Put")(b"\x0b\x0c"), "request: cannot decode rft.v1.ExperienceBatch")
        await _refused(raw("PutSequenced")(garbage), "request: cannot decode rft.v1.SequencedBatch")
        await _refused(raw("GetBatch")(garbage), "request: cannot decode rft.v1.GetBatchRequest")
        stream = channel.stream_unary(
            f"/{SERVICE}/PutExperiences", request_serializer=None, response_deserializer=None
        )
        await _refused(stream(iter([garbage])), "request: cannot decode rft.v1.ExperienceBatch")
        stats = await stub.Stats(buffer_pb2.StatsRequest())
        assert stats.accepted == 0 and stats.size == 0


async def test_undeclared_consumer_group_is_refused_and_holds_nothing_back(tmp_path, request, kind):
    async with _served(_config(tmp_path, request, kind)) as (core, stub, _):
        await stub.Put(batch(group("a", 2), group("b", 2), vocab_size=1000))
        expected = ("consumer_group", "'stray' is not declared", "default")
        await _refused(stub.GetBatch(buffer_pb2.GetBatchRequest(size=4, consumer_group="stray")), *expected)
        await _refused(stub.Ack(buffer_pb2.AckRequest(lease_id="x", consumer_group="stray")), *expected)
        await _refused(stub.Nack(buffer_pb2.NackRequest(lease_id="x", consumer_group="stray")), *expected)
        await _refused(stub.Stats(buffer_pb2.StatsRequest(consumer_group="stray")), *expected)
        # the stray name made no group: once the one declared group acks, nothing is retained
        leased = await stub.GetBatch(buffer_pb2.GetBatchRequest(size=4))
        assert len(leased.experiences) == 4
        await stub.Ack(buffer_pb2.AckRequest(lease_id=leased.lease_id))
        assert (await stub.Stats(buffer_pb2.StatsRequest())).size == 0
        if kind == "redis":
            groups = await core.store.client.xinfo_groups(core.store._key("stream"))
            assert [g["name"].decode() for g in groups] == ["default"]


async def test_declared_consumer_groups_exist_from_the_start(tmp_path, request, kind):
    config = _config(tmp_path, request, kind, groups=["default", "eval"])
    assert config.services.buffer.consumer_groups == ["default", "eval"]
    async with _served(config) as (_, stub, _channel):
        await stub.Put(batch(group("a", 2), group("b", 2), vocab_size=1000))
        for name, size_after_ack in (("default", 4), ("eval", 0)):  # each group sees everything once
            leased = await stub.GetBatch(buffer_pb2.GetBatchRequest(size=4, consumer_group=name))
            assert len(leased.experiences) == 4
            await stub.Ack(buffer_pb2.AckRequest(lease_id=leased.lease_id, consumer_group=name))
            assert (await stub.Stats(buffer_pb2.StatsRequest(consumer_group=name))).size == size_after_ack


async def test_redis_start_creates_declared_groups_and_warns_about_others(redis_server):
    prefix = f"t-{uuid.uuid4().hex[:8]}"
    first = RedisStore(redis_server.url, capacity=100, prefix=prefix)
    await first.start(("default", "old"))
    groups = await first.client.xinfo_groups(first._key("stream"))
    assert sorted(g["name"].decode() for g in groups) == ["default", "old"]  # before any read
    await first.close()
    second = RedisStore(redis_server.url, capacity=100, prefix=prefix)
    with capture_logs() as logs:
        await second.start(("default",))  # again: BUSYGROUP is not an error
    await second.close()
    warned = [e for e in logs if e["log_level"] == "warning" and e.get("consumer_group") == "old"]
    assert warned and "not declared" in warned[0]["event"]


async def test_min_model_version_out_of_range_is_refused_and_keeps_the_backlog(tmp_path, request, kind):
    async with _served(_config(tmp_path, request, kind)) as (_, stub, _channel):
        await stub.Put(batch(group("a", 2, model_version=1), group("b", 2, model_version=1), vocab_size=1000))
        for bad in (1 << 62, (1 << 31) + 1, -1):
            request_ = buffer_pb2.GetBatchRequest(size=4, min_model_version=bad)
            await _refused(stub.GetBatch(request_), "min_model_version", str(bad))
        stats = await stub.Stats(buffer_pb2.StatsRequest())
        assert stats.size == 4 and stats.dropped_stale == 0
        leased = await stub.GetBatch(buffer_pb2.GetBatchRequest(size=4, min_model_version=1))
        assert len(leased.experiences) == 4 and leased.dropped_stale == 0


async def test_token_ids_are_checked_against_the_model_vocabulary(tmp_path, request):
    config = _config(tmp_path, request, model=_model_folder(tmp_path, 1000))
    async with _served(config) as (core, stub, _):
        assert core.settings.limits.vocab_size == 1000

        def with_token(token: int, vocab_size: int):
            b = batch(group("a", 2), vocab_size=vocab_size)
            for exp in b.experiences:  # every other id fits the narrowest vocabulary below
                exp.tokens[:] = [t % 400 for t in exp.tokens]
            b.experiences[1].tokens[3] = token
            return b

        where = "experiences[1].tokens[3]"
        await _refused(stub.Put(with_token((1 << 31) - 1, 0)), where, "vocab_size 1000")
        await _refused(stub.Put(with_token(5000, (1 << 31) - 1)), where, "vocab_size 1000")  # cannot widen
        await _refused(stub.Put(with_token(600, 500)), where, "vocab_size 500")  # may narrow
        assert (await stub.Put(with_token(999, 0))).accepted == 2
        stats = await stub.Stats(buffer_pb2.StatsRequest())
        assert stats.size == 2 and stats.rejected == 6


async def test_without_the_model_folder_the_batch_vocab_size_applies(tmp_path, request):
    with capture_logs() as logs:
        config = _config(tmp_path, request, model=str(tmp_path / "not-here"))
        core = build_core(config)
    assert core.settings.limits.vocab_size == 0
    assert any(e["log_level"] == "warning" and "not-here" in e.get("reason", "") for e in logs)
    async with _served(config) as (_, stub, _channel):
        b = batch(group("a", 2), vocab_size=1000)
        b.experiences[0].tokens[0] = 1000
        await _refused(stub.Put(b), "experiences[0].tokens[0]", "vocab_size 1000")


async def test_a_second_buffer_on_a_port_in_use_exits_with_a_clear_error(tmp_path, request):
    async with _served(_config(tmp_path, request)) as (core, stub, _channel):
        taken = await start_server([registration(core)])  # a buffer serving on a known port
        try:
            config_file = tmp_path / "run.yaml"
            config_file.write_text("services:\n  buffer: {store: memory}\n")
            proc = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "services.buffer", "--config", str(config_file),
                "--port", str(taken.port),
                cwd=ROOT,
                env={**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{ROOT / 'protos'}"},
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
            )  # fmt: skip
            _, err = await asyncio.wait_for(proc.communicate(), 120)
            assert proc.returncode == 1, err.decode()
            assert f"port {taken.port} on 127.0.0.1 is in use" in err.decode()
            assert "Traceback" not in err.decode()
            async with create_channel(taken.address, timeout_s=10) as ch:  # the first one still serves
                assert (await buffer_pb2_grpc.BufferServiceStub(ch).Stats(buffer_pb2.StatsRequest())).store
        finally:
            await taken.stop(0)
