"""One row per veRL key that `rft convert-verl` maps (table.DIRECT, the rules' keys, and the veRL keys the
trainer reads under trainer.trainer_config): the key set in a command lands where the row says, and a
command that leaves the key out means the same run as one that gives veRL's default for it
(verl/trainer/config/ppo_trainer.yaml), except for the differences listed with their reason."""

from __future__ import annotations

import dataclasses
import inspect
from dataclasses import dataclass
from typing import Any

import pytest

from launcher.convert_verl import convert_script
from launcher.convert_verl.draft import Draft
from launcher.convert_verl.rules_run import RUN_KEYS, RUN_RULES
from launcher.convert_verl.rules_training import TRAINING_KEYS, TRAINING_RULES
from launcher.convert_verl.table import DIRECT, VERL_DEFAULTS
from services.common.config import RFTConfig, load_config, resolve
from services.common.config.compat import TRAINER_CONFIG_KEYS
from services.trainer.algorithms.kl import make_kl_controller
from services.trainer.algorithms.registries import get_advantage_fn, get_policy_loss_fn
from services.trainer.settings import TrainerSettings

ENV = {"HOME": "/home/user"}
MISSING = object()  # veRL has no default that means a run (a path, a name, a required key)
A, R, D, T = "actor_rollout_ref.actor.", "actor_rollout_ref.rollout.", "data.", "trainer."
TC = "trainer.trainer_config."
DYN = A + "use_dynamic_bsz=True"
TRAIN = D + "train_files=/d/gsm8k/train.parquet"
VAL = D + "val_files=/d/gsm8k/test.parquet"


@dataclass(frozen=True)
class Row:
    key: str
    text: str  # the value as a script writes it
    expect: dict[str, Any]  # config path -> value, after loading
    default: Any = MISSING  # veRL's default for the key
    why: str = ""  # why leaving the key out does not mean veRL's default here, or why there is none
    extra: str = ""  # other keys the row needs


