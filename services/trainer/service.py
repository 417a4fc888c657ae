"""Assembles the trainer from the run config: process group, FSDP2 engine, buffer client, monitor,
core (resumed from the latest checkpoint when asked), weight sync and the servicer that
`service_main` serves on rank 0.  Ranks > 0 build the same engine and serve rank 0's commands, and
write their progress records (`<job_dir>/progress/rank<N>.json`) that rank 0's liveness answer judges:
a stopped or wedged rank makes the trainer stuck, and `rft run` restarts it with all its ranks.

With a synchronizer address (`services.synchronizer.address` or `host`+`port`, or
`RFT_SYNCHRONIZER_ADDRESS`/`_PORT`) the trainer registers as member `trainer`, heartbeats, and syncs
after each step through `TrainerSyncHook` with `synchronizer.sync_method` (memory: pushes to the
synchronizer; checkpoint: writes and notifies; nccl: joins the group the synchronizer hands out and
broadcasts) on the synchronizer's sync plan. Without one, weights move only on SyncWeights RPCs.

`trainer.auto_start`: the service trains on its own (`TrainerCore.run`) until `total_steps` or, with
a synchronizer, until every explorer that joined has finished its data (STOPPED; a FAILED or LOST one
may be restarted, so it is waited for) and the buffer holds less than a batch ("data exhausted" in the
log); then it saves the last step (HF export per `save_hf_checkpoint`), reports STOPPED to the
synchronizer (which ends the run for the explorers) and stops its process: exit code 0, or 1 with an
`trainer failed` log line when a step, a sync or the save failed (reported to the synchronizer as
FAILED). Stopped by SIGTERM/SIGINT before the end, it lets the step in flight commit, saves it, acks
what is durable and leaves as LOST (the run is not over: a restarted trainer continues it).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path

import grpc
from rft.v1 import common_pb2, synchronizer_pb2

from services.common import liveness, progress
from services.common.app import RunEnd
from services.common.buffer_client import BufferClient
from services.common.config import RFTConfig, resolve
from services.common.log import get_logger
from services.common.monitor import build_monitor
from services.common.rpc.client import create_channel
from services.common.rpc.server import Registration
from services.trainer.core import PreconditionError, TrainerCore
from services.trainer.distributed import DistInfo, ensure_process_group, leave_process_group
from services.trainer.engine import FSDPEngine
from services.trainer.servicer import TrainerServicer, registration
from services.trainer.settings import TrainerSettings
from services.trainer.weight_sync import WeightSync
from services.weight_sync import WeightSyncError
from services.weight_sync.member.away import is_away, synchronizer_away
from services.weight_sync.member.client import SyncClient
from services.weight_sync.member.trainer_hook import TrainerSyncHook
from services.weight_sync.transport import transport_options

__all__ = ["build", "build_core", "run_worker_rank"]

log = get_logger("trainer")
Status = common_pb2.MemberStatus
LEASE_WAIT_MS = 1000  # one lease wait of the auto-started loop (how soon the end of the data is seen)
TRAINER_MEMBER_ID = "trainer"


def build_core(
    config: RFTConfig, info: DistInfo, engine: FSDPEngine, source, console: bool = True
) -> TrainerCore:
    """The core of rank 0 (the engine is built by the caller, on every rank)."""
    settings = engine.worker.settings
    bound = settings.sync_plan.default_staleness()  # staleness_control's, or fully_async's
    monitor = build_monitor(
        config.monitor.monitor_type,
        project=config.project,
        run_name=resolve(config).trainer_run_name,
        job_dir=settings.job_dir,
        metrics_file="trainer.jsonl",
        args=config.monitor.monitor_args,
        console=console,
        role="trainer",
        constants={"checkpoint_interval_steps": settings.save_interval}
        | ({"staleness_bound": bound} if bound is not None else {}),
    )
    return TrainerCore(settings, engine, source, monitor, max_staleness=bound)


async def build(config: RFTConfig) -> tuple[Sequence[Registration], Callable[[], Awaitable[None]] | None]:
    """`service_main` hook for rank 0."""
    info = ensure_process_group()
    settings = TrainerSettings.from_config(config)
    engine = await asyncio.to_thread(FSDPEngine, settings, info)
    svc = config.services
    buffer_channel = create_channel(
        svc.buffer.target, auth_token=svc.auth_token, tls=svc.tls, timeout_s=svc.rpc_timeout
    )
    source = BufferClient(buffer_channel, consumer=f"{config.name}-trainer", timeout_s=svc.rpc_timeout)
    core = build_core(config, info, engine, source)
    await core.prepare()
    liveness.track("trainer step", lambda: core.global_step)
    if info.world_size > 1:  # ranks > 0 serve no RPC: their progress records say whether they move
        floor, folder = config.services.progress_timeout, progress_folder(settings)
        liveness.PROCESS.watch_ranks(lambda: progress.rank_reports(folder, range(1, info.world_size), floor))
    client = _sync_client(config)
    weight_sync = WeightSync(
        core,
        method=settings.sync_method,
        options=transport_options(
            config, device=str(info.device), checkpoint_dir=str(settings.job_dir / "state_dicts")
        ),
        push=_push_to(client) if client is not None else None,
        digest=config.synchronizer.weight_digest,
    )
    if client is not None:
        await client.register(step=core.global_step, model_version=core.model_version)
        await client.start()
        hook = TrainerSyncHook(
            client,
            settings.sync_method,
            sync=_logged(weight_sync),
            specs=weight_sync.specs,
            join_group=weight_sync.join,
            abandon=weight_sync.abandon,
            snapshot=weight_sync.snapshot,
            pipeline_every=settings.sync_plan.pipeline_every(),
        )
        core.sync_hook = _TransferFailureTolerant(hook)
    runner: asyncio.Task[None] | None = None
    if config.trainer.auto_start:
        runner = asyncio.get_running_loop().create_task(_drive(core, client), name="trainer-run")
    servicer = TrainerServicer(core, weight_sync, on_shutdown=lambda: signal.raise_signal(signal.SIGTERM))

    async def close() -> None:
        reported = runner is not None and runner.done()  # the run told the synchronizer how it ended
        if runner is not None and not runner.done():
            runner.cancel()  # a step in flight commits first (TrainerCore)
            await asyncio.gather(runner, return_exceptions=True)
        with contextlib.suppress(Exception):  # a pipelined sync in flight ends before the group does
            await asyncio.wait_for(core.sync_hook.flush(), FLUSH_ON_STOP_S)
        await weight_sync.close()
        await core.shutdown(wait_for_save=True)  # saves the last trained step
        if client is not None:
            if not reported:
                # stopped before the end of the run: not STOPPED (that ends the run for the
                # explorers), LOST, as a crash would be; a restarted trainer continues the run
                status = Status.MEMBER_STATUS_STOPPED if core.finished else Status.MEMBER_STATUS_LOST
                await client.stop(status)
            await client.close()
        await buffer_channel.close()

    return [registration(servicer)], close


def _sync_client(config: RFTConfig) -> SyncClient | None:
    endpoint = config.services.synchronizer
    if not (endpoint.address or endpoint.port):
        return None
    trainer = config.services.trainer
    return SyncClient.from_config(
        config, TRAINER_MEMBER_ID, "trainer", address=trainer.address or trainer.host, workers=1
    )


def _push_to(client: SyncClient):
    async def push(chunks: Sequence[common_pb2.WeightChunk]) -> None:
        await client.push_chunks(chunks)

    return push


def _logged(weight_sync: WeightSync):
    """`weight_sync.sync` plus a log line per sent version (with the weights' digest when asked)."""

    async def sync(snapshot=None):
        result = await weight_sync.sync(snapshot=snapshot)
        log.info(
            "weights sent", version=result.version, step=result.step, bytes=result.nbytes,
            digest=result.digest or None,
        )  # fmt: skip
        return result

    return sync


FLUSH_ON_STOP_S = 10.0  # how long a stopping trainer lets a background weight sync finish


class _TransferFailureTolerant:
    """A sync that failed in the transport (a broadcast member died, the group timed out) or because
    the synchronizer is away is logged and skipped: the step stands, and the next sync (after a later
    step, or while waiting for data) sends newer weights. Other errors stop."""

    def __init__(self, hook: TrainerSyncHook):
        self.hook = hook

    async def after_step(self, step: int):
        return await self._tolerant(self.hook.after_step(step), step)

    async def flush(self):
        return await self._tolerant(self.hook.flush(), -1)

    async def _tolerant(self, call, step: int):
        try:
            return await call
        except grpc.aio.AioRpcError as exc:
            # the synchronizer is restarting, slow, or forgot this member (register again now): the
            # sync is skipped, and a later one sends newer weights; other codes raise
            if not is_away(exc):
                raise
            log.warning("synchronizer unreachable; sync skipped", step=step, error=exc.code().name)
            await synchronizer_away(exc, lambda: self.hook.client.register(step=step))
            return {"sync/failed": 1.0}
        except (WeightSyncError, PreconditionError) as exc:
            if not isinstance(exc, WeightSyncError) and not isinstance(exc.__cause__, WeightSyncError):
                raise
            log.warning("weight sync failed; a later sync sends newer weights", step=step, error=str(exc))
            return {"sync/failed": 1.0}


async def _explorers_stopped(client: SyncClient) -> bool:
    """Every explorer that joined the run has finished (STOPPED: its data or total_steps ran out),
    and at least one joined. A FAILED or LOST explorer may be restarted, so it is waited for."""
    try:
        state = await client.get_run_state()
    except grpc.aio.AioRpcError as exc:
        await synchronizer_away(exc)  # away: not known yet; other codes raise
        return False
    explorers = [m for m in state.members if m.role == synchronizer_pb2.MEMBER_ROLE_EXPLORER]
    return bool(explorers) and all(m.status == common_pb2.MEMBER_STATUS_STOPPED for m in explorers)


async def _drive(core: TrainerCore, client: SyncClient | None) -> None:
    """`trainer.auto_start`: the whole run, then stop the service with the exit code."""
    with RunEnd() as end:
        try:
            ended = (lambda: _explorers_stopped(client)) if client is not None else None
            log.info("training", start_step=core.global_step, total_steps=core.settings.total_steps)
            await core.run(timeout_ms=LEASE_WAIT_MS, data_ended=ended)
            path = await core.finish()
            end.code = 0
            reason = (
                "total_steps reached"
                if core.finished
                else "data exhausted: every explorer finished its data and the buffer holds less than a batch"
            )
            log.info(
                "run finished",
                reason=reason,
                step=core.global_step,
                total_steps=core.settings.total_steps,
                checkpoint=path,
            )
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            end.code = 1
            log.exception("trainer failed", step=core.global_step, error=f"{type(exc).__name__}: {exc}")
        if client is not None and not await client.leave(ok=end.code == 0):
            log.warning("could not report the end of the run to the synchronizer")


def run_worker_rank(config: RFTConfig) -> int:
    """Ranks > 0: build the engine and execute rank 0's commands until it stops.

    A stop signal reaches every rank (torchrun's agent forwards SIGTERM to all its workers, a terminal's
    Ctrl-C reaches the whole process group), but only rank 0 decides when the ranks stop: its last save
    is a collective over every rank's shards, so a rank that died on the signal would lose that save.
    These ranks ignore SIGTERM/SIGINT and leave on rank 0's `stop`, or as soon as rank 0 is gone (its
    command channel closes); torchrun's agent ends them with SIGKILL if that takes over 30 s.
    """
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    settings = TrainerSettings.from_config(config)
    progress.configure(config.services.progress_timeout)
    rank = int(os.environ.get("RANK", "0"))
    beacon = progress.RankBeacon(progress_folder(settings), rank).start()  # before rank 0 can serve
    info = ensure_process_group()
    engine = FSDPEngine(settings, info)
    engine.serve_workers()
    engine.worker.wait_for_save()
    leave_process_group(info)
    beacon.stop()
    return 0


def progress_folder(settings: TrainerSettings) -> Path:
    """Where each trainer rank > 0 writes its progress record (services/common/progress.py)."""
    return Path(settings.job_dir) / "progress"
