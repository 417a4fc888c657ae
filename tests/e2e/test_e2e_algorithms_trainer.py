"""`rft run` (all four services as processes, memory store, tiny model, a few steps) with ReMax, the
adaptive KL controller and rollout IS correction: each algorithm's metric reaches
`metrics/trainer.jsonl` with finite, sane values."""

from __future__ import annotations

import math

import pytest

from tests.support.rft_run import ROOT, assert_no_orphans, jsonl, run_rft, tiny_model, write_config

pytestmark = pytest.mark.slow

STEPS = 2
CASES = {
    "remax": {"algorithm_type": "remax", "repeat_times": 2},
    "adaptive_kl": {
        "algorithm_type": "grpo",
        "repeat_times": 4,
        "kl_penalty_fn": "k1",
        "kl_penalty_fn_args": {"kl_coef": 0.1, "kl_ctrl": "adaptive", "target_kl": 0.001, "horizon": 20},
    },
    "rollout_is": {
        "algorithm_type": "grpo",
        "repeat_times": 4,
        "rollout_is": True,
        "rollout_is_threshold": 2.0,
        "rollout_is_veto_threshold": 1.0e-4,
    },
}


def _config(tmp_path, algorithm):
    tree = {
        "project": "alg",
        "name": "run",
        "checkpoint_root_dir": str(tmp_path / "ckpt"),
        "mode": "both",
        "algorithm": {"kl_loss_fn": "none", "optimizer": {"lr": 1e-3, "weight_decay": 0.0}, **algorithm},
        "model": {"model_path": str(tiny_model()), "max_prompt_tokens": 8, "max_response_tokens": 4},
        "buffer": {
            "batch_size": 2,
            "total_steps": STEPS,
            "total_epochs": 100,
            "explorer_input": {
                "taskset": {
                    "name": "arithmetic",
                    "path": str(ROOT / "examples" / "data" / "arithmetic.jsonl"),
                    "default_workflow_type": "arithmetic",
                    "format": {
                        "prompt_type": "plaintext",
                        "prompt_key": "question",
                        "response_key": "answer",
                    },
                }
            },
        },
        "explorer": {"eval_on_startup": False, "rollout_model": {"engine_type": "hf"}},
        "synchronizer": {"sync_method": "memory", "sync_interval": 1, "sync_offset": 0},
        "trainer": {"save_hf_checkpoint": "never"},
        "monitor": {"monitor_type": "none"},
    }
    return write_config(tmp_path / "config.yaml", tree)


@pytest.mark.parametrize("case", sorted(CASES))
def test_algorithm_metric_reaches_the_trainer_log(tmp_path, case):
    proc = run_rft(_config(tmp_path, CASES[case]), timeout_s=120)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    assert_no_orphans(out)
    run_dir = tmp_path / "ckpt" / "alg" / "run"
    train = jsonl(run_dir / "metrics" / "trainer.jsonl")
    assert [r["step"] for r in train] == list(range(1, STEPS + 1))
    if case == "remax":
        explore = [r for r in jsonl(run_dir / "metrics" / "explorer.jsonl") if "rollout/reward/mean" in r]
        baselines = [r["rollout/reward_baseline/mean"] for r in explore]
        assert baselines and all(0.0 <= b <= 1.0 for b in baselines)
        # ReMax advantages r - r_greedy lie in [-1, 1] for 0/0.1/1 rewards
        assert all(-1.0 <= r["critic/advantages/min"] <= r["critic/advantages/max"] <= 1.0 for r in train)
    elif case == "adaptive_kl":
        coefs = [r["actor/reward_kl_penalty_coeff"] for r in train]
        assert all(math.isfinite(c) and 0 < c < 0.2 for c in coefs)
        assert len(set(coefs)) == STEPS, coefs  # moved every step
    else:
        means = [r["mismatch/rollout_is_mean"] for r in train]
        # the hf engine's log-probs and the trainer's agree closely: weights near 1
        assert all(0.5 < m < 2.0 for m in means), means
        assert all(0.0 <= r["mismatch/rollout_is_veto_fraction"] <= 1.0 for r in train)
