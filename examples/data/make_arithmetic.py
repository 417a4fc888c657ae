"""Write the quickstart's synthetic task: every sum `a+b=` with a, b in 0..N-1 and its answer.

    python examples/data/make_arithmetic.py                # -> examples/data/arithmetic.jsonl (25 rows)
    python examples/data/make_arithmetic.py --max-operand 9 --out /tmp/arith.jsonl
    python examples/data/make_arithmetic.py --pairs        # -> examples/data/arithmetic_pairs.jsonl (DPO)

One JSON object per line, `{"question": "3+4=", "answer": "7"}`, in a fixed shuffled order. The same
file is the GRPO taskset (`question` is the prompt, `answer` the ground truth of the `arithmetic`
workflow) and the SFT warm-up data (`question` -> `answer`). A randomly initialised model answers
almost none of these; the quickstart's short SFT stage brings it to about a quarter, and GRPO the rest.

With `--pairs` each sum is a DPO preference pair instead, `{"prompt": "3+4=", "chosen": "7",
"rejected": "9"}` (the rejected answer is 1..3 too high), for `examples/dpo.yaml`.
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path


def rows(max_operand: int = 4, seed: int = 0) -> list[dict[str, str]]:
    out = [{"question": f"{a}+{b}=", "answer": str(a + b)}
           for a in range(max_operand + 1) for b in range(max_operand + 1)]  # fmt: skip
    random.Random(seed).shuffle(out)
    return out


def pair_rows(max_operand: int = 4, seed: int = 0) -> list[dict[str, str]]:
    rng = random.Random(seed)
    out = [{"prompt": f"{a}+{b}=", "chosen": str(a + b), "rejected": str(a + b + rng.randint(1, 3))}
           for a in range(max_operand + 1) for b in range(max_operand + 1)]  # fmt: skip
    rng.shuffle(out)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-operand", type=int, default=4)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--pairs", action="store_true", help="DPO preference pairs")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    name = "arithmetic_pairs.jsonl" if args.pairs else "arithmetic.jsonl"
    args.out = args.out or Path(__file__).with_name(name)
    data = (pair_rows if args.pairs else rows)(args.max_operand, args.seed)
    args.out.write_text("".join(json.dumps(r) + "\n" for r in data))
    print(f"wrote {len(data)} rows to {args.out}")


if __name__ == "__main__":
    main()
