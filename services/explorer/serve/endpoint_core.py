"""What the served endpoint does, without HTTP: render a request into prompt tokens, sample with the
explorer's engines (the current policy: they take new weights at every sync), record the answer in
the `SessionStore`, set rewards, and put committed sessions into the sink (the buffer).

Prompts are never cut: a prompt above `model.max_prompt_tokens` (or one that leaves no room under
`max_model_len`) is refused, since a cut history would no longer continue the session's sequence.
With `tools` in a chat request (and `tool_choice` not `none`), the prompt is rendered with the tool
definitions (services/explorer/tools/template.py) and tool calls are parsed from the answer
(services/explorer/tools/parser.py; `explorer.rollout_model.tool_call_parser`, default `hermes`).
"""

from __future__ import annotations

import itertools
import secrets
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from services.common.config import RFTConfig, resolve
from services.explorer.engines.base import RolloutEngine
from services.explorer.model_wrapper import ModelWrapper
from services.explorer.serve.protocol import (
    ChatRequest,
    CompletionRequest,
    ServeError,
    stop_strings,
    token_limit,
)
from services.explorer.serve.sessions import Call, Choice, SessionStore
from services.explorer.sink import ExperienceSink
from services.explorer.tools import parse_tool_calls, render_prompt


@dataclass
class Answer:
    """One sampled choice as the response shows it."""

    choice: Choice
    content: str | None
    tool_calls: list[dict[str, Any]]
    finish_reason: str
    tokens: list[str]  # each sampled token as text (logprobs)
    top: list[list[tuple[str, float]]] | None = None  # per token, the k most likely (text, log-prob)


def _token_prompt(prompt: Any, vocab: int) -> list[int] | None:
    """A completion prompt given as token ids (a list of ints), checked against the vocabulary."""
    if not isinstance(prompt, list) or not prompt or not all(isinstance(t, int) for t in prompt):
        return None
    bad = [t for t in prompt if not 0 <= t < vocab]
    if bad:
        raise ServeError(
            400, f"prompt: token id {bad[0]} is outside the vocabulary (0..{vocab - 1})", "prompt"
        )
    return list(prompt)


def _text(content: Any) -> str:
    """OpenAI message content: a string or a list of `{"type": "text", "text": ...}` parts."""
    if content is None or isinstance(content, str):
        return content or ""
    return "".join(p.get("text", "") for p in content if isinstance(p, Mapping))


