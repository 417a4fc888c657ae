"""veRL keys -> run config keys: the table, veRL's defaults, the rules that read several keys, and keys
with no equivalent (comments + warnings). Every converted config is loaded back with `load_config`."""

from __future__ import annotations

import yaml

from launcher.convert_verl import Conversion, convert_script
from services.common.config import load_config, resolve
from services.common.config.loader import config_warnings
from services.trainer.settings import TrainerSettings

ENV = {"HOME": "/home/user"}


def conv(args: str) -> Conversion:
    [c] = convert_script(f"python3 -m verl.trainer.main_ppo {args}\n", "run.sh")
    load_config(text=c.yaml, environ=ENV)  # what is written always loads
    assert yaml.safe_load(c.yaml) == c.tree  # the YAML holds exactly the tree
    return c


def at(c: Conversion, path: str):
    node = c.tree
    for part in path.split("."):
        node = node[part]
    return node


def has(c: Conversion, path: str) -> bool:
    try:
        at(c, path)
    except (KeyError, TypeError):
        return False
    return True


def test_empty_command_takes_verl_defaults():
    c = conv("")
    config = load_config(text=c.yaml, environ=ENV)
    assert config.algorithm.algorithm_type == "ppo" and config.algorithm.advantage_fn == "ppo"
    assert config.buffer.batch_size == 1024 and config.algorithm.repeat_times == 1
    assert config.buffer.total_epochs == 30
    assert (config.model.max_prompt_tokens, config.model.max_response_tokens) == (512, 512)
    assert config.trainer.use_dynamic_bsz is False
    assert at(c, "trainer.trainer_config.actor_rollout_ref.actor.ppo_mini_batch_size") == 256
    assert (config.algorithm.kl_penalty_fn, config.algorithm.kl_loss_fn) == ("none", "none")
    assert (config.synchronizer.sync_interval, config.synchronizer.sync_offset) == (1, 0)
    assert "batch_size: 1024  # veRL default data.train_batch_size=1024" in c.yaml


def test_one_to_one_keys():
    c = conv(
        "actor_rollout_ref.actor.optim.lr=3e-6 actor_rollout_ref.actor.optim.warmup_style=cosine "
        "actor_rollout_ref.actor.optim.min_lr_ratio=0.1 actor_rollout_ref.actor.grad_clip=0.5 "
        "actor_rollout_ref.actor.ppo_epochs=2 actor_rollout_ref.actor.clip_ratio_low=0.2 "
        "actor_rollout_ref.actor.clip_ratio_high=0.28 actor_rollout_ref.actor.loss_agg_mode=seq-mean-token-mean "
        "actor_rollout_ref.actor.entropy_coeff=0.001 actor_rollout_ref.rollout.temperature=0.7 "
        "actor_rollout_ref.rollout.top_p=0.9 trainer.save_freq=-1 trainer.total_training_steps=50 "
        "trainer.max_actor_ckpt_to_keep=3 +actor_rollout_ref.actor.optim.betas=[0.9,0.95]"
    )
    cfg = load_config(text=c.yaml, environ=ENV)
    opt = cfg.algorithm.optimizer
    assert (opt.lr, opt.lr_scheduler_type, opt.min_lr_ratio, opt.betas) == (3e-6, "cosine", 0.1, (0.9, 0.95))
    assert cfg.trainer.grad_clip == 0.5 and cfg.algorithm.ppo_epochs == 2
    assert cfg.algorithm.policy_loss_fn_args == {"clip_ratio_low": 0.2, "clip_ratio_high": 0.28}
    assert cfg.algorithm.loss_agg_mode == "seq-mean-token-mean"
    assert cfg.algorithm.entropy_loss_fn_args == {"entropy_coef": 0.001}
    assert (cfg.model.temperature, cfg.model.top_p) == (0.7, 0.9)
    assert cfg.trainer.save_interval == 0  # veRL -1: never
    assert cfg.buffer.total_steps == 50 and cfg.trainer.max_checkpoints_to_keep == 3
    assert "lr: 3.0e-06  # actor_rollout_ref.actor.optim.lr=3e-6" in c.yaml


