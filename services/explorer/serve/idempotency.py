"""Retries of the served endpoint answered once: the first answer of an `Idempotency-Key`, replayed.

A client that lost an answer (a dropped connection, a timeout) sends the request again; without this, a
completion would be sampled and recorded twice (two sequences in the session: two experiences for one
episode) and a commit that went through would be refused as committed. A request carrying the
`Idempotency-Key` header (1 to 256 characters) is run once per key and route: a retry with the same key
and the same request gets the first answer (its status, body and headers, plus `Idempotent-Replayed:
true`) and records nothing; a retry that arrives while the first is still running waits for it; the
same key with a different request is refused (422, `param: Idempotency-Key`). A request that failed is
forgotten, so its retry runs again. Commit derives a key from its session ids when none is sent (a
commit of the same sessions can succeed only once, so the first answer is the right one); feedback
sets a value and needs none; completions are never derived (two equal requests may want two samples).
The last `CAPACITY` keys are kept, in memory (an endpoint restarted forgets them; its sessions too).
"""

from __future__ import annotations

import asyncio
import hashlib
from collections import OrderedDict
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field

from pydantic import BaseModel
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from services.explorer.serve.protocol import ServeError

HEADER = "Idempotency-Key"
REPLAYED = "Idempotent-Replayed"
CAPACITY = 10_000  # keys kept, oldest finished ones dropped first


@dataclass
class _Answer:
    status: int
    body: bytes
    media_type: str | None
    headers: dict[str, str]


@dataclass
class _Entry:
    digest: str
    done: asyncio.Future[_Answer] = field(default_factory=lambda: asyncio.get_running_loop().create_future())


class IdempotencyStore:
    """The answers of the last `capacity` idempotency keys (module docstring)."""

    def __init__(self, capacity: int = CAPACITY):
        self.capacity = capacity
        self.replays = 0  # retries answered from the store
        self._entries: OrderedDict[str, _Entry] = OrderedDict()

    async def answer(
        self,
        request: Request,
        route: str,
        body: BaseModel,
        produce: Callable[[], Awaitable[Response]],
        derive: bool = False,
    ) -> Response:
        """`produce()`'s response, or the stored one of the request's key (with `derive`, the
        request's digest stands in for a key it did not send). `body`: the parsed request; with the
        session header it is what makes two requests the same. No key: nothing is computed or kept."""
        given = request.headers.get(HEADER)
        if given is not None and not 0 < len(given) <= 256:
            raise ServeError(400, f"{HEADER}: 1 to 256 characters", HEADER)
        if given is None and not derive:
            return await produce()
        digest = fingerprint(body.model_dump_json(), request.headers.get("x-session-id"))
        key = f"{route} {given if given is not None else f'derived:{digest}'}"
        entry = self._entries.get(key)
        if entry is not None:
            if entry.digest != digest:
                raise ServeError(
                    422, f"{HEADER} {given!r} was used with a different request on {route}; "
                    "send a new key for a new request", HEADER, "idempotency_key_reused",
                )  # fmt: skip
            self._entries.move_to_end(key)
            stored = await asyncio.shield(entry.done)  # the first's error is raised here too
            self.replays += 1
            return Response(
                stored.body, stored.status, {**stored.headers, REPLAYED: "true"}, stored.media_type
            )
        entry = self._entries[key] = _Entry(digest)
        self._evict()
        try:
            response = await produce()
        except BaseException as exc:
            self._fail(key, entry, exc)
            raise
        if isinstance(response, StreamingResponse):
            response.body_iterator = self._recorded(key, entry, response)
            return response
        self._finish(key, entry, response, bytes(response.body))
        return response

    async def _recorded(self, key: str, entry: _Entry, response: StreamingResponse) -> AsyncIterator[bytes]:
        """The stream as sent, kept whole for a replay once it ended (a stream cut short is forgotten)."""
        parts: list[bytes] = []
        try:
            async for chunk in response.body_iterator:
                data = chunk.encode() if isinstance(chunk, str) else bytes(chunk)
                parts.append(data)
                yield data
        except BaseException as exc:
            self._fail(key, entry, exc)
            raise
        if not entry.done.done():
            self._finish(key, entry, response, b"".join(parts))

    def _finish(self, key: str, entry: _Entry, response: Response, body: bytes) -> None:
        if response.status_code >= 400:  # not an answer to keep: forgotten, as a raised error
            self._fail(key, entry, ServeError(response.status_code, body.decode(errors="replace")))
            return
        headers = {k: v for k, v in response.headers.items() if k.lower() not in ("content-length",)}
        entry.done.set_result(_Answer(response.status_code, body, response.media_type, headers))

    def _fail(self, key: str, entry: _Entry, exc: BaseException) -> None:
        if self._entries.get(key) is entry:
            del self._entries[key]
        if not entry.done.done():
            if isinstance(exc, Exception):
                entry.done.set_exception(exc)
                entry.done.exception()  # retrieved: waiters re-raise it, no "never retrieved" warning
            else:
                entry.done.cancel()

    def _evict(self) -> None:
        while len(self._entries) > self.capacity:
            oldest = next(iter(self._entries))
            if not self._entries[oldest].done.done():
                break  # the oldest still runs: keep it (the store grows by those in flight only)
            del self._entries[oldest]


def fingerprint(*parts: str | None) -> str:
    """A digest of what makes two requests the same."""
    return hashlib.sha256("\x00".join(p or "" for p in parts).encode()).hexdigest()
