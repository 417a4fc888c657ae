"""The serve-mode pieces of the explorer service: the endpoint built over the explorer's engines and
sink, and the task that replaces exploring (take new weights until the run finishes, then stop).

`follow_run` replaces the explore loop's sync gate in serve mode: there are no explore steps, so it
runs the member's follow loop (`services.weight_sync.member.follow.follow_versions`) for any version
newer than the one it holds (`WaitForVersion` with `min_version` = held + 1, held counted from the
client's version), fetched with the run's `sync_method` (the gate's fetch), loaded into the engines
between generations and reported. A synchronizer that is away is waited for (one that forgot this
member is registered with again); any other error ends serving. It returns when the run finished
(the trainer reached its `total_steps`).

`mode: serve` starts the endpoint and `follow_run`; `explorer.rollout_model.enable_openai_api` in
another mode starts only the endpoint, next to the usual explore loop (its committed sessions join
the buffer with the workflows' experiences).
"""

from __future__ import annotations

import asyncio
import functools
from pathlib import Path

from services.common.app import stop_service
from services.common.config import RFTConfig, resolve
from services.common.log import get_logger
from services.explorer.core import ExplorerCore
from services.explorer.serve.endpoint_core import EndpointCore
from services.explorer.serve.http_server import HttpServer
from services.explorer.serve.openai_app import build_app
from services.explorer.serve.sessions import SessionStore
from services.weight_sync.member.away import synchronizer_away
from services.weight_sync.member.client import SyncClient
from services.weight_sync.member.follow import follow_versions

log = get_logger("explorer.serve")
LOOPBACK = ("127.0.0.1", "localhost", "::1")


def serves_http(config: RFTConfig) -> bool:
    return config.mode == "serve" or config.explorer.rollout_model.enable_openai_api


class Endpoint:
    """The endpoint core, its FastAPI app and the HTTP server of one explorer."""

    def __init__(self, config: RFTConfig, core: ExplorerCore):
        rollout = config.explorer.rollout_model
        name = rollout.name or Path(rollout.model_path or config.model.model_path or "policy").name
        monitor = core.monitor
        self.core = EndpointCore(
            config, core.engines, core.sink, SessionStore(core.explorer_id, config.explorer.serve.max_open_sessions), name,
            on_commit=monitor.log if monitor is not None else None,
        )  # fmt: skip
        self.http = HttpServer(
            build_app(self.core, config.services.auth_token), config.explorer.serve.host,
            config.explorer.serve.port,
        )  # fmt: skip
        self.run_dir = resolve(config).job_dir / "run"
        self.open_to_all = not config.services.auth_token and config.explorer.serve.host not in LOOPBACK

    def start(self) -> None:
        if self.open_to_all:
            log.warning("the endpoint listens beyond loopback without a token: set services.auth_token "
                        "(RFT_AUTH_TOKEN)", host=self.http.host)  # fmt: skip
        self.http.start()
        self.http.write_url(self.run_dir)
        log.info("serving the OpenAI-compatible endpoint", endpoint=self.http.url, model=self.core.model_name)

    async def stop(self) -> None:
        await self.http.stop()


def build_endpoint(config: RFTConfig, core: ExplorerCore) -> Endpoint:
    return Endpoint(config, core)


async def follow_run(core: ExplorerCore, client: SyncClient | None) -> None:
    """Serve mode's main task: load each new version until the run finishes, then stop the service
    (exit 0; 1 with `explorer failed` when following failed). Without a synchronizer it serves until
    a signal stops it."""
    if client is None:
        return
    fetch = getattr(core.gate, "fetch", None)
    if fetch is None:
        raise RuntimeError("serve mode needs the synchronizer's sync gate (attach_synchronizer)")
    held = client.model_version

    def loaded(version: int) -> None:
        nonlocal held
        held = max(held, version)

    code = 0
    try:
        await follow_versions(
            client, fetch, core.settings.sync_method, lambda: held, timeout_s=core.settings.sync_timeout,
            on_away=functools.partial(synchronizer_away, register=client.register), errors="raise",
            on_loaded=loaded, log=log,
        )  # fmt: skip
        log.info("run finished", model_version=core.model_version)
    except asyncio.CancelledError:
        raise
    except Exception as exc:
        code = core.failed(exc, log)
    if not await client.leave(ok=code == 0):
        log.warning("could not report the end to the synchronizer")
    stop_service(code)
