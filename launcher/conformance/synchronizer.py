"""The synchronizer suite: every guarantee of `protos/rft/v1/synchronizer.proto` a member relies on, as
named checks, run in this order against one synchronizer no run uses (`rft conformance synchronizer
ADDRESS`). Checks of one sync_method (push/pull for memory, the rendezvous for nccl) SKIP under another."""

from __future__ import annotations

import sys
from typing import TextIO

from launcher.conformance.harness import run_suite
from launcher.conformance.synchronizer_bounds import auth_before_parse, bounds
from launcher.conformance.synchronizer_context import SyncContext
from launcher.conformance.synchronizer_members import heartbeat, register, roles_and_methods, unknown_member
from launcher.conformance.synchronizer_plan import sync_plan
from launcher.conformance.synchronizer_versions import versions_monotonic, wait_for_version
from launcher.conformance.synchronizer_weights import push_pull_weights, rendezvous

CHECKS = (
    register,
    unknown_member,
    heartbeat,
    roles_and_methods,
    versions_monotonic,
    wait_for_version,
    sync_plan,
    push_pull_weights,
    rendezvous,
    bounds,
    auth_before_parse,
)


async def run_synchronizer_suite(
    address: str, auth_token: str | None = None, out: TextIO | None = None
) -> int:
    """Run every check against the synchronizer at `address`; 0 all passed (or skipped), 1 a check failed
    or the server cannot be used, 2 the suite cannot run as asked (live members, a token needed)."""
    out = out or sys.stdout
    ctx = SyncContext(address, auth_token or None)
    return await run_suite(
        ctx,
        CHECKS,
        out,
        lambda: (
            f"synchronizer conformance: {address}, sync_method {ctx.method}, {ctx.style} plan "
            f"(interval {ctx.interval}, offset {ctx.offset}), run tag {ctx.tag}"
        ),
    )
