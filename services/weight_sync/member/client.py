"""Client of the synchronizer service, used by the trainer and the explorers (async, deadlines on every call).

    client = SyncClient.from_config(config, member_id="explorer-0", role="explorer", workers=1)
    await client.register(); await client.start()       # heartbeat loop (explicit start/stop)
    ...
    await client.stop(); await client.close()

Calls (one per RPC): `register`, `heartbeat`, `request_sync` (trainer, after a step: publish now?),
`wait_for_version` (explorer, before a step: returns when it may run or must join a broadcast),
`report_sync`, `push_weights`/`push_chunks` (memory: a state dict, or `WeightChunk`s),
`pull_weights` (memory: to a state dict), `notify_checkpoint`,
`get_run_state`, `get_weight_sync_info` (nccl rendezvous: `GroupInfo` and this member's ranks),
`shutdown_run`. `push_weights` / `pull_weights` move serialized chunks with pass-through
(de)serializers (`encode_raw_chunks` / `join_raw_chunks`): no message objects are built
for the bulk bytes on either side. Delta pulls: `pull_weights` keeps the last payload it received
(one payload of memory) and sends its version as `have_version`; a delta stream is applied to it
(`weight_sync.delta`), and a delta that does not apply (`DeltaMismatchError`, any `WeightSyncError`)
is counted in `delta_fallbacks` and the version pulled again in full.
Unary calls use `timeout_s`; waits add their own timeout; weight streams use
`sync_timeout_s`. The heartbeat loop registers again when the synchronizer answers NOT_FOUND (after
it marked this member LOST or restarted). The hook adapters for the trainer and explorer cores
are in `services.weight_sync.member.trainer_hook` and `explorer_gate`.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Literal

import grpc
import torch
from rft.v1 import common_pb2, synchronizer_pb2, synchronizer_pb2_grpc

from services.common.log import get_logger
from services.common.rpc import create_channel
from services.weight_sync import GroupInfo, TensorSpec, WeightSyncError, specs_to_proto
from services.weight_sync.member.away import Backoff, synchronizer_away
from services.weight_sync.wire.chunks import encode_raw_chunks, join_raw_chunks
from services.weight_sync.wire.codec import decode_state_dict
from services.weight_sync.wire.delta import apply_delta

log = get_logger("sync_client")

_PUSH = "/rft.v1.SynchronizerService/PushWeights"
_PULL = "/rft.v1.SynchronizerService/PullWeights"
ROLES = {"trainer": synchronizer_pb2.MEMBER_ROLE_TRAINER, "explorer": synchronizer_pb2.MEMBER_ROLE_EXPLORER}
Status = common_pb2.MemberStatus


class SyncWaitTimeout(TimeoutError):
    """The synchronizer did not deliver the required version within the wait."""


class RunFinished(RuntimeError):
    """The run is over (the trainer stopped or the synchronizer was shut down)."""


class SyncClient:
    def __init__(
        self,
        channel: grpc.aio.Channel,
        member_id: str,
        role: Literal["trainer", "explorer"],
        *,
        address: str = "",
        workers: int = 1,
        weight_sync_port: int = 0,
        timeout_s: float = 30.0,
        sync_timeout_s: float = 3600.0,
        owns_channel: bool = False,
        delta_pulls: bool = True,
    ):
        if role not in ROLES:
            raise ValueError(f"role {role!r} is not one of {', '.join(ROLES)}")
        self.stub = synchronizer_pb2_grpc.SynchronizerServiceStub(channel)
        self._push_raw = channel.stream_unary(
            _PUSH,
            request_serializer=None,
            response_deserializer=synchronizer_pb2.PushWeightsResponse.FromString,
        )
        self._pull_raw = channel.unary_stream(
            _PULL,
            request_serializer=synchronizer_pb2.PullWeightsRequest.SerializeToString,
            response_deserializer=None,
        )
        self.channel = channel
        self.member_id, self.role = member_id, role
        self.address, self.workers, self.weight_sync_port = address, workers, weight_sync_port
        self.timeout_s, self.sync_timeout_s = timeout_s, sync_timeout_s
        self.owns_channel = owns_channel
        self.delta_pulls = delta_pulls  # memory: ask for deltas (synchronizer.delta_sync)
        self.step = 0  # last finished step, sent with heartbeats
        self.model_version = 0  # weights this member holds
        self.heartbeat_timeout_s = 60.0
        self.generation = 0  # last group generation the synchronizer announced
        self.broadcast_generation = 0  # generation of the broadcast in progress, as of the last heartbeat
        self.on_sync_pending: Callable[[], None] | None = None
        self._stop = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._held: tuple[int, bytearray] | None = None  # memory: the last payload pulled, its version
        self.pulled_bytes_full = self.pulled_bytes_delta = self.delta_fallbacks = 0  # from the synchronizer
        self.relayed_bytes_full = self.relayed_bytes_delta = 0  # from a relay's copy (fan-out)
        # fan-out (synchronizer.fanout > 0): this explorer's weight relay (`tree.server.ServedRelay`, set by
        # `tree.fetch.explorer_fetch`): its address is registered, and it is closed with the client
        self.relay = None

    @classmethod
    def from_config(
        cls, config, member_id: str, role: Literal["trainer", "explorer"], **kwargs
    ) -> SyncClient:
        """A client on its own channel to `services.synchronizer` of an `RFTConfig`."""
        svc = config.services
        channel = create_channel(
            svc.synchronizer.target, auth_token=svc.auth_token, tls=svc.tls, timeout_s=svc.rpc_timeout
        )
        kwargs.setdefault("timeout_s", svc.rpc_timeout)
        kwargs.setdefault("sync_timeout_s", config.synchronizer.sync_timeout)
        kwargs.setdefault("delta_pulls", config.synchronizer.delta_sync)
        return cls(channel, member_id, role, owns_channel=True, **kwargs)

    # ---- membership ----------------------------------------------------------------------------
    async def register(
        self, step: int | None = None, model_version: int | None = None
    ) -> common_pb2.ModelVersion:
        if step is not None:
            self.step = step
        if model_version is not None:
            self.model_version = model_version
        member = synchronizer_pb2.Member(
            member_id=self.member_id, role=ROLES[self.role], status=Status.MEMBER_STATUS_RUNNING,
            step=self.step, model_version=self.model_version, address=self.address, workers=self.workers,
            weight_sync_port=self.weight_sync_port,
            relay_address=self.relay.address if self.relay is not None else "",
        )  # fmt: skip
        resp = await self.stub.Register(
            synchronizer_pb2.RegisterRequest(member=member), timeout=self.timeout_s
        )
        self.heartbeat_timeout_s = float(resp.heartbeat_timeout_s or 60)
        return resp.model_version

    async def heartbeat(self, status: int = 0, step: int | None = None) -> synchronizer_pb2.HeartbeatResponse:
        """One heartbeat (status 0 = unchanged; STOPPED/FAILED leave the run)."""
        if step is not None:
            self.step = step
        req = synchronizer_pb2.HeartbeatRequest(
            member_id=self.member_id, status=status, step=self.step, model_version=self.model_version
        )
        resp = await self.stub.Heartbeat(req, timeout=self.timeout_s)
        self.generation, self.broadcast_generation = resp.generation, resp.broadcast_generation
        if resp.sync_pending and self.on_sync_pending is not None:
            self.on_sync_pending()
        return resp

    report_step = heartbeat

    async def start(self, interval_s: float | None = None) -> None:
        """Start the heartbeat loop (every `heartbeat_timeout / 3` unless given). Call `register` first."""
        if self._task is None:
            self._stop.clear()
            every = interval_s or self.heartbeat_timeout_s / 3
            self._task = asyncio.get_running_loop().create_task(self._beat(every), name="sync-heartbeat")

    async def _beat(self, every: float) -> None:
        while not self._stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stop.wait(), every)
                return
            try:
                await self.heartbeat()
            except grpc.aio.AioRpcError as exc:
                if exc.code() == grpc.StatusCode.NOT_FOUND:
                    log.warning("synchronizer forgot this member; registering again", member=self.member_id)
                else:
                    log.warning("heartbeat failed", member=self.member_id, code=exc.code().name)
                with contextlib.suppress(grpc.aio.AioRpcError):  # the next beat tries again
                    await synchronizer_away(exc, self.register)

    async def stop(self, status: int = Status.MEMBER_STATUS_STOPPED) -> None:
        """Stop the heartbeat loop and tell the synchronizer (status STOPPED by default; 0 = say nothing)."""
        self._stop.set()
        if self._task is not None:
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
        if status:
            with contextlib.suppress(grpc.aio.AioRpcError):
                await self.heartbeat(status)

    async def leave(self, ok: bool) -> bool:
        """End this member's part in the run: stop heartbeats and report STOPPED (ok) or FAILED.
        Returns False when the synchronizer could not be told (the caller's exit code still says it)."""
        status = Status.MEMBER_STATUS_STOPPED if ok else Status.MEMBER_STATUS_FAILED
        try:
            await self.stop(status)
        except Exception:  # noqa: BLE001 - a member that is leaving must not fail on the way out
            return False
        return True

    async def close(self) -> None:
        await self.stop(status=0)
        if self.relay is not None:
            relay, self.relay = self.relay, None
            await relay.close()
        if self.owns_channel:
            await self.channel.close()

    # ---- plan -----------------------------------------------------------------------------------
    async def request_sync(
        self, step: int, version: int = 0, timeout_s: float | None = None
    ) -> synchronizer_pb2.RequestSyncResponse:
        """Trainer after step `step`: `accepted` = publish now (nccl: the receivers are ready)."""
        wait = timeout_s or self.sync_timeout_s
        self.step = step
        req = synchronizer_pb2.RequestSyncRequest(
            member_id=self.member_id, step=step, version=version, timeout_ms=int(wait * 1000)
        )
        resp = await self.stub.RequestSync(req, timeout=wait + self.timeout_s)
        self.generation = resp.generation or self.generation
        return resp

    async def wait_for_version(
        self, step: int = 0, min_version: int = 0, timeout_s: float | None = None
    ) -> synchronizer_pb2.WaitForVersionResponse:
        """Explorer before step `step`: returns when it may run, must receive a broadcast, or timed out."""
        wait = timeout_s or self.sync_timeout_s
        if step:
            self.step = step - 1
        req = synchronizer_pb2.WaitForVersionRequest(
            member_id=self.member_id, min_version=min_version, step=step, timeout_ms=int(wait * 1000)
        )
        resp = await self.stub.WaitForVersion(req, timeout=wait + self.timeout_s)
        self.generation = resp.generation
        return resp

    async def report_sync(
        self, version: int, ok: bool = True, generation: int = 0, message: str = ""
    ) -> synchronizer_pb2.ReportSyncResponse:
        if ok and self.role == "explorer":
            self.model_version = max(self.model_version, version)
        req = synchronizer_pb2.ReportSyncRequest(
            member_id=self.member_id, version=version, ok=ok, generation=generation, message=message[:2000]
        )
        return await self.stub.ReportSync(req, timeout=self.timeout_s)

    async def report_load(
        self, version: int, ok: bool, generation: int = 0, message: str = "", within_s: float | None = None
    ) -> None:
        """An explorer's `report_sync` of a load that survives a synchronizer away or restarted: while it
        is away the report is retried for at most `within_s` (default: the sync timeout), then dropped
        with a warning; a restarted one that forgot this member (NOT_FOUND) hears the held version by
        the registration instead (`report_sync` recorded it first), so the report is done then. Any
        other error is raised."""
        deadline, backoff = time.monotonic() + (within_s or self.sync_timeout_s), Backoff()
        while True:
            try:
                await self.report_sync(version, ok, generation, message)
                return
            except grpc.aio.AioRpcError as exc:
                await synchronizer_away(exc, self.register)
                if exc.code() == grpc.StatusCode.NOT_FOUND:
                    return
                if time.monotonic() >= deadline:
                    log.warning("load report not delivered", version=version, ok=ok, code=exc.code().name)
                    return
                await backoff.wait(deadline - time.monotonic())

    async def get_run_state(self) -> synchronizer_pb2.RunState:
        return await self.stub.GetRunState(synchronizer_pb2.GetRunStateRequest(), timeout=self.timeout_s)

    async def shutdown_run(self) -> None:
        await self.stub.Shutdown(synchronizer_pb2.SynchronizerShutdownRequest(), timeout=self.timeout_s)

    # ---- weights ----------------------------------------------------------------------------------
    async def push_chunks(
        self, chunks: Iterable[common_pb2.WeightChunk]
    ) -> synchronizer_pb2.PushWeightsResponse:
        """memory: stream one version's chunks; model_version moves only if the stream is complete."""
        resp = await self.stub.PushWeights(iter(chunks), timeout=self.sync_timeout_s)
        return resp

    async def push_weights(
        self,
        state_dict: Mapping[str, torch.Tensor],
        version: int,
        step: int | None = None,
        chunk_bytes: int = 4 << 20,
    ) -> synchronizer_pb2.PushWeightsResponse:
        """memory: encode `state_dict` (serialized safetensors chunks, in a thread), push it as `version`."""
        raws = await asyncio.to_thread(
            encode_raw_chunks, state_dict, version, step=step, chunk_bytes=chunk_bytes
        )
        return await self._push_raw(iter(raws), timeout=self.sync_timeout_s)

    async def pull_chunks(self, version: int = 0) -> list[common_pb2.WeightChunk]:
        req = synchronizer_pb2.PullWeightsRequest(member_id=self.member_id, version=version)
        return [c async for c in self.stub.PullWeights(req, timeout=self.sync_timeout_s)]

    async def pull_weights(
        self, version: int = 0, device: str | torch.device = "cpu", *, delta: bool | None = None
    ) -> tuple[common_pb2.ModelVersion, dict[str, torch.Tensor]]:
        """memory: the latest (or `version`) state dict, decoded (in a thread). With `delta` (default:
        the client's `delta_pulls`) the payload is kept and the next pull asks for a delta from it;
        without, nothing is kept."""
        delta = self.delta_pulls if delta is None else delta
        held = self._held if delta else None
        try:
            mv, payload = await self._pull_payload(version, held)
        except WeightSyncError as exc:
            if held is None:
                raise
            self.delta_fallbacks += 1
            log.warning("weight delta did not apply; pulling in full", member=self.member_id, error=str(exc))
            mv, payload = await self._pull_payload(version, None)
        self._held = (int(mv.version), payload) if delta else None
        state_dict, _ = await asyncio.to_thread(decode_state_dict, payload, device)
        return mv, state_dict

    @property
    def held_version(self) -> int | None:
        """The version a delta may be from: the last payload pulled and kept (`delta_pulls`), else None."""
        return self._held[0] if self.delta_pulls and self._held is not None else None

    async def decode_raw(
        self, raws: Sequence[bytes], device: str | torch.device = "cpu"
    ) -> tuple[common_pb2.ModelVersion, dict[str, torch.Tensor]]:
        """`pull_weights` for chunks that came another way (a relay's copy): a full payload, or a
        delta applied to the held one (`WeightSyncError` when it does not apply: pull in full then);
        kept as the held payload like a pull."""
        held = self._held if self.delta_pulls else None
        mv, payload = await self._payload_of(raws, held, relayed=True)
        self._held = (int(mv.version), payload) if self.delta_pulls else None
        state_dict, _ = await asyncio.to_thread(decode_state_dict, payload, device)
        return mv, state_dict

    async def _pull_payload(
        self, version: int, held: tuple[int, bytearray] | None
    ) -> tuple[common_pb2.ModelVersion, bytearray]:
        """One PullWeights stream, as the full payload (a delta stream applied to `held`)."""
        req = synchronizer_pb2.PullWeightsRequest(
            member_id=self.member_id, version=version, have_version=held[0] if held else None
        )
        raws = [r async for r in self._pull_raw(req, timeout=self.sync_timeout_s)]
        return await self._payload_of(raws, held)

    async def _payload_of(
        self, raws: Sequence[bytes], held: tuple[int, bytearray] | None, relayed: bool = False
    ) -> tuple[common_pb2.ModelVersion, bytearray]:
        """A version's raw chunks as its full payload: joined, and a delta applied to `held`; the
        bytes count as pulled from the synchronizer, or with `relayed` as read from a relay's copy."""
        # joined and the delta applied in one trip to a thread
        mv, base, nbytes, payload = await asyncio.to_thread(_join_and_apply, raws, held)
        if relayed:
            if base is None:
                self.relayed_bytes_full += nbytes
            else:
                self.relayed_bytes_delta += nbytes
        elif base is None:
            self.pulled_bytes_full += nbytes
        else:
            self.pulled_bytes_delta += nbytes
        if isinstance(payload, WeightSyncError):  # counted above: the bytes did arrive
            raise payload
        return mv, payload

    async def notify_checkpoint(self, version: int, step: int, path: str) -> common_pb2.ModelVersion:
        req = common_pb2.ModelVersion(version=version, step=step, checkpoint_path=str(path))
        return (await self.stub.NotifyCheckpoint(req, timeout=self.timeout_s)).model_version

    async def get_weight_sync_info(self, specs: Sequence[TensorSpec] = ()) -> tuple[GroupInfo, list[int]]:
        """nccl: the current group instance and this member's ranks (the trainer passes its specs)."""
        req = synchronizer_pb2.SyncGroupRequest(member_id=self.member_id, tensors=specs_to_proto(specs))
        resp = await self.stub.GetWeightSyncInfo(req, timeout=self.timeout_s)
        self.generation = resp.group.generation
        return GroupInfo.from_proto(resp.group), list(resp.ranks)


def _join_and_apply(
    raws: Sequence[bytes], held: tuple[int, bytearray] | None
) -> tuple[common_pb2.ModelVersion, int | None, int, bytearray | WeightSyncError]:
    """(version, the delta's base or None, bytes received, the full payload, or the error when the
    chunks are a delta that does not apply to the `held` payload)."""
    mv, base, data = join_raw_chunks(raws)
    if base is None:
        return mv, None, len(data), data
    if held is None or held[0] != base:
        error = WeightSyncError(f"got a delta from version {base}, this receiver holds {held and held[0]}")
        return mv, base, len(data), error
    try:
        return mv, base, len(data), apply_delta(held[1], data, base_version=base)
    except WeightSyncError as exc:
        return mv, base, len(data), exc
