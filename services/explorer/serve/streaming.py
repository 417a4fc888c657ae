"""Token-by-token streaming for the served endpoint: tokens from the generating thread reach an
asyncio queue (`TokenFeed`), an `IncrementalDecoder` per choice turns them into text deltas (never
splitting a multi-byte character, holding back any tail that could start a `stop` string), and the
deltas go out as OpenAI SSE chunks. The recorded answer is the whole-answer one; the last delta of a
choice is whatever of that answer was not sent yet, so the deltas always add up to it."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

from services.explorer.serve.protocol import ServeError


class IncrementalDecoder:
    """Text deltas of a growing token sequence: decode the ids so far, emit the new clean suffix."""

    def __init__(self, tokenizer: Any, stops: Sequence[str] = ()):
        self.tokenizer, self.stops = tokenizer, tuple(s for s in stops if s)
        self.ids: list[int] = []
        self.sent = ""
        self.stopped = False

    def push(self, token_id: int) -> str:
        if self.stopped:
            return ""
        self.ids.append(int(token_id))
        text = self.tokenizer.decode(self.ids, skip_special_tokens=True)
        if text.endswith("\ufffd"):  # a multi-byte character not complete yet
            return ""
        cuts = [text.find(s) for s in self.stops if s in text]
        if cuts:
            text, self.stopped = text[: min(cuts)], True
        else:
            text = text[: len(text) - self._held(text)]
        if not text.startswith(self.sent) or len(text) <= len(self.sent):
            return ""
        new, self.sent = text[len(self.sent) :], text
        return new

    def _held(self, text: str) -> int:
        """Length of the longest tail of `text` that is a proper prefix of a stop string."""
        best = 0
        for s in self.stops:
            for k in range(min(len(s) - 1, len(text)), best, -1):
                if text.endswith(s[:k]):
                    best = k
                    break
        return best

    def finish(self, final_text: str) -> str:
        """The rest of the recorded answer after what was sent."""
        return final_text[len(self.sent) :] if final_text.startswith(self.sent) else ""


class TokenFeed:
    """`on_token` for an engine: queues (choice, token) on the event loop; drops them once closed."""

    def __init__(self) -> None:
        self.loop = asyncio.get_running_loop()
        self.queue: asyncio.Queue[tuple[int, int] | None] = asyncio.Queue()
        self.closed = False

    def on_token(self, _prompt: int, choice: int, token: int, _logprob: float) -> None:
        if self.closed:
            return
        try:
            self.loop.call_soon_threadsafe(self.queue.put_nowait, (choice, token))
        except RuntimeError:  # the loop is gone
            self.closed = True


async def start(feed: TokenFeed, run: Callable[[], Any]) -> tuple[asyncio.Task, tuple[int, int] | None]:
    """Run the call; wait for its first token (or its end: a failure before any token raises here, so
    the client gets a plain HTTP error)."""
    task = asyncio.get_running_loop().create_task(run())
    task.add_done_callback(lambda _t: feed.queue.put_nowait(None))
    first = await feed.queue.get()
    if first is None:
        task.result()
    return task, first


async def live_chunks(
    feed: TokenFeed, task: asyncio.Task, first: tuple[int, int] | None, decoders: list[IncrementalDecoder],
    head: dict[str, Any], chat: bool, usage: bool,
) -> AsyncIterator[str]:  # fmt: skip
    """SSE events as tokens arrive (`chat`: chat.completion.chunk, else text_completion)."""

    def event(choices: list[dict[str, Any]], **extra: Any) -> str:
        return f"data: {json.dumps({**head, 'created': int(time.time()), 'choices': choices, **extra})}\n\n"

    def delta(i: int, text: str, finish: str | None = None) -> str:
        if chat:
            body = {"content": text} if text else {}
            return event([{"index": i, "delta": body, "logprobs": None, "finish_reason": finish}])
        return event([{"index": i, "text": text, "logprobs": None, "finish_reason": finish}])

    try:
        if chat:
            for i in range(len(decoders)):
                yield event([{"index": i, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                              "finish_reason": None}])  # fmt: skip
        item = first
        while item is not None:
            text = decoders[item[0]].push(item[1])
            if text:
                yield delta(item[0], text)
            item = await feed.queue.get()
        try:
            call, _sid, answers = task.result()
        except ServeError as exc:
            yield f"data: {json.dumps(exc.body())}\n\n"
            return
        for a in answers:
            rest = decoders[a.choice.index].finish(a.choice.text)
            if rest:
                yield delta(a.choice.index, rest)
            yield delta(a.choice.index, "", a.finish_reason)
        if usage:
            done = sum(len(c.token_ids) for c in call.choices)
            yield event([], usage={"prompt_tokens": len(call.prompt_ids), "completion_tokens": done,
                                   "total_tokens": len(call.prompt_ids) + done})  # fmt: skip
        yield "data: [DONE]\n\n"
    finally:
        feed.closed = True