ROWS = [
    Row("actor_rollout_ref.model.path", "/m/actor", {"model.model_path": "/m/actor"}, why="a path"),
    Row("critic.model.path", "/m/critic", {"model.critic_model_path": "/m/critic"}, why="a path"),
    Row("actor_rollout_ref.model.custom_chat_template", "tmpl", {"model.custom_chat_template": "tmpl"}, None),
    Row(
        "actor_rollout_ref.model.enable_gradient_checkpointing",
        "False",
        {TC + "actor_rollout_ref.model.enable_gradient_checkpointing": False},
        True,
    ),
    Row(R + "temperature", "0.7", {"model.temperature": 0.7}, 1.0),
    Row(R + "top_p", "0.9", {"model.top_p": 0.9}, 1.0),
    Row(R + "top_k", "20", {"model.top_k": 20}, -1),
    Row(R + "max_model_len", "4096", {"model.max_model_len": 4096}, None),
    Row(D + "max_prompt_length", "1024", {"model.max_prompt_tokens": 1024}, 512),
    Row(D + "max_response_length", "2048", {"model.max_response_tokens": 2048}, 512),
    Row(A + "optim.lr", "3e-6", {"algorithm.optimizer.lr": 3e-6}, 1e-6),
    Row(A + "optim.lr_warmup_steps", "10", {"algorithm.optimizer.lr_warmup_steps": 10}, -1),
    Row(A + "optim.lr_warmup_steps_ratio", "0.1", {"algorithm.optimizer.lr_warmup_steps_ratio": 0.1}, 0.0),
    Row(A + "optim.min_lr_ratio", "0.1", {"algorithm.optimizer.min_lr_ratio": 0.1}, 0.0),
    Row(A + "optim.warmup_style", "cosine", {"algorithm.optimizer.lr_scheduler_type": "cosine"}, "constant"),
    Row(
        A + "optim.lr_scheduler_type",
        "cosine",
        {"algorithm.optimizer.lr_scheduler_type": "cosine"},
        "constant",
    ),
    Row(A + "optim.weight_decay", "0.1", {"algorithm.optimizer.weight_decay": 0.1}, 0.01),
    Row(A + "optim.betas", "[0.9,0.95]", {"algorithm.optimizer.betas": (0.9, 0.95)}, [0.9, 0.999]),
    Row(A + "optim.optimizer", "AdamW", {"algorithm.optimizer.optimizer_type": "adamw"}, "AdamW"),
    Row(A + "optim.clip_grad", "0.5", {"trainer.grad_clip": 0.5}, 1.0),
    Row(A + "grad_clip", "0.5", {"trainer.grad_clip": 0.5}, 1.0),
    Row(A + "ppo_epochs", "2", {"algorithm.ppo_epochs": 2}, 1),
    Row(A + "clip_ratio", "0.3", {"algorithm.policy_loss_fn_args.clip_ratio": 0.3}, 0.2),
    Row(A + "clip_ratio_low", "0.1", {"algorithm.policy_loss_fn_args.clip_ratio_low": 0.1}, 0.2),
    Row(A + "clip_ratio_high", "0.28", {"algorithm.policy_loss_fn_args.clip_ratio_high": 0.28}, 0.2),
    Row(A + "clip_ratio_c", "10.0", {"algorithm.policy_loss_fn_args.clip_ratio_c": 10.0}, 3.0),
    Row(
        A + "loss_agg_mode",
        "seq-mean-token-mean",
        {"algorithm.loss_agg_mode": "seq-mean-token-mean"},
        "token-mean",
    ),
    Row(A + "entropy_coeff", "0.001", {"algorithm.entropy_loss_fn_args.entropy_coef": 0.001}, 0),
    Row(
        A + "ppo_micro_batch_size_per_gpu",
        "4",
        {"trainer.micro_batch_size_per_gpu": 4},
        why="veRL has none (it asserts one is given without dynamic batches); here 8",
    ),
    Row(A + "use_dynamic_bsz", "True", {"trainer.use_dynamic_bsz": True}, False),
    Row(A + "ppo_max_token_len_per_gpu", "8192", {"trainer.max_token_len_per_gpu": 8192}, 16384, extra=DYN),
    Row(A + "ulysses_sequence_parallel_size", "1", {"trainer.ulysses_sequence_parallel_size": 1}, 1),
    Row(R + "n", "4", {"algorithm.repeat_times": 4}, 1),
    Row(R + "tensor_model_parallel_size", "4", {"explorer.rollout_model.tensor_parallel_size": 4}, 2),
    Row(
        R + "gpu_memory_utilization",
        "0.6",
        {"explorer.rollout_model.gpu_memory_utilization": 0.6},
        0.5,
        why="veRL's engine shares each GPU with training (0.5); here it has GPUs of its own (0.9)",
    ),
    Row(R + "enforce_eager", "True", {"explorer.rollout_model.enforce_eager": True}, False),
    Row(
        R + "enable_chunked_prefill", "False", {"explorer.rollout_model.enable_chunked_prefill": False}, True
    ),
    Row(R + "enable_prefix_caching", "False", {"explorer.rollout_model.enable_prefix_caching": False}, True),
    Row(
        R + "dtype",
        "float16",
        {"explorer.rollout_model.dtype": "float16"},
        "bfloat16",
        why="here `auto` takes the model's own dtype (bfloat16 for the models veRL's examples train)",
    ),
    Row(D + "train_batch_size", "64", {"buffer.batch_size": 64}, 1024),
    Row(T + "total_epochs", "3", {"buffer.total_epochs": 3}, 30),
    Row(T + "total_training_steps", "50", {"buffer.total_steps": 50}, None),
    Row(T + "val_before_train", "False", {"explorer.eval_on_startup": False}, True),
    Row(T + "project_name", "p", {"project": "p"}, why="a name"),
    Row(T + "experiment_name", "e", {"name": "e"}, why="a name"),
    Row(T + "max_actor_ckpt_to_keep", "3", {"trainer.max_checkpoints_to_keep": 3}, None),
    Row(T + "nnodes", "2", {"cluster.node_num": 2}, 1),
    Row(
        T + "n_gpus_per_node",
        "4",
        {"cluster.gpu_per_node": 4},
        8,
        why="veRL assumes 8 GPUs a node; left out, each service here sees every GPU of its machine",
    ),
    # DAPO (verl/recipe/dapo): not keys of ppo_trainer.yaml
    Row(
        "algorithm.filter_groups.enable",
        "True",
        {"algorithm.filter_groups.enable": True},
        why="a DAPO recipe key",
        extra=R + "n=4",
    ),
    Row(
        "algorithm.filter_groups.metric",
        "seq_reward",
        {"algorithm.filter_groups.metric": "seq_reward"},
        why="a DAPO recipe key",
    ),
    Row(
        "algorithm.filter_groups.max_num_gen_batches",
        "10",
        {"algorithm.filter_groups.max_num_gen_batches": 10},
        why="a DAPO recipe key",
    ),
    Row("reward_model.reward_manager", "dapo", {"algorithm.reward_manager": "dapo"}, "naive"),
    *(
        Row(
            f"reward_model.overlong_buffer.{k}",
            text,
            {f"algorithm.reward_manager_args.overlong_buffer.{k}": value},
            why="a DAPO recipe key",
            extra="reward_model.reward_manager=dapo",
        )
        for k, text, value in (
            ("enable", "True", True),
            ("len", "512", 512),
            ("penalty_factor", "0.5", 0.5),
            ("log", "True", True),
        )
    ),
    Row("critic.optim.warmup_style", "cosine", {TC + "critic.optim.lr_scheduler_type": "cosine"}, "constant"),
    *(
        Row(key, "True", {TC + key: True}, False)
        for key in (
            A + "fsdp_config.param_offload",
            A + "fsdp_config.optimizer_offload",
            "actor_rollout_ref.ref.fsdp_config.param_offload",
        )
    ),
    # veRL keys the trainer reads under trainer.trainer_config
    Row("critic.optim.lr", "2e-5", {TC + "critic.optim.lr": 2e-5}, 1e-5),
    Row("critic.optim.lr_warmup_steps", "5", {TC + "critic.optim.lr_warmup_steps": 5}, -1),
    Row("critic.optim.lr_warmup_steps_ratio", "0.1", {TC + "critic.optim.lr_warmup_steps_ratio": 0.1}, 0.0),
    Row(
        "critic.optim.min_lr_ratio",
        "0.1",
        {TC + "critic.optim.min_lr_ratio": 0.1},
        why="veRL's is null (its scheduler's own default); here the actor's (0.0 from veRL)",
    ),
    Row(
        "critic.optim.lr_scheduler_type",
        "cosine",
        {TC + "critic.optim.lr_scheduler_type": "cosine"},
        "constant",
    ),
    Row("critic.optim.weight_decay", "0.1", {TC + "critic.optim.weight_decay": 0.1}, 0.01),
    Row("critic.cliprange_value", "0.3", {TC + "critic.cliprange_value": 0.3}, 0.5),
    Row("critic.grad_clip", "0.5", {TC + "critic.grad_clip": 0.5}, 1.0),
    Row("seed", "7", {TC + "seed": 7}, why="not a key of ppo_trainer.yaml; the trainer's seed here (42)"),
    # rules_training
    Row(
        "algorithm.adv_estimator",
        "grpo",
        {"algorithm.algorithm_type": "grpo", "algorithm.advantage_fn": "grpo"},
        "gae",
    ),
    Row("algorithm.gamma", "0.9", {"algorithm.advantage_fn_args.gamma": 0.9}, 1.0),
    Row("algorithm.lam", "0.95", {"algorithm.advantage_fn_args.lam": 0.95}, 1.0),
    Row(
        "algorithm.norm_adv_by_std_in_grpo",
        "False",
        {"algorithm.advantage_fn_args.norm_adv_by_std_in_grpo": False},
        True,
        extra="algorithm.adv_estimator=grpo",
    ),
    Row(A + "policy_loss.loss_mode", "gspo", {"algorithm.policy_loss_fn": "gspo"}, "vanilla"),
    Row("algorithm.use_kl_in_reward", "True", {"algorithm.kl_penalty_fn": "kl"}, False),
    Row(
        "algorithm.kl_penalty",
        "low_var_kl",
        {"algorithm.kl_penalty_fn": "low_var_kl"},
        "kl",
        extra="algorithm.use_kl_in_reward=True",
    ),
    Row(
        "algorithm.kl_ctrl.type",
        "adaptive",
        {"algorithm.kl_penalty_fn_args.kl_ctrl": "adaptive"},
        "fixed",
        extra="algorithm.use_kl_in_reward=True",
    ),
    Row(
        "algorithm.kl_ctrl.kl_coef",
        "0.002",
        {"algorithm.kl_penalty_fn_args.kl_coef": 0.002},
        0.001,
        extra="algorithm.use_kl_in_reward=True",
    ),
    Row(
        "algorithm.kl_ctrl.target_kl",
        "0.2",
        {"algorithm.kl_penalty_fn_args.target_kl": 0.2},
        0.1,
        extra="algorithm.use_kl_in_reward=True algorithm.kl_ctrl.type=adaptive",
    ),
    Row(
        "algorithm.kl_ctrl.horizon",
        "500",
        {"algorithm.kl_penalty_fn_args.horizon": 500},
        10000,
        extra="algorithm.use_kl_in_reward=True algorithm.kl_ctrl.type=adaptive",
    ),
    Row(A + "use_kl_loss", "True", {"algorithm.kl_loss_fn": "low_var_kl"}, False),
    Row(A + "kl_loss_type", "k3", {"algorithm.kl_loss_fn": "k3"}, "low_var_kl", extra=A + "use_kl_loss=True"),
    Row(
        A + "kl_loss_coef",
        "0.01",
        {"algorithm.kl_loss_fn_args.kl_coef": 0.01},
        0.001,
        extra=A + "use_kl_loss=True",
    ),
    Row(
        A + "ppo_mini_batch_size",
        "16",
        {TC + "actor_rollout_ref.actor.ppo_mini_batch_size": 16},
        256,
        extra=D + "train_batch_size=64",
    ),
    Row(
        "critic.ppo_mini_batch_size",
        "16",
        {TC + "actor_rollout_ref.actor.ppo_mini_batch_size": 16},
        why="veRL's follows the actor's",
        extra=D + "train_batch_size=64 " + A + "ppo_mini_batch_size=16",
    ),
    Row("actor_rollout_ref.model.lora_rank", "8", {"model.lora_configs.0.lora_rank": 8}, 0),
    *(
        Row(
            f"actor_rollout_ref.model.{k}",
            text,
            {f"model.lora_configs.0.{k}": value},
            default,
            extra="actor_rollout_ref.model.lora_rank=8",
        )
        for k, text, value, default in (
            ("lora_alpha", "32", 32, 16),
            ("target_modules", "[q_proj,v_proj]", ["q_proj", "v_proj"], "all-linear"),
            ("exclude_modules", "[lm_head]", ["lm_head"], None),
        )
    ),
    # rules_run
    Row(
        D + "train_files",
        "/d/gsm8k/train.parquet",
        {"buffer.explorer_input.tasksets.0.path": "/d/gsm8k/train.parquet"},
        why="a path",
    ),
    Row(
        D + "val_files",
        "/d/gsm8k/test.parquet",
        {"buffer.explorer_input.eval_tasksets.0.path": "/d/gsm8k/test.parquet"},
        why="a path",
    ),
    Row(
        D + "prompt_key",
        "question",
        {"buffer.explorer_input.tasksets.0.format.prompt_key": "question"},
        "prompt",
        extra=TRAIN,
    ),
    Row(
        D + "shuffle",
        "False",
        {"buffer.explorer_input.tasksets.0.data_selector.selector_type": "sequential"},
        True,
        extra=TRAIN,
    ),
    Row(
        D + "seed",
        "7",
        {"buffer.explorer_input.tasksets.0.data_selector.seed": 7},
        why="not a key of ppo_trainer.yaml",
        extra=TRAIN,
    ),
    Row(
        R + "val_kwargs.do_sample",
        "True",
        {"buffer.explorer_input.eval_tasksets.0.rollout_args.temperature": 0.6},
        False,
        extra=f"{VAL} {R}val_kwargs.temperature=0.6",
    ),
    Row(
        R + "val_kwargs.temperature",
        "0.6",
        {"buffer.explorer_input.eval_tasksets.0.rollout_args.temperature": 0.6},
        0,
        extra=f"{VAL} {R}val_kwargs.do_sample=True",
    ),
    Row(
        R + "val_kwargs.top_p",
        "0.9",
        {"buffer.explorer_input.eval_tasksets.0.rollout_args.top_p": 0.9},
        1.0,
        extra=VAL,
    ),
    Row(
        R + "val_kwargs.top_k",
        "20",
        {"buffer.explorer_input.eval_tasksets.0.rollout_args.top_k": 20},
        -1,
        extra=VAL,
    ),
    Row(R + "val_kwargs.n", "4", {"buffer.explorer_input.eval_tasksets.0.repeat_times": 4}, 1, extra=VAL),
    Row(D + "filter_overlong_prompts", "True", {"model.enable_prompt_truncation": False}, False),
    Row(D + "truncation", "left", {"model.enable_prompt_truncation": True}, "error"),
    Row(
        R + "name",
        "hf",
        {"explorer.rollout_model.engine_type": "hf"},
        why="veRL requires it (`???`); left out, the conversion assumes vllm",
    ),
    Row(
        "reward_model.enable",
        "True",
        {"explorer.auxiliary_models.0.model_path": "/rm"},
        False,
        extra="reward_model.model.path=/rm " + T + "n_gpus_per_node=8",
    ),
    Row(
        "reward_model.model.path",
        "/rm",
        {"explorer.auxiliary_models.0.model_path": "/rm"},
        why="a path",
        extra="reward_model.enable=True " + T + "n_gpus_per_node=8",
    ),
    Row(
        T + "logger",
        "[console,tensorboard]",
        {"monitor.monitor_type": "tensorboard"},
        ["console", "wandb"],
        why="veRL logs to wandb by default; left out, a run here logs to the console and JSON lines only, "
        "so it needs no wandb account",
    ),
    Row(T + "test_freq", "5", {"explorer.eval_interval": 5}, -1, extra=VAL),
    Row(T + "save_freq", "10", {"trainer.save_interval": 10}, -1),
    Row(
        T + "default_local_dir",
        "/ck/p/e",
        {"checkpoint_root_dir": "/ck"},
        why="veRL's is checkpoints/${trainer.project_name}/${trainer.experiment_name}, as here",
        extra=T + "project_name=p " + T + "experiment_name=e",
    ),
    Row(T + "resume_mode", "disable", {"continue_from_checkpoint": False}, "auto"),
]
BY_KEY = {row.key: row for row in ROWS}