def test_advantage_estimators_and_their_args():
    for adv, atype, fn in [
        ("grpo", "grpo", "grpo"),
        ("rloo", "rloo", "rloo"),
        ("reinforce_plus_plus", "reinforceplusplus", "reinforceplusplus"),
        ("remax", "remax", "remax"),
        ("opo", "opo", "opo"),
    ]:
        c = conv(f"algorithm.adv_estimator={adv}")
        assert (at(c, "algorithm.algorithm_type"), at(c, "algorithm.advantage_fn")) == (atype, fn)
    c = conv("algorithm.adv_estimator=grpo algorithm.norm_adv_by_std_in_grpo=False algorithm.gamma=0.9")
    assert at(c, "algorithm.advantage_fn_args") == {"norm_adv_by_std_in_grpo": False}
    assert "# veRL algorithm.gamma=0.9: no equivalent (adv_estimator=grpo does not use it)" in c.yaml
    TrainerSettings.from_config(load_config(text=c.yaml, environ=ENV))
    c = conv("algorithm.gamma=0.99 algorithm.lam=0.95")
    assert at(c, "algorithm.advantage_fn_args") == {"gamma": 0.99, "lam": 0.95}


def test_unknown_estimator_and_loss_mode_become_comments():
    c = conv("algorithm.adv_estimator=grpo_passk actor_rollout_ref.actor.policy_loss.loss_mode=clip_cov")
    assert not has(c, "algorithm.algorithm_type")
    assert any(w.startswith("veRL algorithm.adv_estimator=grpo_passk: no equivalent (") for w in c.warnings)
    assert "# veRL actor_rollout_ref.actor.policy_loss.loss_mode=clip_cov: no equivalent" in c.yaml
    c = conv("algorithm.adv_estimator=grpo actor_rollout_ref.actor.policy_loss.loss_mode=gspo")
    assert at(c, "algorithm.policy_loss_fn") == "gspo"


def test_kl_loss_and_kl_in_reward():
    c = conv(
        "actor_rollout_ref.actor.use_kl_loss=True actor_rollout_ref.actor.kl_loss_type=k3 "
        "actor_rollout_ref.actor.kl_loss_coef=0.01 algorithm.use_kl_in_reward=True algorithm.kl_penalty=kl "
        "algorithm.kl_ctrl.type=adaptive algorithm.kl_ctrl.kl_coef=0.002 algorithm.kl_ctrl.target_kl=0.1 "
        "algorithm.kl_ctrl.horizon=10000"
    )
    alg = load_config(text=c.yaml, environ=ENV).algorithm
    assert (alg.kl_loss_fn, alg.kl_loss_fn_args) == ("k3", {"kl_coef": 0.01})
    assert alg.kl_penalty_fn == "kl"
    assert alg.kl_penalty_fn_args == {
        "kl_ctrl": "adaptive",
        "kl_coef": 0.002,
        "target_kl": 0.1,
        "horizon": 10000,
    }
    preset = TrainerSettings.from_config(load_config(text=c.yaml, environ=ENV)).preset
    assert preset.use_kl_loss and preset.use_kl_in_reward
    c = conv("actor_rollout_ref.actor.use_kl_loss=True actor_rollout_ref.actor.kl_loss_type=full")
    assert at(c, "algorithm.kl_loss_fn") == "low_var_kl"
    assert any("kl_loss_type=full: no equivalent" in w for w in c.warnings)
    c = conv("actor_rollout_ref.actor.kl_loss_type=k3")  # use_kl_loss stays False in veRL
    assert at(c, "algorithm.kl_loss_fn") == "none" and not c.warnings


def test_batches_keep_verl_meaning():
    c = conv(
        "data.train_batch_size=64 actor_rollout_ref.actor.ppo_mini_batch_size=16 actor_rollout_ref.rollout.n=4"
    )
    s = TrainerSettings.from_config(load_config(text=c.yaml, environ=ENV))
    assert s.train_batch_size == 64 * 4 and s.mini_batch_size == 16 * 4  # 4 optimizer steps per explore step
    c = conv("data.train_batch_size=16 actor_rollout_ref.actor.ppo_mini_batch_size=16")
    assert not has(c, "trainer.trainer_config.actor_rollout_ref.actor")
    c = conv("data.train_batch_size=10 actor_rollout_ref.actor.ppo_mini_batch_size=4")
    assert any("not a multiple" in w for w in c.warnings)


