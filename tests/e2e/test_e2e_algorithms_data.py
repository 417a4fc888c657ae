"""`rft run` with the data-side algorithms on the tiny model: DPO on offline preference pairs
(examples/dpo.yaml) and DAPO with its overlong penalty and dynamic sampling (filter_groups)."""

from __future__ import annotations

import copy

import pytest

from tests.support.rft_run import assert_no_orphans, example, jsonl, run_rft, tiny_model, write_config

pytestmark = pytest.mark.slow

DPO_METRICS = ("actor/dpo_loss", "actor/chosen_reward", "actor/rejected_reward", "actor/reward_margin",
               "actor/accuracy_mean")  # fmt: skip


def test_dpo_example_raises_the_chosen_margin(tmp_path):
    tree = example("dpo.yaml")
    tree["checkpoint_root_dir"] = str(tmp_path / "ckpt")
    tree["model"]["model_path"] = str(tiny_model())
    proc = run_rft(write_config(tmp_path / "dpo.yaml", tree), timeout_s=150)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    assert_no_orphans(out)
    rows = jsonl(tmp_path / "ckpt" / "dpo" / "arithmetic-pairs" / "metrics" / "trainer.jsonl")
    steps = tree["buffer"]["total_steps"]
    assert [r["step"] for r in rows] == list(range(1, steps + 1))
    assert all(k in r for r in rows for k in DPO_METRICS)
    assert rows[0]["actor/dpo_loss"] == pytest.approx(0.693147, abs=1e-4)  # the policy is the reference
    last = rows[-3:]
    assert min(r["actor/reward_margin"] for r in last) > 0.05, [r["actor/reward_margin"] for r in rows]
    assert sum(r["actor/accuracy_mean"] for r in last) / 3 >= 0.75
    assert sum(r["actor/dpo_loss"] for r in last) / 3 < 0.67


def _dapo_tree(tmp_path) -> dict:
    tree = copy.deepcopy(example("quickstart.yaml"))
    del tree["stages"]
    tree["name"] = "dapo"
    tree["checkpoint_root_dir"] = str(tmp_path / "ckpt")
    tree["model"]["model_path"] = str(tiny_model())
    tree["algorithm"] = {
        "algorithm_type": "dapo",
        "repeat_times": 2,  # small groups: many have equal rewards under the random model
        # L_max = max_response_tokens 4, L_cache 2: a 3-token response gets -0.5, a 4-token one -1
        "reward_manager_args": {"overlong_buffer": {"len": 2}},
        "filter_groups": {"enable": True, "metric": "seq_reward", "max_num_gen_batches": 6},
        "optimizer": {"lr": 1e-3, "weight_decay": 0.0},
    }
    tree["buffer"]["batch_size"] = 4
    tree["buffer"]["total_steps"] = 4
    tree["buffer"]["explorer_input"]["taskset"]["reward_fn_args"] = {"format_score": 0.1}
    tree["trainer"] = {"save_interval": 0, "save_hf_checkpoint": "never"}
    return tree


def test_dapo_applies_the_overlong_penalty_and_drops_flat_groups(tmp_path):
    tree = _dapo_tree(tmp_path)
    proc = run_rft(write_config(tmp_path / "dapo.yaml", tree), timeout_s=150)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    assert_no_orphans(out)
    job = tmp_path / "ckpt" / "quickstart" / "dapo"
    train = jsonl(job / "metrics" / "trainer.jsonl")
    explore = [r for r in jsonl(job / "metrics" / "explorer.jsonl") if "rollout/num_gen_batches" in r]
    assert [r["step"] for r in train] == [1, 2, 3, 4]  # every step got a full batch
    assert [r["step"] for r in explore] == [1, 2, 3, 4]
    # overlong penalty: applied by the trainer before advantages, visible in its metrics
    assert all(r["reward/overlong_penalty_mean"] < 0 and 0 < r["reward/overlong_ratio"] <= 1 for r in train)
    # dynamic sampling: flat groups were dropped, more were sampled, and every step was still full
    assert sum(r["rollout/dropped_groups"] for r in explore) > 0
    assert max(r["rollout/num_gen_batches"] for r in explore) > 1
    assert all(r["rollout/experience_count"] == 8 for r in explore)