def _load(args: str) -> tuple[RFTConfig, list[str]]:
    [c] = convert_script(f"python3 -m verl.trainer.main_ppo {args}\n", "run.sh")
    return load_config(text=c.yaml, environ=ENV), c.warnings


def _at(node: Any, path: str) -> Any:
    for part in path.split("."):
        if isinstance(node, dict):
            node = node[part]
        elif isinstance(node, list | tuple):
            node = node[int(part)]
        else:
            node = getattr(node, part)
    return node


def _hydra(value: Any) -> str:
    if isinstance(value, bool):
        return str(value)
    if value is None:
        return "null"
    if isinstance(value, list):
        return "[" + ",".join(_hydra(v) for v in value) + "]"
    return str(value)


def meaning(config: RFTConfig) -> dict[str, Any]:
    """The run as the services read it: the trainer's settings (with the resolved preset, every
    function's args with their defaults filled in), the explorer's sampling per eval taskset, and the rest
    of the config without the slots those two resolve (algorithm args, trainer_config, rollout_args)."""
    settings = TrainerSettings.from_config(config)
    preset = settings.preset
    loss = get_policy_loss_fn(preset.policy_loss_fn)
    params = getattr(loss, "config_cls", None)
    loss_args = dataclasses.asdict(params.from_dict(preset.policy_loss_fn_args)) if params else {}
    if "clip_ratio" in loss_args:  # an unset low/high bound is clip_ratio, as in veRL
        for bound in ("clip_ratio_low", "clip_ratio_high"):
            loss_args[bound] = loss_args[bound] if loss_args[bound] is not None else loss_args["clip_ratio"]
    adv_args = {}
    if preset.advantage_fn:
        signature = inspect.signature(get_advantage_fn(preset.advantage_fn))
        adv_args = {n: p.default for n, p in signature.parameters.items() if p.default is not p.empty}
        adv_args |= dict(preset.advantage_fn_args)
    dump = config.model_dump()
    dump["algorithm"] = {
        k: v for k, v in dump["algorithm"].items() if not (k.endswith("_args") or k.endswith("_fn"))
    }
    for key in ("loss_agg_mode", "reward_manager"):
        dump["algorithm"].pop(key)
    dump["trainer"].pop("trainer_config")
    for t in dump["buffer"]["explorer_input"]["eval_tasksets"]:
        t.pop("rollout_args")
    r = resolve(config)
    bare = dataclasses.replace(preset, policy_loss_fn_args={}, advantage_fn_args={}, kl_penalty_fn_args={})
    return {
        "config": dump,
        "trainer": dataclasses.replace(settings, preset=bare),
        "policy_loss_args": loss_args,
        "advantage_args": adv_args,
        "kl_controller": make_kl_controller(preset.kl_penalty_fn_args),
        "eval_sampling": [r.sampling_params(t) for t in config.buffer.explorer_input.eval_tasksets],
    }