class EndpointCore:
    def __init__(
        self,
        config: RFTConfig,
        engines: Sequence[RolloutEngine],
        sink: ExperienceSink,
        store: SessionStore,
        model_name: str,
        on_commit: Callable[[dict[str, float], int], None] | None = None,
    ):
        self.cfg = config.explorer.serve
        resolved = resolve(config)
        self.engines, self.sink, self.store, self.model_name = list(engines), sink, store, model_name
        self.max_prompt_tokens = resolved.max_prompt_tokens
        self.max_model_len = resolved.max_model_len
        self.chat_template = resolved.chat_template
        self.enable_thinking = resolved.enable_thinking
        self.tool_parser = config.explorer.rollout_model.tool_call_parser or "hermes"
        # `model.*` sampling arguments; a request sets temperature, top_p, n, stop and its token limit
        self.sampling = resolved.sampling_params(max_tokens=self.cfg.max_tokens)
        self._next = itertools.count()
        self.on_commit = on_commit  # (metrics, commit number): the explorer's metrics, one row per commit

    def _model(self) -> ModelWrapper:
        engine = self.engines[next(self._next) % len(self.engines)]
        return ModelWrapper(engine, chat_template=self.chat_template, enable_thinking=self.enable_thinking)

    @property
    def model_version(self) -> int:
        return min(e.model_version for e in self.engines)

    @property
    def streams_tokens(self) -> bool:
        """Whether every engine can report tokens as they are sampled (`generate(on_token=...)`)."""
        return all(getattr(e, "supports_streaming", False) for e in self.engines)

    @property
    def tokenizer(self) -> Any:
        return self.engines[0].tokenizer

    # ------------------------------------------------------------------ prompts
    def _chat_prompt(self, model: ModelWrapper, req: ChatRequest) -> str:
        """The prompt text: the chat template over the messages (and the tools when used)."""
        use_tools = bool(req.tools) and req.tool_choice != "none"
        messages = [
            {
                **m,
                "role": "system" if m["role"] == "developer" else m["role"],
                "content": _text(m.get("content")),
            }
            for m in req.messages
        ]
        extra = {} if self.enable_thinking is None else {"enable_thinking": self.enable_thinking}
        try:
            return render_prompt(
                model.tokenizer, messages, req.tools if use_tools else None, self.chat_template, **extra
            )
        except Exception as exc:  # a template or a tool call that cannot be rendered
            raise ServeError(400, f"messages: the chat template refused them ({exc})", "messages") from exc

    def _encode(self, model: ModelWrapper, session_id: str, text: str) -> list[int]:
        """Prompt token ids; a prompt continuing an earlier answer keeps that answer's tokens."""
        tok = model.tokenizer
        base = self.store.continuation(
            session_id, text, lambda ids: tok.decode(ids, skip_special_tokens=False)
        )
        if base is None:
            return model.encode_text(text)
        ids, covered = base
        return ids + (model.encode_text(text[covered:]) if covered < len(text) else [])

    def _fit(self, ids: list[int], param: str) -> int:
        """Tokens left for the answer; refuses a prompt that is too long."""
        if self.max_prompt_tokens is not None and len(ids) > self.max_prompt_tokens:
            raise ServeError(
                400, f"{param}: the prompt has {len(ids)} tokens, above model.max_prompt_tokens "
                f"({self.max_prompt_tokens}); shorten it or start a new session", param, "context_length_exceeded",
            )  # fmt: skip
        if self.max_model_len is None:
            return self.cfg.max_tokens
        room = self.max_model_len - len(ids)
        if room < 1:
            raise ServeError(
                400, f"{param}: the prompt has {len(ids)} tokens, leaving no room under max_model_len "
                f"({self.max_model_len})", param, "context_length_exceeded",
            )  # fmt: skip
        return min(room, self.cfg.max_tokens)

    # ------------------------------------------------------------------ sampling
    async def _sample(
        self, model: ModelWrapper, prompt_ids: list[int], req: Any, room: int,
        on_token: Callable[..., None] | None = None, top_logprobs: int = 0,
    ) -> tuple[list[Choice], list[Any]]:  # fmt: skip
        limit = token_limit(req, self.cfg.max_tokens)
        params = self.sampling.replace(
            temperature=req.temperature, top_p=req.top_p, max_tokens=min(limit, room), n=req.n,
            stop=stop_strings(req.stop),
        )  # fmt: skip
        top_k, stop_ids = getattr(req, "top_k", None), getattr(req, "stop_token_ids", None)
        if top_k is not None:
            params = params.replace(top_k=top_k if top_k > 0 else -1)
        if stop_ids:
            params = params.replace(stop_token_ids=tuple(stop_ids))
        extra: dict[str, Any] = {}
        if on_token is not None and getattr(model.engine, "supports_streaming", False):
            extra["on_token"] = on_token
        if top_logprobs:
            if not getattr(model.engine, "supports_top_logprobs", False):
                raise ServeError(
                    400, f"top_logprobs: the {model.engine.name} engine reports only the sampled token's "
                    "log-prob; use top_logprobs: 0", "top_logprobs",
                )  # fmt: skip
            extra["top_logprobs"] = top_logprobs
        outs = (await model.engine.generate([prompt_ids], params, **extra))[0]
        if any(o.finish_reason == "abort" for o in outs):
            raise ServeError(
                503, "the engine aborted the generation (weights changing or shutting down); retry"
            )
        return [
            Choice(
                i,
                list(o.token_ids),
                [float(x) for x in o.logprobs.tolist()],
                o.model_version,
                o.finish_reason,
                o.text,
            )  # fmt: skip
            for i, o in enumerate(outs)
        ], [o.top_logprobs for o in outs]

    def _answers(
        self, model: ModelWrapper, choices: list[Choice], tools: bool, tops: list[Any] | None = None
    ) -> list[Answer]:
        tok = model.tokenizer
        out = []
        for c, top in zip(choices, tops or [None] * len(choices), strict=True):
            content: str | None = c.text
            calls: list[dict[str, Any]] = []
            if tools:
                parsed = parse_tool_calls(c.text, self.tool_parser)
                content = parsed.content
                calls = [{"id": t.id, "type": "function", "function": {"name": t.name, "arguments": t.arguments}}
                         for t in parsed.tool_calls]  # fmt: skip
            finish = "tool_calls" if calls else c.finish_reason
            top_text = [[(tok.decode([t]), lp) for t, lp in step] for step in top] if top else None
            out.append(Answer(c, content, calls, finish, [tok.decode([t]) for t in c.token_ids], top_text))
        return out

    async def chat(
        self, req: ChatRequest, session_id: str | None, on_token: Callable[..., None] | None = None,
        call_id: str | None = None,
    ) -> tuple[Call, str, list[Answer]]:  # fmt: skip
        """(the recorded call, its session id, the answers). Nothing is recorded when it fails.
        `on_token(prompt, choice, token_id, logprob, top)` sees tokens as they are sampled (streaming)."""
        call_id = call_id or f"chatcmpl-{secrets.token_hex(12)}"
        sid = session_id or call_id
        self.store.check_open(sid)
        model = self._model()
        prompt_text = self._chat_prompt(model, req)
        ids = self._encode(model, sid, prompt_text)
        k = (req.top_logprobs or 0) if req.logprobs else 0
        choices, tops = await self._sample(model, ids, req, self._fit(ids, "messages"), on_token, k)
        answers = self._answers(model, choices, bool(req.tools) and req.tool_choice != "none", tops)
        call = Call(call_id, ids, choices, prompt_text)
        self.store.record(sid, call)
        return call, sid, answers

    async def complete(
        self, req: CompletionRequest, session_id: str | None, on_token: Callable[..., None] | None = None,
        call_id: str | None = None,
    ) -> tuple[Call, str, list[Answer]]:  # fmt: skip
        token_ids = _token_prompt(req.prompt, self.engines[0].vocab_size)
        prompt = (
            req.prompt if isinstance(req.prompt, str) else req.prompt[0] if len(req.prompt) == 1 else None
        )
        if prompt is None and token_ids is None:
            raise ServeError(400, "prompt: give one prompt per request (a string or its token ids)", "prompt")
        if req.echo:
            raise ServeError(400, "echo: not supported", "echo")
        call_id = call_id or f"cmpl-{secrets.token_hex(12)}"
        sid = session_id or call_id
        if req.record:
            self.store.check_open(sid)
        model = self._model()
        if token_ids is not None:  # sampled as given: no session continuation re-encodes them
            ids, prompt = token_ids, model.tokenizer.decode(token_ids, skip_special_tokens=False)
        else:
            ids = self._encode(model, sid, str(prompt))
        if not ids:
            raise ServeError(400, "prompt: empty", "prompt")
        k = req.logprobs or 0
        choices, tops = await self._sample(model, ids, req, self._fit(ids, "prompt"), on_token, k)
        call = Call(call_id, ids, choices, str(prompt))
        if req.record:
            self.store.record(sid, call)
        return call, sid, self._answers(model, choices, False, tops)

    # ------------------------------------------------------------------ feedback and commit
    def feedback(
        self, reward: float, session_id: str | None, response_id: str | None, choice_index: int | None
    ) -> str:
        return self.store.feedback(
            reward, session_id=session_id or None, response_id=response_id or None, choice_index=choice_index
        )

    async def commit(self, session_ids: list[str]) -> dict[str, Any]:
        """Put the sessions' experiences into the sink; exactly once (a failed put can be retried)."""
        experiences, sessions = self.store.begin_commit(list(session_ids))
        try:
            await self.sink.put(experiences)
        except BaseException:
            self.store.end_commit(sessions, ok=False)
            raise
        self.store.end_commit(sessions, ok=True)
        if self.on_commit is not None and experiences:
            rewards = [float(e.reward or 0.0) for e in experiences]
            self.on_commit(
                {"rollout/reward/mean": sum(rewards) / len(rewards), "serve/sessions": float(len(sessions)),
                 "serve/experiences": float(len(experiences)),
                 "rollout/model_version": float(min(e.model_version for e in experiences))},
                self.store.commits,
            )  # fmt: skip
        return {
            "committed": [s.session_id for s in sessions],
            "experiences": len(experiences),
            "model_versions": sorted({e.model_version for e in experiences}),
        }
