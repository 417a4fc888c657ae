"""One factory for client channels: 64 MiB messages, wait_for_ready, a default deadline, retries on UNAVAILABLE,
optional TLS (with a client certificate for mutual TLS) and bearer token.

gRPC's retry policy re-sends a call whose server went away before answering, and the server may already
have done the work: only idempotent methods get it. The methods in `NOT_RETRIED` change state on every
call (a lease, a store without a sequence number, a step); a lost reply surfaces to their caller, which
knows how to recover (a fenced buffer consumer opens again and gets the lost lease back).

When a unary call fails because the connection never came up (UNAVAILABLE or DEADLINE_EXCEEDED while
the channel's connection attempts fail: TRANSIENT_FAILURE), `TLSDiagnosis` asks
`services.common.tls.handshake_problem` whether TLS is the cause (a refused or untrusted certificate,
TLS on one side only) and, if so, raises UNAUTHENTICATED with the reason instead: gRPC itself reports
these as `Socket closed` or a bare deadline, and a transport error would be retried for minutes where
only the configuration can help. Every client's first call is unary, so streaming calls need no such
diagnosis."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import grpc

from services.common.config.services import TLSConfig
from services.common.rpc.auth import client_token_interceptors
from services.common.rpc.trace_context import client_trace_interceptors
from services.common.tls import handshake_problem, read_tls_file

DEFAULT_MAX_MESSAGE_BYTES = 64 << 20


# Not idempotent: a retry after a lost reply would do the work twice (service -> methods).
NOT_RETRIED: dict[str, tuple[str, ...]] = {
    "rft.v1.BufferService": ("GetBatch", "Put", "PutExperiences"),
    "rft.v1.ExplorerService": ("Explore", "Eval", "Bench"),
    "rft.v1.TrainerService": ("TrainStep", "SyncWeights"),
}

# Long polls: the server holds the call until something happens or the request's own wait ends, and
# the caller sets a deadline past that wait. A service-config timeout would cap it (gRPC uses the
# smaller of the two), so these methods get none.
LONG_POLLS: dict[str, tuple[str, ...]] = {
    "rft.v1.SynchronizerService": ("WaitForVersion", "RequestSync"),
}


def default_service_config(timeout_s: float = 30.0, max_attempts: int = 5) -> str:
    """gRPC service config: every method waits for the server to be ready and has a deadline (but
    `LONG_POLLS`, whose callers set theirs); all but `NOT_RETRIED` retry UNAVAILABLE with exponential
    backoff."""
    timeout = f"{timeout_s:.3f}s"
    once = [{"service": service, "method": m} for service, methods in NOT_RETRIED.items() for m in methods]
    polls = [{"service": service, "method": m} for service, methods in LONG_POLLS.items() for m in methods]
    retry = {
        "maxAttempts": max_attempts,
        "initialBackoff": "0.1s",
        "maxBackoff": "2s",
        "backoffMultiplier": 2,
        "retryableStatusCodes": ["UNAVAILABLE"],
    }
    return json.dumps(
        {
            "methodConfig": [
                {"name": [{}], "waitForReady": True, "timeout": timeout, "retryPolicy": retry},
                {"name": once, "waitForReady": True, "timeout": timeout},
                {"name": polls, "waitForReady": True, "retryPolicy": retry},
            ]
        }
    )


def channel_options(max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES) -> list[tuple[str, object]]:
    return [
        ("grpc.max_send_message_length", max_message_bytes),
        ("grpc.max_receive_message_length", max_message_bytes),
    ]


def channel_credentials(tls: TLSConfig) -> grpc.ChannelCredentials:
    """TLS credentials of a client: the CA bundle that verifies servers (gRPC's default roots when
    `ca_file` is unset) and the client certificate presented when a server asks for one."""
    roots = read_tls_file(tls.ca_file, "services.tls.ca_file") if tls.ca_file else None
    identity = tls.client_identity
    if identity is None:
        return grpc.ssl_channel_credentials(root_certificates=roots)
    cert_setting = "client_cert_file" if tls.client_cert_file else "cert_file"
    key_setting = "client_key_file" if tls.client_key_file else "key_file"
    return grpc.ssl_channel_credentials(
        root_certificates=roots,
        private_key=read_tls_file(identity[1], f"services.tls.{key_setting}"),
        certificate_chain=read_tls_file(identity[0], f"services.tls.{cert_setting}"),
    )


class TLSDiagnosis(grpc.aio.UnaryUnaryClientInterceptor):
    """Turns a unary call that failed to connect because of TLS into UNAUTHENTICATED naming the reason."""

    CODES = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)

    def __init__(self, target: str, tls: TLSConfig | None):
        self.target, self.tls = target, tls
        self.channel: grpc.aio.Channel | None = None  # set once the channel exists

    def _failing(self) -> bool:
        """Whether the channel's connection attempts fail (a hung or busy server is not a TLS problem)."""
        return self.channel is not None and (
            self.channel.get_state(try_to_connect=False) == grpc.ChannelConnectivity.TRANSIENT_FAILURE
        )

    async def problem(self) -> str | None:
        """Why TLS keeps this client from the server, or None."""
        tls = self.tls
        identity = tls.client_identity if tls is not None else None
        return await asyncio.to_thread(
            handshake_problem,
            self.target,
            tls=tls is not None and tls.client_tls,
            ca_file=tls.ca_file if tls is not None else None,
            cert_file=identity[0] if identity else None,
            key_file=identity[1] if identity else None,
        )

    async def intercept_unary_unary(self, continuation, client_call_details, request):  # type: ignore[override]
        call = await continuation(client_call_details, request)
        try:
            return await call
        except grpc.aio.AioRpcError as exc:
            if exc.code() not in self.CODES or not self._failing():
                raise
            problem = await self.problem()
            if problem is None:
                raise
            raise grpc.aio.AioRpcError(
                grpc.StatusCode.UNAUTHENTICATED,
                exc.initial_metadata(),
                exc.trailing_metadata(),
                details=f"TLS: {problem} ({exc.code().name}: {exc.details()})",
                debug_error_string=exc.debug_error_string(),
            ) from None


def create_channel(
    target: str,
    *,
    auth_token: str | None = None,
    tls: TLSConfig | None = None,
    timeout_s: float = 30.0,
    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
    retries: int = 5,
) -> grpc.aio.Channel:
    """An asyncio channel to `target` (host:port): TLS when `tls.client_tls`, else plaintext. Calls
    inherit the default deadline `timeout_s` unless they pass their own `timeout=`. Raises
    `TLSFileError` (naming the setting) when a TLS file cannot be read."""
    options = channel_options(max_message_bytes) + [
        ("grpc.enable_retries", 1),
        ("grpc.service_config", default_service_config(timeout_s, retries)),
    ]
    diagnosis = TLSDiagnosis(target, tls)
    # the trace context first (outermost: its client span covers the TLS diagnosis); none when off
    interceptors: list[Any] = [*client_trace_interceptors(), diagnosis]
    if auth_token:
        interceptors += client_token_interceptors(auth_token)
    if tls is not None and tls.client_tls:
        channel = grpc.aio.secure_channel(
            target, channel_credentials(tls), options=options, interceptors=interceptors
        )
    else:
        channel = grpc.aio.insecure_channel(target, options=options, interceptors=interceptors)
    diagnosis.channel = channel
    return channel
