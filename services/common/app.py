"""The skeleton every service's `__main__` shares: parse `--config`/`--set`, load the config, set up
logging and the Prometheus endpoint, start the gRPC server, and stop gracefully on SIGTERM/SIGINT.

    # services/<name>/__main__.py
    sys.exit(service_main("buffer", build_buffer))

`build(config)` returns the servicer registrations and an optional async close hook. A service that
ends by itself (a run that drives itself, `trainer.auto_start` / `explorer.auto_start`) calls
`stop_service(code)`: the same graceful stop as SIGTERM, and `service_main` returns `code` (the
highest code asked for wins, so a failure is never masked by a clean stop asked later). A port that
cannot be bound (`BindError`, e.g. "port N on HOST is in use"; the Prometheus port likewise, naming its
setting; TLS files that cannot be read) ends the process with code 1 and that one line on stderr. A
service that cannot start (a plug-in folder that does not load, an exception while building it) logs
the exception (`failed to start`, with its traceback) and exits 1, or 2 for plug-ins, before it serves;
`rft run` shows that first exception in its failure message.

With tracing on (`monitor.tracing`, or `OTEL_TRACES_EXPORTER=otlp`: services/common/tracing.py) the
tracer is made before the build and flushed at the stop; an OTLP protocol it cannot export exits 2.

Every service also serves `rft.v1.Liveness` (services/common/liveness.py): a heartbeat on its event loop
and the step it is on (`liveness.track(...)` in its build), which `rft run` asks to tell a hung process,
and whether its unit of work in flight moves (services/common/progress.py, `services.progress_timeout`):
while it is stuck the standard health check answers NOT_SERVING.
"""

from __future__ import annotations

import argparse
import asyncio
import errno
import os
import signal
import sys
from collections.abc import Awaitable, Callable, Sequence

from grpc_health.v1 import health_pb2
from prometheus_client import start_http_server

from services.common import liveness, progress, tracing
from services.common.config import ConfigError, RFTConfig, load_config
from services.common.log import configure_logging
from services.common.plugins import PluginError, load_plugin_dirs, python_path, resolve_plugin_dirs
from services.common.rpc.server import (
    BindError,
    PortInUseError,
    Registration,
    ServerHandle,
    serve_until_signal,
    start_server,
)

_EXIT_CODE = [0]
# Set by `stop_service`; the served loop waits on it (with SIGTERM/SIGINT). It exists from before the
# service is built, so a stop asked while starting (an auto-started run failing at once) is kept.
_STOP: list[asyncio.Event | None] = [None]


class StartFailed(Exception):
    """The service could not start; the reason is already logged. `code` is the exit code."""

    def __init__(self, code: int):
        super().__init__(code)
        self.code = code


def stop_service(code: int = 0) -> None:
    """Stop the running service gracefully (as on SIGTERM) and make the process exit with `code`."""
    _EXIT_CODE[0] = max(_EXIT_CODE[0], int(code))
    loop = asyncio.get_running_loop()
    stop = _STOP[0]
    if stop is not None:
        loop.call_soon(stop.set)
    else:
        loop.call_soon(signal.raise_signal, signal.SIGTERM)


class RunEnd:
    """The end of an auto-started run (`with RunEnd() as end: ...; end.code = 0`): when the block ends,
    however (an error on the way out included), the service stops with `end.code`, 1 unless the run set
    it; not when the block is cancelled (the service is already closing)."""

    def __init__(self) -> None:
        self.code = 1

    def __enter__(self) -> RunEnd:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: object) -> None:
        if kind is None or not issubclass(kind, asyncio.CancelledError):
            stop_service(self.code)


def load_service_plugins(config: RFTConfig, config_file: str, cli_dirs: Sequence[str] = ()) -> list[str]:
    """Import the run's plug-in folders (`plugin_dirs`, `--plugin-dir`) and put them on `PYTHONPATH`
    for the processes this one starts; returns the folders. Raises `PluginError`."""
    dirs = resolve_plugin_dirs(config.plugin_dirs, config_file, cli_dirs)
    if dirs:
        load_plugin_dirs(dirs)
        os.environ["PYTHONPATH"] = python_path(dirs, os.environ)
    return dirs


Build = Callable[[RFTConfig], Awaitable[tuple[Sequence[Registration], Callable[[], Awaitable[None]] | None]]]


def _write_port(path: str, port: int) -> None:
    with open(path + ".tmp", "w") as fh:
        fh.write(str(port))
    os.replace(path + ".tmp", path)


def start_metrics_server(host: str, port: int, setting: str = "metrics_port") -> int | None:
    """Serve Prometheus /metrics on `port` (0 = free port, -1 = off); returns the bound port. A port that
    cannot be bound is `PortInUseError` / `BindError` naming `setting`, as for the gRPC port."""
    if port < 0:
        return None
    try:
        server, _thread = start_http_server(port, addr=host)
    except OSError as exc:
        fix = f"set {setting} to a free port, 0 for any free port or -1 for no metrics endpoint"
        if exc.errno == errno.EADDRINUSE:
            raise PortInUseError(
                errno.EADDRINUSE, f"metrics port {port} on {host} is in use; {fix}"
            ) from None
        reason = exc.strerror or exc
        raise BindError(
            exc.errno or 0, f"could not serve metrics on {host}:{port}: {reason}; {fix}"
        ) from None
    return int(server.server_port)


