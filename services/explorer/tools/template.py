"""OpenAI-style messages (with tool specs, tool calls and tool results) -> prompt text.

`render_prompt` uses the tokenizer's chat template (or `chat_template`) with `tools=` when that
template renders tools (checked once per tokenizer and template by rendering a probe tool); else,
when tools or tool messages are present, the Hermes/Qwen2.5-style `FALLBACK_TOOL_TEMPLATE`:

- tool specs listed as JSON lines inside `<tools></tools>` in the system turn;
- an assistant's `tool_calls` as `<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`,
  exactly what the `hermes` parser (parser.py) reads back;
- `role: tool` results as `<tool_response>...</tool_response>` in a user turn (consecutive results
  share one turn, as Qwen2.5's template).

Messages are normalised first: an assistant `content: None` becomes "", and tool-call `arguments`
given as a JSON string (as the OpenAI API sends them) become objects for the template, which
serialises them itself. The text ends with the generation prompt (`<|im_start|>assistant\\n` in the
fallback) unless `add_generation_prompt=False`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from jinja2.sandbox import ImmutableSandboxedEnvironment

__all__ = ["FALLBACK_TOOL_TEMPLATE", "normalize_messages", "render_prompt", "supports_tools"]

FALLBACK_TOOL_TEMPLATE = """\
{%- if tools %}
{{- '<|im_start|>system\\n' }}
{%- if messages[0].role == 'system' %}{{- messages[0].content + '\\n\\n' }}{%- endif %}
{{- '# Tools\\n\\nYou may call functions. Their signatures are in <tools></tools>:\\n<tools>' }}
{%- for tool in tools %}{{- '\\n' + (tool | tojson) }}{%- endfor %}
{{- '\\n</tools>\\n\\nTo call one, reply with\\n<tool_call>\\n{"name": <name>, "arguments": <object>}\\n</tool_call><|im_end|>\\n' }}
{%- elif messages[0].role == 'system' %}
{{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}
{%- endif %}
{%- for message in messages %}
{%- if message.role == 'user' or (message.role == 'system' and not loop.first) %}
{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}
{%- elif message.role == 'assistant' %}
{{- '<|im_start|>assistant\\n' + message.content }}
{%- for call in message.tool_calls or [] %}
{%- if call.function is defined %}{%- set call = call.function %}{%- endif %}
{%- if message.content or not loop.first %}{{- '\\n' }}{%- endif %}
{{- '<tool_call>\\n{"name": ' + (call.name | tojson) + ', "arguments": ' }}
{%- if call.arguments is string %}{{- call.arguments }}{%- else %}{{- call.arguments | tojson }}{%- endif %}
{{- '}\\n</tool_call>' }}
{%- endfor %}
{{- '<|im_end|>\\n' }}
{%- elif message.role == 'tool' %}
{%- if loop.first or messages[loop.index0 - 1].role != 'tool' %}{{- '<|im_start|>user' }}{%- endif %}
{{- '\\n<tool_response>\\n' + message.content + '\\n</tool_response>' }}
{%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}{{- '<|im_end|>\\n' }}{%- endif %}
{%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}
"""

_PROBE_NAME = "probe_tool_7f3a"
_PROBE_TOOLS = [
    {
        "type": "function",
        "function": {
            "name": _PROBE_NAME,
            "description": "probe",
            "parameters": {"type": "object", "properties": {}},
        },
    }
]
_support_cache: dict[tuple[int, str], bool] = {}


def _tojson(value: Any, indent: int | None = None) -> str:
    # jinja's own `tojson` HTML-escapes <, >, & and '; chat templates want the plain JSON
    return json.dumps(value, ensure_ascii=False, indent=indent)


_env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
_env.filters["tojson"] = _tojson
_fallback = _env.from_string(FALLBACK_TOOL_TEMPLATE)


def normalize_messages(messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Copies with `content` None -> "" and tool-call arguments parsed from JSON strings to objects."""
    out = []
    for i, m in enumerate(messages):
        if "role" not in m:
            raise ValueError(f"messages[{i}] has no 'role' (expected system, user, assistant or tool)")
        msg = dict(m)
        msg["content"] = "" if msg.get("content") is None else msg["content"]
        if msg.get("tool_calls"):
            msg["tool_calls"] = [_normalize_call(c, i) for c in msg["tool_calls"]]
        out.append(msg)
    return out


def _normalize_call(call: Mapping[str, Any], index: int) -> dict[str, Any]:
    call = dict(call)
    fn = dict(call.get("function", call))
    args = fn.get("arguments", {})
    if isinstance(args, str):
        try:
            args = json.loads(args) if args.strip() else {}
        except json.JSONDecodeError as exc:
            raise ValueError(
                f"messages[{index}].tool_calls: arguments {args[:80]!r} are not JSON ({exc.msg}); "
                "send them as a JSON object string, e.g. '{\"x\": 1}'"
            ) from exc
    fn["arguments"] = args
    if "function" in call:
        call["function"] = fn
        return call
    return fn


def _apply(
    tokenizer: Any, messages: list[dict[str, Any]], tools: Any, template: str | None, gen: bool, **kw: Any
) -> str:
    extra: dict[str, Any] = {"chat_template": template, **kw} if template else dict(kw)
    if tools:
        extra["tools"] = tools
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=gen, **extra)


def supports_tools(tokenizer: Any, chat_template: str | None = None) -> bool:
    """Whether the template renders the specs given as `tools=` (a probe tool's name shows up)."""
    # the template text is in the key, so a new tokenizer that reuses an old id is not misjudged
    key = (id(tokenizer), chat_template or str(getattr(tokenizer, "chat_template", None)))
    if key not in _support_cache:
        try:
            text = _apply(tokenizer, [{"role": "user", "content": "hi"}], _PROBE_TOOLS, chat_template, True)
        except Exception:  # a template that fails on tools does not support them
            text = ""
        _support_cache[key] = _PROBE_NAME in text
    return _support_cache[key]


def _uses_tools(messages: list[dict[str, Any]]) -> bool:
    return any(m["role"] == "tool" or m.get("tool_calls") for m in messages)


def render_prompt(
    tokenizer: Any,
    messages: list[dict],
    tools: list[dict] | None = None,
    chat_template: str | None = None,
    *,
    add_generation_prompt: bool = True,
    **template_kwargs: Any,
) -> str:
    """The prompt text of `messages` (+ `tools`), ending with the generation prompt.

    `template_kwargs` (e.g. `enable_thinking`) go to the tokenizer's template, not to the fallback."""
    msgs = normalize_messages(messages)
    gen = add_generation_prompt
    if not tools and not _uses_tools(msgs):
        return _apply(tokenizer, msgs, None, chat_template, gen, **template_kwargs)
    if supports_tools(tokenizer, chat_template):
        return _apply(tokenizer, msgs, tools, chat_template, gen, **template_kwargs)
    specials = {name: getattr(tokenizer, name, None) or "" for name in ("bos_token", "eos_token")}
    return _fallback.render(
        messages=msgs, tools=tools or [], add_generation_prompt=add_generation_prompt, **specials
    )
