"""The `rft top` loop: `--once` prints one frame and returns; otherwise a `rich.live.Live` shows a new
frame every `interval_s` until Ctrl-C."""

from __future__ import annotations

import asyncio
import contextlib

from rich.console import Console
from rich.live import Live

from launcher.top.collect import Collector
from launcher.top.render import render
from launcher.top.targets import Targets


async def _watch(targets: Targets, interval_s: float, once: bool, console: Console) -> None:
    collector = Collector(targets)
    try:
        if once:
            console.print(render(await collector.snapshot()))
            return
        with Live(console=console, auto_refresh=False, screen=False) as live:
            while True:
                live.update(render(await collector.snapshot()), refresh=True)
                await asyncio.sleep(interval_s)  # ok-sleep: the refresh interval
    finally:
        await collector.close()


def watch(
    targets: Targets, interval_s: float = 2.0, once: bool = False, console: Console | None = None
) -> None:
    with contextlib.suppress(KeyboardInterrupt):
        if console is None:  # a pipe or file gets 80 columns by default: too narrow for the tables
            console = Console()
            console = console if console.is_terminal else Console(width=max(console.width, 140))
        asyncio.run(_watch(targets, interval_s, once, console))
