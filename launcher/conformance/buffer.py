"""The buffer suite: every guarantee of `protos/rft/v1/buffer.proto` a client relies on, as named checks,
run in this order against one server (`rft conformance buffer ADDRESS`)."""

from __future__ import annotations

import sys
from typing import TextIO

from launcher.conformance.buffer_auth import auth_before_parse
from launcher.conformance.buffer_bounds import bounds_lists, bounds_strings
from launcher.conformance.buffer_context import BufferContext
from launcher.conformance.buffer_fencing import fencing, takeover_ack_and_keep
from launcher.conformance.buffer_lease import lease_whole_groups
from launcher.conformance.buffer_put import put_exactly_once
from launcher.conformance.buffer_settle import ack_idempotent, redelivery_after_expiry, redelivery_after_nack
from launcher.conformance.harness import run_suite

CHECKS = (
    put_exactly_once,
    lease_whole_groups,
    ack_idempotent,
    redelivery_after_nack,
    redelivery_after_expiry,
    fencing,
    takeover_ack_and_keep,
    bounds_strings,
    bounds_lists,
    auth_before_parse,
)
DEFAULT_GROUP = "conformance"


async def run_buffer_suite(
    address: str, auth_token: str | None = None, group: str = DEFAULT_GROUP, out: TextIO | None = None
) -> int:
    """Run every check against the buffer at `address`; 0 all passed (or skipped), 1 a check failed or
    the server cannot be used, 2 the suite cannot run as asked (a group not declared, a token needed)."""
    out = out or sys.stdout
    ctx = BufferContext(address, group, auth_token or None)
    return await run_suite(
        ctx,
        CHECKS,
        out,
        lambda: f"buffer conformance: {address}, consumer group {group!r}, run tag {ctx.tag}",
    )
