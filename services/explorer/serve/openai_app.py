"""The HTTP routes of the served endpoint (FastAPI), over `EndpointCore`.

    POST /v1/chat/completions   OpenAI chat (stream, n, temperature, top_p, max_tokens, stop, logprobs,
                                tools/tool_choice); the answer is recorded under the session
    POST /v1/completions        OpenAI text completion (one prompt per request: a string or its token
                                ids; vLLM's `return_token_ids`, `top_k`, `stop_token_ids`; `record: false`
                                answers without recording the call)
    GET  /v1/models             the served model
    GET  /health                liveness and the model version being served (no token needed)
    POST /v1/feedback           {"session_id" | "response_id" [+ "choice_index"], "reward"}
    POST /v1/commit             {"session_ids": [...]}: the sessions become experiences in the buffer

A streamed answer (`stream: true`) is sent token by token as it is sampled (serve/streaming.py) when
the engine reports tokens as they come (`hf`): the role, content deltas, the finish reason per choice,
`[DONE]`; with `logprobs`, each delta carries its tokens' log-probs (and top k). With `tools` (tool
calls are parsed from the whole answer) or an engine that samples whole sequences (vLLM here), the
answer is sampled whole first and then sent as such chunks.
`logprobs: true, top_logprobs: k` (chat) and `logprobs: k` (completions) report the k most likely
tokens of the distribution each token was sampled from (`hf`).

Session id of a call: the `X-Session-Id` request header, else the OpenAI `user` field, else
`metadata.session_id`; with none, the call is a session of its own named by its response id. The
answer repeats it in the `X-Session-Id` header and a `session_id` body field.

As the gRPC services: with `services.auth_token` (RFT_AUTH_TOKEN) set, every route but /health needs
`Authorization: Bearer <token>` (401 otherwise). Bodies above `explorer.serve.max_body_bytes` get 413.
Every error is `{"error": {"message", "type", "param", "code"}}` with the field in `param`.
A request with an `Idempotency-Key` header is answered once; its retries get that answer
(serve/idempotency.py; commit derives a key from its session ids when none is sent).
"""

from __future__ import annotations

import hmac
import secrets
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import BaseModel, ValidationError
from starlette.exceptions import HTTPException

from services.explorer.serve import responses, streaming
from services.explorer.serve.endpoint_core import EndpointCore
from services.explorer.serve.idempotency import IdempotencyStore
from services.explorer.serve.protocol import (
    ChatRequest,
    CommitRequest,
    CompletionRequest,
    FeedbackRequest,
    ServeError,
    check_chat,
    stop_strings,
)
from services.explorer.serve.sessions import SessionError


