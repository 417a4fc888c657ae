"""What every check of a suite shares: the outcome types, a registry of named checks, the runner that
prints one `PASS|FAIL|SKIP name: reason` line per check and returns the exit code (0 when none failed,
1 otherwise), and the two checks every service's contract states alike: bounds (`refused`) and auth
before parse (`auth_before_parse_of`)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, TextIO

import grpc

from services.common.rpc import create_channel

CALL_TIMEOUT_S = 10.0  # each suite's calls


class Connected:
    """What every suite's context shares: one channel to the service under test (with the run's
    token and the suites' call timeout), closed with the context."""

    address: str
    auth_token: str | None

    def connect(self) -> grpc.aio.Channel:
        self.channel = create_channel(self.address, auth_token=self.auth_token, timeout_s=CALL_TIMEOUT_S)
        return self.channel

    async def close(self) -> None:
        await self.channel.close()


CHECK_TIMEOUT_S = 60.0  # one check's whole budget; every wait inside has its own, shorter deadline
MAX_MESSAGE_CHARS = 512  # a refusal's message: the field, a why, 64 shown characters and a length
SHOWN_CHARS = 64
GARBAGE = b"\xff\xff\xff\xff\x0f"  # not a protobuf message: a truncated varint of an invalid tag


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


class SetupError(Exception):
    """The suite cannot run against this server; `code` is the exit code (2 usage, 1 runtime)."""

    def __init__(self, message: str, code: int):
        super().__init__(message)
        self.code = code


def setup_error(exc: grpc.aio.AioRpcError, service: str, address: str) -> SetupError:
    """Why the suite cannot use `service` at `address` after its first call failed with `exc`: a missing
    token (exit 2) or anything else (exit 1)."""
    code, details = exc.code(), one_line(exc.details())
    if code == grpc.StatusCode.UNAUTHENTICATED:
        return SetupError(f"{address} wants a token: pass --auth-token ({details})", 2)
    return SetupError(f"cannot use the {service} at {address}: {code.name} ({details})", 1)


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


async def run_suite(context: Any, checks: Sequence[Check], out: TextIO, headline: Callable[[], str]) -> int:
    """A whole suite: `context.preflight()`, the `headline` (read after the preflight, which learns what
    the server runs), every check, the summary; always `context.close()`. Returns the exit code: 0 all
    passed (or skipped), 1 a check failed, or a SetupError's code."""
    import sys

    try:
        await context.preflight()
        print(headline(), file=out)
        outcomes = await run_checks(checks, context, out)
    except SetupError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.code
    finally:
        await context.close()
    print(summary(outcomes), file=out)
    return exit_code(outcomes)


def exit_code(outcomes: Sequence[Outcome]) -> int:
    return 1 if any(o.status == "FAIL" for o in outcomes) else 0


def summary(outcomes: Sequence[Outcome]) -> str:
    counts = {s: sum(o.status == s for o in outcomes) for s in ("PASS", "FAIL", "SKIP")}
    return (
        f"{len(outcomes)} checks: {counts['PASS']} passed, {counts['FAIL']} failed, "
        f"{counts['SKIP']} skipped ({sum(o.seconds for o in outcomes):.1f} s)"
    )


async def refused(call: Awaitable[Any], field: str, value: str = "") -> str:
    """`call` is INVALID_ARGUMENT starting with `field`, at most 512 characters long and echoing at most 64
    characters of `value`; its message."""
    err = await expect_error(call, grpc.StatusCode.INVALID_ARGUMENT, f"over-long {field}")
    details = err.details() or ""
    require(
        details.startswith(field), f"{field}: the message does not start with the field: {details[:80]!r}"
    )
    require(len(details) <= MAX_MESSAGE_CHARS, f"{field}: the message is {len(details)} characters long")
    if len(value) > SHOWN_CHARS:
        run = value[: SHOWN_CHARS + 1]
        require(run not in details, f"{field}: the message echoes more than {SHOWN_CHARS} characters")
    return details


async def _drain(call: Any) -> None:
    async for _ in call:
        pass


async def auth_before_parse_of(
    address: str,
    channel: grpc.aio.Channel,
    token: str | None,
    tag: str,
    service: str,
    probe: tuple[str, bytes],
    unary: Sequence[str],
    client_streams: Sequence[str] = (),
    server_streams: Sequence[str] = (),
    parsed: str = "",
) -> str:
    """Auth before parse for `service` (e.g. `rft.v1.SynchronizerService`): SKIP without a token or when
    `probe` (method, valid body) answers without one; else every method, `unary`, `client_streams` and
    `server_streams`, called with a malformed body without a token and with a wrong one, must be
    UNAUTHENTICATED, and `parsed` (a unary method) called with the token and the same garbage
    INVALID_ARGUMENT (on `channel`, which carries the token). The PASS reason."""
    if not token:
        raise CheckSkipped("no --auth-token given: cannot tell a server with auth on")
    timeout = 10.0
    async with create_channel(address, timeout_s=timeout, retries=2) as bare:
        method, body = probe
        try:
            await bare.unary_unary(f"/{service}/{method}")(body, timeout=timeout)
        except grpc.aio.AioRpcError as exc:
            if exc.code() != grpc.StatusCode.UNAUTHENTICATED:
                raise
        else:
            raise CheckSkipped(f"the server answers {method} without a token: auth is off there")
        for bad in ("", "wrong-" + tag):
            metadata = (("authorization", f"Bearer {bad}"),) if bad else None
            who = "with a wrong token" if bad else "without a token"
            calls: list[tuple[str, Callable[[], Awaitable[Any]]]] = []
            for name in unary:
                call = bare.unary_unary(f"/{service}/{name}")
                calls.append((name, lambda c=call, m=metadata: c(GARBAGE, timeout=timeout, metadata=m)))
            for name in client_streams:
                call = bare.stream_unary(f"/{service}/{name}")
                calls.append(
                    (name, lambda c=call, m=metadata: c(iter([GARBAGE]), timeout=timeout, metadata=m))
                )
            for name in server_streams:
                call = bare.unary_stream(f"/{service}/{name}")
                calls.append(
                    (name, lambda c=call, m=metadata: _drain(c(GARBAGE, timeout=timeout, metadata=m)))
                )
            for name, start in calls:
                await expect_error(
                    start(), grpc.StatusCode.UNAUTHENTICATED, f"{name} {who} and a malformed body"
                )
    count = len(unary) + len(client_streams) + len(server_streams)
    if not parsed:
        return f"{count} methods refused garbage without/with a wrong token"
    call = channel.unary_unary(f"/{service}/{parsed}")
    err = await expect_error(
        call(GARBAGE, timeout=timeout),
        grpc.StatusCode.INVALID_ARGUMENT,
        f"{parsed} with the token and garbage",
    )
    return (
        f"{count} methods refused garbage without/with a wrong token; with it: {one_line(err.details(), 60)}"
    )
