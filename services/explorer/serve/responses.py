"""OpenAI response bodies for the served endpoint: chat completions (whole, or as SSE chunks),
completions and usage. Every body also carries `session_id` (an extra field the OpenAI client keeps)
so an application learns the session its call was recorded under."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

from services.explorer.serve.backend import Answer
from services.explorer.serve.sessions import Call


def _usage(call: Call) -> dict[str, int]:
    done = sum(len(c.token_ids) for c in call.choices)
    return {
        "prompt_tokens": len(call.prompt_ids),
        "completion_tokens": done,
        "total_tokens": len(call.prompt_ids) + done,
    }


def _logprobs(a: Answer) -> dict[str, Any]:
    return {
        "content": [
            {"token": t, "logprob": lp, "bytes": list(t.encode("utf-8")), "top_logprobs": []}
            for t, lp in zip(a.tokens, a.choice.logprobs, strict=True)
        ],
        "refusal": None,
    }


def _message(a: Answer) -> dict[str, Any]:
    msg: dict[str, Any] = {"role": "assistant", "content": a.content}
    if a.tool_calls:
        msg["tool_calls"] = a.tool_calls
    return msg


def chat_body(call: Call, sid: str, answers: list[Answer], model: str, logprobs: bool) -> dict[str, Any]:
    return {
        "id": call.call_id,
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [
            {
                "index": a.choice.index,
                "message": _message(a),
                "finish_reason": a.finish_reason,
                "logprobs": _logprobs(a) if logprobs else None,
            }  # fmt: skip
            for a in answers
        ],
        "usage": _usage(call),
        "session_id": sid,
        "model_version": min(c.model_version for c in call.choices),
    }


def chat_chunks(
    call: Call, sid: str, answers: list[Answer], model: str, logprobs: bool, usage: bool
) -> Iterator[str]:
    """The answer as `data: {...}` server-sent events, as OpenAI streams it: a role chunk, the content
    (and tool calls), the finish reason per choice, optionally the usage, then `data: [DONE]`."""
    head = {"id": call.call_id, "object": "chat.completion.chunk", "created": int(time.time()),
            "model": model, "session_id": sid}  # fmt: skip

    def event(choices: list[dict[str, Any]], **extra: Any) -> str:
        return f"data: {json.dumps({**head, 'choices': choices, **extra})}\n\n"

    for a in answers:
        i = a.choice.index
        yield event([{"index": i, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                      "finish_reason": None}])  # fmt: skip
        if a.content:
            yield event([{"index": i, "delta": {"content": a.content},
                          "logprobs": _logprobs(a) if logprobs else None, "finish_reason": None}])  # fmt: skip
        if a.tool_calls:
            calls = [{"index": k, **tc} for k, tc in enumerate(a.tool_calls)]
            yield event(
                [{"index": i, "delta": {"tool_calls": calls}, "logprobs": None, "finish_reason": None}]
            )
        yield event([{"index": i, "delta": {}, "logprobs": None, "finish_reason": a.finish_reason}])
    if usage:
        yield event([], usage=_usage(call))
    yield "data: [DONE]\n\n"


def completion_body(call: Call, sid: str, answers: list[Answer], model: str) -> dict[str, Any]:
    return {
        "id": call.call_id,
        "object": "text_completion",
        "created": int(time.time()),
        "model": model,
        "choices": [
            {
                "index": a.choice.index,
                "text": a.choice.text,
                "finish_reason": a.finish_reason,
                "logprobs": None,
            }
            for a in answers
        ],
        "usage": _usage(call),
        "session_id": sid,
        "model_version": min(c.model_version for c in call.choices),
    }


def completion_chunks(call: Call, sid: str, answers: list[Answer], model: str) -> Iterator[str]:
    head = {"id": call.call_id, "object": "text_completion", "created": int(time.time()), "model": model,
            "session_id": sid}  # fmt: skip
    for a in answers:
        for text, finish in ((a.choice.text, None), ("", a.finish_reason)):
            body = {**head, "choices": [{"index": a.choice.index, "text": text, "finish_reason": finish,
                                         "logprobs": None}]}  # fmt: skip
            yield f"data: {json.dumps(body)}\n\n"
    yield "data: [DONE]\n\n"
