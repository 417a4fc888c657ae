"""Tool-use accuracy of exported models, sampled outside the run: whole `tool_arithmetic` episodes.

    python bench/tool_use_episodes.py BASELINE_HF_DIR MODEL_HF_DIR [--samples 4] [--seed 0]

For each question of examples/data/tool_arithmetic.jsonl and each model, `--samples` episodes at
temperature 1 with transformers, as the workflow plays them: the question rendered with the example's
chat template and the calculator's spec, the reply parsed with the hermes parser, the calls answered by
the workflow's `CalculatorEnv` as `<tool_response>`s, then the model's answer; an episode is right when
the answer's last integer is the row's answer (a reply without a call is the answer itself). Typical use: the SFT stage's export of `bench/tool_use.py
--out DIR` as the baseline and the GRPO stage's export as the model. Prints both accuracies; the last
line is one JSON object with "ratio" = model accuracy / baseline accuracy (target 1.0: no worse).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from services.explorer.tools import render_prompt  # noqa: E402
from services.explorer.tools.parser import parse_tool_calls  # noqa: E402
from services.explorer.workflows.tool_arithmetic import CalculatorEnv, final_integer  # noqa: E402

TASKS = ROOT / "examples" / "data" / "tool_arithmetic.jsonl"
TEMPLATE = ROOT / "examples" / "data" / "tool_use_template.jinja"
CALL_TOKENS, ANSWER_TOKENS = 80, 8


def _sample(model, tok, text: str, n: int, max_tokens: int) -> list[str]:
    ids = tok(text, return_tensors="pt", add_special_tokens=False)
    out = model.generate(
        **ids, do_sample=True, temperature=1.0, top_p=1.0, top_k=0, max_new_tokens=max_tokens,
        num_return_sequences=n, pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id,
    )  # fmt: skip
    return tok.batch_decode(out[:, ids["input_ids"].shape[1] :], skip_special_tokens=True)


def _right(model, tok, row: dict[str, str], reply: str, template: str) -> tuple[bool, bool]:
    """(made a well-formed call, ended with the right number) for one episode that began with `reply`,
    played on as `tool_arithmetic` with max_turns 2: the calculator environment answers the calls, and
    the next reply is the answer (a second call instead ends the episode unanswered)."""
    env, messages = CalculatorEnv(), [{"role": "user", "content": row["question"]}]
    calls = parse_tool_calls(reply, "hermes").tool_calls
    if not calls:
        return False, final_integer(reply) == int(row["answer"])
    messages.append({"role": "assistant", "content": reply})
    messages += [{"role": "tool", "tool_call_id": c.id, "content": env.call_tool(c)} for c in calls]
    answer = _sample(model, tok, render_prompt(tok, messages, env.tools, template), 1, ANSWER_TOKENS)[0]
    if parse_tool_calls(answer, "hermes").tool_calls:
        return env.good_calls > 0, False
    return env.good_calls > 0, final_integer(answer) == int(row["answer"])


def episodes(model_dir: Path, samples: int, seed: int) -> dict[str, float]:
    tok = PreTrainedTokenizerFast.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    template = TEMPLATE.read_text()
    torch.manual_seed(seed)
    total = calls = right = 0
    with torch.no_grad():
        for line in TASKS.read_text().splitlines():
            row = json.loads(line)
            prompt = render_prompt(
                tok, [{"role": "user", "content": row["question"]}], CalculatorEnv.tools, template
            )
            for reply in _sample(model, tok, prompt, samples, CALL_TOKENS):
                called, ok = _right(model, tok, row, reply, template)
                total, calls, right = total + 1, calls + called, right + ok
    return {"episodes": total, "calls": round(calls / total, 4), "accuracy": round(right / total, 4)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("baseline", type=Path, help="HF folder of the baseline (e.g. the SFT export)")
    ap.add_argument("model", type=Path, help="HF folder of the model to compare (e.g. the GRPO export)")
    ap.add_argument("--samples", type=int, default=4, help="episodes per question and model")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    torch.set_num_threads(2)
    base = episodes(args.baseline, args.samples, args.seed)
    ours = episodes(args.model, args.samples, args.seed)
    for name, r in (("baseline", base), ("model", ours)):
        se = math.sqrt(r["accuracy"] * (1 - r["accuracy"]) / r["episodes"])
        print(
            f"{name:<10} {r['episodes']} episodes: accuracy {r['accuracy']:.3f} (+- {se:.3f}), calls {r['calls']:.3f}"
        )
    print(json.dumps({
        "bench": "tool_use_episodes", "baseline_dir": str(args.baseline), "model_dir": str(args.model),
        "baseline": base, "model": ours, "accuracy": ours["accuracy"],
        "baseline_accuracy": base["accuracy"],
        "ratio": round(ours["accuracy"] / base["accuracy"], 3) if base["accuracy"] else None, "target": 1.0,
    }))  # fmt: skip


if __name__ == "__main__":
    main()
