"""Buffer throughput: experiences/s through the buffer service (gRPC, Redis store) against raw redis-py.

Project: a `python -m services.buffer` process on a Redis store; in this process one producer streams
batches of 64 experiences (8 groups of 8, 256 tokens each: 64 prompt + 192 response, with logprobs and
action mask) with `PutExperiences`, while one consumer loops `GetBatch(64)` and acks each lease in the
background while it leases the next one, as the trainer does (`TrainerCore` starts its acks, then asks
for the next batch). Timed from the first put to the last ack.
Baseline: the same serialized experiences with redis-py (asyncio): pipelined XADD (64 per pipeline)
while a consumer loops XREADGROUP COUNT 64, with the XACK of each read in flight during the next read.
Same redis-server, same run, interleaved repetitions, median. Both sides are also run with each ack
awaited before the next read ("serial_ack_*" in the JSON). The last line printed is one JSON object
with both figures, "ratio" and "target".

    python bench/buffer_throughput.py [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "protos")]

import redis.asyncio as aioredis  # noqa: E402
from rft.v1 import buffer_pb2, buffer_pb2_grpc, experience_pb2  # noqa: E402

from services.common.rpc import create_channel  # noqa: E402
from tests.support.buffer_data import experience  # noqa: E402
from tests.support.redis_server import RedisServer, free_port  # noqa: E402

BATCH, GROUP = 64, 8
TARGET = 0.8


def make_batches(n: int) -> list[experience_pb2.ExperienceBatch]:
    batches = []
    for b in range(n // BATCH):
        exps = [
            experience(f"b{b}-g{i // GROUP}", i % GROUP, prompt=64, response=192, model_version=1)
            for i in range(BATCH)
        ]
        batches.append(experience_pb2.ExperienceBatch(experiences=exps, vocab_size=1000, producer_id="bench"))
    return batches


def start_service(redis_url: str, workdir: Path) -> tuple[subprocess.Popen, int]:
    port = free_port()
    config = workdir / "bench.yaml"
    config.write_text(
        "services:\n  buffer:\n    store: redis\n"
        f"    redis_url: {redis_url}\n    stream_prefix: bench\n    port: {port}\n"
        "buffer:\n  trainer_input:\n    experience_buffer:\n      capacity: 1000000\n"
        "log:\n  level: WARNING\n"
    )
    port_file = workdir / "port"
    env = dict(os.environ, PYTHONPATH=f"{ROOT}{os.pathsep}{ROOT / 'protos'}")
    proc = subprocess.Popen(
        [sys.executable, "-m", "services.buffer", "--config", str(config), "--port-file", str(port_file)],
        cwd=ROOT,
        env=env,
        stdout=open(workdir / "buffer.log", "w"),  # noqa: SIM115 - lives as long as the process
        stderr=subprocess.STDOUT,
    )
    deadline = time.monotonic() + 60
    while not port_file.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError("buffer service did not start")
        time.sleep(0.02)  # ok-sleep: polling with a deadline for the port file
    return proc, port


async def consume_loop(
    read: Callable[[], Awaitable[tuple[Any, int]]],
    ack: Callable[[Any], Awaitable[Any]],
    total: int,
    overlap: bool,
) -> None:
    """Read until `total` experiences came; ack each read (`read` answers its ack token and count).
    `overlap`: the ack of a read is in flight during the next read (the trainer's pattern); otherwise
    each ack is awaited before the next read."""
    got, pending = 0, None
    while got < total:
        token, n = await read()
        if pending is not None:
            await pending
            pending = None
        if n:
            task = asyncio.ensure_future(ack(token))
            if overlap:
                pending = task
            else:
                await task
            got += n
    if pending is not None:
        await pending


async def run_project(address: str, batches: list[experience_pb2.ExperienceBatch], overlap: bool) -> float:
    total = len(batches) * BATCH
    group = "default"  # the declared consumer group; earlier repetitions acked everything they stored
    async with create_channel(address, timeout_s=60) as channel:
        stub = buffer_pb2_grpc.BufferServiceStub(channel)
        await stub.Stats(buffer_pb2.StatsRequest(), timeout=10)  # connected
        start = time.perf_counter()

        async def produce() -> None:
            async def gen():
                for b in batches:
                    yield b

            resp = await stub.PutExperiences(gen())
            assert resp.accepted == total, resp

        async def read() -> tuple[str, int]:
            resp = await stub.GetBatch(
                buffer_pb2.GetBatchRequest(consumer_group=group, size=BATCH, timeout_ms=1000)
            )
            return resp.lease_id, len(resp.experiences) if resp.lease_id else 0

        def ack(lease_id: str) -> Awaitable[Any]:
            return stub.Ack(buffer_pb2.AckRequest(lease_id=lease_id, consumer_group=group))

        await asyncio.gather(produce(), consume_loop(read, ack, total, overlap))
        return total / (time.perf_counter() - start)


async def run_raw(url: str, batches: list[experience_pb2.ExperienceBatch], overlap: bool) -> float:
    payloads = [[e.SerializeToString() for e in b.experiences] for b in batches]
    total = len(batches) * BATCH
    client = aioredis.from_url(url)
    stream, group = f"raw-{uuid.uuid4().hex[:8]}", "g"
    await client.xgroup_create(stream, group, id="0", mkstream=True)
    start = time.perf_counter()

    async def produce() -> None:
        for chunk in payloads:
            pipe = client.pipeline(transaction=False)
            for data in chunk:
                pipe.xadd(stream, {"d": data})
            await pipe.execute()

    async def read() -> tuple[list[bytes], int]:
        res = await client.xreadgroup(group, "c", {stream: ">"}, count=BATCH, block=1000)
        ids = [entry_id for entry_id, _ in res[0][1]] if res else []
        return ids, len(ids)

    def ack(ids: list[bytes]) -> Awaitable[Any]:
        return client.xack(stream, group, *ids)

    await asyncio.gather(produce(), consume_loop(read, ack, total, overlap))
    rate = total / (time.perf_counter() - start)
    await client.delete(stream)
    await client.aclose()
    return rate


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="fewer experiences and repetitions")
    args = parser.parse_args()
    n, reps = (4096, 3) if args.quick else (16384, 5)
    batches = make_batches(n)
    ours, raw, ours_serial, raw_serial = [], [], [], []
    with RedisServer.start() as redis_server, tempfile.TemporaryDirectory() as tmp:
        proc, port = start_service(redis_server.url, Path(tmp))
        address = f"127.0.0.1:{port}"
        try:
            asyncio.run(run_project(address, batches[:8], overlap=True))  # warm-up
            for _ in range(reps):
                ours.append(asyncio.run(run_project(address, batches, overlap=True)))
                raw.append(asyncio.run(run_raw(redis_server.url, batches, overlap=True)))
                ours_serial.append(asyncio.run(run_project(address, batches, overlap=False)))
                raw_serial.append(asyncio.run(run_raw(redis_server.url, batches, overlap=False)))
        finally:
            proc.terminate()
            proc.wait(10)
    ours_med, raw_med = statistics.median(ours), statistics.median(raw)
    serial_med, raw_serial_med = statistics.median(ours_serial), statistics.median(raw_serial)
    size = batches[0].experiences[0].ByteSize()
    print(f"buffer throughput: {n} experiences of 256 tokens ({size} B each), {reps} repetitions, median")
    print(f"{'path':<44}{'experiences/s':>16}{'runs':>40}")
    print(f"{'buffer service (gRPC, Redis store)':<44}{ours_med:>16,.0f}{str([round(x) for x in ours]):>40}")
    print(f"{'raw redis-py XADD + XREADGROUP + XACK':<44}{raw_med:>16,.0f}{str([round(x) for x in raw]):>40}")
    print(f"{'  the same, each ack awaited before the next read:':<44}")
    print(f"{'  buffer service':<44}{serial_med:>16,.0f}{str([round(x) for x in ours_serial]):>40}")
    print(f"{'  raw redis-py':<44}{raw_serial_med:>16,.0f}{str([round(x) for x in raw_serial]):>40}")
    print(f"ratio (ours / raw): {ours_med / raw_med:.2f}   target: {TARGET}   "
          f"(acks awaited: {serial_med / raw_serial_med:.2f})")  # fmt: skip
    result = {
        "experiences": n,
        "repetitions": reps,
        "experience_bytes": size,
        "experiences_per_s": round(ours_med, 1),
        "baseline_experiences_per_s": round(raw_med, 1),
        "runs": [round(x, 1) for x in ours],
        "baseline_runs": [round(x, 1) for x in raw],
        "serial_ack_experiences_per_s": round(serial_med, 1),
        "serial_ack_baseline_experiences_per_s": round(raw_serial_med, 1),
        "serial_ack_ratio": round(serial_med / raw_serial_med, 3),
        "ratio": round(ours_med / raw_med, 3),
        "target": TARGET,
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
