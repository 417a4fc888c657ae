"""Rollout throughput: generated tokens/s of the explorer's `hf` engine vs a plain `model.generate` loop.

    python bench/rollout.py [--quick] [--size tiny|small] [--threads N] [--device cpu|cuda]

Both sides sample the same prompts (varied lengths, given in a shuffled order) from the same tiny model
made locally (`make_tiny_model`), at temperature 1 with `max_new_tokens` new tokens, in batches of
`--batch` prompts, in the same process, interleaved, several repetitions; the median is reported.
- ours: `HFEngine.generate_sync` (sorts prompts by length before batching, KV-cached loop over
  `model(...)` with logits of the last position only, finished rows leave the batch, exact log-probs).
- baseline: `model.generate(do_sample=True, top_k=0, top_p=1.0)` on left-padded batches in the given
  order (no log-probs requested, so it does less work than ours).
Tokens are the real generated tokens (up to and including EOS). Two scenarios: `uniform` (every prompt
may generate `max_new_tokens`: the same work on both sides; this is the headline "ratio") and `mixed`
(half of the prompts have a smaller `max_tokens`, as when tasksets differ; `generate` must run a batch to
its longest request and only tokens within each prompt's budget count; our rows leave when done).
The last line printed is one JSON object with the figures, "ratio" (ours / generate) and "target".
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "protos")]

import torch  # noqa: E402

from services.common.config import RFTConfig, resolve  # noqa: E402
from services.common.modeling import load_model, load_tokenizer  # noqa: E402
from services.common.tiny_model import make_tiny_model  # noqa: E402
from services.explorer.engines.hf import HFEngine  # noqa: E402


def make_prompts(tokenizer, n: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    words = ["what", "is", "the", "sum", "of", "and", "then", "total", "answer", "compute"]
    prompts = []
    for _ in range(n):
        text = (
            " ".join(rng.choice(words) for _ in range(rng.randint(2, 40)))
            + f" {rng.randint(0, 999)}+{rng.randint(0, 999)}="
        )
        prompts.append(tokenizer.encode(text, add_special_tokens=False))
    return prompts


def budgets(n: int, max_new: int, seed: int, mixed: bool = True) -> list[int]:
    if not mixed:
        return [max_new] * n
    rng = random.Random(seed + 1)
    return [max_new if i % 2 == 0 else rng.randint(max_new // 4, max_new) for i in range(n)]


def count_tokens(rows: torch.Tensor, eos: int, limits: list[int]) -> int:
    total = 0
    for row, limit in zip(rows.tolist(), limits, strict=True):
        row = row[:limit]
        total += row.index(eos) + 1 if eos in row else len(row)
    return total


def run_generate(model, tokenizer, prompts, limits, batch: int, device) -> tuple[int, float]:
    eos, pad = tokenizer.eos_token_id, tokenizer.pad_token_id
    tokens = 0
    t0 = time.perf_counter()
    for s in range(0, len(prompts), batch):
        chunk, lim = prompts[s : s + batch], limits[s : s + batch]
        width = max(len(p) for p in chunk)
        ids = torch.tensor([[pad] * (width - len(p)) + p for p in chunk], device=device)
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in chunk], device=device)
        with torch.inference_mode():
            out = model.generate(
                input_ids=ids, attention_mask=mask, do_sample=True, top_k=0, top_p=1.0, temperature=1.0,
                max_new_tokens=max(lim), pad_token_id=pad, eos_token_id=eos,
            )  # fmt: skip
        tokens += count_tokens(out[:, width:].cpu(), eos, lim)
    if device.type == "cuda":
        torch.cuda.synchronize()
    return tokens, time.perf_counter() - t0


def run_ours(engine: HFEngine, prompts, limits) -> tuple[int, float]:
    t0 = time.perf_counter()
    base = resolve(RFTConfig()).sampling_params(temperature=1.0, max_tokens=1)  # the model.* defaults
    outs = engine.generate_sync(prompts, [base.replace(max_tokens=m) for m in limits])
    if engine.model.device.type == "cuda":
        torch.cuda.synchronize()
    return sum(len(g[0].token_ids) for g in outs), time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer prompts and repetitions (under 3 minutes)")
    ap.add_argument("--size", default=None, choices=["tiny", "small"])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--batch", type=int, default=32)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    size = args.size or ("tiny" if args.quick else "small")
    n, max_new, reps = (64, 32, 3) if args.quick else (128, 64, 5)
    device = torch.device(args.device)
    with tempfile.TemporaryDirectory() as tmp:
        folder = make_tiny_model(Path(tmp) / "model", size=size)
        tokenizer = load_tokenizer(folder)
        model = load_model(folder, dtype="float32", device=device).eval()
        engine = HFEngine(model, tokenizer, micro_batch_size=args.batch, seed=0)
        prompts = make_prompts(tokenizer, n, seed=0)
        run_ours(engine, prompts[:4], [4] * 4)  # warm-up both paths
        run_generate(model, tokenizer, prompts[:4], [4] * 4, args.batch, device)
        figures: dict[str, tuple[list[float], list[float]]] = {}
        for scenario in ("uniform", "mixed"):
            limits = budgets(n, max_new, seed=0, mixed=scenario == "mixed")
            ours, base = [], []
            for rep in range(reps):
                for side in ("ours", "base") if rep % 2 == 0 else ("base", "ours"):
                    if side == "ours":
                        tok, sec = run_ours(engine, prompts, limits)
                        ours.append(tok / sec)
                    else:
                        tok, sec = run_generate(model, tokenizer, prompts, limits, args.batch, device)
                        base.append(tok / sec)
            figures[scenario] = (ours, base)
    print(f"rollout: {n} prompts of 4-60 tokens, batch {args.batch}, model {size}, {device}, "
          f"{args.threads} thread(s), {reps} reps interleaved (median tokens/s)")  # fmt: skip
    print("  uniform: every prompt may generate max_new_tokens =", max_new)
    print("  mixed:   half of the prompts have a smaller max_tokens (per-request budgets)")
    print(f"{'scenario':10}{'hf engine (ours)':>18}{'model.generate':>16}{'ratio':>8}   runs ours | generate")
    result: dict[str, object] = {"bench": "rollout", "model": size, "device": str(device), "prompts": n,
                                 "max_new_tokens": max_new}  # fmt: skip
    for scenario, (ours, base) in figures.items():
        o, b = statistics.median(ours), statistics.median(base)
        runs = f"{', '.join(f'{x:.0f}' for x in ours)} | {', '.join(f'{x:.0f}' for x in base)}"
        print(f"{scenario:10}{o:18.0f}{b:16.0f}{o / b:8.2f}   {runs}")
        result[f"ours_tokens_per_s_{scenario}"] = round(o, 1)
        result[f"generate_tokens_per_s_{scenario}"] = round(b, 1)
        result[f"ratio_{scenario}"] = round(o / b, 3)
    # the headline is the uniform case: the same work on both sides
    result["ours_tokens_per_s"] = result["ours_tokens_per_s_uniform"]
    result["generate_tokens_per_s"] = result["generate_tokens_per_s_uniform"]
    result["ratio"] = result["ratio_uniform"]
    result["target"] = 1.0
    print(json.dumps(result))


if __name__ == "__main__":
    main()
