"""A fake service for the launcher's tests: the real skeleton (`services.common.app.service_main`:
config, `--port-file`, gRPC health, `RFT_<SERVICE>_PORT`, graceful stop on SIGTERM) around no servicer,
so `rft run`'s supervisor sees exactly the process interface of the four services, without their
start-up cost.

    python -m tests.support.fake_service SERVICE --config X --port-file P [--events F]
        [--finish-file F] [--crash-file F]

--events F       append `<SERVICE> started <pid>` / `<SERVICE> stopped <pid>` lines to F (the order
                 the processes started and stopped in)
--finish-file F  end by itself with exit code 0 once F exists (a trainer that reached total_steps)
--crash-file F   exit at once with the code written in F once F exists (a crash; again after a restart)
--wedge-file F   run "generate calls" in a worker thread (services/common/progress.py units), each
                 taking a multiprocessing lock shared with a helper process; once F exists the helper
                 takes the lock and stops itself (SIGSTOP) holding it, so the next call blocks for good
                 while the event loop answers: a real wedge. The helper's pid goes to F + ".pid".
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import os
import signal
import sys
import threading
import time
from pathlib import Path

from services.common import progress
from services.common.app import service_main, stop_service

WATCH_S = 0.02


def _note(events: str | None, line: str) -> None:
    if events:
        with open(events, "a") as fh:  # one short O_APPEND write: whole lines from several processes
            fh.write(f"{line} {os.getpid()}\n")


async def _watch(finish: Path | None, crash: Path | None) -> None:
    while True:
        if crash is not None and crash.exists():
            text = crash.read_text().strip()
            print(f"crashing with code {text}", flush=True)
            os._exit(int(text or 1))
        if finish is not None and finish.exists():
            stop_service(0)
            return
        await asyncio.sleep(WATCH_S)  # ok-sleep: polling a file the test creates


def _helper(lock, trigger: str) -> None:
    """The process the generate calls share `lock` with: once `trigger` exists it takes the lock and stops."""
    Path(trigger + ".pid").write_text(str(os.getpid()))
    while not os.path.exists(trigger):
        time.sleep(WATCH_S)  # ok-sleep: polling a file the test creates
    lock.acquire()
    os.kill(os.getpid(), signal.SIGSTOP)


def _generate_calls(lock, stop: threading.Event) -> None:
    while not stop.is_set():
        with progress.work("generate call"), lock:
            pass
        stop.wait(WATCH_S)


def _start_wedge(trigger: Path) -> threading.Event:
    ctx = multiprocessing.get_context("spawn")  # no fork of a process that runs gRPC threads
    lock = ctx.Lock()
    ctx.Process(target=_helper, args=(lock, str(trigger)), daemon=True).start()
    stop = threading.Event()
    threading.Thread(target=_generate_calls, args=(lock, stop), name="generate", daemon=True).start()
    return stop


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.support.fake_service")
    parser.add_argument("service")
    parser.add_argument("--events")
    parser.add_argument("--finish-file", type=Path)
    parser.add_argument("--crash-file", type=Path)
    parser.add_argument("--wedge-file", type=Path)
    ours, rest = parser.parse_known_args(argv)
    tasks: list[asyncio.Task[None]] = []

    async def build(config):
        _note(ours.events, f"{ours.service} started")
        tasks.append(asyncio.create_task(_watch(ours.finish_file, ours.crash_file)))
        wedge = _start_wedge(ours.wedge_file) if ours.wedge_file is not None else None

        async def close() -> None:
            _note(ours.events, f"{ours.service} stopped")
            if wedge is not None:
                wedge.set()

        return [], close

    return service_main(ours.service, build, rest)


if __name__ == "__main__":
    sys.exit(main())
