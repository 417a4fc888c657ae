"""What every check of a suite shares: the outcome types, a registry of named checks, and the runner
that prints one `PASS|FAIL|SKIP name: reason` line per check and returns the exit code (0 when none
failed, 1 otherwise)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, TextIO

import grpc

CHECK_TIMEOUT_S = 60.0  # one check's whole budget; every wait inside has its own, shorter deadline


class CheckFailed(Exception):
    """The server broke the guarantee; the message is the one-line reason."""


class CheckSkipped(Exception):
    """The guarantee cannot be judged against this server (e.g. auth is off); the message says why."""


@dataclass(frozen=True)
class Check:
    name: str
    run: Callable[[Any], Awaitable[str]]  # returns the PASS reason; raises CheckFailed / CheckSkipped

    @property
    def doc(self) -> str:
        return (self.run.__doc__ or "").strip()


def check(name: str) -> Callable[[Callable[[Any], Awaitable[str]]], Check]:
    """Decorator: make an async function of the suite context into a named `Check`."""

    def wrap(fn: Callable[[Any], Awaitable[str]]) -> Check:
        return Check(name, fn)

    return wrap


def require(condition: bool, reason: str) -> None:
    if not condition:
        raise CheckFailed(reason)


async def expect_error(call: Awaitable[Any], code: grpc.StatusCode, what: str) -> grpc.aio.AioRpcError:
    """Await `call`, which must fail with `code`; the error, or CheckFailed naming `what`."""
    try:
        await call
    except grpc.aio.AioRpcError as exc:
        if exc.code() != code:
            raise CheckFailed(
                f"{what}: expected {code.name}, got {exc.code().name} ({one_line(exc.details())})"
            ) from None
        return exc
    raise CheckFailed(f"{what}: expected {code.name}, the call succeeded")


def one_line(text: str | None, keep: int = 120) -> str:
    text = " ".join((text or "").split())
    return text if len(text) <= keep else text[:keep] + "..."


@dataclass(frozen=True)
class Outcome:
    name: str
    status: str  # PASS | FAIL | SKIP
    reason: str
    seconds: float


async def run_checks(
    checks: Sequence[Check], context: Any, out: TextIO, timeout_s: float = CHECK_TIMEOUT_S
) -> list[Outcome]:
    """Run `checks` one after another (they share the server), printing each outcome as it ends."""
    outcomes = []
    for item in checks:
        start = time.monotonic()
        try:
            status, reason = "PASS", await asyncio.wait_for(item.run(context), timeout_s)
        except CheckFailed as exc:
            status, reason = "FAIL", str(exc)
        except CheckSkipped as exc:
            status, reason = "SKIP", str(exc)
        except TimeoutError:
            status, reason = "FAIL", f"did not finish within {timeout_s:.0f} s"
        except grpc.aio.AioRpcError as exc:
            status, reason = "FAIL", f"unexpected {exc.code().name}: {one_line(exc.details())}"
        outcome = Outcome(item.name, status, one_line(reason, 300), time.monotonic() - start)
        print(f"{outcome.status} {outcome.name}: {outcome.reason}", file=out, flush=True)
        outcomes.append(outcome)
    return outcomes


def exit_code(outcomes: Sequence[Outcome]) -> int:
    return 1 if any(o.status == "FAIL" for o in outcomes) else 0


def summary(outcomes: Sequence[Outcome]) -> str:
    counts = {s: sum(o.status == s for o in outcomes) for s in ("PASS", "FAIL", "SKIP")}
    return (
        f"{len(outcomes)} checks: {counts['PASS']} passed, {counts['FAIL']} failed, "
        f"{counts['SKIP']} skipped ({sum(o.seconds for o in outcomes):.1f} s)"
    )
