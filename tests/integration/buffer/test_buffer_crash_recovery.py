"""Crash test: a buffer service process on Redis is killed with SIGKILL (twice) while three producers
and a consumer run; it is restarted on the same port. Afterwards every experience was delivered and
acked exactly once: the acked ids are checked one by one against what the producers sent.

Producers use the sequenced put (a retry after a lost reply stores nothing twice); the consumer acks
with retries (a repeated Ack is answered again) and drops a batch whose lease expired while the service
was down (Ack says FAILED_PRECONDITION, `LeaseUnknown` in the client; the batch is redelivered)."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import grpc
import pytest

from services.common.buffer_client import BufferClient, LeaseUnknown
from services.common.rpc import create_channel
from tests.support.buffer_data import batch, group, uid
from tests.support.redis_server import free_port

ROOT = Path(__file__).resolve().parents[3]
PRODUCERS, BATCHES, GROUPS_PER_BATCH, GROUP_SIZE = 3, 60, 2, 4
TOTAL = PRODUCERS * BATCHES * GROUPS_PER_BATCH * GROUP_SIZE


class BufferProcess:
    def __init__(self, config: Path, port: int, workdir: Path):
        self.config, self.port, self.workdir = config, port, workdir
        self.proc: subprocess.Popen | None = None
        self.starts = 0

    def start(self) -> None:
        self.starts += 1
        port_file = self.workdir / f"port{self.starts}"
        env = dict(os.environ, PYTHONPATH=f"{ROOT}{os.pathsep}{ROOT / 'protos'}")
        log = open(self.workdir / f"buffer{self.starts}.log", "w")  # noqa: SIM115 - closed with the process
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "services.buffer",
                "--config",
                str(self.config),
                "--port-file",
                str(port_file),
            ],
            cwd=ROOT,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + 60
        while not port_file.exists():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError((self.workdir / f"buffer{self.starts}.log").read_text()[-3000:])
            time.sleep(0.02)  # ok-sleep: polling with a deadline for the port file

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()


@pytest.fixture
def buffer_process(redis_server, tmp_path):
    port = free_port()
    config = tmp_path / "run.yaml"
    config.write_text(
        "services:\n"
        "  buffer:\n"
        "    store: redis\n"
        f"    redis_url: {redis_server.url}\n"
        f"    stream_prefix: crash-{uuid.uuid4().hex[:8]}\n"
        f"    port: {port}\n"
        "    lease_ms: 1500\n"
        "buffer:\n"
        "  trainer_input:\n"
        "    experience_buffer:\n"
        "      capacity: 100000\n"
        "log:\n"
        "  level: WARNING\n"
    )
    proc = BufferProcess(config, port, tmp_path)
    proc.start()
    yield proc
    proc.stop()


@pytest.mark.slow
async def test_sigkill_during_traffic_loses_and_duplicates_nothing(buffer_process):
    address = f"127.0.0.1:{buffer_process.port}"
    sent: list[str] = []
    acked: list[str] = []

    async def produce(p: int) -> None:
        async with create_channel(address, timeout_s=5) as channel:
            client = BufferClient(channel, producer_id=f"p{p}", timeout_s=5, retry_deadline_s=60)
            for b in range(BATCHES):
                groups = [
                    group(f"p{p}-{b}-{j}", GROUP_SIZE, explorer_id=f"p{p}") for j in range(GROUPS_PER_BATCH)
                ]
                await client.put_proto(batch(*groups))
                sent.extend(uid(e) for g in groups for e in g)

    async def consume() -> None:
        async with create_channel(address, timeout_s=5) as channel:
            client = BufferClient(channel, consumer="trainer-0", timeout_s=5, retry_deadline_s=60)
            while len(acked) < TOTAL:
                try:
                    leased = await client.get_batch(16, timeout_ms=200)
                except grpc.aio.AioRpcError as exc:
                    if exc.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
                        continue  # the service is down; the channel waits for it to come back
                    raise
                if not leased.lease_id:
                    continue
                ids = [uid(e) for e in leased.experiences]
                try:
                    await client.ack(leased.lease_id)
                except LeaseUnknown:
                    continue  # expired while the service was down: it will be redelivered
                acked.extend(ids)

    async def crash_twice() -> None:
        for threshold in (TOTAL // 4, TOTAL // 2):
            while len(acked) < threshold:
                await asyncio.sleep(0.005)  # ok-sleep: polling for progress (the test has a deadline)
            await asyncio.to_thread(buffer_process.kill)
            await asyncio.to_thread(buffer_process.start)

    async def producers() -> None:
        await asyncio.gather(*[produce(p) for p in range(PRODUCERS)])

    await asyncio.wait_for(asyncio.gather(producers(), consume(), crash_twice()), 90)
    assert buffer_process.starts == 3
    assert len(sent) == TOTAL and len(set(sent)) == TOTAL
    assert len(acked) == TOTAL, f"{len(acked)} acked of {TOTAL}"
    assert sorted(acked) == sorted(sent)  # every id exactly once
    async with create_channel(address, timeout_s=5) as channel:
        stats = await BufferClient(channel).stats()
    assert stats.acked == TOTAL and stats.size == 0 and stats.accepted == TOTAL and stats.pending_leases == 0
