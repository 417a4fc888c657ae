"""Rollout throughput: generated tokens/s of the explorer's `hf` and `vllm` engines vs `model.generate`.

    python bench/rollout.py [--quick] [--size tiny|small] [--threads N] [--device cpu|cuda]
                            [--vllm-python PATH | --no-vllm]

Both sides sample the same prompts (varied lengths, given in a shuffled order) from the same tiny model
made locally (`make_tiny_model`), at temperature 1 with `max_new_tokens` new tokens, in batches of
`--batch` prompts, in the same process, interleaved, several repetitions; the median is reported.
- ours: `HFEngine.generate_sync` (sorts prompts by length before batching, KV-cached loop over
  `model(...)` with logits of the last position only, finished rows leave the batch, exact log-probs).
- baseline: `model.generate(do_sample=True, top_k=0, top_p=1.0)` on left-padded batches in the given
  order (no log-probs requested, so it does less work than ours).
- vllm: the explorer's `vllm` engine (`VLLMEngine.from_config`, float32, `generate` with the same
  per-prompt `SamplingParams`: every prompt sent at once, vLLM batches them itself; log-probs of the
  sampled tokens come back as for ours). vLLM lives in its own environment (.venv-vllm, `bash
  scripts/setup.sh --engine vllm`), so this row runs in a worker process of that interpreter (this
  file with `--vllm-worker`; its own interpreter when vLLM is importable here), started once before
  the repetitions (its start-up, ~1-2 min on 2 cores, is reported apart) and sent each repetition's
  prompts; its processes get `--threads` torch threads each (OMP_NUM_THREADS). Without .venv-vllm
  the row is left out (or with `--no-vllm`).
Tokens are the real generated tokens (up to and including EOS). Two scenarios: `uniform` (every prompt
may generate `max_new_tokens`: the same work on both sides; this is the headline "ratio") and `mixed`
(half of the prompts have a smaller `max_tokens`, as when tasksets differ; `generate` must run a batch to
its longest request and only tokens within each prompt's budget count; our rows leave when done).
The last line printed is one JSON object with the figures, "ratio" (ours / generate) and "target";
with the vLLM row also `vllm_tokens_per_s[_scenario]` and `vllm_ratio[_scenario]` (vllm / generate,
the same run's baseline).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "protos")]

import torch  # noqa: E402

from launcher.tiny_model import make_tiny_model  # noqa: E402
from services.common.config import RFTConfig, resolve  # noqa: E402
from services.common.modeling import load_model, load_tokenizer  # noqa: E402
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


def vllm_worker(folder: str, seed: int) -> None:
    """The vLLM side, in the vLLM environment: start the engine, then for each JSON line on stdin
    ({"prompts", "limits"}) generate and answer {"tokens", "seconds"} on the original stdout; vLLM's
    own output (its processes inherit fd 1) goes to stderr."""
    import asyncio

    from services.common.config import InferenceModelConfig
    from services.explorer.engines.vllm import VLLMEngine

    answer = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)

    async def serve() -> None:
        t0 = time.perf_counter()
        cfg = InferenceModelConfig(engine_type="vllm", dtype="float32", gpu_memory_utilization=0.3, seed=seed)
        engine = VLLMEngine.from_config(cfg, folder)
        base = resolve(RFTConfig()).sampling_params(temperature=1.0, max_tokens=1)
        try:
            answer.write(json.dumps({"ready": True, "start_s": time.perf_counter() - t0}) + "\n")
            while line := await asyncio.to_thread(sys.stdin.readline):
                job = json.loads(line)
                params = [base.replace(max_tokens=m) for m in job["limits"]]
                # as after each weight load of a run: no prompt's KV is kept from the previous repetition
                await engine.llm.reset_prefix_cache()
                t = time.perf_counter()
                outs = await engine.generate(job["prompts"], params)
                sec = time.perf_counter() - t
                answer.write(
                    json.dumps({"tokens": sum(len(g[0].token_ids) for g in outs), "seconds": sec}) + "\n"
                )
        finally:
            await engine.close()

    asyncio.run(serve())


class VLLMSide:
    """The worker process of `vllm_worker`, driven one generation at a time."""

    def __init__(self, python: str, folder: Path, threads: int, log: Path):
        extra = os.environ.get("PYTHONPATH", "").split(os.pathsep)
        paths = [str(ROOT), str(ROOT / "protos"), *filter(None, extra)]
        env = {**os.environ, "OMP_NUM_THREADS": str(threads), "PYTHONPATH": os.pathsep.join(paths)}
        self.log = log
        self._log = log.open("w")
        self.proc = subprocess.Popen(
            [python, str(Path(__file__).resolve()), "--vllm-worker", str(folder)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._log, text=True, env=env, cwd=ROOT,
        )  # fmt: skip
        self.start_s = float(self._read()["start_s"])

    def _read(self) -> dict:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            tail = self.log.read_text()[-3000:]
            raise RuntimeError(f"the vLLM worker ended ({self.proc.wait()}); its log ends:\n{tail}")
        return json.loads(line)

    def run(self, prompts, limits) -> tuple[int, float]:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps({"prompts": prompts, "limits": limits}) + "\n")
        self.proc.stdin.flush()
        r = self._read()
        return int(r["tokens"]), float(r["seconds"])

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self._log.close()


def vllm_python(arg: str | None) -> str | None:
    """The interpreter of the vLLM row: `arg`, this one when it has vLLM, else .venv-vllm's; None when
    there is none."""
    if arg:
        return arg
    if importlib.util.find_spec("vllm") is not None:
        return sys.executable
    venv = ROOT / ".venv-vllm" / "bin" / "python"
    return str(venv) if venv.exists() else None


def main() -> None:
    if len(sys.argv) == 3 and sys.argv[1] == "--vllm-worker":
        vllm_worker(sys.argv[2], seed=0)
        return
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer prompts and repetitions (under 3 minutes)")
    ap.add_argument("--size", default=None, choices=["tiny", "small"])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument(
        "--vllm-python",
        default=None,
        help="interpreter with vLLM for the vllm row (default: this one if it has vLLM, else .venv-vllm)",
    )
    ap.add_argument("--no-vllm", action="store_true", help="leave the vllm row out")
    args = ap.parse_args()
    vpython = None if args.no_vllm else vllm_python(args.vllm_python)
    if vpython is None and not args.no_vllm:
        print("vllm row left out: no .venv-vllm here (bash scripts/setup.sh --engine vllm)", flush=True)
    if vpython is not None and args.device != "cpu":
        print("vllm row left out: it is measured on CPU only here (--device cpu)", flush=True)
        vpython = None
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
        vside = None
        if vpython is not None:  # started first: its start-up must not overlap the measured runs
            print(f"starting the vLLM worker ({vpython})", flush=True)
            vside = VLLMSide(vpython, folder, args.threads, Path(tmp) / "vllm.log")
        sides = ("ours", "base", "vllm") if vside is not None else ("ours", "base")
        run_ours(engine, prompts[:4], [4] * 4)  # warm-up every path
        run_generate(model, tokenizer, prompts[:4], [4] * 4, args.batch, device)
        if vside is not None:
            vside.run(prompts[:4], [4] * 4)
        figures: dict[str, dict[str, list[float]]] = {}
        try:
            for scenario in ("uniform", "mixed"):
                limits = budgets(n, max_new, seed=0, mixed=scenario == "mixed")
                runs: dict[str, list[float]] = {side: [] for side in sides}
                for rep in range(reps):
                    for side in sides if rep % 2 == 0 else sides[::-1]:
                        if side == "ours":
                            tok, sec = run_ours(engine, prompts, limits)
                        elif side == "base":
                            tok, sec = run_generate(model, tokenizer, prompts, limits, args.batch, device)
                        else:
                            assert vside is not None
                            tok, sec = vside.run(prompts, limits)
                        runs[side].append(tok / sec)
                figures[scenario] = runs
        finally:
            if vside is not None:
                vside.close()
    print(f"rollout: {n} prompts of 4-60 tokens, batch {args.batch}, model {size}, {device}, "
          f"{args.threads} thread(s), {reps} reps interleaved (median tokens/s)")  # fmt: skip
    print("  uniform: every prompt may generate max_new_tokens =", max_new)
    print("  mixed:   half of the prompts have a smaller max_tokens (per-request budgets)")
    if vside is not None:
        print(
            "  vllm:    the explorer's vllm engine in its own environment "
            f"(engine start {vside.start_s:.0f}s, not counted)"
        )
    vhead = f"{'vllm engine':>13}{'ratio':>7}" if vside is not None else ""
    print(f"{'scenario':10}{'hf engine (ours)':>18}{'model.generate':>16}{'ratio':>8}{vhead}"
          f"   runs ours | generate{' | vllm' if vside is not None else ''}")  # fmt: skip
    result: dict[str, object] = {"bench": "rollout", "model": size, "device": str(device), "prompts": n,
                                 "max_new_tokens": max_new, "threads": args.threads}  # fmt: skip
    for scenario, runs in figures.items():
        o, b = statistics.median(runs["ours"]), statistics.median(runs["base"])
        listed = " | ".join(", ".join(f"{x:.0f}" for x in runs[side]) for side in sides)
        vcols = ""
        result[f"ours_tokens_per_s_{scenario}"] = round(o, 1)
        result[f"generate_tokens_per_s_{scenario}"] = round(b, 1)
        result[f"ratio_{scenario}"] = round(o / b, 3)
        if "vllm" in runs:
            v = statistics.median(runs["vllm"])
            vcols = f"{v:13.0f}{v / b:7.2f}"
            result[f"vllm_tokens_per_s_{scenario}"] = round(v, 1)
            result[f"vllm_ratio_{scenario}"] = round(v / b, 3)
        print(f"{scenario:10}{o:18.0f}{b:16.0f}{o / b:8.2f}{vcols}   {listed}")
    # the headline is the uniform case: the same work on both sides
    result["ours_tokens_per_s"] = result["ours_tokens_per_s_uniform"]
    result["generate_tokens_per_s"] = result["generate_tokens_per_s_uniform"]
    result["ratio"] = result["ratio_uniform"]
    if vside is not None:
        result["vllm_tokens_per_s"] = result["vllm_tokens_per_s_uniform"]
        result["vllm_ratio"] = result["vllm_ratio_uniform"]
        result["vllm_start_s"] = round(vside.start_s, 1)
    result["target"] = 1.0
    print(json.dumps(result))


if __name__ == "__main__":
    main()
