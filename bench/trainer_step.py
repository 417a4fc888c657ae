"""Trainer step throughput: the FSDP2 trainer step vs a bare PyTorch loop doing the same work.

    python bench/trainer_step.py [--quick] [--gpu] [--device cpu|cuda] [--dtype auto|fp32|bf16]
        [--shape tiny|small|qwen2-0.5b|qwen2.5-1.5b] [--micro N] [--peak-tflops T] [--reps N]
        [--logits-chunk N]

Both sides run on the same batch of experiences (varied lengths), in the same process, one after the
other: each side is built, warmed up with one step, timed and freed before the next is built, so a
micro-batch that fits one side is not refused for the other's memory (on the CPU in rounds of one
timed step per side, so load drifting over the run touches every side alike; on CUDA each side once,
over all repetitions); the median is reported.  Work per step on both sides (checked before timing): one no-grad forward over the same
micro-batches (old log-probs, which PPO-family trainers recompute), then forward + backward of a
policy-gradient loss over them, gradient clipping and one AdamW step.

A third run, ours with `trainer.logits_chunk_tokens: 0` (all logits at once), gives the
"chunked vs full logits" ratio of the chunked LM head (services/trainer/chunked_logprobs.py), whose
chunk is `--logits-chunk` tokens (default: the trainer's, 4096).

- ours: `FSDPEngine.train_step` (one process: the plain module on CPU, FSDP2 on CUDA — see
  `services.trainer.fsdp.uses_fsdp`; packed micro-batches, the registered PPO loss, entropy
  metric, GRPO advantages, exact loss scaling, data metrics).
- bare: a plain HF module, right-padded micro-batches with an attention mask, -A·log π masked
  mean, `clip_grad_norm_`, `torch.optim.AdamW`.

tokens/s counts real (non-padding) tokens.  Options:
- `--device cpu|cuda` (default: cuda when available), `--shape tiny|small|qwen2-0.5b|qwen2.5-1.5b`
  (default small, tiny with --quick); `qwen2-0.5b` is the Qwen2.5-0.5B shape (hidden 896, 24 layers, 14
  heads, 2 KV heads, intermediate 4864, vocab 151936), `qwen2.5-1.5b` the 1.5B one (hidden 1536, 28
  layers, 12 heads, 2 KV heads, intermediate 8960), built from a `Qwen2Config` with random weights, no
  download. `--micro N`: experiences per micro-batch (default 4).
- `--dtype auto|fp32|bf16`: the trainer computes in bf16 on CUDA (FSDP2 mixed precision: bf16 parameters
  and activations, fp32 master weights and gradient reduction) and in fp32 on CPU; the option states the
  expectation and refuses a combination the engine does not run.
- `--gpu` is short for `--device cuda --dtype bf16 --shape qwen2-0.5b`.
- MFU = achieved model FLOP/s / peak, with 8·N FLOPs per token (N parameters): 2·N for the no-grad
  old-log-prob forward plus 6·N for forward + backward (Kaplan et al. 2020, "Scaling Laws", C ≈ 6N per
  token for training).  The peak is `--peak-tflops`, or on CUDA detected from the device name (H100 and
  H200: 989 TFLOP/s dense bf16).  With an MFU the headline "ratio" is MFU / 0.35 (a 35% MFU target) and
  the ours/bare ratio moves to "ratio_vs_bare"; without one "ratio" is ours/bare (target 0.9).
- On CUDA the JSON also has the memory check: `torch.cuda.max_memory_allocated` after our warm-up step
  (the baseline's model is built after it) against the memory plan of one trainer rank
  (`memory_plan_gib`, `memory_peak_vs_plan`; launcher/memory_plan.py).
The last line is one JSON object.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "protos"))

from launcher.tiny_model import build_tokenizer, make_tiny_model  # noqa: E402
from services.common.experience import Experience, ExperienceId  # noqa: E402
from services.common.modeling import load_model  # noqa: E402
from services.trainer.collate import collate  # noqa: E402
from services.trainer.distributed import ensure_process_group  # noqa: E402
from services.trainer.engine import FSDPEngine  # noqa: E402
from services.trainer.rowwise import local_micro_batches  # noqa: E402
from services.trainer.settings import TrainerSettings  # noqa: E402
from tests.support.trainer_data import make_config  # noqa: E402

# Qwen2.5 shapes (hidden, intermediate, layers, attention heads, KV heads), vocab 151936, tied embeddings
QWEN_SHAPES = {"qwen2-0.5b": (896, 4864, 24, 14, 2), "qwen2.5-1.5b": (1536, 8960, 28, 12, 2)}


def make_gpu_model(out: Path, shape: str = "qwen2-0.5b") -> Path:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    hidden, intermediate, layers, heads, kv_heads = QWEN_SHAPES[shape]
    tok = build_tokenizer(512)
    config = Qwen2Config(
        vocab_size=151936,
        hidden_size=hidden,
        intermediate_size=intermediate,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        max_position_embeddings=4096,
        tie_word_embeddings=True,
        pad_token_id=tok.pad_token_id,
        eos_token_id=tok.eos_token_id,
        bos_token_id=tok.bos_token_id,
    )
    torch.manual_seed(0)
    Qwen2ForCausalLM(config).save_pretrained(out)
    tok.save_pretrained(out)
    return out


def make_batch(n: int, prompt: int, response: int, vocab: int, seed: int = 0) -> list[Experience]:
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        r = int(torch.randint(response // 2, response + 1, (1,), generator=g))
        out.append(
            Experience(
                tokens=torch.randint(3, vocab, (prompt + r,), generator=g),
                prompt_length=prompt,
                reward=float(i % 2),
                eid=ExperienceId(group_id=str(i // 4)),
            )
        )
    return out


class Bare:
    """The baseline: plain module, padded micro-batches, AdamW."""

    def __init__(self, model_dir: Path, device: torch.device, lr: float, micro: int):
        self.device = device
        self.model = load_model(model_dir, dtype="float32").to(device)
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=lr, weight_decay=0.0)
        self.micro = micro
        self.amp = device.type == "cuda"

    def _pad(self, exps: list[Experience]):
        n = max(e.tokens.numel() for e in exps)
        ids = torch.zeros(len(exps), n, dtype=torch.long)
        attn = torch.zeros(len(exps), n, dtype=torch.long)
        loss_mask = torch.zeros(len(exps), n - 1)
        for i, e in enumerate(exps):
            L = e.tokens.numel()
            ids[i, :L], attn[i, :L] = e.tokens, 1
            loss_mask[i, e.prompt_length - 1 : L - 1] = 1
        return ids.to(self.device), attn.to(self.device), loss_mask.to(self.device)

    def _logp(self, ids, attn):
        with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.amp):
            logits = self.model(input_ids=ids, attention_mask=attn, use_cache=False).logits[:, :-1].float()
        return torch.gather(logits.log_softmax(-1), -1, ids[:, 1:, None]).squeeze(-1)

    def step(self, exps: list[Experience]) -> None:
        chunks = [exps[i : i + self.micro] for i in range(0, len(exps), self.micro)]
        with torch.no_grad():
            for c in chunks:
                self._logp(*self._pad(c)[:2])
        adv = torch.tensor([1.0 if e.reward else -1.0 for e in exps], device=self.device)
        total = sum(e.response_length for e in exps)
        self.opt.zero_grad(set_to_none=True)
        for k, c in enumerate(chunks):
            ids, attn, mask = self._pad(c)
            a = adv[k * self.micro : k * self.micro + len(c), None]
            loss = -(self._logp(ids, attn) * a * mask).sum() / total
            loss.backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
        self.opt.step()


def memory_figures(config, model_dir: Path, device: torch.device) -> dict[str, object]:
    """On CUDA: `torch.cuda.max_memory_allocated` over our steps (the other sides built only after ours
    is freed) next to the memory plan of one trainer rank (launcher/memory_plan.py, its
    margin included), in GiB; {} elsewhere."""
    if device.type != "cuda":
        return {}
    from launcher.memory_plan import read_shape, trainer_plan

    peak = torch.cuda.max_memory_allocated(device) / 2**30
    shape, why = read_shape(str(model_dir))
    if shape is None:
        return {"max_memory_allocated_gib": round(peak, 2), "memory_plan": why}
    plan = trainer_plan(config, shape)
    planned = sum(plan.parts.values()) / 2**30
    return {
        "max_memory_allocated_gib": round(peak, 2),
        "memory_plan_gib": round(planned, 2),
        "memory_plan_parts_gib": {k: round(v / 2**30, 2) for k, v in plan.parts.items()},
        "memory_plan_tokens": plan.tokens,
        "memory_peak_vs_plan": round(peak / planned, 3),
    }


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def free(device: torch.device) -> None:
    """Return what the side just measured held, so the next one starts from an empty device."""
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def measure(side, step, exps, reps: int, device: torch.device) -> tuple[list[float], bool, int]:
    """Seconds of `reps` steps of `side` (ours: an `FSDPEngine`; a `Bare`) after one warm-up step;
    whether it ran FSDP2, and its parameter count.  `side` is closed and released on return."""
    fn = (lambda: side.step(exps)) if isinstance(side, Bare) else (lambda: side.train_step(step))
    fn()
    out = []
    for _ in range(reps):
        sync(device)
        t0 = time.perf_counter()
        fn()
        sync(device)
        out.append(time.perf_counter() - t0)
    model = side.model if isinstance(side, Bare) else side.worker.policy
    n_params = sum(p.numel() for p in model.parameters())
    fsdp = not isinstance(side, Bare) and side.worker.fsdp
    if not isinstance(side, Bare):
        side.close()
    return out, fsdp, n_params


# dense bf16 peak TFLOP/s by device name (NVIDIA data sheets, SXM parts)
PEAK_BF16_TFLOPS = {"H100": 989.0, "H200": 989.0, "A100": 312.0}
MFU_TARGET = 0.35
# (experiences, prompt tokens, max response tokens, micro-batch size) per shape
WORK = {
    "tiny": (16, 16, 48, 4), "small": (16, 32, 96, 4),
    "qwen2-0.5b": (32, 256, 768, 4), "qwen2.5-1.5b": (32, 256, 768, 4),
}  # fmt: skip


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--gpu", action="store_true", help="--device cuda --dtype bf16 --shape qwen2-0.5b")
    parser.add_argument("--device", choices=["cpu", "cuda"], default=None)
    parser.add_argument("--dtype", choices=["auto", "fp32", "bf16"], default="auto")
    parser.add_argument("--shape", choices=sorted(WORK), default=None)
    parser.add_argument(
        "--reps", type=int, default=None, help="timed repetitions (default 7, 3 with --quick)"
    )
    parser.add_argument("--peak-tflops", type=float, default=None, help="peak FLOP/s for MFU (TFLOP/s)")
    parser.add_argument(
        "--micro", type=int, default=None, help="experiences per micro-batch (default: the shape's, 4)"
    )
    parser.add_argument(
        "--logits-chunk", type=int, default=None, help="trainer.logits_chunk_tokens of ours (default 4096)"
    )
    args = parser.parse_args(argv)
    if args.gpu:
        args.device, args.dtype, args.shape = args.device or "cuda", "bf16", args.shape or "qwen2-0.5b"
    args.device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    args.shape = args.shape or ("tiny" if args.quick else "small")
    want = "bf16" if args.device == "cuda" else "fp32"
    if args.dtype not in ("auto", want):
        parser.error(f"--dtype {args.dtype} with --device {args.device}: the trainer runs {want} there; "
                     f"pass --dtype {want} or auto")  # fmt: skip
    args.dtype = want
    if args.micro is not None and args.micro < 1:
        parser.error(f"--micro must be >= 1, got {args.micro}")
    if args.logits_chunk is not None and args.logits_chunk < 1:
        parser.error(
            f"--logits-chunk must be >= 1 (the full-logits run is measured anyway), got {args.logits_chunk}"
        )
    if args.reps is not None and args.reps < 1:
        parser.error(f"--reps must be >= 1, got {args.reps}")
    if args.peak_tflops is not None and args.peak_tflops <= 0:
        parser.error(f"--peak-tflops must be > 0, got {args.peak_tflops}")
    return args


def peak_tflops(args: argparse.Namespace, device: torch.device) -> float | None:
    """--peak-tflops, else the data-sheet peak of a known CUDA device, else None (no MFU)."""
    if args.peak_tflops is not None or device.type != "cuda":
        return args.peak_tflops
    name = torch.cuda.get_device_name(device)
    return next((v for k, v in PEAK_BF16_TFLOPS.items() if k in name), None)


def main() -> int:
    args = parse_args()
    if args.device == "cpu":
        os.environ["CUDA_VISIBLE_DEVICES"] = ""  # before CUDA starts: the trainer picks cuda when it sees one
    elif not torch.cuda.is_available():
        print("--device cuda needs CUDA", file=sys.stderr)
        return 2
    if args.device == "cpu":
        torch.set_num_threads(max(1, torch.get_num_threads()))
    info = ensure_process_group()
    reps = args.reps or (3 if args.quick else 7)
    with tempfile.TemporaryDirectory() as tmp:
        if args.shape in QWEN_SHAPES:
            model_dir = make_gpu_model(Path(tmp) / "m", args.shape)
        else:
            model_dir = make_tiny_model(Path(tmp) / "m", size=args.shape)
        n, prompt, response, micro = WORK[args.shape]
        micro = args.micro or micro
        exps = make_batch(n, prompt, response, vocab=500)
        step = collate(exps)
        tokens = step.num_tokens

        def config_for(chunk: int | None):
            trainer = {"micro_batch_size_per_gpu": micro, "use_dynamic_bsz": False}
            if chunk is not None:
                trainer["logits_chunk_tokens"] = chunk
            return make_config(model_dir, Path(tmp) / "ck", buffer={"batch_size": n // 4}, trainer=trainer)

        def settings_for(chunk: int | None) -> TrainerSettings:
            return TrainerSettings.from_config(config_for(chunk))

        def engine(settings: TrainerSettings) -> FSDPEngine:
            ours = FSDPEngine(settings, info)
            # the same work on both sides: Bare.step's micro-batches and a single optimizer step
            same_micro = [list(range(i, min(i + micro, n))) for i in range(0, n, micro)]
            assert local_micro_batches(step, info, ours.worker.actor.batching) == same_micro
            assert settings.ppo_epochs == 1 and settings.mini_batch_size == n
            return ours

        config = config_for(args.logits_chunk)
        settings = TrainerSettings.from_config(config)
        sides = {
            "ours": lambda: engine(settings),
            "full": lambda: engine(settings_for(0)),  # ours with all logits at once
            "bare": lambda: Bare(model_dir, info.device, settings.actor_optim.lr, micro),
        }
        times: dict[str, list[float]] = {name: [] for name in sides}
        ours_fsdp = False
        memory: dict[str, object] = {}
        # CPU: rounds of one timed step per side, so load drifting over the run (a shared machine)
        # touches every side alike; CUDA: each side built once (loading a Qwen shape takes seconds)
        rounds, per_round = (reps, 1) if info.device.type == "cpu" else (1, reps)
        for _ in range(rounds):
            for name, build in sides.items():  # one at a time, each freed before the next is built
                if info.device.type == "cuda":
                    torch.cuda.reset_peak_memory_stats(info.device)
                seconds, fsdp, n_params = measure(build(), step, exps, per_round, info.device)
                times[name] += seconds
                if name == "ours":  # its peak, warm-up included, with nothing else on the device
                    ours_fsdp = fsdp
                    memory = memory or memory_figures(config, model_dir, info.device)
                free(info.device)
    med = {k: statistics.median(v) for k, v in times.items()}
    tps = {k: tokens / v for k, v in med.items()}
    result = {
        "tokens_per_step": tokens,
        "params": n_params,
        "reps": reps,
        "shape": args.shape,
        "dtype": args.dtype,
        "tokens_per_s": round(tps["ours"], 1),
        "ours_tokens_per_s": round(tps["ours"], 1),
        "ours_step_s": round(med["ours"], 4),
        "baseline": {"bare_tokens_per_s": round(tps["bare"], 1), "bare_step_s": round(med["bare"], 4)},
        "ratio": round(tps["ours"] / tps["bare"], 3),
        "target": 0.9,
        "logits_chunk_tokens": settings.logits_chunk_tokens,
        "full_logits": {"tokens_per_s": round(tps["full"], 1), "step_s": round(med["full"], 4)},
        "chunked_vs_full": round(tps["ours"] / tps["full"], 3),
        "device": str(info.device),
        "fsdp": ours_fsdp,
        "threads": torch.get_num_threads(),
        "micro_batch": micro,
    }
    peak = peak_tflops(args, info.device)
    if peak is not None:
        flops_per_token = 8 * n_params  # 2N old-log-prob forward + 6N forward/backward
        mfu = {k: flops_per_token * v / (peak * 1e12) for k, v in tps.items()}
        result.update(
            mfu=round(mfu["ours"], 4),
            mfu_bare=round(mfu["bare"], 4),
            peak_tflops=peak,
            flops_per_token=flops_per_token,
            ratio=round(mfu["ours"] / MFU_TARGET, 3),
            target=1.0,
            mfu_target=MFU_TARGET,
            ratio_vs_bare=result["ratio"],
            target_vs_bare=result["target"],
        )
    if info.device.type == "cuda":
        result["device_name"] = torch.cuda.get_device_name(info.device)
    result.update(memory)
    print(f"{'':8} {'step s (median)':>16} {'tokens/s':>12}")
    for k in ("ours", "full", "bare"):
        print(f"{k:8} {med[k]:>16.4f} {tps[k]:>12.1f}")
    ours_vs_bare = result.get("ratio_vs_bare", result["ratio"])
    print(f"ratio ours/bare = {ours_vs_bare}  (target 0.9; {tokens} tokens/step, {n_params} params)")
    print(f"chunked vs full logits = {result['chunked_vs_full']}  (ours with logits_chunk_tokens "
          f"{settings.logits_chunk_tokens} vs 0)")  # fmt: skip
    if peak is not None:
        print(f"MFU ours {result['mfu']:.4f}  bare {result['mfu_bare']:.4f}  (peak {peak:g} TFLOP/s, "
              f"8N FLOPs/token; ratio MFU/{MFU_TARGET} = {result['ratio']})")  # fmt: skip
    if memory:
        print(f"memory: peak allocated {memory['max_memory_allocated_gib']} GiB (ours, warm-up step), plan "
              f"{memory['memory_plan_gib']} GiB; peak/plan = {memory['memory_peak_vs_plan']}")  # fmt: skip
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
