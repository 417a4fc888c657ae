"""What the Tinker HTTP path costs: the same SFT-then-RL loop through `rft serve tinker` and in-process.

    python bench/tinker_api.py [--sft-steps 30] [--rl-steps 30]

1. API: `rft serve tinker` in a subprocess (tiny model trained in full, one torch thread) and the
   SDK-only loop of tests/support/tinker_loop.py (SFT with cross_entropy, then importance_sampling RL
   on the quickstart's arithmetic task, 8 prompts x 8 samples per step).
2. Baseline, measured in the same run: the same loop on the same server code called in-process
   (tinker_api: TrainingModel.forward_backward / optim_step, the hf sampler), no HTTP, no SDK.
The last line printed is one JSON object: RL steps/s of each, the reward gain of each, and
"ratio" = API steps/s / in-process steps/s (1.0 = the HTTP path costs nothing).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from services.common.modeling import load_tokenizer  # noqa: E402
from services.explorer.workflows.arithmetic import arithmetic_reward  # noqa: E402
from tests.support.rft_run import env, poll_until, tiny_model  # noqa: E402
from tests.support.tinker_loop import rows, sft_then_rl  # noqa: E402
from tinker_api.server import TinkerServer  # noqa: E402
from tinker_api.wire import Datum, FwdBwd  # noqa: E402


class _P:  # the sampling parameters the in-process sampler reads
    max_tokens, temperature, top_k, top_p, stop, seed = 4, 1.0, -1, 1.0, None, None


def in_process(folder: Path, work: Path, sft_steps: int, rl_steps: int, lr: float = 1e-3) -> dict[str, float]:
    torch.set_num_threads(1)
    tok = load_tokenizer(folder)
    server = TinkerServer({"tiny": str(folder)}, work / "ck", full=frozenset({"tiny"}))
    session = server.sessions.create({})
    mid = server.create_model({"session_id": session, "model_seq_id": 0, "base_model": "tiny"})["model_id"]
    model, data, eos = server.models[mid], rows(), tok.eos_token_id
    adam = {"learning_rate": lr}

    def datum(tokens: list[int], **per_token: list[float]) -> Datum:
        inputs = {"target_tokens": np.array(tokens[1:])} | {
            k: np.array(v[1:], np.float32) for k, v in per_token.items()
        }
        return Datum(tokens[:-1], inputs)

    def sample(prompt: list[int], n: int) -> list[tuple[list[int], list[float], str]]:
        key = f"snapshot-{model.step}"
        server.sampler.states.setdefault(key, model.full_state())
        return server.sampler.sample(model.folder, key, None, prompt, n, _P)

    def evaluate() -> float:
        scores = [
            arithmetic_reward(tok.decode(t), r["answer"], format_score=0.0)
            for r in data
            for t, _, _ in sample(tok(r["question"]).input_ids, 4)
        ]
        return float(np.mean(scores))

    sft = []
    for r in data:
        p, a = tok(r["question"]).input_ids, tok(r["answer"]).input_ids + [eos]
        sft.append(datum(p + a, weights=[0.0] * len(p) + [1.0] * len(a)))
    for _ in range(sft_steps):
        model.forward_backward(FwdBwd(mid, "cross_entropy", {}, False, sft))
        model.optim_step(adam)
    before, rng, t0 = evaluate(), np.random.default_rng(1), time.perf_counter()
    for _ in range(rl_steps):
        datums = []
        for i in rng.choice(len(data), 8, replace=False):
            p = tok(data[i]["question"]).input_ids
            seqs = sample(p, 8)
            rewards = np.array(
                [arithmetic_reward(tok.decode(t), data[i]["answer"], format_score=0.0) for t, _, _ in seqs]
            )
            for (t, lp, _), a in zip(seqs, rewards - rewards.mean(), strict=True):
                if a != 0:
                    datums.append(
                        datum(
                            p + t,
                            logprobs=[0.0] * len(p) + lp,
                            advantages=[0.0] * len(p) + [float(a)] * len(t),
                        )
                    )
        if datums:
            model.forward_backward(FwdBwd(mid, "importance_sampling", {}, False, datums))
            model.optim_step(adam)
    rl_s = time.perf_counter() - t0
    after = evaluate()
    return {"before": before, "after": after, "gain": after - before, "rl_steps_per_s": rl_steps / rl_s}


def through_api(folder: Path, work: Path, sft_steps: int, rl_steps: int) -> dict[str, float]:
    import tinker

    port_file = work / "port"
    argv = [
        sys.executable,
        "-m",
        "tinker_api",
        "--port",
        "0",
        "--port-file",
        str(port_file),
        "--api-key",
        "tml-bench",
        "--base-model",
        f"tiny={folder}",
        "--full",
        "tiny",
        "--threads",
        "1",
        "--checkpoint-dir",
        str(work / "ck-api"),
    ]
    proc = subprocess.Popen(argv, cwd=ROOT, env=env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        poll_until(lambda: port_file.is_file() and port_file.read_text(), 120, "rft serve tinker")
        sc = tinker.ServiceClient(base_url=f"http://127.0.0.1:{port_file.read_text()}", api_key="tml-bench")
        return sft_then_rl(sc, load_tokenizer(folder), sft_steps=sft_steps, rl_steps=rl_steps, lr=1e-3)
    finally:
        proc.kill()
        proc.wait()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sft-steps", type=int, default=30)
    ap.add_argument("--rl-steps", type=int, default=30)
    a = ap.parse_args()
    folder = tiny_model()
    with tempfile.TemporaryDirectory() as tmp:
        api = through_api(folder, Path(tmp), a.sft_steps, a.rl_steps)
        print(f"api:        {api}", flush=True)
        base = in_process(folder, Path(tmp), a.sft_steps, a.rl_steps)
        print(f"in-process: {base}", flush=True)
    ratio = api["rl_steps_per_s"] / base["rl_steps_per_s"]
    print(json.dumps({"api": api, "in_process": base, "ratio": round(ratio, 3), "target": 1.0}))


if __name__ == "__main__":
    main()
