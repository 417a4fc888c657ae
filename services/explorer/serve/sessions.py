"""The record of every answered call of the served endpoint, grouped into sessions, and how a finished,
rewarded session becomes Experiences.

A session is one conversation of an application: several calls under one session id. A call holds
the prompt token ids the engine saw and, per choice (`n` of them), the sampled token ids and their
log-probs under the sampling distribution (engines/base.py), with the model version that produced them.

Experiences of a session (multi-turn, as `workflows/multi_turn.py`): the endpoint core encodes a prompt that
continues an earlier answer of the session (as text) as that answer's token ids plus the new text
(`continuation`), so the model's tokens are never re-tokenized. A call whose prompt starts with
the full token sequence of an earlier answer (the usual agent loop: the history plus the reply plus
the new user/tool message) continues that answer's sequence. The tokens between the earlier answer and
the new one (template text, tool results, user turns) get `action_mask` False and log-prob 0; the
model's own tokens get mask True and their engine log-probs, so the trainer learns only from what the
model said. Each sequence that no later call continues is one Experience; a session whose calls all
continue each other is exactly one Experience. The `n` choices of one call start `n` sequences that
share a group id (a GRPO group); a call that continues nothing starts a new sequence.

Reward of a sequence: the reward given to its last choice (`feedback` by response id and choice
index), else the session's reward (`feedback` by session id). Commit refuses a session with a sequence
that has neither, an unknown session and one committed before: every session is committed exactly once.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from services.common.experience import Experience, ExperienceId


class SessionError(ValueError):
    """A feedback or commit the store refuses; `status` is the HTTP status, `param` the field."""

    def __init__(self, message: str, *, status: int = 400, param: str = "session_ids", code: str = ""):
        super().__init__(message)
        self.status, self.param, self.code = status, param, code


@dataclass
class Choice:
    """One sampled answer. Shapes: token_ids (R,), logprobs (R,)."""

    index: int
    token_ids: list[int]
    logprobs: list[float]
    model_version: int
    finish_reason: str
    text: str = ""
    reward: float | None = None


@dataclass
class Call:
    """One answered request: the prompt the engine saw and its `n` choices."""

    call_id: str
    prompt_ids: list[int]
    choices: list[Choice]
    prompt_text: str = ""


@dataclass
class Session:
    session_id: str
    calls: list[Call] = field(default_factory=list)
    reward: float | None = None
    state: str = "open"  # open -> committing -> committed (back to open if the sink fails)


@dataclass
class _Sequence:
    tokens: list[int]
    prompt_length: int
    mask: list[bool]
    logprobs: list[float]
    choices: list[Choice]
    group: str
    prompt_text: str
    continued: bool = False


class SessionStore:
    """Calls by session, rewards, and the exactly-once commit. Not thread-safe: one event loop uses it."""

    def __init__(self, explorer_id: str = "explorer", max_open: int = 10000):
        self.explorer_id, self.max_open = explorer_id, max_open
        self.open_count = 0
        self.sessions: dict[str, Session] = {}
        self._calls: dict[str, tuple[str, Call]] = {}
        self.commits = 0

    def check_open(self, session_id: str) -> None:
        """Refuse a call to a committed session (409) or one that would open too many (429)."""
        s = self.sessions.get(session_id)
        if s is not None and s.state != "open":
            raise SessionError(
                f"session {session_id!r} is {s.state}; start a new session id for new calls",
                status=409, param="session_id", code="session_committed",
            )  # fmt: skip
        if s is None and self.open_count >= self.max_open:
            raise SessionError(
                f"{self.open_count} sessions are open (explorer.serve.max_open_sessions); commit some first",
                status=429, param="session_id", code="too_many_sessions",
            )  # fmt: skip

    def continuation(
        self, session_id: str | None, text: str, decode: Callable[[list[int]], str]
    ) -> tuple[list[int], int] | None:
        """(token ids, characters of `text` they cover) of the longest earlier answer of the session
        that the rendered prompt `text` continues, compared as text like `workflows/multi_turn.py`
        (the answer decoded with its special tokens, or as the client saw it); None if none does."""
        s = self.sessions.get(session_id) if session_id else None
        best: tuple[list[int], int] | None = None
        for call in s.calls if s else ():
            for c in call.choices:
                for said in (decode(c.token_ids), c.text):
                    prefix = call.prompt_text + said
                    if text.startswith(prefix) and (best is None or len(prefix) > best[1]):
                        best = (call.prompt_ids + c.token_ids, len(prefix))
        return best

    def record(self, session_id: str, call: Call) -> None:
        self.check_open(session_id)
        if session_id not in self.sessions:
            self.sessions[session_id] = Session(session_id)
            self.open_count += 1
        self.sessions[session_id].calls.append(call)
        self._calls[call.call_id] = (session_id, call)

    def feedback(
        self,
        reward: float,
        *,
        session_id: str | None = None,
        response_id: str | None = None,
        choice_index: int | None = None,
    ) -> str:
        """Set a reward; returns the session id it belongs to."""
        if (session_id is None) == (response_id is None):
            raise SessionError("give exactly one of session_id and response_id", param="session_id")
        if response_id is not None:
            found = self._calls.get(response_id)
            if found is None:
                raise SessionError(f"unknown response_id {response_id!r}", status=404, param="response_id")
            session_id, call = found
            self.check_open(session_id)
            if choice_index is None:
                for c in call.choices:
                    c.reward = float(reward)
            elif 0 <= choice_index < len(call.choices):
                call.choices[choice_index].reward = float(reward)
            else:
                raise SessionError(
                    f"choice_index {choice_index} is not in [0, {len(call.choices)}) for {response_id!r}",
                    param="choice_index",
                )
            return session_id
        assert session_id is not None
        if session_id not in self.sessions:
            raise SessionError(f"unknown session_id {session_id!r}", status=404, param="session_id")
        self.check_open(session_id)
        self.sessions[session_id].reward = float(reward)
        return session_id

    def begin_commit(self, session_ids: list[str]) -> tuple[list[Experience], list[Session]]:
        """Experiences of `session_ids` (all or none: any refusal raises before anything changes);
        the sessions are marked committing until `end_commit`."""
        if not session_ids:
            raise SessionError("session_ids: give at least one session id")
        if len(set(session_ids)) != len(session_ids):
            raise SessionError("session_ids: a session id is listed twice")
        sessions = []
        for sid in session_ids:
            s = self.sessions.get(sid)
            if s is None:
                raise SessionError(f"unknown session {sid!r}", status=404, code="unknown_session")
            if s.state != "open":
                raise SessionError(
                    f"session {sid!r} is {s.state} (exactly once)", status=409, code="committed"
                )
            sessions.append(s)
        step = self.commits + 1
        out = []
        for s in sessions:
            out += self._experiences(s, step)
        for s in sessions:
            s.state = "committing"
        self.commits = step
        return out, sessions

    def end_commit(self, sessions: list[Session], ok: bool) -> None:
        for s in sessions:
            s.state = "committed" if ok else "open"
            if ok:  # keep only the id: a committed session takes no more calls
                self.open_count -= 1
                for call in s.calls:
                    self._calls.pop(call.call_id, None)
                s.calls = []

    def _experiences(self, s: Session, step: int) -> list[Experience]:
        seqs = build_sequences(s)
        by_group: dict[str, int] = {}
        out = []
        for seq in seqs:
            last = seq.choices[-1]
            reward = last.reward if last.reward is not None else s.reward
            if reward is None:
                raise SessionError(
                    f"session {s.session_id!r} has no reward for response {last_call_id(s, last)!r}: POST "
                    f"/v1/feedback with its session_id (or that response_id) and a reward first",
                    code="unrewarded",
                )
            run = by_group.get(seq.group, 0)
            by_group[seq.group] = run + 1
            response = len(seq.tokens) - seq.prompt_length
            exp = Experience(
                tokens=seq.tokens,
                prompt_length=seq.prompt_length,
                eid=ExperienceId(
                    batch_id=f"serve/{step}",
                    task_id=s.session_id,
                    run_id=run,
                    step=step,
                    group_id=f"{self.explorer_id}/serve/{seq.group}",
                    explorer_id=self.explorer_id,
                ),
                logprobs=seq.logprobs,
                action_mask=seq.mask,
                reward=float(reward),
                truncated=last.finish_reason == "length",
                model_version=min(c.model_version for c in seq.choices),
                prompt_text=seq.prompt_text,
                response_text="\n".join(c.text for c in seq.choices),
                metrics={
                    "reward": float(reward),
                    "turns": float(len(seq.choices)),
                    "response_length": float(response),
                },  # fmt: skip
                info={"session_id": s.session_id},
            )
            out.append(exp)
        return out


def last_call_id(s: Session, choice: Choice) -> str:
    return next((c.call_id for c in s.calls if any(x is choice for x in c.choices)), "?")


def build_sequences(s: Session) -> list[_Sequence]:
    """The token sequences of a session (module docstring): continued answers are merged, each
    sequence nobody continues is returned, in call order."""
    seqs: list[_Sequence] = []
    for call in s.calls:
        p = call.prompt_ids
        parent = None
        for seq in seqs:  # the longest earlier sequence the prompt starts with
            n = len(seq.tokens)
            if n <= len(p) and p[:n] == seq.tokens and (parent is None or n > len(parent.tokens)):
                parent = seq
        for choice in call.choices:
            if parent is None:
                group = f"{s.session_id}/{call.call_id}"
                seq = _Sequence(list(p), len(p), [], [], [], group, call.prompt_text)
            else:
                parent.continued = True
                between = p[len(parent.tokens) :]
                seq = _Sequence(
                    parent.tokens + between,
                    parent.prompt_length,
                    parent.mask + [False] * len(between),
                    parent.logprobs + [0.0] * len(between),
                    list(parent.choices),
                    f"{s.session_id}/{call.call_id}" if len(call.choices) > 1 else parent.group,
                    parent.prompt_text,
                )
            seq.tokens = seq.tokens + list(choice.token_ids)
            seq.mask = seq.mask + [True] * len(choice.token_ids)
            seq.logprobs = seq.logprobs + list(choice.logprobs)
            seq.choices.append(choice)
            seqs.append(seq)
    return [q for q in seqs if not q.continued]
