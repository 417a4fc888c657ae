"""Assembles the buffer from the run config: picks the store by name (`services.buffer.store`), builds
the core with the section's limits, declared consumer groups and the model's vocabulary size (read from
`model.model_path`'s config.json; without the folder, a warning and each batch's own vocab_size),
registers the Prometheus collector, and returns what `service_main` serves."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence

from prometheus_client import REGISTRY

from services.buffer import in_process_store, redis_store  # noqa: F401 - register the stores
from services.buffer.core import BufferCore
from services.buffer.metrics import BufferCollector
from services.buffer.replay_store import ReplayStore
from services.buffer.servicer import registration
from services.buffer.settings import BufferSettings
from services.buffer.store import STORES
from services.common import liveness
from services.common.config import RFTConfig
from services.common.log import get_logger
from services.common.model_folder import ModelLoadError, read_vocab_size
from services.common.rpc.server import Registration

log = get_logger("buffer")


def model_vocab_size(model_path: str) -> int:
    """The model's vocabulary size, or 0 (unknown: token ids are checked against each batch's own
    vocab_size only) with a warning when the folder is not here, e.g. a buffer container without it."""
    try:
        if not model_path:
            raise ModelLoadError("model.model_path is empty")
        return read_vocab_size(model_path)
    except ModelLoadError as exc:
        log.warning("token ids are checked only against each batch's vocab_size", reason=str(exc))
        return 0


def build_core(config: RFTConfig) -> BufferCore:
    endpoint = config.services.buffer
    buffer = config.buffer.trainer_input.experience_buffer
    replay = buffer.replay_buffer
    if replay.enable:
        if endpoint.store != "memory":
            raise ValueError(
                "buffer.trainer_input.experience_buffer.replay_buffer.enable needs services.buffer.store: memory"
            )
        args = replay.priority_fn_args
        store = ReplayStore(
            capacity=buffer.capacity,
            priority_fn=replay.priority_fn,
            decay=float(args.get("decay", 2.0)),
            sigma=float(args.get("sigma", 0.0)),
            reuse_cooldown_s=replay.reuse_cooldown_time,
            use_count_limit=replay.use_count_limit,
        )
    else:
        store = STORES.get(endpoint.store)(endpoint, buffer)
    settings = BufferSettings.from_config(config, vocab_size=model_vocab_size(config.model.model_path))
    return BufferCore(store, settings)


async def build(config: RFTConfig) -> tuple[Sequence[Registration], Callable[[], Awaitable[None]] | None]:
    core = build_core(config)
    await core.start()
    liveness.track("requests handled", lambda: core.handled)
    collector = BufferCollector(core, asyncio.get_running_loop())
    REGISTRY.register(collector)

    async def close() -> None:
        REGISTRY.unregister(collector)
        await core.close()

    return [registration(core)], close
