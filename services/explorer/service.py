"""Assembles an explorer from the run config: its id and shard, the rollout engines, auxiliary models,
the sink (the buffer service; nothing is sent in bench mode), the monitor, the core and the servicer —
what `service_main` serves. With `explorer.auto_start` it also starts exploring (or benchmarking) and
stops the service when done: exit code 0 when its data or `total_steps` ran out or the run finished
(the trainer stopped), 1 with an `explorer failed` log line otherwise (e.g. no weights within
`sync_timeout`).

With a synchronizer address (`services.synchronizer.address` or `host`+`port`, or
`RFT_SYNCHRONIZER_ADDRESS`/`_PORT`) the explorer registers under its id with its rollout worker
count, heartbeats, and waits before each step on `ExplorerSyncGate` with the fetch of
`synchronizer.sync_method` (memory: pull from the synchronizer; checkpoint: read the published
file; nccl: join the group, receive the broadcast); with `explorer.inflight_weight_update` it also
fetches each new version while a step samples (inflight.py). With `sync_style: fully_async` it never waits and
explores past `buffer.total_steps` until the run finishes (the trainer drops experiences staler than
its bound, so it may need more explore steps than it trains). In mode `both` it first waits until a trainer has
registered and rewinds to the trainer's step when its own saved position is ahead of it (a restart
after a crash: the trainer restored an earlier checkpoint, or a buffer lost data), so it never waits
for a version that cannot come. When its data ends it reports STOPPED; once every explorer has, the
trainer drains the buffer and ends the run. Stopped by a signal before that, it reports LOST (it may
come back), so the trainer keeps waiting for its data.

In `mode: serve` (or with `explorer.rollout_model.enable_openai_api` in another mode) it also serves
the OpenAI-compatible endpoint of services/explorer/serve/; in serve mode it reads no tasksets and,
instead of exploring, loads every new version the trainer publishes until the run finishes.

Several explorers can run at once: each needs its own id (`--explorer-id`, `RFT_EXPLORER_ID`, else
`explorer.name`) and, to split the tasksets, a shard `i/n` (`--shard`, `RFT_EXPLORER_SHARD`).
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Awaitable, Callable, Sequence

import grpc
from rft.v1 import common_pb2, synchronizer_pb2

from services.common import liveness
from services.common.app import RunEnd, stop_service
from services.common.buffer_client import BufferClient
from services.common.config import RFTConfig, resolve
from services.common.config.gpus import explorer_gpu_count
from services.common.log import get_logger
from services.common.monitor import build_monitor, explorer_run_name
from services.common.rpc import create_channel
from services.common.rpc.server import Registration
from services.explorer.auxiliary import build_auxiliary_models
from services.explorer.core import ExplorerCore, find_checkpoints
from services.explorer.engines import build_engines
from services.explorer.engines.placement import engine_devices
from services.explorer.inflight import InflightFollower, enable_inflight, serialised
from services.explorer.serve.endpoint import build_endpoint, follow_run, serves_http
from services.explorer.servicer import ExplorerServicer, registration
from services.explorer.settings import ExplorerSettings
from services.explorer.sink import BufferSink, ExperienceSink, ListSink
from services.explorer.weight_receiver import WeightReceiver
from services.weight_sync.member.away import Backoff, synchronizer_away
from services.weight_sync.member.client import RunFinished, SyncClient, SyncWaitTimeout
from services.weight_sync.member.explorer_gate import ExplorerSyncGate
from services.weight_sync.method import Receiver
from services.weight_sync.tree.fetch import explorer_fetch
from services.weight_sync.tree.notices import tree_wait

log = get_logger("explorer")
_GONE = (common_pb2.MEMBER_STATUS_STOPPED, common_pb2.MEMBER_STATUS_FAILED, common_pb2.MEMBER_STATUS_LOST)


def parse_shard(text: str | None) -> tuple[int, int]:
    if not text:
        return (0, 1)
    try:
        index, count = (int(x) for x in text.split("/"))
    except ValueError:
        raise ValueError(f"shard {text!r} must look like i/n, e.g. 0/2") from None
    if not 0 <= index < count:
        raise ValueError(f"shard {text!r}: need 0 <= i < n")
    return index, count


def explorer_identity(config: RFTConfig, explorer_id: str | None = None, shard: str | None = None):
    ident = explorer_id or os.environ.get("RFT_EXPLORER_ID") or config.explorer.name
    return ident, parse_shard(shard or os.environ.get("RFT_EXPLORER_SHARD"))


async def build_core(
    config: RFTConfig,
    *,
    explorer_id: str | None = None,
    shard: str | None = None,
    sink: ExperienceSink | None = None,
) -> ExplorerCore:
    ident, parts = explorer_identity(config, explorer_id, shard)
    resolved = resolve(config)
    rollout = resolved.rollout_model  # twins of model.* (max_model_len, ...) resolved
    model_path = rollout.model_path or config.model.model_path
    rollout_devices, aux_devices = _devices(config)
    engines = await asyncio.to_thread(
        build_engines, rollout, model_path, rollout_devices, parts[0] * rollout.engine_num
    )
    aux = await asyncio.to_thread(build_auxiliary_models, config.explorer.auxiliary_models, aux_devices)
    if sink is None:
        if config.mode == "bench":
            sink = ListSink()
        else:
            s = config.services
            channel = create_channel(
                s.buffer.target, auth_token=s.auth_token, tls=s.tls, timeout_s=s.rpc_timeout,
                max_message_bytes=s.max_message_bytes,
            )  # fmt: skip
            client = BufferClient(channel, producer_id=ident, timeout_s=s.rpc_timeout)
            sink = BufferSink(
                client,
                vocab_size=engines[0].vocab_size,
                max_batch_experiences=s.buffer.max_batch_experiences,
            )
    metrics_file = "explorer.jsonl" if ident == config.explorer.name else f"explorer_{ident}.jsonl"
    monitor = build_monitor(
        config.monitor.monitor_type,
        project=config.project,
        run_name=explorer_run_name(config, ident),  # one monitor run per explorer
        job_dir=resolved.job_dir,
        metrics_file=metrics_file,
        args=config.monitor.monitor_args,
        role="explorer",
    )
    if config.explorer.inflight_weight_update:
        enable_inflight(engines)
    core = ExplorerCore(
        ExplorerSettings.from_config(config),
        engines=engines,
        sink=sink,
        explorer_id=ident,
        auxiliary_models=aux,
        monitor=monitor,
        shard=parts,
    )
    if config.mode == "serve":  # no tasksets: the calls to the endpoint are the data (serve/)
        core.status = "RUNNING"
    else:
        await core.start()
    return core


def _devices(config: RFTConfig) -> tuple[list[str | None], list[str | None]]:
    """Each engine's device among the GPUs this process sees (engines/placement.py)."""
    import torch

    visible = torch.cuda.device_count()
    need = explorer_gpu_count(config.explorer)
    if 0 < visible < need:
        log.warning(
            "fewer GPUs than the engines take; they share the visible ones",
            visible=visible, needed=need, rule="engine_num x tensor_parallel_size + auxiliary models",
        )  # fmt: skip
    return engine_devices(config.explorer, visible)