def test_every_mapped_key_has_a_row():
    mapped = set(DIRECT) | set(TRAINING_KEYS) | set(RUN_KEYS) | set(TRAINER_CONFIG_KEYS)
    assert sorted(mapped - set(BY_KEY)) == [], "a mapped key without a row"
    assert sorted(set(BY_KEY) - mapped) == [], "a row for a key nothing maps"
    assert len(BY_KEY) == len(ROWS), "one row per key"
    assert set(VERL_DEFAULTS) <= set(BY_KEY)


def test_rules_read_only_their_declared_keys():
    draft = Draft([])
    for rule in TRAINING_RULES + RUN_RULES:
        rule(draft)
    assert sorted(draft.used - set(TRAINING_KEYS) - set(RUN_KEYS)) == []


@pytest.mark.parametrize("row", ROWS, ids=lambda r: r.key)
def test_key_lands_where_the_row_says(row):
    config, warnings = _load(f"{row.key}={row.text} {row.extra}")
    for path, value in row.expect.items():
        got = _at(config, path)
        assert (list(got) if isinstance(got, tuple) and isinstance(value, list) else got) == value, path
    assert not [w for w in warnings if w.startswith(f"veRL {row.key}=")], "the key converts without a warning"


@pytest.mark.parametrize(
    "row", [r for r in ROWS if r.default is not MISSING and not r.why], ids=lambda r: r.key
)
def test_a_silent_script_means_veRL_default(row):
    silent, _ = _load(row.extra)
    explicit, _ = _load(f"{row.key}={_hydra(row.default)} {row.extra}")
    assert meaning(silent) == meaning(explicit)


@pytest.mark.parametrize("row", [r for r in ROWS if r.default is not MISSING and r.why], ids=lambda r: r.key)
def test_known_default_differences_are_real(row):
    """Each listed difference still exists (when one is fixed, its `why` goes)."""
    silent, _ = _load(row.extra)
    explicit, _ = _load(f"{row.key}={_hydra(row.default)} {row.extra}")
    assert meaning(silent) != meaning(explicit), row.why
