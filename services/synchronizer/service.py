"""Assembles the synchronizer from the run config: the core with the `synchronizer` section's plan,
method and timeouts, its heartbeat watchdog started, and what `service_main` serves."""

from __future__ import annotations

import signal
from collections.abc import Awaitable, Callable, Sequence

from services.common.config import RFTConfig
from services.common.rpc.server import Registration
from services.synchronizer.core import SynchronizerCore
from services.synchronizer.records import Settings
from services.synchronizer.servicer import registration


def build_core(config: RFTConfig) -> SynchronizerCore:
    return SynchronizerCore(Settings.from_config(config.synchronizer))


async def build(config: RFTConfig) -> tuple[Sequence[Registration], Callable[[], Awaitable[None]] | None]:
    core = build_core(config)
    await core.start()
    return [registration(core, on_shutdown=lambda: signal.raise_signal(signal.SIGTERM))], core.close
