"""Does an application that talks only to the served endpoint train the policy? And what does the
endpoint cost over calling the engine directly?

    python bench/serve_agent.py [--quick] [--rounds N] [--out DIR]

One `rft run` with two stages: the quickstart's SFT warm-up (examples/quickstart.yaml; RL cannot start
from the random tiny model), then `mode: serve` with the quickstart's GRPO settings. This process is
the application, through the `openai` client only:

1. Latency, before any training (the endpoint serves the SFT export, version 0): the same request
   (one `a+b=` prompt, max_tokens 4, n 8, temperature 1) through `POST /v1/completions` and through an
   `HFEngine` on the same model folder in this process (`engine.generate`, the explorer's call),
   interleaved; median and p90 per call. `ratio` = direct / endpoint (docs/conventions.md: 1.0 = as fast);
   `overhead_x` = endpoint / direct, the cost of HTTP, JSON and recording (and of a second process).
2. The agent loop: each round sends one completions call per prompt (8 prompts of
   examples/data/arithmetic.jsonl, plain text as the `arithmetic` workflow prompts, n = the GRPO
   group), scores every choice with `arithmetic_reward` (format_score 0: 1 right, 0 otherwise),
   sends one feedback per choice and commits the round's sessions: 64 experiences = one train step.
   A round waits until the endpoint serves a version at most `--lag` steps behind its own count.
   The baseline of the curve is the SFT model itself (the first rounds).

The run's checkpoint lineage (services/common/lineage.py) must hold exactly the committed answers.
Prints the curve and a table, writes rounds.json (and reward.png when matplotlib is installed) under
--out, then one JSON object as the last line.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx2
import openai
import torch
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "protos"))

from services.common.config import RFTConfig, resolve  # noqa: E402
from services.common.lineage import latest_checkpoint, read_lineage  # noqa: E402
from services.explorer.engines.hf import HFEngine  # noqa: E402
from services.explorer.workflows.arithmetic import arithmetic_reward  # noqa: E402
from tests.support.rft_run import jsonl, poll_until, start_rft, tiny_model  # noqa: E402

PROMPTS, GROUP, MAX_TOKENS = 8, 8, 4
SFT_STEPS = 30  # the warm-up the figures in docs/performance.md were measured with


def _config(tmp: Path, rounds: int) -> Path:
    quick = yaml.safe_load((ROOT / "examples" / "quickstart.yaml").read_text())
    sft = quick["stages"][0]
    sft["buffer"]["total_steps"] = SFT_STEPS
    sft["buffer"]["trainer_input"]["experience_buffer"]["path"] = str(ROOT / "examples/data/arithmetic.jsonl")
    tree = {
        "project": "bench",
        "name": "serve_agent",
        "checkpoint_root_dir": str(tmp / "ckpt"),
        "mode": "serve",
        "algorithm": {**quick["algorithm"], "repeat_times": GROUP},
        "model": {**quick["model"], "model_path": str(tiny_model())},
        "buffer": {
            "batch_size": PROMPTS,
            "total_steps": rounds,
            "total_epochs": quick["buffer"]["total_epochs"],
        },
        "explorer": {
            "rollout_model": quick["explorer"]["rollout_model"],
            "serve": {"host": "127.0.0.1", "port": 0, "max_tokens": MAX_TOKENS, "max_n": GROUP},
        },
        "synchronizer": quick["synchronizer"],
        "trainer": {"save_hf_checkpoint": "last"},
        "monitor": {"monitor_type": "none"},
        "stages": [
            sft,
            {
                "stage_name": "serve",
                "algorithm": {"optimizer": {"lr_scheduler_type": "cosine", "min_lr_ratio": 0.1}},
            },
        ],
    }
    path = tmp / "serve_agent.yaml"
    path.write_text(yaml.safe_dump(tree, sort_keys=False))
    return path


def _pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, round(q * (len(s) - 1)))]


async def _latency(client: openai.AsyncOpenAI, model_dir: str, reps: int) -> dict[str, float]:
    """Per-call ms of the same request through the endpoint and through a direct engine, interleaved
    (2 warm-ups each); and of `GET /health`, the server's HTTP round trip with no work in it."""
    engine = HFEngine.from_pretrained(model_dir, device="cpu", micro_batch_size=64)
    prompt = "3+4="
    ids = list(engine.tokenizer.encode(prompt, add_special_tokens=False))
    params = resolve(RFTConfig()).sampling_params(temperature=1.0, top_p=1.0, max_tokens=MAX_TOKENS, n=GROUP)
    health = str(client.base_url).rstrip("/").removesuffix("/v1") + "/health"
    times: dict[str, list[float]] = {"endpoint": [], "direct": [], "health": []}
    async with httpx2.AsyncClient() as http:
        calls = {
            "endpoint": lambda i: client.completions.create(
                model="policy",
                prompt=prompt,
                max_tokens=MAX_TOKENS,
                n=GROUP,
                temperature=1.0,
                user=f"lat-{i}",
            ),
            "direct": lambda i: engine.generate([ids], params),
            "health": lambda i: http.get(health),
        }
        for i in range(reps + 2):
            for name, call in calls.items():
                t = time.perf_counter()
                await call(i)
                if i >= 2:
                    times[name].append((time.perf_counter() - t) * 1000)
    out = {}
    for name, values in times.items():
        out[f"{name}_ms_median"] = statistics.median(values)
        out[f"{name}_ms_p90"] = _pct(values, 0.9)
    return out


