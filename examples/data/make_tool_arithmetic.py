"""Write the data of examples/tool_use.yaml: arithmetic questions a model answers with a calculator.

    python examples/data/make_tool_arithmetic.py           # -> examples/data/tool_arithmetic.jsonl
                                                           #  + examples/data/tool_arithmetic_sft.jsonl

`tool_arithmetic.jsonl`: the GRPO taskset of the `tool_arithmetic` workflow, `{"question": "7*8=",
"answer": "56"}`, operands up to `--max-operand` (9) with + and *. Single digits keep the copying
the tiny model must learn (question -> call, tool response -> answer) within a short run; with
`--max-operand 99` the tiny model learns the call's format but not to copy the numbers.

`tool_arithmetic_sft.jsonl`: the SFT warm-up. Each of `--sft-rows` further questions is one episode,
written as OpenAI-style messages (user, assistant with `tool_calls`, tool result, assistant answer)
under `messages`, and as the two model turns the trainer learns, `{"prompt", "response"}` text pairs
rendered with the same template and code as the workflow (services/explorer/tools/template.py with
examples/data/tool_use_template.jinja, whose assistant turns end with `--eos-token`): turn 1 answers
the question with the call, turn 2 answers the tool response with the number.
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path
from typing import Any

from services.explorer.tools import render_prompt
from services.explorer.workflows.tool_arithmetic import CALCULATOR_SPEC, calculate

HERE = Path(__file__).parent
TEMPLATE = HERE / "tool_use_template.jinja"


class _TemplateOnly:
    """Renders a given chat template the way transformers does (no tokenizer needed for that)."""

    def __init__(self, eos_token: str):
        self.eos_token = eos_token

    def apply_chat_template(self, messages: Any, chat_template: str, **kw: Any) -> str:
        from transformers.utils.chat_template_utils import render_jinja_template

        kw.pop("tokenize", None)
        rendered, _ = render_jinja_template(
            conversations=[messages], chat_template=chat_template, eos_token=self.eos_token, **kw
        )
        return rendered[0]


def questions(count: int, max_operand: int, seed: int) -> list[dict[str, str]]:
    rng = random.Random(seed)
    out = []
    for _ in range(count):
        a, b, op = rng.randint(0, max_operand), rng.randint(0, max_operand), rng.choice("+*")
        out.append({"question": f"{a}{op}{b}=", "answer": str(calculate(f"{a}{op}{b}"))})
    return out


def episode(row: dict[str, str], index: int) -> list[dict[str, Any]]:
    call = {"name": "calculator", "arguments": json.dumps({"expression": row["question"].rstrip("=")})}
    call_id = f"call_{index:024x}"
    return [
        {"role": "user", "content": row["question"]},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"id": call_id, "type": "function", "function": call}],
        },
        {"role": "tool", "tool_call_id": call_id, "content": row["answer"]},
        {"role": "assistant", "content": row["answer"]},
    ]


def sft_rows(rows: list[dict[str, str]], template: str, eos_token: str = "<eos>") -> list[dict[str, Any]]:
    tok, tools, out = _TemplateOnly(eos_token), [CALCULATOR_SPEC], []
    for i, row in enumerate(rows):
        msgs = episode(row, i)
        first = render_prompt(tok, msgs[:1], tools, template)
        upto_call = render_prompt(tok, msgs[:2], tools, template, add_generation_prompt=False)
        second = render_prompt(tok, msgs[:3], tools, template)
        # what the model says in turn 1 (the trainer appends the EOS token itself)
        call_text = upto_call[len(first) :].removesuffix(eos_token + "\n")
        out.append({"prompt": first, "response": call_text, "messages": msgs, "tools": tools})
        out.append({"prompt": second, "response": row["answer"], "messages": msgs, "tools": tools})
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-operand", type=int, default=9)
    parser.add_argument("--tasks", type=int, default=256)
    parser.add_argument("--sft-rows", type=int, default=256)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--eos-token", default="<eos>", help="the model's EOS token (the tiny model's)")
    parser.add_argument("--out-dir", type=Path, default=HERE)
    args = parser.parse_args()
    tasks = questions(args.tasks, args.max_operand, args.seed)
    sft = sft_rows(
        questions(args.sft_rows, args.max_operand, args.seed + 1), TEMPLATE.read_text(), args.eos_token
    )
    for name, data in (("tool_arithmetic.jsonl", tasks), ("tool_arithmetic_sft.jsonl", sft)):
        path = args.out_dir / name
        path.write_text("".join(json.dumps(r) + "\n" for r in data))
        print(f"wrote {len(data)} rows to {path}")


if __name__ == "__main__":
    main()
