"""One builder for every service's `grpc.aio` server: health service, reflection, 64 MiB messages,
optional bearer token and TLS (mutual with `services.tls.client_auth`), and a graceful stop on
SIGTERM/SIGINT.

Interceptors run in this order: the trace context (only while tracing is on: trace_context.py), the
bearer token (a refused call's body is never parsed), then `DecodeErrorInterceptor` (undecodable request
bytes, and a string or list over its bound -> INVALID_ARGUMENT). SO_REUSEPORT is off: grpc turns it on by
default, which lets a second server bind a port in use, report "serving" and silently split the clients
between two processes (two buffers, two stores); here that is `PortInUseError`.
"""

from __future__ import annotations

import asyncio
import errno
import signal
import socket
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from services.common import tracing
from services.common.config.services import TLSConfig
from services.common.rpc.auth import BearerTokenServerInterceptor
from services.common.rpc.client import DEFAULT_MAX_MESSAGE_BYTES, channel_options
from services.common.rpc.decode import DecodeErrorInterceptor
from services.common.rpc.trace_context import TraceServerInterceptor
from services.common.tls import TLSFileError, read_tls_file

# (add_XServicer_to_server function, servicer instance, full service name e.g. "rft.v1.BufferService")
Registration = tuple[Callable[[Any, grpc.aio.Server], None], Any, str]


@dataclass
class ServerHandle:
    """A started server: its bound port, the health servicer, and a stop that flips health first."""

    server: grpc.aio.Server
    port: int
    health: health.aio.HealthServicer
    service_names: list[str]
    stopped: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    async def stop(self, grace: float = 5.0) -> None:
        """Mark NOT_SERVING, let in-flight RPCs finish for up to `grace` seconds, then stop."""
        if self.stopped.is_set():
            return
        for name in ["", *self.service_names]:
            await self.health.set(name, health_pb2.HealthCheckResponse.NOT_SERVING)
        await self.server.stop(grace)
        self.stopped.set()


class BindError(OSError):
    """The server could not listen on its host:port; `strerror` is the readable reason."""


class PortInUseError(BindError):
    """The server's port is taken by another process: a startup error, never a shared port."""


def _bind_error(host: str, port: int) -> BindError:
    """Why binding `host:port` failed (grpc only logs it): probe the address with a plain socket."""
    bare = host.strip("[]")
    try:
        family, kind, proto, _, address = socket.getaddrinfo(bare, port, type=socket.SOCK_STREAM)[0]
        with socket.socket(family, kind, proto) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as grpc does
            probe.bind(address)
    except OSError as exc:
        if exc.errno == errno.EADDRINUSE:
            return PortInUseError(errno.EADDRINUSE, f"port {port} on {host} is in use")
        return BindError(exc.errno, f"could not bind gRPC server to {host}:{port}: {exc.strerror or exc}")
    return BindError(0, f"could not bind gRPC server to {host}:{port}")


class TLSSetupError(BindError):
    """The server's TLS files cannot be read: a startup error naming the setting and the path."""


def _server_credentials(tls: TLSConfig) -> grpc.ServerCredentials:
    """The server's certificate and key; with `client_auth`, client certificates signed by `ca_file`
    are required (a client without one, or with one that does not verify, is refused in the handshake)."""
    try:
        cert = read_tls_file(tls.cert_file, "services.tls.cert_file")  # type: ignore[arg-type]
        key = read_tls_file(tls.key_file, "services.tls.key_file")  # type: ignore[arg-type]
        roots = read_tls_file(tls.ca_file, "services.tls.ca_file") if tls.client_auth else None  # type: ignore[arg-type]
    except TLSFileError as exc:
        raise TLSSetupError(exc.errno or 0, exc.strerror or str(exc)) from None
    return grpc.ssl_server_credentials(
        [(key, cert)], root_certificates=roots, require_client_auth=tls.client_auth
    )


async def start_server(
    registrations: Sequence[Registration],
    *,
    host: str = "127.0.0.1",
    port: int = 0,
    auth_token: str | None = None,
    tls: TLSConfig | None = None,
    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
) -> ServerHandle:
    """Build and start a server with the given servicers, health and reflection; port 0 picks a free port.

    Raises `PortInUseError` ("port N on HOST is in use") when another process holds the port, and
    `TLSSetupError` (naming the setting) when a TLS file cannot be read."""
    interceptors: list[grpc.aio.ServerInterceptor] = []
    if tracing.enabled():  # outermost: a refused call has its span too
        interceptors.append(TraceServerInterceptor())
    if auth_token:
        interceptors.append(BearerTokenServerInterceptor(auth_token))
    interceptors.append(DecodeErrorInterceptor())
    options = [*channel_options(max_message_bytes), ("grpc.so_reuseport", 0)]
    server = grpc.aio.server(options=options, interceptors=interceptors)
    names = []
    for add_fn, servicer, name in registrations:
        add_fn(servicer, server)
        names.append(name)
    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    reflection.enable_server_reflection(
        [*names, health_pb2.DESCRIPTOR.services_by_name["Health"].full_name, reflection.SERVICE_NAME], server
    )
    bind = f"{host}:{port}"
    credentials = _server_credentials(tls) if tls is not None and tls.enabled else None
    try:
        if credentials is not None:
            bound = server.add_secure_port(bind, credentials)
        else:
            bound = server.add_insecure_port(bind)
    except RuntimeError:  # grpc: "Failed to bind to address ..."; the reason is only in its log
        bound = 0
    if bound == 0:
        raise _bind_error(host, port)
    await server.start()
    for name in ["", *names]:
        await health_servicer.set(name, health_pb2.HealthCheckResponse.SERVING)
    return ServerHandle(server=server, port=bound, health=health_servicer, service_names=names)


async def serve_until_signal(
    handle: ServerHandle,
    *,
    grace: float = 5.0,
    on_stop: Callable[[], Awaitable[None]] | None = None,
    stop_event: asyncio.Event | None = None,
) -> None:
    """Run until SIGTERM/SIGINT (or `stop_event`), then stop gracefully: health flips to NOT_SERVING,
    in-flight RPCs get up to `grace` seconds, and only then `on_stop` closes what they were using."""
    loop = asyncio.get_running_loop()
    stop = stop_event or asyncio.Event()
    installed = []
    for sig in (signal.SIGTERM, signal.SIGINT):
        try:
            loop.add_signal_handler(sig, stop.set)
            installed.append(sig)
        except (NotImplementedError, RuntimeError):  # not the main thread / not supported
            pass
    try:
        await stop.wait()
        await handle.stop(grace)
        if on_stop is not None:
            await on_stop()
    finally:
        for sig in installed:
            loop.remove_signal_handler(sig)
