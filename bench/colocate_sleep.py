"""The cost of a colocated step's sleep/wake cycle for the hf rollout engine (`cluster.colocate`).

    python bench/colocate_sleep.py [--size tiny|small] [--device cpu|cuda] [--steps N] [--batch B]
        [--max-tokens T]

One simulated explore step, as a colocated explorer runs it: generate a batch (B prompts x 4 samples, T
new tokens at most), then load the next weight version. The baseline runs that step as is; the
colocated side puts the engine to sleep after generating (every parameter and buffer storage copied
to host memory and freed on the device; services/explorer/engines/hf.py) and the weight load wakes it
(the storages restored, then the new weights copied in). Both sides use one engine, the same seeds and
the same weights, alternating step by step so load drift touches both alike; the median step time of
each is reported, and the ratio colocated / baseline. The sleep and the wake are also timed apart
(medians). JSON last line: ratio, baseline_step_s, colocated_step_s, sleep_s, wake_s, parked_bytes.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "protos")]

import torch  # noqa: E402

from launcher.tiny_model import make_tiny_model  # noqa: E402
from services.common.config import RFTConfig, resolve  # noqa: E402
from services.explorer.engines.hf import HFEngine  # noqa: E402


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--size", choices=("tiny", "small"), default="small")
    p.add_argument(
        "--device", choices=("cpu", "cuda"), default="cuda" if torch.cuda.is_available() else "cpu"
    )
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--max-tokens", type=int, default=16)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    torch.manual_seed(0)
    if args.device == "cpu":
        torch.set_num_threads(1)  # steadier timings on a shared machine
    with tempfile.TemporaryDirectory() as tmp:
        folder = make_tiny_model(Path(tmp) / "model", size=args.size)
        engine = HFEngine.from_pretrained(str(folder), device=args.device, dtype="float32", sleep_mode=True)
    params = resolve(RFTConfig()).sampling_params(temperature=1.0, max_tokens=args.max_tokens, n=4)
    prompts = [[1 + (i * 7 + j) % 200 for j in range(8)] for i in range(args.batch)]
    weights = {k: v.detach().clone() for k, v in engine.model.state_dict().items()}

    def step(version: int, colocated: bool) -> tuple[float, float, float]:
        engine.reseed(version)
        t0 = time.perf_counter()
        engine.generate_sync(prompts, params)
        t1 = time.perf_counter()
        if colocated:
            asyncio.run(engine.sleep())
        t2 = time.perf_counter()
        asyncio.run(engine.load_weights(weights.items(), version=version))  # wakes a sleeping engine
        if args.device == "cuda":
            torch.cuda.synchronize()
        t3 = time.perf_counter()
        return t3 - t0, t2 - t1, t3 - t2

    step(0, False)  # warm-up: both paths once
    step(0, True)
    base, colo, sleeps, wakes = [], [], [], []
    for v in range(1, args.steps + 1):
        base.append(step(v, False)[0])
        total, slept, _ = step(v, True)
        colo.append(total)
        sleeps.append(slept)
    parked = 0
    for _ in range(args.steps):  # the wake alone: restore the storages, no load
        engine.sleep_sync()
        parked = sum(host.numel() for _, host in engine._parked)
        t0 = time.perf_counter()
        engine.wake_up_sync()
        wakes.append(time.perf_counter() - t0)
    b, c = statistics.median(base), statistics.median(colo)
    result = {
        "bench": "colocate_sleep",
        "device": args.device,
        "size": args.size,
        "steps": args.steps,
        "ratio": round(c / b, 4),
        "baseline_step_s": round(b, 5),
        "colocated_step_s": round(c, 5),
        "sleep_s": round(statistics.median(sleeps), 5),
        "wake_s": round(statistics.median(wakes), 5),
        "parked_bytes": parked,
    }
    print(
        f"hf engine ({args.size}, {args.device}): step {b * 1e3:.1f} ms, with sleep/wake {c * 1e3:.1f} ms "
        f"(x{c / b:.3f}); sleep {result['sleep_s'] * 1e3:.2f} ms, wake {result['wake_s'] * 1e3:.2f} ms, "
        f"{parked / 2**20:.1f} MiB parked"
    )
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main()
