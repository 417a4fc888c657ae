"""The SDK's sessions in this process: created, kept alive by heartbeats, finished, listed.

A session holds the metadata its client gave (`user_metadata`, `display_name`, `tags`), the sampling
sessions opened in it, and for each sampling session the clone ids handed out to unpickled
`SamplingClient`s (`join_sampling_session`; the original client is clone 0). A finished session
(`ServiceClient.close()`, or leaving its `with` block) takes no new training or sampling clients;
the first finish reason stays. Nothing here outlives the process: after a restart every id is unknown.
"""

from __future__ import annotations

import itertools
import uuid
from dataclasses import dataclass, field
from typing import Any


class SessionError(ValueError):
    """An unknown or finished session."""


@dataclass
class Session:
    user_metadata: dict[str, str] | None = None
    display_name: str | None = None
    tags: list[str] = field(default_factory=list)
    heartbeats: int = 0
    finished: str | None = None  # the finish reason (success, errored, interrupted)
    samplers: list[str] = field(default_factory=list)


class Sessions:
    def __init__(self) -> None:
        self._sessions: dict[str, Session] = {}
        self._clones: dict[str, itertools.count[int]] = {}  # sampling session -> next clone id

    def __contains__(self, session_id: object) -> bool:
        return session_id in self._sessions

    def create(self, body: dict[str, Any]) -> str:
        sid = f"session-{uuid.uuid4().hex[:12]}"
        meta = body.get("user_metadata")
        self._sessions[sid] = Session(
            user_metadata={str(k): str(v) for k, v in meta.items()} if meta else None,
            display_name=body.get("display_name"),
            tags=list(body.get("tags") or []),
        )
        return sid

    def get(self, session_id: str) -> Session:
        if session_id not in self._sessions:
            raise SessionError(
                f"unknown session {session_id!r} (the server restarted?); create a new ServiceClient"
            )
        return self._sessions[session_id]

    def live(self, session_id: str) -> Session:
        """The session, if it may still open clients; SessionError when unknown or finished."""
        session = self.get(session_id)
        if session.finished:
            raise SessionError(
                f"session {session_id!r} is finished ({session.finished}); create a new ServiceClient"
            )
        return session

    def heartbeat(self, session_id: str) -> None:
        self.get(session_id).heartbeats += 1

    def finish(self, session_id: str, reason: str) -> None:
        session = self.get(session_id)
        session.finished = session.finished or reason

    def add_sampler(self, session_id: str, sampler_id: str) -> None:
        self.get(session_id).samplers.append(sampler_id)

    def join(self, sampler_id: str) -> int:
        """A new clone id (1, 2, ...) of a sampling session the caller checked exists."""
        return next(self._clones.setdefault(sampler_id, itertools.count(1)))

    def ids(self, limit: int, offset: int) -> list[str]:
        """Session ids, the newest first."""
        newest = list(reversed(self._sessions))
        return newest[offset : offset + limit] if limit > 0 else []