async def _round(client: openai.AsyncOpenAI, rows: list[dict], r: int) -> tuple[float, int, list[str]]:
    """One round: a completions call per prompt, per-choice feedback, one commit. (mean reward,
    oldest model version answering, uids of the committed experiences)."""
    sids = [f"r{r}-{i}" for i in range(len(rows))]
    answers = await asyncio.gather(*(
        client.completions.create(model="policy", prompt=row["question"], max_tokens=MAX_TOKENS, n=GROUP,
                                  temperature=1.0, user=sid)
        for row, sid in zip(rows, sids, strict=True)
    ))  # fmt: skip
    rewards, feedback, uids = [], [], []
    for row, resp, sid in zip(rows, answers, sids, strict=True):
        for c in resp.choices:
            uids.append(f"explorer/explorer/serve/{sid}/{resp.id}/{c.index}/")  # the experience's uid
            reward = arithmetic_reward(c.text, row["answer"], format_score=0.0)
            rewards.append(reward)
            feedback.append({"response_id": resp.id, "choice_index": c.index, "reward": reward})
    await asyncio.gather(*(client.post("/feedback", body=b, cast_to=httpx2.Response) for b in feedback))
    await client.post("/commit", body={"session_ids": sids}, cast_to=httpx2.Response)
    version = min(resp.model_extra["model_version"] for resp in answers)
    return sum(rewards) / len(rewards), version, uids


def _version(health: str) -> int:
    return int(httpx2.get(health, timeout=10).json()["model_version"])


