"""The synchronizer suite's connection and helpers: a `SynchronizerService` stub with the token, members
with ids of this run only, and publishing a new version the way the run's `sync_method` does.

Isolation. A synchronizer is one run's coordinator: the suite registers a trainer and explorers and
publishes versions, which would disturb a run in progress. So it needs a synchronizer no run uses: the
preflight refuses (exit 2) one with a live member or a finished run. Its members' ids carry a random
run tag (`cf-<tag>-...`), and every member a check registers leaves as LOST at the end of the check
("may come back", which keeps the run going: a trainer leaving as STOPPED would finish it), so the
suite can run again on the same server. Versions are monotonic for the server's life: each check
reads the published version first and works above it.
"""

from __future__ import annotations

import asyncio
import json
import struct
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import grpc
from rft.v1 import common_pb2, synchronizer_pb2, synchronizer_pb2_grpc

from launcher.conformance.harness import (
    CALL_TIMEOUT_S,
    CheckFailed,
    Connected,
    SetupError,
    one_line,
    require,
    setup_error,
)

POLL_S = 0.02
TRAINER = synchronizer_pb2.MEMBER_ROLE_TRAINER
EXPLORER = synchronizer_pb2.MEMBER_ROLE_EXPLORER
GONE = (common_pb2.MEMBER_STATUS_STOPPED, common_pb2.MEMBER_STATUS_FAILED, common_pb2.MEMBER_STATUS_LOST)
BROADCAST_METHODS = ("nccl",)
PUSHED_METHODS = ("memory", "memory_bf16")


def safetensors_blob(version: int) -> bytes:
    """A valid safetensors state dict of two small float32 tensors whose values depend on `version`."""
    weight = struct.pack("<4f", *(float(version + i) for i in range(4)))
    bias = struct.pack("<2f", float(version), -float(version))
    header = {
        "w": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 16]},
        "b": {"dtype": "F32", "shape": [2], "data_offsets": [16, 24]},
    }
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text + weight + bias


