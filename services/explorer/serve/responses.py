"""OpenAI response bodies for the served endpoint: chat completions (whole, or as SSE chunks),
completions and usage. Every body also carries `session_id` (an extra field the OpenAI client keeps)
so an application learns the session its call was recorded under."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

from services.explorer.serve.endpoint_core import Answer
from services.explorer.serve.sessions import Call


def _usage(call: Call) -> dict[str, int]:
    done = sum(len(c.token_ids) for c in call.choices)
    return {
        "prompt_tokens": len(call.prompt_ids),
        "completion_tokens": done,
        "total_tokens": len(call.prompt_ids) + done,
    }


# One sampled token as the log-probs show it: its text, its log-prob, its top k (text, log-prob) or None.
Entry = tuple[str, float, list[tuple[str, float]] | None]


def entries(a: Answer) -> list[Entry]:
    tops = a.top or [None] * len(a.tokens)
    return list(zip(a.tokens, a.choice.logprobs, tops, strict=True))


def chat_logprobs(items: list[Entry]) -> dict[str, Any]:
    """OpenAI chat `logprobs`: per token its text, log-prob, bytes and top k."""
    return {
        "content": [
            {
                "token": t,
                "logprob": lp,
                "bytes": list(t.encode("utf-8")),
                "top_logprobs": [
                    {"token": s, "logprob": x, "bytes": list(s.encode("utf-8"))} for s, x in top or []
                ],
            }
            for t, lp, top in items
        ],  # fmt: skip
        "refusal": None,
    }


def _logprobs(a: Answer) -> dict[str, Any]:
    return chat_logprobs(entries(a))


def completion_entries(items: list[Entry], offset: int) -> dict[str, Any]:
    """OpenAI's legacy completions `logprobs` of `items`, the first at text offset `offset`."""
    offsets, at = [], offset
    for t, _, _ in items:
        offsets.append(at)
        at += len(t)
    tops = None if all(top is None for _, _, top in items) else [dict(top or []) for _, _, top in items]
    return {"tokens": [t for t, _, _ in items], "token_logprobs": [lp for _, lp, _ in items],
            "top_logprobs": tops, "text_offset": offsets}  # fmt: skip


def completion_logprobs(a: Answer, prompt: str) -> dict[str, Any]:
    """OpenAI's legacy completions `logprobs`: tokens, their log-probs, the top k per token, offsets."""
    return completion_entries(entries(a), len(prompt))


class StreamedCompletionLogprobs:
    """`completion_entries` chunk by chunk for a streamed completion: each choice's text offsets run
    on from the prompt's end."""

    def __init__(self, prompt: str):
        self.start = len(prompt)
        self.at: dict[int, int] = {}

    def __call__(self, choice: int, items: list[Entry]) -> dict[str, Any]:
        at = self.at.get(choice, self.start)
        self.at[choice] = at + sum(len(t) for t, _, _ in items)
        return completion_entries(items, at)


def _message(a: Answer) -> dict[str, Any]:
    msg: dict[str, Any] = {"role": "assistant", "content": a.content}
    if a.tool_calls:
        msg["tool_calls"] = a.tool_calls
    return msg


def _body(call: Call, sid: str, model: str, kind: str, choices: list[dict[str, Any]]) -> dict[str, Any]:
    """A whole (not streamed) answer of `kind` (`chat.completion`, `text_completion`)."""
    return {
        "id": call.call_id,
        "object": kind,
        "created": int(time.time()),
        "model": model,
        "choices": choices,
        "usage": _usage(call),
        "session_id": sid,
        "model_version": min(c.model_version for c in call.choices),
    }


def chat_body(call: Call, sid: str, answers: list[Answer], model: str, logprobs: bool) -> dict[str, Any]:
    choices = [
        {
            "index": a.choice.index,
            "message": _message(a),
            "finish_reason": a.finish_reason,
            "logprobs": _logprobs(a) if logprobs else None,
        }
        for a in answers
    ]
    return _body(call, sid, model, "chat.completion", choices)


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


def completion_body(
    call: Call, sid: str, answers: list[Answer], model: str, logprobs: bool = False, token_ids: bool = False
) -> dict[str, Any]:
    """`token_ids` (the request's `return_token_ids`): each choice's sampled token ids, and the
    prompt's as `prompt_token_ids`, as vLLM answers them."""
    choices = [
        {
            "index": a.choice.index,
            "text": a.choice.text,
            "finish_reason": a.finish_reason,
            "logprobs": completion_logprobs(a, call.prompt_text) if logprobs else None,
            **({"token_ids": list(a.choice.token_ids)} if token_ids else {}),
        }
        for a in answers
    ]
    body = _body(call, sid, model, "text_completion", choices)
    if token_ids:
        body["prompt_token_ids"] = list(call.prompt_ids)
    return body


def completion_chunks(
    call: Call, sid: str, answers: list[Answer], model: str, logprobs: bool = False
) -> Iterator[str]:
    head = {"id": call.call_id, "object": "text_completion", "created": int(time.time()), "model": model,
            "session_id": sid}  # fmt: skip
    for a in answers:
        lp = completion_logprobs(a, call.prompt_text) if logprobs else None
        for text, finish, lps in ((a.choice.text, None, lp), ("", a.finish_reason, None)):
            body = {**head, "choices": [{"index": a.choice.index, "text": text, "finish_reason": finish,
                                         "logprobs": lps}]}  # fmt: skip
            yield f"data: {json.dumps(body)}\n\n"
    yield "data: [DONE]\n\n"
