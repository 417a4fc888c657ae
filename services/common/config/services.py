"""`services` section: where each service listens, how clients reach it, auth, TLS and the buffer store."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator

from services.common.config.base import Section

SERVICE_NAMES = ("buffer", "explorer", "trainer", "synchronizer")


class Endpoint(Section):
    """One service's listening socket (`host`, `port`; 0 = any free port) and the address clients dial."""

    host: str = "127.0.0.1"
    port: int = Field(0, ge=0, le=65535)
    # host:port clients use; empty = host:port above.
    address: str = ""
    # Prometheus /metrics port; 0 = any free port, -1 = off.
    metrics_port: int = Field(-1, ge=-1, le=65535)

    @property
    def target(self) -> str:
        return self.address or f"{self.host}:{self.port}"


class TLSConfig(Section):
    """Server certificate and key; `ca_file` also makes clients verify the server."""

    cert_file: str | None = None
    key_file: str | None = None
    ca_file: str | None = None

    @property
    def enabled(self) -> bool:
        return bool(self.cert_file and self.key_file)


class BufferEndpoint(Endpoint):
    """The buffer service plus its store: `memory` (in-process) or `redis` (Redis Streams at `redis_url`)."""

    store: Literal["memory", "redis"] = "memory"
    redis_url: str = "redis://127.0.0.1:6379/0"
    stream_prefix: str = "rft"
    # What a full buffer does: refuse with RESOURCE_EXHAUSTED, or make the producer wait.
    on_full: Literal["reject", "wait"] = "reject"
    lease_ms: int = Field(600_000, ge=100)
    max_batch_bytes: int = Field(64 << 20, ge=1 << 10)
    max_batch_experiences: int = Field(65536, ge=1)

    @field_validator("redis_url")
    @classmethod
    def _redis_scheme(cls, value: str) -> str:
        if not value.startswith(("redis://", "rediss://", "unix://")):
            raise ValueError(f"{value!r} must start with redis://, rediss:// or unix://")
        return value


class ServicesConfig(Section):
    buffer: BufferEndpoint = BufferEndpoint()
    explorer: Endpoint = Endpoint()
    trainer: Endpoint = Endpoint()
    synchronizer: Endpoint = Endpoint()
    # Bearer token every RPC must carry when set (UNAUTHENTICATED otherwise).
    auth_token: str | None = None
    tls: TLSConfig = TLSConfig()
    # Client deadline for unary calls, seconds.
    rpc_timeout: float = Field(30.0, gt=0)
    max_message_bytes: int = Field(64 << 20, ge=4 << 20)
