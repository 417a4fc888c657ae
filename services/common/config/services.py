"""`services` section: where each service listens, how clients reach it, auth, TLS and the buffer store."""

from __future__ import annotations

import re
from typing import Literal

from pydantic import Field, field_validator

from services.common.config.base import Section

SERVICE_NAMES = ("buffer", "explorer", "trainer", "synchronizer")
MAX_CONSUMER_GROUPS = 16
CONSUMER_GROUP_NAME = re.compile(r"[A-Za-z0-9_.-]{1,64}")


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
    # The consumer groups trainers may read with, created when the buffer starts. Each declared group
    # sees every experience and retention waits for all of them, so a group is never made by a stray read.
    consumer_groups: list[str] = Field(["default"], min_length=1, max_length=MAX_CONSUMER_GROUPS)

    @field_validator("consumer_groups")
    @classmethod
    def _group_names(cls, value: list[str]) -> list[str]:
        for name in value:
            if not CONSUMER_GROUP_NAME.fullmatch(name):
                raise ValueError(
                    f"consumer group name {name!r} must be 1-64 characters of letters, digits, '_', '.', '-'"
                )
        duplicates = sorted({name for name in value if value.count(name) > 1})
        if duplicates:
            raise ValueError(f"consumer group names repeat: {', '.join(duplicates)}")
        return value

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
    # `rft run`: how often each process of a stage is restarted after it fails before the run fails.
    max_restarts: int = Field(3, ge=0)