async def _drive(url: str, model_dir: str, rounds: int, lag: int, reps: int, out: dict) -> None:
    client = openai.AsyncOpenAI(base_url=url, api_key="none", max_retries=0, timeout=120)
    health = url.removesuffix("/v1") + "/health"
    out.update(await _latency(client, model_dir, reps))
    task = [json.loads(line) for line in (ROOT / "examples/data/arithmetic.jsonl").read_text().splitlines()]
    rng = random.Random(1)
    curve = out["curve"] = []
    out["committed_uids"] = []
    start = time.monotonic()
    for r in range(rounds):
        # the explorer keeps training in the background; keep the answers at most `lag` steps stale
        await asyncio.to_thread(poll_until, lambda r=r: _version(health) >= r - lag, 300, f"version {r - lag}",
                                0.05)  # fmt: skip
        reward, version, uids = await _round(client, rng.sample(task, PROMPTS), r)
        out["committed_uids"] += uids
        curve.append({"round": r + 1, "reward": reward, "model_version": version})
        if (r + 1) % 10 == 0 or r == 0:
            print(f"round {r + 1:4d}  reward {reward:.3f}  model_version {version}", flush=True)
    out["agent_s"] = time.monotonic() - start
    await client.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="20 rounds, 10 latency calls (a smoke run)")
    ap.add_argument("--rounds", type=int, default=None, help="agent rounds = train steps (default 170)")
    ap.add_argument("--lag", type=int, default=1, help="most train steps the answers may lag behind")
    ap.add_argument("--reps", type=int, default=None, help="latency calls per side (default 40)")
    ap.add_argument("--out", type=Path, default=ROOT / "runs" / "bench" / "serve_agent")
    args = ap.parse_args()
    rounds = args.rounds or (20 if args.quick else 170)
    reps = args.reps or (10 if args.quick else 40)
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))  # as each service process
    args.out.mkdir(parents=True, exist_ok=True)
    out: dict = {"bench": "serve_agent", "rounds": rounds}
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        log = tmp / "rft.log"
        begin = time.monotonic()
        proc = start_rft(_config(tmp, rounds), log=log)
        try:
            found = poll_until(lambda: re.search(r"endpoint: (http://\S+/v1)", log.read_text()), 300,
                               "the endpoint")  # fmt: skip
            job = tmp / "ckpt" / "bench" / "serve_agent" / "serve"
            model_dir = yaml.safe_load((job / "config.yaml").read_text())["model"]["model_path"]
            try:
                asyncio.run(_drive(found.group(1), model_dir, rounds, args.lag, reps, out))
            except BaseException:
                print(log.read_text()[-3000:], file=sys.stderr)
                raise
            code = proc.wait(timeout=300)
        finally:
            if proc.poll() is None:
                proc.terminate()
                proc.wait(timeout=60)
        if code != 0:
            sys.exit(f"rft run failed ({code}):\n{log.read_text()[-3000:]}")
        out["run_s"] = time.monotonic() - begin
        lineage = read_lineage(latest_checkpoint(job) or job)
        trained = [u for step in lineage for u in step.uids]
        steps = [r["step"] for r in jsonl(job / "metrics" / "trainer.jsonl") if "step" in r]
        sft_steps = [
            r["step"] for r in jsonl(job.parent / "sft" / "metrics" / "trainer.jsonl") if "step" in r
        ]
    curve, committed = out.pop("curve"), out.pop("committed_uids")
    k = max(1, min(10, rounds // 5))
    first, last = curve[:k], curve[-k:]
    out.update({
        "reward_first": statistics.mean(c["reward"] for c in first),
        "reward_last": statistics.mean(c["reward"] for c in last),
        "rounds_averaged": k,
        "sft_steps": len(sft_steps),
        "committed_sessions": rounds * PROMPTS,
        "committed_experiences": rounds * PROMPTS * GROUP,
        "trained_experiences": len(trained),
        "trained_unique": len(set(trained)),
        "trained_exactly_committed": sorted(trained) == sorted(committed),
        "trained_steps": len(steps),
        "last_model_version": curve[-1]["model_version"],
    })  # fmt: skip
    out["ratio"] = out["direct_ms_median"] / out["endpoint_ms_median"]
    out["overhead_x"] = out["endpoint_ms_median"] / out["direct_ms_median"]  # 1 / ratio
    out["target"] = 0.5  # the endpoint's overhead: at most 2x the direct call
    out["baseline"] = (
        "latency: HFEngine.generate in-process on the same model; reward: the SFT model (first rounds)"
    )
    out = {k: round(v, 4) if isinstance(v, float) else v for k, v in out.items()}
    (args.out / "rounds.json").write_text(json.dumps(curve))
    _plot(curve, args.out / "reward.png")
    print(f"\n{'':<26}{'first ' + str(k):>12}{'last ' + str(k):>12}")
    print(f"{'reward (1 = right)':<26}{out['reward_first']:>12.3f}{out['reward_last']:>12.3f}")
    print(f"{'model_version':<26}{first[0]['model_version']:>12}{last[-1]['model_version']:>12}")
    print(f"\n{'per call (n=8, 4 tokens)':<26}{'median ms':>12}{'p90 ms':>12}")
    print(f"{'endpoint (HTTP)':<26}{out['endpoint_ms_median']:>12.1f}{out['endpoint_ms_p90']:>12.1f}")
    print(f"{'engine, direct':<26}{out['direct_ms_median']:>12.1f}{out['direct_ms_p90']:>12.1f}")
    print(f"{'GET /health (no work)':<26}{out['health_ms_median']:>12.1f}{out['health_ms_p90']:>12.1f}")
    print(f"committed {out['committed_experiences']} answers in {out['committed_sessions']} sessions; "
          f"trained on {out['trained_unique']} in {out['trained_steps']} steps; run {out['run_s']:.0f}s")  # fmt: skip
    print(json.dumps(out))


def _plot(curve: list[dict], path: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    fig, ax = plt.subplots(figsize=(6, 3.5))
    x, y = [c["round"] for c in curve], [c["reward"] for c in curve]
    ax.plot(x, y, lw=0.8, alpha=0.5, label="per round")
    mean10 = [sum(y[max(0, i - 9) : i + 1]) / len(y[max(0, i - 9) : i + 1]) for i in range(len(y))]
    ax.plot(x, mean10, lw=2, label="mean of 10 rounds")
    ax.legend(loc="upper left")
    ax.set_xlabel("round (one commit = one train step)")
    ax.set_ylabel("mean reward (served answers)")
    ax.set_title("serve mode: arithmetic agent via the endpoint")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


if __name__ == "__main__":
    main()
