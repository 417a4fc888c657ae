"""Assembles the trainer from the run config: process group, FSDP2 engine, buffer client, monitor,
core (resumed from the latest checkpoint when asked), weight sync and the servicer that
`service_main` serves on rank 0.  Ranks > 0 build the same engine and serve rank 0's commands.
"""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Awaitable, Callable, Sequence

from rft.v1 import common_pb2, synchronizer_pb2_grpc

from services.common.buffer_client import BufferClient
from services.common.config import RFTConfig, resolve
from services.common.monitor import build_monitor
from services.common.rpc.client import create_channel
from services.common.rpc.server import Registration
from services.common.weight_sync import TransportOptions
from services.trainer.core import TrainerCore
from services.trainer.distributed import DistInfo, ensure_process_group
from services.trainer.engine import FSDPEngine
from services.trainer.servicer import TrainerServicer, registration
from services.trainer.settings import TrainerSettings
from services.trainer.weight_sync import WeightSync

__all__ = ["build", "build_core", "run_worker_rank"]


def _max_staleness(config: RFTConfig) -> int | None:
    if config.algorithm.sample_strategy != "staleness_control":
        return None
    return int((config.algorithm.sample_strategy_args or {}).get("max_staleness", 0))


def build_core(
    config: RFTConfig, info: DistInfo, engine: FSDPEngine, source, console: bool = True
) -> TrainerCore:
    """The core of rank 0 (the engine is built by the caller, on every rank)."""
    monitor = build_monitor(
        config.monitor.monitor_type,
        project=config.project,
        run_name=resolve(config).trainer_run_name,
        job_dir=engine.worker.settings.job_dir,
        metrics_file="trainer.jsonl",
        args=config.monitor.monitor_args,
        console=console,
    )
    return TrainerCore(engine.worker.settings, engine, source, monitor, max_staleness=_max_staleness(config))


def _transport_options(config: RFTConfig, info: DistInfo, settings: TrainerSettings) -> TransportOptions:
    s = config.synchronizer
    return TransportOptions(
        device=str(info.device),
        timeout_s=s.sync_timeout,
        bucket_bytes=s.bucket_bytes,
        master_address=config.services.trainer.host,
        chunk_bytes=s.chunk_bytes,
        checkpoint_dir=str(settings.job_dir / "state_dicts"),
    )


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
    push = None
    if svc.synchronizer.port or svc.synchronizer.address:
        sync_channel = create_channel(
            svc.synchronizer.target,
            auth_token=svc.auth_token,
            tls=svc.tls,
            timeout_s=config.synchronizer.sync_timeout,
        )
        stub = synchronizer_pb2_grpc.SynchronizerServiceStub(sync_channel)

        async def push(chunks: Sequence[common_pb2.WeightChunk]) -> None:
            await stub.PushWeights(iter(chunks))

    weight_sync = WeightSync(
        core,
        method=config.synchronizer.sync_method,
        options=_transport_options(config, info, settings),
        push=push,
    )
    servicer = TrainerServicer(core, weight_sync, on_shutdown=lambda: signal.raise_signal(signal.SIGTERM))

    async def close() -> None:
        await weight_sync.close()
        await core.shutdown(wait_for_save=True)
        await buffer_channel.close()

    return [registration(servicer)], close


def run_worker_rank(config: RFTConfig) -> int:
    """Ranks > 0: build the engine and execute rank 0's commands until it stops."""
    info = ensure_process_group()
    engine = FSDPEngine(TrainerSettings.from_config(config), info)
    engine.serve_workers()
    engine.worker.wait_for_save()
    return 0
