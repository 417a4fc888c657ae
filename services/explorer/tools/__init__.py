"""Tool calls: parse a model's reply into OpenAI-style `tool_calls` (`parser.py`, parsers by name in
`TOOL_CALL_PARSERS`) and render OpenAI-style messages with tool specs into a prompt (`template.py`,
the tokenizer's chat template when it takes `tools`, else a Hermes/Qwen-style fallback).

Used by the tool-using workflows (`multi_turn` with tools, `tool_arithmetic`) and by the explorer's
OpenAI-compatible endpoint, so a rollout and a served chat see the same prompt and the same parse.
"""

from services.explorer.tools.parser import TOOL_CALL_PARSERS, ParsedReply, ToolCall, parse_tool_calls
from services.explorer.tools.template import FALLBACK_TOOL_TEMPLATE, render_prompt, supports_tools

__all__ = [
    "FALLBACK_TOOL_TEMPLATE",
    "TOOL_CALL_PARSERS",
    "ParsedReply",
    "ToolCall",
    "parse_tool_calls",
    "render_prompt",
    "supports_tools",
]