def test_micro_and_dynamic_batches():
    c = conv(
        "actor_rollout_ref.actor.use_dynamic_bsz=True actor_rollout_ref.actor.ppo_max_token_len_per_gpu=8192 "
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2 critic.optim.lr=2e-5 critic.cliprange_value=0.3"
    )
    s = TrainerSettings.from_config(load_config(text=c.yaml, environ=ENV))
    assert (s.use_dynamic_bsz, s.max_tokens_per_micro_batch, s.micro_batch_size) == (True, 8192, 2)
    assert (s.critic_optim.lr, s.cliprange_value) == (2e-5, 0.3)


def test_data_files_become_tasksets():
    c = conv(
        "data.train_files=[/d/gsm8k/train.parquet,/d/math/train.parquet] data.val_files=/d/gsm8k/test.parquet "
        "data.prompt_key=question data.shuffle=False data.seed=7 "
        "actor_rollout_ref.rollout.val_kwargs.do_sample=True actor_rollout_ref.rollout.val_kwargs.temperature=0.6 "
        "actor_rollout_ref.rollout.val_kwargs.n=4"
    )
    cfg = load_config(text=c.yaml, environ=ENV)
    r = resolve(cfg)
    assert [(t.name, t.path) for t in r.tasksets] == [
        ("gsm8k", "/d/gsm8k/train.parquet"),
        ("math", "/d/math/train.parquet"),
    ]
    t = r.tasksets[0]
    assert (t.format.prompt_key, t.format.messages_key) == ("question", "question")
    assert (t.data_selector.selector_type, t.data_selector.seed) == ("sequential", 7)
    [e] = cfg.buffer.explorer_input.eval_tasksets
    assert (e.name, e.rollout_args.temperature, e.repeat_times) == ("gsm8k_eval", 0.6, 4)
    assert any("reward_model.ground_truth" in n for n in c.notes)


def test_gpu_split_engines_and_trainer_ranks():
    c = conv("trainer.n_gpus_per_node=4 actor_rollout_ref.rollout.tensor_model_parallel_size=1")
    assert resolve(load_config(text=c.yaml, environ=ENV)).gpu_split == {
        "total": 4,
        "rollout": 1,
        "auxiliary": 0,
        "trainer": 3,
    }
    assert at(c, "trainer.nproc") == 3
    c = conv(
        "trainer.nnodes=2 trainer.n_gpus_per_node=8 actor_rollout_ref.rollout.tensor_model_parallel_size=2"
    )
    assert (at(c, "explorer.rollout_model.engine_num"), at(c, "trainer.nproc")) == (2, 12)
    c = conv("trainer.n_gpus_per_node=1")
    assert not has(c, "cluster.gpu_per_node") and any("cannot hold both" in w for w in c.warnings)


def test_engine_reward_model_and_logger():
    c = conv(
        "actor_rollout_ref.rollout.name=sglang reward_model.enable=True reward_model.model.path=/rm "
        "trainer.n_gpus_per_node=8 trainer.logger=[console,tensorboard,swanlab]"
    )
    assert at(c, "explorer.rollout_model.engine_type") == "vllm"
    assert any("no sglang engine here" in w for w in c.warnings)
    assert [m["model_path"] for m in at(c, "explorer.auxiliary_models")] == ["/rm"]
    assert at(c, "monitor.monitor_type") == "tensorboard"
    assert any("'swanlab' has no equivalent" in w for w in c.warnings)
    c = conv("reward_model.enable=False reward_model.model.path=/rm")
    assert not has(c, "explorer.auxiliary_models")


def test_trainer_folders_resume_and_eval_cadence():
    c = conv(
        "trainer.project_name=p trainer.experiment_name=e trainer.default_local_dir=/ck/p/e "
        "trainer.resume_mode=disable trainer.test_freq=-1 data.val_files=/d/test.parquet"
    )
    cfg = load_config(text=c.yaml, environ=ENV)
    assert str(resolve(cfg).job_dir) == "/ck/p/e" and cfg.continue_from_checkpoint is False
    assert any(w.startswith("veRL trainer.test_freq=-1: no equivalent") for w in c.warnings)
    assert not conv("trainer.test_freq=-1").warnings  # nothing to evaluate anyway
    silent = conv("data.val_files=/d/test.parquet")
    assert any(
        n.startswith("veRL default trainer.test_freq=-1 validates only before training") for n in silent.notes
    )