def parse_args(service: str, argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog=f"python -m services.{service}", description=f"Run the {service} service."
    )
    parser.add_argument("--config", required=True, help="run config YAML")
    parser.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE", help="override a config key"
    )
    parser.add_argument("--port", type=int, default=None, help="listen port (overrides services.<svc>.port)")
    parser.add_argument("--port-file", default=None, help="write the bound port to this file once serving")
    parser.add_argument(
        "--plugin-dir", action="append", default=[], dest="plugin_dirs", metavar="DIR",
        help="a folder of plug-in modules to import at start (repeatable; adds to plugin_dirs)",
    )  # fmt: skip
    return parser.parse_args(argv)


async def run_service(
    service: str,
    config: RFTConfig,
    build: Build,
    port: int | None,
    port_file: str | None,
    plugins: Callable[[], object] | None = None,
) -> None:
    endpoint = getattr(config.services, service)
    log = configure_logging(service, run=config.name, level=config.log.level, fmt=config.log.format)
    stop = _STOP[0] = asyncio.Event()
    try:  # before the build: the channels it opens carry the trace context
        tracing.setup_tracing(service, config.monitor.tracing)
    except tracing.TracingSetupError as exc:
        log.error("cannot trace", error=str(exc))
        raise StartFailed(2) from exc
    try:
        if plugins is not None:
            plugins()
    except PluginError as exc:
        log.exception("cannot load plug-ins", error=f"{type(exc).__name__}: {exc}")
        raise StartFailed(2) from exc
    try:
        registrations, close = await build(config)
    except Exception as exc:
        log.exception("failed to start", error=f"{type(exc).__name__}: {exc}")
        raise StartFailed(1) from exc
    setting = f"services.{service}.metrics_port (or RFT_{service.upper()}_METRICS_PORT)"
    try:
        metrics_port = start_metrics_server(endpoint.host, endpoint.metrics_port, setting)
        handle = await start_server(
            [*registrations, liveness.registration()],
            host=endpoint.host,
            port=endpoint.port if port is None else port,
            auth_token=config.services.auth_token,
            tls=config.services.tls,
            max_message_bytes=config.services.max_message_bytes,
        )
    except BindError as exc:
        log.error("cannot listen", error=str(exc))
        if close is not None:
            await close()
        raise
    if port_file:
        _write_port(port_file, handle.port)
        if metrics_port is not None:  # `run/<name>.port` -> `run/<name>.metrics_port`
            _write_port(os.path.splitext(port_file)[0] + ".metrics_port", metrics_port)
    progress.configure(config.services.progress_timeout)
    heartbeat = liveness.PROCESS.start(health_follows_work(handle, log))
    log.info("serving", port=handle.port, metrics_port=metrics_port, services=handle.service_names)
    try:
        await serve_until_signal(handle, on_stop=close, stop_event=stop)
    finally:
        await liveness.stop_heartbeat(heartbeat)
        await asyncio.to_thread(tracing.shutdown_tracing)  # the last spans go out
    log.info("stopped")


def health_follows_work(handle: ServerHandle, log=None) -> Callable[[bool], Awaitable[None]]:
    """The heartbeat's `on_stuck`: the standard health check answers NOT_SERVING while the work in flight
    is stuck (what the compose healthcheck and the Kubernetes probe fail on), SERVING once it moves."""

    async def on_stuck(stuck: bool) -> None:
        serving = health_pb2.HealthCheckResponse
        if not handle.stopped.is_set():
            await handle.health.set("", serving.NOT_SERVING if stuck else serving.SERVING)
        if stuck and log is not None:
            log.error("work stuck", stuck=liveness.PROCESS.work().stuck)

    return on_stuck


def service_main(service: str, build: Build, argv: Sequence[str] | None = None) -> int:
    """Entry point of `python -m services.<service>`; returns the process exit code."""
    args = parse_args(service, argv)
    try:
        config = load_config(args.config, overrides=args.set)
    except ConfigError as exc:
        print(exc, file=sys.stderr)
        return 2
    _EXIT_CODE[0] = 0

    def plugins() -> None:
        load_service_plugins(config, args.config, args.plugin_dirs)

    try:
        asyncio.run(run_service(service, config, build, args.port, args.port_file, plugins))
    except BindError as exc:  # e.g. PortInUseError: "port N on HOST is in use"
        print(f"{service}: {exc.strerror}", file=sys.stderr)
        return 1
    except StartFailed as exc:
        return exc.code
    finally:
        _STOP[0] = None
    return _EXIT_CODE[0]