def _stop_process() -> None:
    """Ask `service_main` to stop gracefully (its SIGTERM handler drains RPCs and closes)."""
    stop_service(0)


async def attach_synchronizer(
    config: RFTConfig, core: ExplorerCore, receiver: WeightReceiver
) -> SyncClient | None:
    """Register with the configured synchronizer and gate every explore step on it (None: none set)."""
    endpoint = config.services.synchronizer
    if not (endpoint.address or endpoint.port):
        return None
    me = config.services.explorer
    workers = sum(int(getattr(e, "workers", 1)) for e in core.engines)
    client = SyncClient.from_config(
        config, core.explorer_id, "explorer", address=me.address or me.host, workers=workers
    )
    method = core.settings.sync_method  # resolved once from the config (ExplorerSettings)
    rollout = config.explorer.rollout_model
    model_path = str(rollout.model_path or config.model.model_path)  # the engines' base weights
    # the method's fetch; through a weight relay served beside this explorer when it has a tree fan-out
    fetch = await explorer_fetch(
        config, method, client, Receiver(core.load_weights, receiver, model_path),
        fanout=core.settings.relay_fanout,
    )  # fmt: skip
    inflight = config.explorer.inflight_weight_update and config.mode != "serve"
    if inflight:  # the gate and the in-flight follower share one fetch (inflight.py)
        fetch = serialised(fetch, lambda: core.model_version)
    if config.mode == "both":
        trainer_step = await _trainer_step(client, config.synchronizer.sync_timeout)
        core.rewind_to(trainer_step)
    await client.register(step=core.step, model_version=core.model_version)
    await client.start()
    # with fan-out the waits go to the parent's relay (version notices down the tree)
    core.gate = ExplorerSyncGate(
        client, fetch, method=method, tree=tree_wait(client, core.settings.sync_plan)
    )
    if inflight:
        core.inflight = InflightFollower(
            client, fetch, method, lambda: core.model_version,
            interval=core.settings.sync_plan.interval, timeout_s=core.settings.sync_timeout,
        )  # fmt: skip
    core.until_run_ends = core.settings.sync_plan.explores_until_run_ends()
    return client


