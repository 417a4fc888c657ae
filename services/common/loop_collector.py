"""`LoopCollector`: a Prometheus collector for a service whose state lives on its asyncio event loop.

A scrape runs in prometheus_client's HTTP thread, so each one hands `read` (a coroutine) to the
service's loop and waits for it at most `timeout_s`; `families` turns what it read into metric families
(given None, the empty families `describe` lists). Once the loop is closed (the service stopped) a scrape
gives nothing.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

from prometheus_client.registry import Collector


class LoopCollector(Collector):
    def __init__(self, loop: asyncio.AbstractEventLoop, timeout_s: float = 5.0):
        self.loop = loop
        self.timeout_s = timeout_s

    async def read(self) -> Any:
        """The state to export, read on the service's loop."""
        raise NotImplementedError

    def families(self, state: Any | None) -> list:
        """The metric families of `state` (None: none read; the families without samples)."""
        raise NotImplementedError

    def collect(self) -> Iterator:
        if self.loop.is_closed():
            return iter(())
        state = asyncio.run_coroutine_threadsafe(self.read(), self.loop).result(self.timeout_s)
        return iter(self.families(state))

    def describe(self) -> Iterator:
        return iter(self.families(None))
