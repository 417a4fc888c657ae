"""The quickstart's arithmetic task (`a+b=`, a, b in 0..4) trained through the `tinker` SDK alone.

SFT first (`cross_entropy` on the right answers, as the quickstart's `sft` stage), then RL
(`importance_sampling` or `ppo` with group-centred rewards, as its `grpo` stage). The reward is the
quickstart's with format_score 0: 1 for the right number, else 0. Used by the Tinker API test and by
bench/tinker_api.py.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import numpy as np
import tinker
from tinker import types

from services.explorer.workflows.arithmetic import arithmetic_reward

ROWS = Path(__file__).resolve().parents[2] / "examples" / "data" / "arithmetic.jsonl"


def rows() -> list[dict[str, str]]:
    return [json.loads(line) for line in ROWS.read_text().splitlines() if line.strip()]


def _datum(tokens: list[int], **per_token: list[float]) -> types.Datum:
    """Tinker's convention: input tokens[:-1], targets tokens[1:], per-token arrays on the targets."""
    inputs: dict[str, Any] = {"target_tokens": np.array(tokens[1:], dtype=np.int64)}
    inputs.update({k: np.array(v[1:], dtype=np.float32) for k, v in per_token.items()})
    return types.Datum(model_input=types.ModelInput.from_ints(tokens[:-1]), loss_fn_inputs=inputs)


def evaluate(sampler: Any, tok: Any, data: list[dict[str, str]], n: int = 4) -> float:
    params = types.SamplingParams(max_tokens=4, temperature=1.0, seed=0)
    futures = [
        sampler.sample(types.ModelInput.from_ints(tok(r["question"]).input_ids), n, params) for r in data
    ]
    scores = [
        arithmetic_reward(tok.decode(s.tokens), r["answer"], format_score=0.0)
        for r, f in zip(data, futures, strict=True)
        for s in f.result().sequences
    ]
    return float(np.mean(scores))


def sft_then_rl(
    sc: tinker.ServiceClient,
    tok: Any,
    *,
    base_model: str = "tiny",
    sft_steps: int = 20,
    rl_steps: int = 20,
    loss: str = "importance_sampling",
    group: int = 8,
    lr: float = 5e-3,
    rank: int = 32,
) -> dict[str, float]:
    """Train; returns the reward after SFT and after RL, and the RL steps per second."""
    data = rows()
    tc = sc.create_lora_training_client(base_model=base_model, rank=rank)
    eos = tok.eos_token_id
    sft = []
    for r in data:
        prompt, answer = tok(r["question"]).input_ids, tok(r["answer"]).input_ids + [eos]
        sft.append(_datum(prompt + answer, weights=[0.0] * len(prompt) + [1.0] * len(answer)))
    adam = types.AdamParams(learning_rate=lr)
    for _ in range(sft_steps):
        tc.forward_backward(sft, "cross_entropy")
        tc.optim_step(adam).result()
    before = evaluate(tc.save_weights_and_get_sampling_client(), tok, data)
    rng = np.random.default_rng(1)
    t0 = time.perf_counter()
    for step in range(rl_steps):
        sampler = tc.save_weights_and_get_sampling_client()
        batch = [data[i] for i in rng.choice(len(data), 8, replace=False)]
        prompts = [tok(r["question"]).input_ids for r in batch]
        # seeded: the samples do not depend on what the server's engine sampled before
        results = [
            sampler.sample(
                types.ModelInput.from_ints(p), group, types.SamplingParams(max_tokens=4, seed=100 * step + i)
            )
            for i, p in enumerate(prompts)
        ]
        datums = []
        for r, p, fut in zip(batch, prompts, results, strict=True):
            seqs = fut.result().sequences
            rewards = np.array(
                [arithmetic_reward(tok.decode(s.tokens), r["answer"], format_score=0.0) for s in seqs]
            )
            adv = rewards - rewards.mean()
            for s, a in zip(seqs, adv, strict=True):
                if a == 0:
                    continue
                n = len(s.tokens)
                datums.append(
                    _datum(
                        p + list(s.tokens),
                        logprobs=[0.0] * len(p) + list(s.logprobs),
                        advantages=[0.0] * len(p) + [float(a)] * n,
                    )
                )
        if datums:
            tc.forward_backward(datums, loss)
            tc.optim_step(adam).result()
    rl_s = time.perf_counter() - t0
    after = evaluate(tc.save_weights_and_get_sampling_client(), tok, data)
    return {"before": before, "after": after, "gain": after - before, "rl_steps_per_s": rl_steps / rl_s}
