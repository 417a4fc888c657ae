"""Assembles the synchronizer from the run config: the core with the `synchronizer` section's plan,
method and timeouts, its heartbeat watchdog started, and what `service_main` serves. The core's
events (register, wait, publish, ready, reported, lost, left, generation, ...) are appended, one
JSON object a line, to `<job_dir>/synchronizer/events.jsonl`: the run's sync history, in order."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import signal
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path

from prometheus_client import REGISTRY

from services.common import liveness
from services.common.config import RFTConfig, resolve
from services.common.rpc.server import Registration
from services.synchronizer.core import SynchronizerCore
from services.synchronizer.members import Event
from services.synchronizer.metrics import SynchronizerCollector
from services.synchronizer.servicer import registration
from services.synchronizer.settings import SynchronizerSettings


class EventLog:
    """Appends events as JSON lines (with wall time), flushed per line so readers see them at once."""

    def __init__(self, path: Path):
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._fh = path.open("a", encoding="utf-8")

    def __call__(self, event: Event) -> None:
        self._fh.write(json.dumps({"time": time.time(), **dataclasses.asdict(event)}) + "\n")
        self._fh.flush()

    def close(self) -> None:
        self._fh.close()


def build_core(config: RFTConfig, on_event: Callable[[Event], None] | None = None) -> SynchronizerCore:
    return SynchronizerCore(SynchronizerSettings.from_config(config), on_event=on_event)


async def build(config: RFTConfig) -> tuple[Sequence[Registration], Callable[[], Awaitable[None]] | None]:
    events = EventLog(resolve(config).job_dir / "synchronizer" / "events.jsonl")
    collector: SynchronizerCollector | None = None

    def on_event(event: Event) -> None:
        events(event)
        if collector is not None:
            collector.count(event)

    core = build_core(config, on_event=on_event)
    collector = SynchronizerCollector(core, asyncio.get_running_loop())
    REGISTRY.register(collector)
    await core.start()
    liveness.track("model version", lambda: core.published.version)

    async def close() -> None:
        REGISTRY.unregister(collector)
        await core.close()
        events.close()

    return [registration(core, on_shutdown=lambda: signal.raise_signal(signal.SIGTERM))], close
