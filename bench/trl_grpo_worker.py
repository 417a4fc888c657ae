"""The TRL side of `bench/e2e_vs_trl.py`: one `GRPOTrainer` run, run by the benchmark in its own
virtualenv (TRL is a benchmark-only dependency; see `e2e_vs_trl.py` for how it is installed).

    .venv-bench/bin/python bench/trl_grpo_worker.py --model DIR --data FILE --steps N --out RESULT.json
        [--device cpu|cuda]

`--device cpu` (the default): fp32 on CPU (`use_cpu`); `--device cuda`: the first GPU with bf16 mixed
precision, as the trainer of RFT Mesh computes there (scripts/gpu_probe.sh's baseline).

The reward is `arithmetic_reward` of `services/explorer/workflows/arithmetic.py`, taken from that file's
source (this venv has none of the product's dependencies, so the module itself cannot be imported):
both sides score completions with the same code. Writes per-step wall-clock end times, rewards and
token counts as JSON; the benchmark turns them into figures.
"""

from __future__ import annotations

import argparse
import ast
import json
import re
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
REWARD_SOURCE = ROOT / "services" / "explorer" / "workflows" / "arithmetic.py"


def load_reward() -> Any:
    """`arithmetic_reward` (and the regex it uses) compiled from the product's own source."""
    tree = ast.parse(REWARD_SOURCE.read_text())
    keep = [
        node
        for node in tree.body
        if (isinstance(node, ast.FunctionDef) and node.name == "arithmetic_reward")
        or (
            isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "_LEADING_INT" for t in node.targets)
        )
    ]
    namespace: dict[str, Any] = {"re": re, "Any": Any}
    exec(compile(ast.Module(body=keep, type_ignores=[]), str(REWARD_SOURCE), "exec"), namespace)  # noqa: S102
    return namespace["arithmetic_reward"]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--data", required=True)
    ap.add_argument("--steps", type=int, required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--group", type=int, default=8)
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--format-score", type=float, default=0.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    args = ap.parse_args()

    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: torch sees no CUDA device")
    if args.threads:
        torch.set_num_threads(args.threads)
    reward_fn = load_reward()

    def reward(completions: list[str], answer: list[str], **_: Any) -> list[float]:
        return [
            reward_fn(c, a, format_score=args.format_score) for c, a in zip(completions, answer, strict=True)
        ]

    rows = [json.loads(line) for line in Path(args.data).read_text().splitlines() if line.strip()]
    repeat = -(-args.steps * args.prompts // len(rows)) + 1
    dataset = Dataset.from_list(
        [{"prompt": r["question"], "answer": str(r["answer"])} for r in rows] * repeat
    )

    ends: list[float] = []

    class Clock(TrainerCallback):
        def on_step_end(self, *_: Any, **__: Any) -> None:
            ends.append(time.perf_counter())

    config = GRPOConfig(
        output_dir=str(Path(args.out).parent / "trl_out"),
        use_cpu=args.device == "cpu",
        bf16=args.device == "cuda",
        use_vllm=False,
        beta=0.0,
        learning_rate=args.lr,
        temperature=args.temperature,
        num_generations=args.group,
        per_device_train_batch_size=args.group * args.prompts,
        gradient_accumulation_steps=1,
        max_completion_length=args.max_tokens,
        max_steps=args.steps,
        lr_scheduler_type="constant",
        warmup_steps=0,
        weight_decay=0.0,
        save_strategy="no",
        report_to="none",
        logging_steps=1,
        seed=args.seed,
        disable_tqdm=True,
    )
    t0 = time.perf_counter()
    trainer = GRPOTrainer(
        model=AutoModelForCausalLM.from_pretrained(args.model),
        processing_class=PreTrainedTokenizerFast.from_pretrained(args.model),
        reward_funcs=reward,
        args=config,
        train_dataset=dataset,
        callbacks=[Clock()],
    )
    started = time.perf_counter()
    trainer.train()
    logs = [h for h in trainer.state.log_history if "reward" in h]
    result = {
        "setup_s": started - t0,
        "step_end_s": [t - started for t in ends],
        "reward": [float(h["reward"]) for h in logs],
        "num_tokens": [float(h.get("num_tokens", 0.0)) for h in logs],
        "completion_length": [float(h.get("completions/mean_length", 0.0)) for h in logs],
        "threads": torch.get_num_threads(),
        "device": args.device,
    }
    Path(args.out).write_text(json.dumps(result))


if __name__ == "__main__":
    main()
