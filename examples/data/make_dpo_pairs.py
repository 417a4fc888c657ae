"""Write the DPO example's preference pairs: every sum `a+b=` with its right answer as `chosen` and a
wrong one as `rejected`.

    python examples/data/make_dpo_pairs.py                 # -> examples/data/arithmetic_pairs.jsonl (25 rows)

One JSON object per line, `{"prompt": "3+4=", "chosen": "7", "rejected": "5"}` (the wrong answer is
the right one plus 1..3, seeded), the keys `examples/dpo.yaml` names in its `format`
(`chosen_key`, `rejected_key`).
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path


def rows(max_operand: int = 4, seed: int = 0) -> list[dict[str, str]]:
    rng = random.Random(seed)
    out = [
        {"prompt": f"{a}+{b}=", "chosen": str(a + b), "rejected": str(a + b + rng.randint(1, 3))}
        for a in range(max_operand + 1)
        for b in range(max_operand + 1)
    ]
    rng.shuffle(out)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-operand", type=int, default=4)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=Path(__file__).with_name("arithmetic_pairs.jsonl"))
    args = parser.parse_args()
    data = rows(args.max_operand, args.seed)
    args.out.write_text("".join(json.dumps(r) + "\n" for r in data))
    print(f"wrote {len(data)} rows to {args.out}")


if __name__ == "__main__":
    main()