def chunks_of(version: int, step: int, blob: bytes, parts: int) -> list[common_pb2.WeightChunk]:
    """`blob` cut into `parts` WeightChunks of `version` (index 0..parts-1, total, total_bytes)."""
    size = -(-len(blob) // parts)
    model_version = common_pb2.ModelVersion(version=version, step=step)
    return [
        common_pb2.WeightChunk(
            version=model_version,
            index=i,
            total=parts,
            data=blob[i * size : (i + 1) * size],
            total_bytes=len(blob),
        )
        for i in range(parts)
    ]


@dataclass
class SyncContext(Connected):
    address: str
    auth_token: str | None = None
    tag: str = field(default_factory=lambda: uuid.uuid4().hex[:8])
    method: str = ""
    style: str = ""
    interval: int = 1
    offset: int = 0

    def __post_init__(self) -> None:
        self.stub = synchronizer_pb2_grpc.SynchronizerServiceStub(self.connect())
        self._members = 0
        self.joined: list[str] = []

    @property
    def broadcast(self) -> bool:
        """The run's method moves weights by a collective broadcast between members (nccl)."""
        return self.method in BROADCAST_METHODS

    @property
    def pushed(self) -> bool:
        """The run's method pushes weights to the synchronizer, members pull them (the memory methods)."""
        return self.method in PUSHED_METHODS

    async def preflight(self) -> None:
        """GetRunState: reachable, authorised, no live member and not finished; else SetupError."""
        try:
            state = await self.state()
        except grpc.aio.AioRpcError as exc:
            raise setup_error(exc, "synchronizer", self.address) from None
        live = [m.member_id for m in state.members if m.status not in GONE]
        if live:
            raise SetupError(
                f"the synchronizer has live members ({', '.join(one_line(m, 40) for m in live[:4])}): the suite "
                "registers a trainer and publishes versions, so run it against a synchronizer no run uses "
                "(or wait until those members are marked LOST)",
                2,
            )
        if state.finished:
            raise SetupError(
                "the synchronizer's run is finished: start a fresh synchronizer for the suite", 2
            )
        self.method, self.style = state.sync_method, state.sync_style
        self.interval, self.offset = state.sync_interval, state.sync_offset

    # --- members ---------------------------------------------------------------------------------
    def member_id(self, label: str) -> str:
        self._members += 1
        return f"cf-{self.tag}-{label}-{self._members}"

    async def register(
        self, label: str, role: int, **fields
    ) -> tuple[str, synchronizer_pb2.RegisterResponse]:
        """Register a new member of this run (it leaves at the end of the check: `leave_all`)."""
        member_id = self.member_id(label)
        member = synchronizer_pb2.Member(member_id=member_id, role=role, **fields)
        reply = await self.stub.Register(
            synchronizer_pb2.RegisterRequest(member=member), timeout=CALL_TIMEOUT_S
        )
        self.joined.append(member_id)
        return member_id, reply

    async def leave(self, member_id: str) -> None:
        request = synchronizer_pb2.HeartbeatRequest(member_id=member_id, status=common_pb2.MEMBER_STATUS_LOST)
        try:
            await self.stub.Heartbeat(request, timeout=CALL_TIMEOUT_S)
        except grpc.aio.AioRpcError as exc:
            if exc.code() != grpc.StatusCode.NOT_FOUND:  # already LOST
                raise

    async def leave_all(self) -> None:
        """Every member this run registered leaves as LOST (it may come back; the run is not finished)."""
        joined, self.joined = self.joined, []
        for member_id in joined:
            await self.leave(member_id)

    async def heartbeat(self, member_id: str, **fields) -> synchronizer_pb2.HeartbeatResponse:
        request = synchronizer_pb2.HeartbeatRequest(member_id=member_id, **fields)
        return await self.stub.Heartbeat(request, timeout=CALL_TIMEOUT_S)

    async def state(self) -> synchronizer_pb2.RunState:
        return await self.stub.GetRunState(synchronizer_pb2.GetRunStateRequest(), timeout=CALL_TIMEOUT_S)

    async def member(self, member_id: str) -> synchronizer_pb2.Member:
        found = [m for m in (await self.state()).members if m.member_id == member_id]
        require(len(found) == 1, f"GetRunState lists {len(found)} members named {member_id!r}, want 1")
        return found[0]

    async def until_status(self, member_id: str, status: int, what: str, timeout_s: float = 5.0) -> None:
        """Poll GetRunState until `member_id` has `status`; CheckFailed after `timeout_s`."""
        deadline = time.monotonic() + timeout_s
        while (await self.member(member_id)).status != status:
            if time.monotonic() > deadline:
                name = common_pb2.MemberStatus.Name(status)
                raise CheckFailed(f"{what}: {member_id} did not become {name} within {timeout_s:g} s")
            await asyncio.sleep(POLL_S)  # ok-sleep: polling the run state with a deadline

    # --- calls ---------------------------------------------------------------------------------------
    async def wait(
        self, member_id: str, timeout_ms: int, **fields
    ) -> synchronizer_pb2.WaitForVersionResponse:
        request = synchronizer_pb2.WaitForVersionRequest(member_id=member_id, timeout_ms=timeout_ms, **fields)
        return await self.stub.WaitForVersion(request, timeout=CALL_TIMEOUT_S + timeout_ms / 1000)

    async def request_sync(self, member_id: str, step: int, version: int = 0, timeout_ms: int = 0):
        request = synchronizer_pb2.RequestSyncRequest(
            member_id=member_id, step=step, version=version, timeout_ms=timeout_ms
        )
        return await self.stub.RequestSync(request, timeout=CALL_TIMEOUT_S + timeout_ms / 1000)

    async def report(
        self, member_id: str, version: int, ok: bool = True, generation: int = 0, message: str = ""
    ):
        request = synchronizer_pb2.ReportSyncRequest(
            member_id=member_id, version=version, ok=ok, generation=generation, message=message
        )
        return await self.stub.ReportSync(request, timeout=CALL_TIMEOUT_S)

    async def push(self, chunks: list[common_pb2.WeightChunk]) -> synchronizer_pb2.PushWeightsResponse:
        return await self.stub.PushWeights(iter(chunks), timeout=CALL_TIMEOUT_S)

    async def pull(self, version: int = 0) -> list[common_pb2.WeightChunk]:
        request = synchronizer_pb2.PullWeightsRequest(member_id=f"cf-{self.tag}-puller", version=version)
        return [c async for c in self.stub.PullWeights(request, timeout=CALL_TIMEOUT_S)]

    def publisher(self, trainer: str) -> Callable[[int, int], Awaitable[common_pb2.ModelVersion]]:
        """How this run's sync_method publishes (version, step): memory methods push a state dict,
        checkpoint notifies a path, nccl has the trainer report a finished broadcast. Returns the
        call's model_version."""

        async def publish(version: int, step: int) -> common_pb2.ModelVersion:
            if self.pushed:
                return (await self.push(chunks_of(version, step, safetensors_blob(version), 2))).model_version
            if self.broadcast:
                return (await self.report(trainer, version, ok=True)).model_version
            path = f"/tmp/cf-{self.tag}/global_step_{step}"
            request = common_pb2.ModelVersion(version=version, step=step, checkpoint_path=path)
            return (await self.stub.NotifyCheckpoint(request, timeout=CALL_TIMEOUT_S)).model_version

        return publish


async def with_members(ctx: SyncContext, body: Callable[[], Awaitable[str]]) -> str:
    """Run a check's `body`; every member it registered leaves afterwards, whatever happened."""
    try:
        return await body()
    finally:
        await ctx.leave_all()
