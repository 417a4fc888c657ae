"""Tracing cost: the traced path of one explore step and one trainer step through a real buffer, with
tracing on (spans exported over OTLP/HTTP to a local receiver) against off, in the same run.

One round, as the services do it: under `explorer.step` / `explorer.put`, stamp a group of 8 experiences
(64 prompt + 64 response tokens) with the span context and `Put` them over gRPC to a buffer service
(in-process store, a real grpc.aio server on port 0, this process); under `trainer.step` /
`trainer.get_batch`, `GetBatch(8)` them, link the span to the puts, and `Ack` the lease. That is 4
spans of ours, 3 client and 3 server spans per round, all RPC and no model: the cost relative to the
cheapest traced work there is (a real step adds model time and few spans). Off and on alternate, each a
fresh server and channel (interceptors are chosen when they are made); the median round of each is kept.
The last line printed is one JSON object: "off_us" and "on_us" per round, "ratio" (on / off), "spans"
received by the receiver, and "span_us" (one local span, no RPC, on).

`--run`: the same small run both ways instead: `rft run` (all four services as processes, the quickstart's
GRPO stage on the tiny model, `--steps` steps, memory weight sync), tracing turned on by the OTEL_*
variables alone and exported to the local receiver, runs alternating off/on `--reps` times. Its JSON:
the medians of the CPU seconds of the whole job (`rft run` and its services), the trainer step
(`timing_s/step`, steps after the first), the explore step (`time/explore_step`) and the wall seconds,
each off and on; "ratio" is the CPU seconds on / off (the step times follow what CPU a shared machine's
other tenants leave), the step and wall ratios beside it, and the spans received.

    python bench/tracing.py [--rounds 300] [--reps 5]
    python bench/tracing.py --run [--steps 8] [--reps 2]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "protos")]

import torch  # noqa: E402

from services.buffer.core import BufferCore  # noqa: E402
from services.buffer.in_process_store import InProcessStore  # noqa: E402
from services.buffer.servicer import registration  # noqa: E402
from services.common import tracing  # noqa: E402
from services.common.buffer_client import BufferClient  # noqa: E402
from services.common.config.runtime import TracingConfig  # noqa: E402
from services.common.experience import Experience, ExperienceId  # noqa: E402
from services.common.rpc import create_channel, start_server  # noqa: E402
from tests.support.otlp_receiver import OTLPReceiver  # noqa: E402

GROUP, PROMPT, RESPONSE = 8, 64, 64


def group(index: int) -> list[Experience]:
    return [
        Experience(
            tokens=torch.randint(0, 1000, (PROMPT + RESPONSE,)),
            prompt_length=PROMPT,
            eid=ExperienceId(batch_id=str(index), task_id="t", run_id=j, group_id=f"g{index}"),
            logprobs=torch.zeros(RESPONSE),
            action_mask=torch.ones(RESPONSE, dtype=torch.bool),
            reward=1.0,
        )
        for j in range(GROUP)
    ]


async def rounds(n: int, on: bool, endpoint: str) -> list[float]:
    """Seconds of each of `n` rounds, tracing on (exporting to `endpoint`) or off."""
    if on:
        tracing.setup_tracing("explorer", TracingConfig(enabled=True, endpoint=endpoint), environ={})
    core = BufferCore(InProcessStore(capacity=10 * GROUP))
    await core.start()
    server = await start_server([registration(core)])
    times = []
    try:
        async with create_channel(server.address) as channel:
            client = BufferClient(channel, producer_id="bench", consumer="trainer")
            for i in range(n):
                batch = group(i)
                t0 = time.perf_counter()
                with tracing.span("explorer.step"), tracing.span("explorer.put"):
                    tracing.stamp(batch)
                    await client.put(batch, vocab_size=1000)
                with tracing.span("trainer.step"), tracing.span("trainer.get_batch") as span:
                    leased = await client.get_batch(GROUP, timeout_ms=1000)
                    tracing.link_stamped(span, leased.decoded())
                await client.ack(leased.lease_id)
                times.append(time.perf_counter() - t0)
    finally:
        await server.stop(0)
        tracing.shutdown_tracing()  # exports what is left: the receiver has every span
    return times


def span_cost(n: int, endpoint: str) -> float:
    """Microseconds of one local span (start, make current, end, queue for export), tracing on."""
    tracing.setup_tracing("trainer", TracingConfig(enabled=True, endpoint=endpoint), environ={})
    t0 = time.perf_counter()
    for _ in range(n):
        with tracing.span("bench"):
            pass
    seconds = time.perf_counter() - t0
    tracing.shutdown_tracing()
    return seconds / n * 1e6


async def main_async(args: argparse.Namespace) -> dict:
    with OTLPReceiver() as receiver:
        off: list[float] = []
        on: list[float] = []
        await rounds(20, True, receiver.endpoint)  # warm-up: imports, first connections
        await rounds(20, False, receiver.endpoint)
        warm = len(receiver.spans)
        for _ in range(args.reps):
            off += await rounds(args.rounds, False, receiver.endpoint)
            on += await rounds(args.rounds, True, receiver.endpoint)
        spans = len(receiver.spans) - warm
        per_span = span_cost(2000, receiver.endpoint)  # under the export queue (2048): none dropped
    off_us, on_us = statistics.median(off) * 1e6, statistics.median(on) * 1e6
    return {
        "bench": "tracing",
        "rounds": args.rounds * args.reps,
        "off_us": round(off_us, 1),
        "on_us": round(on_us, 1),
        "ratio": round(on_us / off_us, 3),
        "spans": spans,
        "spans_per_round": round(spans / (args.rounds * args.reps), 2),
        "span_us": round(per_span, 1),
    }


def one_run(workdir: Path, steps: int, environ: dict[str, str]) -> dict[str, float]:
    """The small run once: median trainer and explore step seconds (after the first), wall seconds."""
    from tests.support.rft_run import example, jsonl, run_rft, tiny_model, write_config

    tree = example("quickstart.yaml")
    tree.pop("stages")
    tree.update(checkpoint_root_dir=str(workdir / "ckpt"), continue_from_checkpoint=False)
    tree["model"]["model_path"] = str(tiny_model())
    tree["buffer"].update(total_steps=steps)
    tree["buffer"]["explorer_input"].pop("eval_tasksets", None)
    tree["explorer"].update(eval_on_startup=False)
    tree["trainer"].update(save_interval=0, save_hf_checkpoint="never")
    t0, cpu0 = time.perf_counter(), _children_cpu()
    proc = run_rft(write_config(workdir / "run.yaml", tree), timeout_s=600, extra_env=environ)
    wall, cpu = time.perf_counter() - t0, _children_cpu() - cpu0
    if proc.returncode != 0:
        raise SystemExit((proc.stdout + proc.stderr)[-3000:])
    job = workdir / "ckpt" / "quickstart" / "arithmetic" / "metrics"
    train = [r["timing_s/step"] for r in jsonl(job / "trainer.jsonl") if r["step"] > 1]
    explore = [r["time/explore_step"] for r in jsonl(job / "explorer.jsonl") if "time/explore_step" in r]
    return {
        "trainer_step_s": statistics.median(train),
        "explore_step_s": statistics.median(explore[1:]),
        "wall_s": wall,
        "cpu_s": cpu,
    }


def _children_cpu() -> float:
    """CPU seconds (user + system) of the waited-for processes under this one: `rft run` and, through
    it, every service it started."""
    import resource

    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run_mode(args: argparse.Namespace) -> dict:
    import tempfile

    results: dict[str, list[dict[str, float]]] = {"off": [], "on": []}
    with OTLPReceiver() as receiver:
        for rep in range(args.reps):
            for mode in ("off", "on"):
                with tempfile.TemporaryDirectory() as tmp:
                    env = receiver.environ() if mode == "on" else {}
                    results[mode].append(one_run(Path(tmp), args.steps, env))
                    print(f"rep {rep} {mode}: {results[mode][-1]}", flush=True)
        spans = len(receiver.spans)
    out: dict = {"bench": "tracing_run", "steps": args.steps, "reps": args.reps}
    for mode, runs in results.items():
        for key in ("trainer_step_s", "explore_step_s", "wall_s", "cpu_s"):
            out[f"{key}_{mode}"] = round(statistics.median(r[key] for r in runs), 4)
    # CPU seconds of the whole job: what tracing adds to the work, much less moved by a shared machine's
    # load than the step times (which follow the CPU the other tenants leave)
    out["ratio"] = round(out["cpu_s_on"] / out["cpu_s_off"], 3)
    out["trainer_step_ratio"] = round(out["trainer_step_s_on"] / out["trainer_step_s_off"], 3)
    out["explore_ratio"] = round(out["explore_step_s_on"] / out["explore_step_s_off"], 3)
    out["wall_ratio"] = round(out["wall_s_on"] / out["wall_s_off"], 3)
    out["spans"] = spans
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=300)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--run", action="store_true", help="the same small rft run, off vs on")
    parser.add_argument("--steps", type=int, default=8)
    args = parser.parse_args()
    if args.run:
        result = run_mode(args)
        print(
            f"rft run, {args.steps} steps: CPU off {result['cpu_s_off']:.1f} s, on {result['cpu_s_on']:.1f} s "
            f"({result['ratio']:.3f}x); trainer step {result['trainer_step_ratio']:.2f}x, explore step "
            f"{result['explore_ratio']:.2f}x, wall {result['wall_ratio']:.2f}x; {result['spans']} spans"
        )
        print(json.dumps(result))
        return
    result = asyncio.run(main_async(args))
    print(
        f"traced round (put + get_batch + ack, 8 experiences): off {result['off_us']:.0f} us, "
        f"on {result['on_us']:.0f} us ({result['ratio']:.2f}x); {result['spans_per_round']} spans a round; "
        f"one local span {result['span_us']:.1f} us"
    )
    print(json.dumps(result))


if __name__ == "__main__":
    main()