def test_keys_without_equivalent_become_comments_and_warnings():
    c = conv(
        "actor_rollout_ref.model.use_remove_padding=True critic.model.fsdp_config.param_offload=True "
        "+my.custom.key=1 --config-name=ppo_megatron_trainer"
    )
    assert "# veRL actor_rollout_ref.model.use_remove_padding=True: nothing to set (" in c.yaml
    assert (
        "# veRL critic.model.fsdp_config.param_offload=True: no equivalent "
        "(the trainer shards every decoder layer with FSDP2; of fsdp_config it reads" in c.yaml
    )
    assert "# veRL my.custom.key=1: no equivalent (not a key this converter knows)" in c.yaml
    assert "argument '--config-name=ppo_megatron_trainer' is not a key=value override; ignored" in c.warnings
    assert not any("use_remove_padding" in w for w in c.warnings)  # the same here: no warning
    assert sum("param_offload" in w for w in c.warnings) == 1


def test_values_the_loader_refuses_become_comments():
    c = conv("actor_rollout_ref.rollout.gpu_memory_utilization=1.5 trainer.total_epochs=3")
    assert not has(c, "explorer.rollout_model.gpu_memory_utilization")
    assert any(
        w.startswith("veRL actor_rollout_ref.rollout.gpu_memory_utilization=1.5: no equivalent (")
        for w in c.warnings
    )
    assert at(c, "buffer.total_epochs") == 3


def test_last_repeated_key_wins_and_several_commands_convert_separately():
    script = (
        "python3 -m verl.trainer.main_ppo data.train_batch_size=8 data.train_batch_size=16\n"
        "python3 -m verl.trainer.main_ppo algorithm.adv_estimator=grpo\n"
    )
    first, second = convert_script(script)
    assert at(first, "buffer.batch_size") == 16 and first.line == 1
    assert at(second, "algorithm.algorithm_type") == "grpo" and second.line == 2


def test_no_key_is_written_that_has_no_effect_here():
    c = conv(
        "actor_rollout_ref.rollout.name=hf actor_rollout_ref.rollout.enforce_eager=True "
        "actor_rollout_ref.rollout.gpu_memory_utilization=0.5"
    )
    assert config_warnings(load_config(text=c.yaml, environ=ENV)) == []
    assert not has(c, "explorer.rollout_model.enforce_eager")
    assert "# veRL actor_rollout_ref.rollout.enforce_eager=True: no equivalent (" in c.yaml
    # read by the hf engine too (its share of a GPU it shares with the trainer): carried over
    assert at(c, "explorer.rollout_model.gpu_memory_utilization") == 0.5


def test_lora_keys_become_one_lora_config():
    m = "actor_rollout_ref.model."
    c = conv(f"{m}lora_rank=8 {m}lora_alpha=16 {m}target_modules=[q_proj,v_proj]")
    config = load_config(text=c.yaml, environ=ENV)
    [lora] = config.model.lora_configs
    assert (lora.lora_rank, lora.lora_alpha, lora.target_modules) == (8, 16, ["q_proj", "v_proj"])
    assert TrainerSettings.from_config(config).lora is not None
    assert not any("lora" in w for w in c.warnings)
    off = conv(f"{m}lora_rank=0 {m}lora_alpha=16")
    assert load_config(text=off.yaml, environ=ENV).model.lora_configs == []
    assert not any("lora" in w for w in off.warnings)


def test_offload_keys_map_to_the_keys_the_trainer_reads():
    f = "fsdp_config."
    c = conv(
        f"actor_rollout_ref.actor.{f}param_offload=True actor_rollout_ref.actor.{f}optimizer_offload=True "
        f"actor_rollout_ref.ref.{f}param_offload=True"
    )
    config = load_config(text=c.yaml, environ=ENV)
    assert config_warnings(config) == []
    settings = TrainerSettings.from_config(config)
    assert (settings.param_offload, settings.optimizer_offload, settings.ref_param_offload) == (
        True,
        True,
        True,
    )
    assert not any("offload" in w for w in c.warnings)


