"""`launcher` without processes: it imports only services.common; stages and the effective
config every process reads; offline SFT rows become experiences tokenised as the explorer does;
summary.json from metrics files; metrics tailing keeps partial lines for later."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest
import yaml

from launcher.offline_data import build_experiences, epochs_needed
from launcher.progress import MetricsTail
from launcher.stages import WAVES, child_env, effective_tree, run_stages
from launcher.summary import run_summary, stage_summary
from launcher.tiny_model import make_tiny_model
from services.common.config import load_config, resolve, validate_tree

ROOT = Path(__file__).resolve().parents[3]


# names.py checks a config's names against the services' registries (and the trainer's preset resolution)
NAMES_IMPORTS = {
    "services.trainer.settings",
    "services.trainer.algorithms",
    "services.trainer.algorithms.presets",
    "services.explorer.workflows",
}


def test_launch_imports_only_common_and_itself():
    bad = []
    for path in (ROOT / "launcher").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else (
                [node.module] if isinstance(node, ast.ImportFrom) and node.module and node.level == 0 else [])  # fmt: skip
            bad += [f"{path.name}: {n}" for n in names
                    if n.startswith("services.") and not n.startswith(("services.common", "services.weight_sync", "launcher"))
                    and not (path.name == "names.py" and n in NAMES_IMPORTS)]  # fmt: skip
    assert not bad


def test_quickstart_stages_and_effective_config(tmp_path):
    config = load_config(ROOT / "examples" / "quickstart.yaml", overrides=[f"checkpoint_root_dir={tmp_path}"])
    stages = run_stages(config)
    assert [(s.name, s.config.mode, s.config.algorithm.algorithm_type) for s in stages] == [
        ("sft", "train", "sft"), ("grpo", "both", "grpo")]  # fmt: skip
    assert stages[1].job_dir == tmp_path / "quickstart" / "arithmetic" / "grpo"
    tree = effective_tree(stages[1], "/x/global_step_30/huggingface", multi_stage=True)
    checked = validate_tree(tree)  # what the services load is a valid config
    assert checked.model.model_path == "/x/global_step_30/huggingface"
    assert checked.explorer.auto_start and checked.trainer.auto_start and not checked.stages
    assert {checked.services.buffer.port, checked.services.trainer.port} == {0}
    assert set(WAVES) == {"both", "train", "explore", "bench", "serve"}


@pytest.mark.parametrize(
    "rollout,share,sleep",
    [
        ("{engine_type: vllm}", 0.3, True),  # one-GPU mode's defaults survive the written config
        ("{engine_type: vllm, gpu_memory_utilization: 0.4, enable_sleep_mode: false}", 0.4, False),
    ],
)
def test_the_written_config_resolves_the_one_gpu_defaults_as_the_users(rollout, share, sleep):
    text = f"model: {{max_response_tokens: 4}}\ncluster: {{gpu_per_node: 1}}\nexplorer: {{rollout_model: {rollout}}}\n"
    (stage,) = run_stages(load_config(text=text, environ={}))
    written = resolve(validate_tree(effective_tree(stage, None, False)))
    assert written.rollout_gpu_memory_utilization == share
    assert written.rollout_model.enable_sleep_mode is sleep
    assert written.trainer_gpu_memory_fraction == pytest.approx(1 - share - 0.05)


def test_child_env_drops_address_overrides_and_carries_the_token():
    env = child_env({"RFT_BUFFER_PORT": "1", "RFT_EXPLORER_ID": "x", "HOME": "/h"}, "tok")
    assert "RFT_BUFFER_PORT" not in env and "RFT_EXPLORER_ID" not in env
    assert env["RFT_AUTH_TOKEN"] == "tok" and env["HOME"] == "/h"


def test_offline_rows_become_prompt_plus_response_plus_eos(tmp_path):
    from services.common.config import FormatConfig
    from services.common.modeling import load_tokenizer

    tok = load_tokenizer(make_tiny_model(tmp_path / "m"))
    fmt = FormatConfig(prompt_type="plaintext", prompt_key="question", response_key="answer")
    (exp,) = build_experiences([{"question": "3+4=", "answer": "7"}], tok, fmt)
    prompt = tok.encode("3+4=", add_special_tokens=False)
    assert exp.tokens.tolist() == prompt + tok.encode("7", add_special_tokens=False) + [tok.eos_token_id]
    assert exp.prompt_length == len(prompt)
    assert exp.logprobs.shape == exp.action_mask.shape == (exp.response_length,)
    with pytest.raises(ValueError, match="needs keys"):
        build_experiences([{"q": "1"}], tok, fmt, source="f.jsonl")


def test_epochs_cover_the_steps(tmp_path):
    text = yaml.safe_dump(
        {"algorithm": {"algorithm_type": "sft"}, "buffer": {"batch_size": 25, "total_steps": 30}}
    )
    assert epochs_needed(load_config(text=text), rows=25) == 30
    assert epochs_needed(load_config(text=text), rows=100) == 8


def test_summary_from_metrics_files(tmp_path):
    job = tmp_path / "job"
    (job / "metrics").mkdir(parents=True)
    rewards = [0.1, 0.2, 0.3, 0.5, 0.7, 0.8, 0.9, 1.0]
    (job / "metrics" / "explorer.jsonl").write_text("".join(
        json.dumps({"step": i + 1, "rollout/reward/mean": r, "rollout/model_version": i,
                    "rollout/experience_count": 8}) + "\n" for i, r in enumerate(rewards)))  # fmt: skip
    (job / "metrics" / "trainer.jsonl").write_text(
        "".join(json.dumps({"step": i}) + "\n" for i in range(1, 9))
    )
    (job / "global_step_8" / "huggingface").mkdir(parents=True)
    (job / "global_step_8" / "huggingface" / "config.json").write_text("{}")
    (job / "latest_checkpointed_iteration.txt").write_text("8")
    s = stage_summary(job, "finished", 4.0, train_batch_size=8)
    assert (s["steps"], s["model_version"], s["first_reward_mean"]) == (8, 8, 0.1)
    assert s["last_reward_mean"] == pytest.approx(sum(rewards[-5:]) / 5)
    assert s["samples_per_s"] == 16.0 and s["checkpoint"].endswith("global_step_8/huggingface")
    top = run_summary([("sft", {**s, "first_reward_mean": None, "steps": 3}), ("rl", s)], "finished")
    assert top["steps"] == 11 and top["first_reward_mean"] == 0.1 and len(top["stages"]) == 2
    assert top["wall_time_s"] == 8.0 and top["samples_per_s"] == 16.0  # the stages' sums


def test_metrics_tail_keeps_partial_lines(tmp_path):
    path = tmp_path / "m.jsonl"
    tail = MetricsTail(path)
    assert tail.read_new() == []
    path.write_text('{"step": 1}\n{"st')
    assert tail.read_new() == [{"step": 1}]
    with path.open("a") as fh:
        fh.write('ep": 2}\n')
    assert tail.read_new() == [{"step": 2}]