def _param(loc: tuple[Any, ...]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


async def _parse(request: Request, model: type[BaseModel], max_bytes: int) -> Any:
    declared = request.headers.get("content-length")
    if declared and declared.isdigit() and int(declared) > max_bytes:
        raise ServeError(
            413, f"the body is {declared} bytes, above explorer.serve.max_body_bytes ({max_bytes})"
        )
    body = b""
    async for part in request.stream():
        body += part
        if len(body) > max_bytes:
            raise ServeError(413, f"the body is above explorer.serve.max_body_bytes ({max_bytes})")
    try:
        return model.model_validate_json(body or b"{}")
    except ValidationError as exc:
        err = exc.errors()[0]
        where = _param(tuple(err["loc"])) or "body"
        raise ServeError(400, f"{where}: {err['msg']}", where, err["type"]) from None


def _streamed_logprobs(req: Any, chat: bool) -> Any:
    """How a token-by-token stream renders its deltas' log-probs (None: not asked for)."""
    if chat:
        return (lambda _choice, items: responses.chat_logprobs(items)) if req.logprobs else None
    if req.logprobs is None:
        return None
    return responses.StreamedCompletionLogprobs(req.prompt if isinstance(req.prompt, str) else req.prompt[0])


def _session(request: Request, body: Any) -> str | None:
    sid = request.headers.get("x-session-id") or body.user or (body.metadata or {}).get("session_id")
    if sid is not None and not 0 < len(sid) <= 256:
        raise ServeError(400, "session id: 1 to 256 characters", "X-Session-Id")
    return sid


def _answer(body: Any, sid: str, stream: bool = False) -> Any:
    headers = {"X-Session-Id": sid}
    if stream:
        return StreamingResponse(body, media_type="text/event-stream", headers=headers)
    return JSONResponse(body, headers=headers)


async def _live(core: EndpointCore, request: Request, req: Any, chat: bool, usage: bool) -> Any:
    """Stream token by token (when the engines can; else the whole-answer chunks)."""
    sid = _session(request, req)
    if not core.streams_tokens:
        run = core.chat if chat else core.complete
        call, sid, answers = await run(req, sid)
        name = core.model_name
        if chat:
            chunks = responses.chat_chunks(call, sid, answers, name, bool(req.logprobs), usage)
        else:
            chunks = responses.completion_chunks(call, sid, answers, name, req.logprobs is not None)
        return _answer(chunks, sid, True)
    call_id = f"{'chatcmpl' if chat else 'cmpl'}-{secrets.token_hex(12)}"
    sid = sid or call_id
    feed = streaming.TokenFeed()
    run = core.chat if chat else core.complete
    task, first = await streaming.start(feed, lambda: run(req, sid, feed.on_token, call_id))
    stops = stop_strings(req.stop)
    decoders = [streaming.IncrementalDecoder(core.tokenizer, stops) for _ in range(req.n)]
    head = {"id": call_id, "object": "chat.completion.chunk" if chat else "text_completion",
            "model": core.model_name, "session_id": sid}  # fmt: skip
    lp = _streamed_logprobs(req, chat)
    chunks = streaming.live_chunks(feed, task, first, decoders, head, chat, usage, lp)
    return _answer(chunks, sid, True)


def _guard(app: FastAPI, auth_token: str | None) -> None:
    """The bearer-token check (all routes but /health) and every error as an OpenAI error body."""
    expected = f"Bearer {auth_token}".encode() if auth_token else None

    @app.middleware("http")
    async def _auth(request: Request, call_next):
        if expected is not None and request.url.path != "/health":
            given = request.headers.get("authorization", "").encode()
            if not hmac.compare_digest(given, expected):
                err = ServeError(401, "missing or wrong bearer token (services.auth_token)", "Authorization",
                                 "invalid_api_key")  # fmt: skip
                return JSONResponse(err.body(), status_code=401)
        return await call_next(request)

    @app.exception_handler(ServeError)
    async def _serve_error(_request: Request, exc: ServeError) -> JSONResponse:
        return JSONResponse(exc.body(), status_code=exc.status)

    @app.exception_handler(SessionError)
    async def _session_error(_request: Request, exc: SessionError) -> JSONResponse:
        err = ServeError(exc.status, str(exc), exc.param, exc.code or None)
        return JSONResponse(err.body(), status_code=exc.status)

    @app.exception_handler(HTTPException)
    async def _http_error(request: Request, exc: HTTPException) -> JSONResponse:
        err = ServeError(exc.status_code, f"{request.method} {request.url.path}: {exc.detail}")
        return JSONResponse(err.body(), status_code=exc.status_code)


def build_app(core: EndpointCore, auth_token: str | None = None) -> FastAPI:
    app = FastAPI(title="RFT Mesh serve", docs_url=None, redoc_url=None, openapi_url=None)
    cfg = core.cfg
    _guard(app, auth_token)
    once = app.state.idempotency = IdempotencyStore()

    @app.get("/health")
    async def health() -> dict[str, Any]:
        return {"status": "ok", "model": core.model_name, "model_version": core.model_version}

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        card = {"id": core.model_name, "object": "model", "created": 0, "owned_by": "rft-mesh"}
        return {"object": "list", "data": [card]}

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> Any:
        req = await _parse(request, ChatRequest, cfg.max_body_bytes)
        check_chat(req, cfg.max_n)
        return await once.answer(request, "chat", req, lambda: _chat(request, req))

    async def _chat(request: Request, req: ChatRequest) -> Any:
        usage = bool((req.stream_options or {}).get("include_usage"))
        if req.stream and not (req.tools and req.tool_choice != "none"):
            return await _live(core, request, req, True, usage)
        call, sid, answers = await core.chat(req, _session(request, req))
        name = core.model_name
        if req.stream:
            return _answer(responses.chat_chunks(call, sid, answers, name, req.logprobs, usage), sid, True)
        return _answer(responses.chat_body(call, sid, answers, name, req.logprobs), sid)

    @app.post("/v1/completions")
    async def complete(request: Request) -> Any:
        req = await _parse(request, CompletionRequest, cfg.max_body_bytes)
        if req.n > cfg.max_n:
            raise ServeError(
                400, f"n: {req.n} is above this server's limit {cfg.max_n} (explorer.serve.max_n)", "n"
            )
        return await once.answer(request, "completions", req, lambda: _complete(request, req))

    async def _complete(request: Request, req: CompletionRequest) -> Any:
        if req.stream:
            return await _live(core, request, req, False, False)
        call, sid, answers = await core.complete(req, _session(request, req))
        lp, name = req.logprobs is not None, core.model_name
        body = responses.completion_body(call, sid, answers, name, lp, req.return_token_ids)
        return _answer(body, sid)

    @app.post("/v1/feedback")
    async def feedback(request: Request) -> Any:
        req = await _parse(request, FeedbackRequest, cfg.max_body_bytes)

        async def run() -> JSONResponse:
            sid = core.feedback(req.reward, req.session_id, req.response_id, req.choice_index)
            return JSONResponse({"session_id": sid, "reward": req.reward})

        return await once.answer(request, "feedback", req, run)

    @app.post("/v1/commit")
    async def commit(request: Request) -> Any:
        req = await _parse(request, CommitRequest, cfg.max_body_bytes)

        async def run() -> JSONResponse:
            return JSONResponse(await core.commit(req.session_ids))

        # a commit of the same sessions succeeds once: its retry without a key gets that answer too
        return await once.answer(request, "commit", req, run, derive=True)

    return app
