"""One factory for client channels: 64 MiB messages, wait_for_ready, a default deadline, retries on UNAVAILABLE,
optional TLS and bearer token.

gRPC's retry policy re-sends a call whose server went away before answering, and the server may already
have done the work: only idempotent methods get it. The methods in `NOT_RETRIED` change state on every
call (a lease, a store without a sequence number, a step); a lost reply surfaces to their caller, which
knows how to recover (a fenced buffer consumer opens again and gets the lost lease back)."""

from __future__ import annotations

import json
from pathlib import Path

import grpc

from services.common.config.services import TLSConfig
from services.common.rpc.auth import client_token_interceptors

DEFAULT_MAX_MESSAGE_BYTES = 64 << 20


# Not idempotent: a retry after a lost reply would do the work twice (service -> methods).
NOT_RETRIED: dict[str, tuple[str, ...]] = {
    "rft.v1.BufferService": ("GetBatch", "Put", "PutExperiences"),
    "rft.v1.ExplorerService": ("Explore", "Eval", "Bench"),
    "rft.v1.TrainerService": ("TrainStep", "SyncWeights"),
}


def default_service_config(timeout_s: float = 30.0, max_attempts: int = 5) -> str:
    """gRPC service config: every method waits for the server to be ready and has a deadline; all but
    `NOT_RETRIED` retry UNAVAILABLE with exponential backoff."""
    timeout = f"{timeout_s:.3f}s"
    once = [{"service": service, "method": m} for service, methods in NOT_RETRIED.items() for m in methods]
    return json.dumps(
        {
            "methodConfig": [
                {
                    "name": [{}],
                    "waitForReady": True,
                    "timeout": timeout,
                    "retryPolicy": {
                        "maxAttempts": max_attempts,
                        "initialBackoff": "0.1s",
                        "maxBackoff": "2s",
                        "backoffMultiplier": 2,
                        "retryableStatusCodes": ["UNAVAILABLE"],
                    },
                },
                {"name": once, "waitForReady": True, "timeout": timeout},
            ]
        }
    )


def channel_options(max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES) -> list[tuple[str, object]]:
    return [
        ("grpc.max_send_message_length", max_message_bytes),
        ("grpc.max_receive_message_length", max_message_bytes),
    ]


def create_channel(
    target: str,
    *,
    auth_token: str | None = None,
    tls: TLSConfig | None = None,
    timeout_s: float = 30.0,
    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
    retries: int = 5,
) -> grpc.aio.Channel:
    """An asyncio channel to `target` (host:port). Calls inherit the default deadline `timeout_s` unless
    they pass their own `timeout=`."""
    options = channel_options(max_message_bytes) + [
        ("grpc.enable_retries", 1),
        ("grpc.service_config", default_service_config(timeout_s, retries)),
    ]
    interceptors = client_token_interceptors(auth_token) if auth_token else None
    if tls is not None and tls.ca_file:
        creds = grpc.ssl_channel_credentials(root_certificates=Path(tls.ca_file).read_bytes())
        return grpc.aio.secure_channel(target, creds, options=options, interceptors=interceptors)
    return grpc.aio.insecure_channel(target, options=options, interceptors=interceptors)