async def _trainer_step(client: SyncClient, timeout_s: float) -> int:
    """The step of the run's trainer, once one has registered (waits up to `timeout_s`)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    backoff = Backoff()
    while True:
        try:
            state = await client.get_run_state()
            trainers = [m for m in state.members if m.role == synchronizer_pb2.MEMBER_ROLE_TRAINER]
            alive = [m for m in trainers if m.status not in _GONE]
            if alive:
                return int(alive[0].step)
        except grpc.aio.AioRpcError as exc:
            await synchronizer_away(exc)  # not yet registered: nothing to register again
        if loop.time() + backoff.delay > deadline:
            raise SyncWaitTimeout(
                f"no trainer registered with the synchronizer within {timeout_s:g}s "
                "(an explorer of a mode-both run resumes at the trainer's step)"
            )
        await backoff.wait()  # polling the synchronizer with a deadline


async def _auto_run(core: ExplorerCore, client: SyncClient | None) -> None:
    with RunEnd() as end:
        try:
            if core.settings.mode == "bench":
                found = find_checkpoints(core.settings.job_dir, core.settings.bench_on_latest_checkpoint)
                await core.bench(found)
            else:
                await core.explore()
            log.info("done", step=core.step)
            end.code = 0
        except RunFinished:
            log.info("run finished", step=core.step)
            end.code = 0
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            end.code = core.failed(exc, log, step=core.step)
        settle = getattr(core.gate, "settle", None)
        if settle is not None:  # the last load's report goes out before this explorer leaves
            try:
                await settle()
            except Exception as exc:
                log.warning("last sync report failed", error=f"{type(exc).__name__}: {exc}")
        if client is not None and not await client.leave(ok=end.code == 0):
            log.warning("could not report the end to the synchronizer")


def make_build(explorer_id: str | None = None, shard: str | None = None):
    async def build(config: RFTConfig) -> tuple[Sequence[Registration], Callable[[], Awaitable[None]] | None]:
        core = await build_core(config, explorer_id=explorer_id, shard=shard)
        liveness.track("explore step", lambda: core.step)
        endpoint = build_endpoint(config, core) if serves_http(config) else None
        servicer = ExplorerServicer(core, on_shutdown=_stop_process, serve=endpoint and endpoint.core)
        client = await attach_synchronizer(config, core, servicer.weights)
        runner: asyncio.Task[None] | None = None
        if endpoint is not None:
            endpoint.start()
        if config.mode == "serve":
            runner = asyncio.get_running_loop().create_task(follow_run(core, client))
        elif config.explorer.auto_start:
            runner = asyncio.get_running_loop().create_task(_auto_run(core, client))

        async def close() -> None:
            reported = runner is not None and runner.done()
            if endpoint is not None:
                await endpoint.stop()
            await core.stop()
            if runner is not None and not runner.done():
                runner.cancel()
                await asyncio.gather(runner, return_exceptions=True)
            if client is not None:
                if not reported:  # stopped by a signal before its data ended: it may come back
                    await client.stop(common_pb2.MEMBER_STATUS_LOST)
                await client.close()
            await core.close()

        return [registration(servicer)], close

    return build