def test_filtered_prompts_are_skipped_not_cut():
    """veRL's filter drops an over-long prompt; here truncation would cut and train on it, so the faithful
    value is enable_prompt_truncation: false (the prompt's task fails and is skipped)."""
    from services.explorer.model_wrapper import ModelWrapper, PromptTooLong

    c = conv("data.filter_overlong_prompts=True data.truncation=error data.max_prompt_length=4")
    config = load_config(text=c.yaml, environ=ENV)
    assert config.model.enable_prompt_truncation is False
    assert "# veRL data.truncation=error: nothing to set (" in c.yaml
    assert "handled by model.enable_prompt_truncation" not in c.yaml
    assert not any("truncation" in w for w in c.warnings)
    wrapper = ModelWrapper(None, max_prompt_tokens=4, enable_prompt_truncation=False)  # type: ignore[arg-type]
    try:
        wrapper.fit_prompt([1, 2, 3, 4, 5])
    except PromptTooLong:
        pass
    else:
        raise AssertionError("an over-long prompt must not be cut")
    assert at(conv(""), "model.enable_prompt_truncation") is False  # veRL's default truncation=error
    assert "veRL default data.truncation=error" in conv("").yaml
    assert at(conv("data.truncation=left"), "model.enable_prompt_truncation") is True
    right = conv("data.truncation=right")
    assert any(w.startswith("veRL data.truncation=right: no equivalent (") for w in right.warnings)


def test_save_freq_minus_one_says_what_zero_means():
    c = conv("trainer.save_freq=-1")
    assert at(c, "trainer.save_interval") == 0
    assert "save_interval: 0  # trainer.save_freq=-1: 0 = no checkpoint every N steps" in c.yaml
    assert any(w.startswith("veRL trainer.save_freq=-1 never saves a checkpoint") for w in c.warnings)
    c = conv("trainer.save_freq=20")
    assert at(c, "trainer.save_interval") == 20 and not c.warnings


def test_remax_takes_the_remax_preset():
    c = conv("algorithm.adv_estimator=remax actor_rollout_ref.rollout.n=4")
    config = load_config(text=c.yaml, environ=ENV)
    assert (config.algorithm.algorithm_type, config.algorithm.advantage_fn) == ("remax", "remax")
    assert config.algorithm.greedy_baseline
    assert TrainerSettings.from_config(config).preset.algorithm_type == "remax"


def test_sequence_parallel_keys_say_why():
    for key in (
        "critic.ulysses_sequence_parallel_size",
        "actor_rollout_ref.ref.ulysses_sequence_parallel_size",
    ):
        c = conv(f"{key}=2")
        [w] = [w for w in c.warnings if key in w]
        assert "sequence parallelism is not implemented" in w and "not a key this converter knows" not in w
        same = conv(f"{key}=1")
        assert not same.warnings and f"# veRL {key}=1: nothing to set (" in same.yaml


def test_engine_num_comment_gives_the_real_share():
    c = conv("trainer.n_gpus_per_node=8 actor_rollout_ref.rollout.tensor_model_parallel_size=4")
    line = next(x for x in c.yaml.splitlines() if x.strip().startswith("engine_num:"))
    assert "here 4 of the 8 GPUs roll out (1 engine(s) x tensor_parallel_size 4)" in line
    c = conv("trainer.n_gpus_per_node=8 actor_rollout_ref.rollout.tensor_model_parallel_size=1")
    line = next(x for x in c.yaml.splitlines() if x.strip().startswith("engine_num:"))
    assert "here a quarter of the 8 GPUs roll out (2 engine(s) x tensor_parallel_size 1)" in line


def test_the_docs_state_the_batch_rule_the_converter_uses():
    from pathlib import Path

    docs = Path(__file__).resolve().parents[3] / "docs"
    readme = "\n".join(page.read_text() for page in sorted(docs.glob("*.md")))
    assert "`actor.ppo_mini_batch_size` (-> `batch_size`)" not in readme  # Trinity-RFT's rule, not ours
    assert "`sync_interval` = data.train_batch_size / ppo_mini_batch_size" not in readme
    c = conv("data.train_batch_size=64 actor_rollout_ref.actor.ppo_mini_batch_size=16")
    assert at(c, "buffer.batch_size") == 64 and at(c, "synchronizer.sync_interval") == 1
    assert "`buffer.batch_size` = `data.train_batch_size`" in readme
