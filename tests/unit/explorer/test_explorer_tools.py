"""Tool calls: the hermes parser on pinned replies, and prompt rendering with tools on the tiny
model's real tokenizer (its plain template ignores tools, so the fallback renders them) and with a
tool-aware template."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from services.common.modeling import load_tokenizer
from services.common.registry import UnknownNameError
from services.explorer.tools import (
    FALLBACK_TOOL_TEMPLATE,
    TOOL_CALL_PARSERS,
    ParsedReply,
    ToolCall,
    parse_tool_calls,
    render_prompt,
    supports_tools,
)

CALL = '<tool_call>\n{"name": "calculator", "arguments": {"expression": "3+4"}}\n</tool_call>'


def _calls(reply: ParsedReply) -> list[tuple[str, dict]]:
    return [(c.name, json.loads(c.arguments)) for c in reply.tool_calls]


def test_one_call_and_no_content():
    reply = parse_tool_calls(CALL)
    assert reply.content is None and reply.parse_errors == 0
    assert _calls(reply) == [("calculator", {"expression": "3+4"})]
    call = reply.tool_calls[0]
    assert re.fullmatch(r"call_[0-9a-f]{24}", call.id)
    assert call.arguments == '{"expression": "3+4"}'  # a JSON string, as OpenAI's function.arguments
    assert call.to_openai() == {
        "id": call.id,
        "type": "function",
        "function": {"name": "calculator", "arguments": '{"expression": "3+4"}'},
    }


def test_several_calls_with_text_around():
    text = f'Let me check.\n{CALL}\n<tool_call>{{"name": "search", "arguments": {{}}}}</tool_call>\nDone.'
    reply = parse_tool_calls(text, "hermes")
    assert _calls(reply) == [("calculator", {"expression": "3+4"}), ("search", {})]
    assert reply.content == "Let me check.\n\n\nDone."
    assert len({c.id for c in reply.tool_calls}) == 2


def test_no_call_keeps_the_text():
    assert parse_tool_calls("  The answer is 7.\n") == ParsedReply("The answer is 7.", [], 0)
    assert parse_tool_calls("") == ParsedReply(None, [], 0)


def test_malformed_blocks_stay_in_the_content_and_are_counted():
    bad = '<tool_call>\n{"name": "calculator", "arguments": {"expression": "3+4"</tool_call>'
    no_name = '<tool_call>{"arguments": {}}</tool_call>'
    reply = parse_tool_calls(f"a {bad} b {CALL} c {no_name}")
    assert _calls(reply) == [("calculator", {"expression": "3+4"})]
    assert reply.parse_errors == 2
    assert reply.content == f"a {bad} b  c {no_name}"
    cut = parse_tool_calls('7 <tool_call>\n{"name": "calcu')  # cut by the token limit
    assert cut == ParsedReply('7 <tool_call>\n{"name": "calcu', [], 1)


def test_nested_json_and_string_arguments():
    nested = {"filter": {"tags": ["a", "b"], "range": {"lo": 1, "hi": [2, 3]}}, "note": "x</y>"}
    reply = parse_tool_calls(f"<tool_call>{json.dumps({'name': 'q', 'arguments': nested})}</tool_call>")
    assert _calls(reply) == [("q", nested)]
    as_string = json.dumps({"name": "q", "arguments": json.dumps({"k": 1})})
    assert _calls(parse_tool_calls(f"<tool_call>{as_string}</tool_call>")) == [("q", {"k": 1})]


def test_records_are_frozen_and_parsers_are_found_by_name():
    call = ToolCall("call_0", "f", "{}")
    with pytest.raises(AttributeError):
        call.name = "g"  # type: ignore[misc]
    assert TOOL_CALL_PARSERS.get("qwen") is TOOL_CALL_PARSERS.get("hermes")
    with pytest.raises(UnknownNameError, match="did you mean 'hermes'"):
        parse_tool_calls(CALL, "hermse")


TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "calculator",
            "description": "Evaluate a+b or a*b",
            "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}},
        },
    }
]
ROUND_TRIP = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "3+4="},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "call_1",
                "type": "function",
                "function": {"name": "calculator", "arguments": '{"expression": "3+4"}'},
            }
        ],
    },
    {"role": "tool", "tool_call_id": "call_1", "content": "7"},
]


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir: Path):
    return load_tokenizer(tiny_model_dir)


def test_the_tiny_template_ignores_tools_so_the_fallback_renders_them(tokenizer):
    assert not supports_tools(tokenizer) and supports_tools(tokenizer, FALLBACK_TOOL_TEMPLATE)
    text = render_prompt(tokenizer, ROUND_TRIP[:2], TOOLS)
    assert text.startswith("<|im_start|>system\nBe brief.\n\n# Tools")
    assert "<tools>\n" + json.dumps(TOOLS[0]) + "\n</tools>" in text
    assert text.endswith("<|im_start|>user\n3+4=<|im_end|>\n<|im_start|>assistant\n")


def test_a_tool_round_trip_renders_with_the_generation_prompt_last(tokenizer):
    text = render_prompt(tokenizer, ROUND_TRIP, TOOLS)
    call_text = "<|im_start|>assistant\n" + CALL + "<|im_end|>\n"
    response = "<|im_start|>user\n<tool_response>\n7\n</tool_response><|im_end|>\n"
    assert text.endswith(call_text + response + "<|im_start|>assistant\n")
    # what the template writes for a call is what the parser reads back
    assert _calls(parse_tool_calls(CALL)) == [("calculator", {"expression": "3+4"})]
    no_prompt = render_prompt(tokenizer, ROUND_TRIP, TOOLS, add_generation_prompt=False)
    assert no_prompt == text.removesuffix("<|im_start|>assistant\n")
    # the text goes through the real tokenizer and back
    assert tokenizer.decode(tokenizer.encode(text, add_special_tokens=False)) == text


def test_a_tool_aware_template_is_used_as_given(tokenizer):
    template = (
        "{% for t in tools %}TOOL {{ t.function.name }}\n{% endfor %}"
        "{% for m in messages %}{{ m.role }}: {{ m.content }}"
        "{% for c in m.tool_calls or [] %}CALL {{ c.function.name }} {{ c.function.arguments.expression }}"
        "{% endfor %}{{ '\\n' }}{% endfor %}{% if add_generation_prompt %}assistant: {% endif %}"
    )
    text = render_prompt(tokenizer, ROUND_TRIP, TOOLS, chat_template=template)
    # arguments reach the template as an object (the OpenAI JSON string is parsed)
    assert text == (
        "TOOL calculator\nsystem: Be brief.\nuser: 3+4=\nassistant: CALL calculator 3+4\ntool: 7\nassistant: "
    )


def test_without_tools_the_tokenizer_template_renders_and_bad_arguments_are_named(tokenizer):
    assert render_prompt(tokenizer, [{"role": "user", "content": "hi"}]) == "user: hi\nassistant: "
    broken = [dict(ROUND_TRIP[2], tool_calls=[{"function": {"name": "f", "arguments": "{x"}}])]
    with pytest.raises(ValueError, match=r"messages\[0\]\.tool_calls: arguments '\{x' are not JSON"):
        render_prompt(tokenizer, broken, TOOLS)


def test_the_configured_parser_is_checked_before_a_run_and_the_keys_load():
    import yaml

    from launcher.names import check_names
    from services.common.config import load_config

    tree = {
        "mode": "explore",
        "model": {"max_response_tokens": 4},
        "buffer": {"explorer_input": {"taskset": {"path": "t.jsonl", "format": {"tools_key": "functions"}}}},
        "explorer": {"rollout_model": {"tool_call_parser": "hermse"}},
    }
    config = load_config(text=yaml.safe_dump(tree))  # no longer refused at load
    assert config.buffer.explorer_input.taskset.format.tools_key == "functions"
    problems = {p.path: p.message for p in check_names(config)}
    assert "did you mean `hermes`" in problems["explorer.rollout_model.tool_call_parser"]
    config = load_config(
        text=yaml.safe_dump(tree), overrides=["explorer.rollout_model.tool_call_parser=qwen"]
    )
    assert check_names(config) == []
