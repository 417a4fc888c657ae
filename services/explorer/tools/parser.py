"""Tool-call parsers: a model's reply text -> `ParsedReply(content, tool_calls)` as in the OpenAI API.

Parsers are found by name in `TOOL_CALL_PARSERS` (`explorer.rollout_model.tool_call_parser`, default
`hermes`) or as a dotted-path plug-in `my_pkg.mod:parse` (a callable `text -> ParsedReply`).

`hermes` (aliases `qwen`, `qwen2_5`): the format of Hermes-2-Pro and Qwen2.5/Qwen3 chat templates,
one or more blocks

    <tool_call>
    {"name": "calculator", "arguments": {"expression": "3+4"}}
    </tool_call>

anywhere in the reply. Text outside the blocks is the content (None when only whitespace is left).
A block whose body is not a JSON object with a string `name` (or an unclosed `<tool_call>` at the end,
as a reply cut by the token limit leaves it) is not a call: it stays in the content as written and
is counted in `ParsedReply.parse_errors`, so a workflow can report the failures instead of crashing.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from services.common.registry import Registry

__all__ = ["TOOL_CALL_PARSERS", "ParsedReply", "ToolCall", "new_call_id", "parse_tool_calls"]


@dataclass(frozen=True)
class ToolCall:
    """One call: `arguments` is a JSON object as a string, as OpenAI's `function.arguments`."""

    id: str  # "call_<24 hex>"
    name: str
    arguments: str

    def to_openai(self) -> dict[str, Any]:
        """The `tool_calls[i]` entry of an OpenAI assistant message."""
        return {
            "id": self.id,
            "type": "function",
            "function": {"name": self.name, "arguments": self.arguments},
        }


@dataclass(frozen=True)
class ParsedReply:
    content: str | None
    tool_calls: list[ToolCall] = field(default_factory=list)
    parse_errors: int = 0  # tool-call blocks that could not be read (left in `content`)


Parser = Callable[[str], ParsedReply]
TOOL_CALL_PARSERS: Registry[Parser] = Registry("tool call parser")


def new_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


def _call_from_json(body: str) -> ToolCall | None:
    """The call in a block body, or None when it is not `{"name": str, "arguments": object|str}`."""
    try:
        obj = json.loads(body)
    except json.JSONDecodeError:
        return None
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str) or not obj["name"]:
        return None
    args = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(args, str):  # some models emit the arguments already as a JSON string
        try:
            args = json.loads(args)
        except json.JSONDecodeError:
            return None
    if not isinstance(args, dict):
        return None
    return ToolCall(id=new_call_id(), name=obj["name"], arguments=json.dumps(args, ensure_ascii=False))


_HERMES_BLOCK = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)


@TOOL_CALL_PARSERS.register("hermes", "qwen", "qwen2_5")
def parse_hermes(text: str) -> ParsedReply:
    calls: list[ToolCall] = []
    kept: list[str] = []  # content pieces, in order
    errors, pos = 0, 0
    for block in _HERMES_BLOCK.finditer(text):
        kept.append(text[pos : block.start()])
        call = _call_from_json(block.group(1).strip())
        if call is None:
            errors += 1
            kept.append(block.group(0))
        else:
            calls.append(call)
        pos = block.end()
    tail = text[pos:]
    if "<tool_call>" in tail:  # opened, never closed (cut by the token limit)
        errors += 1
    kept.append(tail)
    content = "".join(kept).strip()
    return ParsedReply(content=content or None, tool_calls=calls, parse_errors=errors)


def parse_tool_calls(text: str, parser: str = "hermes") -> ParsedReply:
    """Split `text` into content and tool calls with the parser named `parser`."""
    return TOOL_CALL_PARSERS.get(parser)(text)
