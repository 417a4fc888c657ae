"""`services` section: where each service listens, how clients reach it, auth, TLS and the buffer store."""

from __future__ import annotations

import re
from typing import Literal

from pydantic import Field, field_validator, model_validator

from services.common.config.base import Section

SERVICE_NAMES = ("buffer", "explorer", "trainer", "synchronizer")
MAX_CONSUMER_GROUPS = 16
MIN_LIVENESS_TIMEOUT_S = 3.0
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
    """TLS for every service of the run (one section: each service is a server and a client of the others).

    `cert_file` + `key_file` turn TLS on: every server serves them and every client dials TLS, verifying
    the server with `ca_file` (gRPC's default roots when unset). `client_auth: true` is mutual TLS: the
    servers also require a client certificate signed by `ca_file`, which the clients present:
    `client_cert_file` + `client_key_file`, or else `cert_file` + `key_file` (a certificate made for
    both ends: extended key usage serverAuth and clientAuth, or none). With only `ca_file` (no server
    files) the servers stay plaintext and the clients dial TLS: a client of a TLS deployment elsewhere.
    """

    cert_file: str | None = None
    key_file: str | None = None
    ca_file: str | None = None
    client_auth: bool = False
    client_cert_file: str | None = None
    client_key_file: str | None = None

    @model_validator(mode="after")
    def _complete(self) -> TLSConfig:
        for cert, key in (("cert_file", "key_file"), ("client_cert_file", "client_key_file")):
            have = [name for name in (cert, key) if getattr(self, name)]
            if len(have) == 1:
                missing = key if have[0] == cert else cert
                raise ValueError(
                    f"{have[0]} is set but {missing} is not: a certificate needs "
                    f"its private key; set both (or neither)"
                )
        if self.client_auth and not (self.ca_file and self.enabled):
            missing = (
                "ca_file (the CA that signs the client certificates)"
                if not self.ca_file
                else "cert_file and key_file (the servers' certificate: mutual TLS is TLS first)"
            )
            raise ValueError(f"client_auth: true needs {missing}; set it, or client_auth: false")
        return self

    @property
    def enabled(self) -> bool:
        """Whether the servers serve TLS."""
        return bool(self.cert_file and self.key_file)

    @property
    def client_tls(self) -> bool:
        """Whether clients dial TLS."""
        return self.enabled or bool(self.ca_file)

    @property
    def client_identity(self) -> tuple[str, str] | None:
        """(certificate, key) the clients present when a server asks for one."""
        if self.client_cert_file and self.client_key_file:
            return self.client_cert_file, self.client_key_file
        if self.cert_file and self.key_file:
            return self.cert_file, self.key_file
        return None


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
    # `rft run`: seconds a ready service may go without answering its liveness check (rft.v1.Liveness,
    # answered by its event loop) before it is declared hung, SIGKILLed and restarted like a crashed one
    # (it counts against `max_restarts`). Not asked before a service is first ready (a long model load
    # or vLLM start is `rft run`'s ready timeout's), nor while a restarted one gets ready. 0 = off.
    liveness_timeout: float = Field(120.0, ge=0)
    # Seconds a service's unit of work in flight (a trainer step on any rank, a generate call, a weight
    # load, a buffer commit) may go without moving while its event loop still answers (a thread blocked
    # in a collective whose peer rank is stopped, a generate call that never returns) before the service
    # is stuck: `rft run` then kills and restarts it as hung (the trainer with all its ranks), logging the
    # stuck thread's Python stack, and its health check answers NOT_SERVING (compose, Kubernetes). The
    # floor of a limit sized by the work: each unit may take 3x the longest recent unit of its kind, so a
    # slow step on a loaded machine is not killed. Also how long a trainer rank > 0 may leave its progress
    # record unwritten (stopped). Judged through the liveness check: needs `liveness_timeout` > 0. 0 = off.
    progress_timeout: float = Field(900.0, ge=0)

    @field_validator("liveness_timeout", "progress_timeout")
    @classmethod
    def _liveness_window(cls, value: float) -> float:
        if 0 < value < MIN_LIVENESS_TIMEOUT_S:
            raise ValueError(
                f"{value} is too short to tell a hung service from a busy one: 0 (off) or at least "
                f"{MIN_LIVENESS_TIMEOUT_S:g} seconds"
            )
        return value
