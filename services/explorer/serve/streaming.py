"""Token-by-token streaming for the served endpoint: tokens from the generating thread reach an
asyncio queue (`TokenFeed`), an `IncrementalDecoder` per choice turns them into text deltas (never
splitting a multi-byte character, holding back any tail that could start a `stop` string), and the
deltas go out as OpenAI SSE chunks. The recorded answer is the whole-answer one; the last delta of a
choice is whatever of that answer was not sent yet, so the deltas always add up to it. When the request
asks for log-probs, each delta carries those of the tokens it is made of (with their top k when asked),
in the response's format (`logprobs(choice, entries)`); the last delta carries the recorded answer's
entries not sent yet, so the streamed entries also add up to the whole answer's."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

from services.explorer.serve.protocol import ServeError
from services.explorer.serve.responses import Entry, entries

Item = tuple[int, int, float, list[tuple[int, float]] | None]  # choice, token id, log-prob, top k


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
    """`on_token` for an engine: queues (choice, token, log-prob, top k) on the event loop; drops
    them once closed."""

    def __init__(self) -> None:
        self.loop = asyncio.get_running_loop()
        self.queue: asyncio.Queue[Item | None] = asyncio.Queue()
        self.closed = False

    def on_token(
        self,
        _prompt: int,
        choice: int,
        token: int,
        logprob: float,
        top: list[tuple[int, float]] | None = None,
    ) -> None:
        if self.closed:
            return
        try:
            self.loop.call_soon_threadsafe(self.queue.put_nowait, (choice, token, logprob, top))
        except RuntimeError:  # the loop is gone
            self.closed = True


async def start(feed: TokenFeed, run: Callable[[], Any]) -> tuple[asyncio.Task, Item | None]:
    """Run the call; wait for its first token (or its end: a failure before any token raises here, so
    the client gets a plain HTTP error)."""
    task = asyncio.get_running_loop().create_task(run())
    task.add_done_callback(lambda _t: feed.queue.put_nowait(None))
    first = await feed.queue.get()
    if first is None:
        task.result()
    return task, first


def _entry(tokenizer: Any, token: int, logprob: float, top: list[tuple[int, float]] | None) -> Entry:
    text = [(tokenizer.decode([t]), x) for t, x in top] if top is not None else None
    return tokenizer.decode([token]), logprob, text


async def live_chunks(
    feed: TokenFeed, task: asyncio.Task, first: Item | None, decoders: list[IncrementalDecoder],
    head: dict[str, Any], chat: bool, usage: bool,
    logprobs: Callable[[int, list[Entry]], Any] | None = None,
) -> AsyncIterator[str]:  # fmt: skip
    """SSE events as tokens arrive (`chat`: chat.completion.chunk, else text_completion); with
    `logprobs`, each delta carries the log-probs of its tokens."""
    pending: dict[int, list[Entry]] = {i: [] for i in range(len(decoders))}
    sent = dict.fromkeys(pending, 0)

    def event(choices: list[dict[str, Any]], **extra: Any) -> str:
        return f"data: {json.dumps({**head, 'created': int(time.time()), 'choices': choices, **extra})}\n\n"

    def delta(i: int, text: str, finish: str | None = None, items: list[Entry] | None = None) -> str:
        lp = logprobs(i, items) if logprobs is not None and items else None
        sent[i] += len(items or [])
        if chat:
            body = {"content": text} if text else {}
            return event([{"index": i, "delta": body, "logprobs": lp, "finish_reason": finish}])
        return event([{"index": i, "text": text, "logprobs": lp, "finish_reason": finish}])

    try:
        if chat:
            for i in range(len(decoders)):
                yield event([{"index": i, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                              "finish_reason": None}])  # fmt: skip
        item = first
        while item is not None:
            i, token, lp, top = item
            if logprobs is not None:
                pending[i].append(_entry(decoders[i].tokenizer, token, lp, top))
            text = decoders[i].push(token)
            if text:
                yield delta(i, text, items=pending[i])
                pending[i] = []
            item = await feed.queue.get()
        try:
            call, _sid, answers = task.result()
        except ServeError as exc:
            yield f"data: {json.dumps(exc.body())}\n\n"
            return
        for a in answers:
            i = a.choice.index
            rest = decoders[i].finish(a.choice.text)
            unsent = entries(a)[sent[i] :] if logprobs is not None else []
            if rest or unsent:
                yield delta(i, rest, items=unsent)
            yield delta(i, "", a.finish_reason)
        if usage:
            done = sum(len(c.token_ids) for c in call.choices)
            yield event([], usage={"prompt_tokens": len(call.prompt_ids), "completion_tokens": done,
                                   "total_tokens": len(call.prompt_ids) + done})  # fmt: skip
        yield "data: [DONE]\n\n"
    finally:
        feed.closed = True
