"""The explorer suite's connection: an `ExplorerService` stub with the token, and whether the suite may
drive the explorer (`--drive`).

Isolation. Most checks change nothing: Status, refused requests (bounds, malformed weight streams, calls of
serve mode on an explorer that does not serve), auth. The checks that run explore and eval steps, or touch
the weight-sync group, act on the explorer and, through it, on its buffer (an explore step puts real
experiences there): they run only with `--drive`, for an explorer of the suite's own (else SKIP).
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field

import grpc
from rft.v1 import explorer_pb2, explorer_pb2_grpc

from launcher.conformance.harness import (
    CALL_TIMEOUT_S,
    CheckSkipped,
    Connected,
    setup_error,
)

STEP_TIMEOUT_S = 50.0  # an explore or eval call runs rollouts


@dataclass
class ExplorerContext(Connected):
    address: str
    auth_token: str | None = None
    drive: bool = False
    tag: str = field(default_factory=lambda: uuid.uuid4().hex[:8])

    def __post_init__(self) -> None:
        self.stub = explorer_pb2_grpc.ExplorerServiceStub(self.connect())
        self.explorer_id = ""

    async def preflight(self) -> None:
        """Status: reachable and authorised; else SetupError."""
        try:
            self.explorer_id = (await self.status()).explorer_id
        except grpc.aio.AioRpcError as exc:
            raise setup_error(exc, "explorer", self.address) from None

    def driving(self) -> None:
        """SKIP the calling check unless the suite may drive the explorer."""
        if not self.drive:
            raise CheckSkipped(
                "acts on the explorer and its buffer: pass --drive for an explorer of the suite's own"
            )

    async def status(self) -> explorer_pb2.ExplorerStatus:
        return await self.stub.Status(explorer_pb2.ExplorerStatusRequest(), timeout=CALL_TIMEOUT_S)
