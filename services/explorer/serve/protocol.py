"""Request bodies of the served endpoint (the OpenAI fields it honours), its limits, and errors in the
OpenAI shape `{"error": {"message", "type", "param", "code"}}`.

Unknown fields are ignored, as OpenAI-compatible servers do (clients send extras such as
`stream_options`); fields whose meaning this server cannot give are refused by name: `top_logprobs`
above 0 on an engine that reports the sampled token's log-prob only (vLLM here), `tool_choice` naming
a function or `required` (the parser reads tool calls, it does not force them).
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field


class ServeError(Exception):
    """An error answered as `{"error": {...}}` with HTTP `status`."""

    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code

    def body(self) -> dict[str, Any]:
        kind = {401: "authentication_error", 404: "not_found_error", 409: "conflict_error",
                413: "request_too_large", 429: "rate_limit_error"}.get(self.status)  # fmt: skip
        if kind is None:
            kind = "invalid_request_error" if self.status < 500 else "server_error"
        return {"error": {"message": self.message, "type": kind, "param": self.param, "code": self.code}}


class _Body(BaseModel):
    model_config = ConfigDict(extra="ignore")


class _Sampling(_Body):
    model: str | None = None
    n: int = Field(1, ge=1)
    temperature: float = Field(1.0, ge=0, le=2)
    top_p: float = Field(1.0, gt=0, le=1)
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    stop: str | list[str] | None = None
    stream: bool = False
    stream_options: dict[str, Any] | None = None
    seed: int | None = None
    user: str | None = None
    metadata: dict[str, str] | None = None


class ChatRequest(_Sampling):
    messages: list[dict[str, Any]] = Field(min_length=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=20)
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None


class CompletionRequest(_Sampling):
    # a string, or one prompt's token ids (OpenAI's array-of-tokens form: sampled as given)
    prompt: str | list[str] | list[int]
    logprobs: int | None = Field(None, ge=0, le=5)
    echo: bool = False
    # extras (vLLM's names): the choices' and the prompt's token ids in the answer, top-k, stop ids
    return_token_ids: bool = False
    top_k: int | None = None
    stop_token_ids: list[int] | None = Field(None, max_length=64)
    # false: answer without recording the call (a session that will never be committed, e.g. a
    # sampler that keeps its own data, such as `rft serve tinker`)
    record: bool = True


class FeedbackRequest(_Body):
    reward: float
    session_id: str | None = None
    response_id: str | None = None
    choice_index: int | None = Field(None, ge=0)


class CommitRequest(_Body):
    session_ids: list[str] = Field(min_length=1)


def stop_strings(stop: str | list[str] | None) -> tuple[str, ...]:
    if stop is None:
        return ()
    items = [stop] if isinstance(stop, str) else list(stop)
    if len(items) > 4:
        raise ServeError(400, "stop: at most 4 stop strings", "stop")
    return tuple(items)


def token_limit(req: _Sampling, limit: int) -> int:
    """The request's `max_tokens` (or `max_completion_tokens`), within `explorer.serve.max_tokens`."""
    asked = req.max_completion_tokens or req.max_tokens
    if asked is None:
        return limit
    if asked > limit:
        name = "max_completion_tokens" if req.max_completion_tokens else "max_tokens"
        raise ServeError(
            400, f"{name}: {asked} is above this server's limit {limit} (explorer.serve.max_tokens)", name
        )
    return asked


def check_chat(req: ChatRequest, max_n: int) -> None:
    if req.n > max_n:
        raise ServeError(400, f"n: {req.n} is above this server's limit {max_n} (explorer.serve.max_n)", "n")
    if req.top_logprobs and not req.logprobs:
        raise ServeError(400, "top_logprobs: needs logprobs: true", "top_logprobs")
    choice = req.tool_choice
    if choice is not None and choice not in ("auto", "none"):
        raise ServeError(400, "tool_choice: only 'auto' and 'none' are supported", "tool_choice")
    for i, m in enumerate(req.messages):
        role = m.get("role")
        if role not in ("system", "developer", "user", "assistant", "tool"):
            raise ServeError(
                400,
                f"messages[{i}].role: {role!r} is not system, user, assistant or tool",
                f"messages[{i}].role",
            )
