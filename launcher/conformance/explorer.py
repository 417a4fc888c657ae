"""The explorer suite: every guarantee of `protos/rft/v1/explorer.proto` a caller relies on, as named checks,
run in this order against one explorer (`rft conformance explorer ADDRESS [--drive]`). Without `--drive`
only checks that change nothing run; the others SKIP."""

from __future__ import annotations

import sys
from typing import TextIO

from launcher.conformance.explorer_calls import (
    auth_before_parse,
    bounds,
    serve_calls,
    weight_group_calls,
    weights_refused,
)
from launcher.conformance.explorer_context import ExplorerContext
from launcher.conformance.explorer_steps import eval_tasksets, explore_steps, status
from launcher.conformance.harness import run_suite

CHECKS = (
    status,
    explore_steps,
    eval_tasksets,
    weights_refused,
    weight_group_calls,
    serve_calls,
    bounds,
    auth_before_parse,
)


async def run_explorer_suite(
    address: str, auth_token: str | None = None, drive: bool = False, out: TextIO | None = None
) -> int:
    """Run every check against the explorer at `address`; 0 all passed (or skipped), 1 a check failed or
    the server cannot be used, 2 the suite cannot run as asked (a token needed)."""
    out = out or sys.stdout
    ctx = ExplorerContext(address, auth_token or None, drive)
    mode = "driving it" if drive else "read-only (no --drive)"
    return await run_suite(
        ctx,
        CHECKS,
        out,
        lambda: f"explorer conformance: {address}, explorer {ctx.explorer_id!r}, {mode}, run tag {ctx.tag}",
    )
