"""Conversions of a veRL command's training settings that read several keys at once: the algorithm
(with veRL's own critic learning rate for gae), the KL terms, the batch sizes (with veRL's token budget
for dynamic batches) and LoRA. Each rule takes a `Draft`, reads the keys it owns (marking them handled)
and sets RFT Mesh keys with a comment naming their source.

Batch sizes follow veRL's meaning: one veRL step rolls out `data.train_batch_size` prompts x
`rollout.n` with the latest weights and then makes `train_batch_size / ppo_mini_batch_size` optimizer
steps on it. Here that is `buffer.batch_size` = data.train_batch_size, the mini-batch in
`trainer.trainer_config.actor_rollout_ref.actor.ppo_mini_batch_size` (prompts, as veRL counts it), and
`sync_interval: 1, sync_offset: 0` (every explore step uses the weights of the step before). Trinity-RFT's
guide writes the same run as `batch_size` = the mini-batch with `sync_interval` = the number of
mini-batches; both roll out the same prompts per weight version and make the same optimizer steps, but
only this layout computes the old log-probs once per rollout, as veRL does, so PPO's clip acts across
the mini-batches of a step (and save_freq / test_freq keep counting veRL steps).
"""

from __future__ import annotations

from launcher.convert_verl.draft import Draft
from launcher.convert_verl.table import VERL_DEFAULTS

A, D = "actor_rollout_ref.actor.", "data."

# veRL adv_estimator -> (algorithm_type, advantage_fn): the preset of that name where there is one, so
# the rest of the preset comes with it (remax: a greedy rollout per task gives the reward baseline)
ADVANTAGE = {
    "gae": ("ppo", "ppo"),
    "grpo": ("grpo", "grpo"),
    "grpo_vectorized": ("grpo", "grpo"),
    "rloo": ("rloo", "rloo"),
    "rloo_vectorized": ("rloo", "rloo"),
    "reinforce_plus_plus": ("reinforceplusplus", "reinforceplusplus"),
    "remax": ("remax", "remax"),
    "opo": ("opo", "opo"),
}
# veRL key -> (advantage_fn_args key, estimators that take it)
ADVANTAGE_ARGS = {
    "algorithm.gamma": ("gamma", {"gae", "reinforce_plus_plus"}),
    "algorithm.lam": ("lam", {"gae"}),
    "algorithm.norm_adv_by_std_in_grpo": ("norm_adv_by_std_in_grpo", {"grpo", "grpo_vectorized"}),
}
POLICY_LOSSES = {"vanilla": None, "gspo": "gspo", "sapo": "sapo", "cispo": "cispo", "gpg": "gpg"}
KL_TYPES = set(
    ["kl", "k1", "abs", "mse", "k2", "low_var_kl", "k3", "kl+", "k1+", "k3+", "low_var_kl+", "abs+", "mse+"]
)
KL_CTRL = {"type": "kl_ctrl", "kl_coef": "kl_coef", "target_kl": "target_kl", "horizon": "horizon"}


def algorithm(d: Draft) -> None:
    key = "algorithm.adv_estimator"
    adv = d.get(key, "gae")
    if adv in ADVANTAGE:
        atype, fn = ADVANTAGE[adv]
        d.set("algorithm.algorithm_type", atype, d.source_or_default(key, adv), (key,))
        d.set("algorithm.advantage_fn", fn, d.source_or_default(key, adv), (key,))
    else:
        d.drop(key, f"advantage estimators here: {', '.join(ADVANTAGE)}")
    lr_key = "critic.optim.lr"
    if adv == "gae" and not d.has(lr_key):  # the critic here takes the actor's lr unless told
        lr = VERL_DEFAULTS[lr_key]
        d.set(f"trainer.trainer_config.{lr_key}", lr, d.source_or_default(lr_key, lr), (lr_key,))
    for vkey, (arg, takers) in ADVANTAGE_ARGS.items():
        if d.has(vkey):
            if adv in takers:
                d.set(f"algorithm.advantage_fn_args.{arg}", d.get(vkey), keys=(vkey,))
            else:
                d.drop(vkey, f"adv_estimator={adv} does not use it")
    mode_key = A + "policy_loss.loss_mode"
    mode = d.get(mode_key, "vanilla")
    if mode not in POLICY_LOSSES:
        d.drop(mode_key, f"policy losses here: {', '.join(POLICY_LOSSES)}")
    elif POLICY_LOSSES[mode]:
        d.set("algorithm.policy_loss_fn", POLICY_LOSSES[mode], keys=(mode_key,))


def kl(d: Draft) -> None:
    """KL in the reward (algorithm.use_kl_in_reward) and as a loss (actor.use_kl_loss); both off in veRL
    by default, while presets here may add a KL loss, so both are always written."""
    in_reward = bool(d.get("algorithm.use_kl_in_reward", False))
    fn = d.get("algorithm.kl_penalty", "kl") if in_reward else "none"
    d.set(
        "algorithm.kl_penalty_fn",
        fn,
        d.source_or_default("algorithm.use_kl_in_reward", False),
        ("algorithm.use_kl_in_reward",) + (("algorithm.kl_penalty",) if in_reward else ()),
    )
    for name, arg in KL_CTRL.items():
        vkey = f"algorithm.kl_ctrl.{name}"
        if d.has(vkey):
            d.set(f"algorithm.kl_penalty_fn_args.{arg}", d.get(vkey), keys=(vkey,))
    if not in_reward and d.has("algorithm.kl_penalty"):
        d.drop("algorithm.kl_penalty", "use_kl_in_reward is False", warn=False, same=True)
    use_loss = bool(d.get(A + "use_kl_loss", False))
    loss_type = d.get(A + "kl_loss_type", "low_var_kl") if use_loss else "none"
    if loss_type != "none" and loss_type not in KL_TYPES:
        d.drop(A + "kl_loss_type", f"KL estimators here: {', '.join(sorted(KL_TYPES))}")
        loss_type = "low_var_kl"
    keys = (A + "use_kl_loss",) + ((A + "kl_loss_type",) if use_loss else ())
    d.set("algorithm.kl_loss_fn", loss_type, d.source_or_default(A + "use_kl_loss", False), keys)
    if d.has(A + "kl_loss_coef"):
        d.set("algorithm.kl_loss_fn_args.kl_coef", d.get(A + "kl_loss_coef"), keys=(A + "kl_loss_coef",))
    if not use_loss and d.has(A + "kl_loss_type"):
        d.drop(A + "kl_loss_type", "use_kl_loss is False", warn=False, same=True)


def batches(d: Draft) -> None:
    bkey, mkey = D + "train_batch_size", A + "ppo_mini_batch_size"
    batch = int(d.get(bkey, VERL_DEFAULTS[bkey]))
    mini = int(d.get(mkey, VERL_DEFAULTS[mkey]))
    d.set("buffer.batch_size", batch, d.source_or_default(bkey, batch), (bkey,))
    if mini < batch:
        if batch % mini:
            d.warn(f"{bkey}={batch} is not a multiple of {mkey}={mini}; the trainer needs whole mini-batches")
        d.set(
            "trainer.trainer_config.actor_rollout_ref.actor.ppo_mini_batch_size",
            mini,
            f"{d.source_or_default(mkey, mini)}: {batch // mini} optimizer steps per step, as veRL",
            (mkey,),
        )
    else:
        d.comment(
            "buffer.batch_size",
            f"{d.source_or_default(bkey, batch)}; one optimizer step per step ({mkey}={mini})",
        )
    dyn_key, tok_key = A + "use_dynamic_bsz", A + "ppo_max_token_len_per_gpu"
    if d.peek(dyn_key, VERL_DEFAULTS[dyn_key]) and not d.has(tok_key):
        tokens = VERL_DEFAULTS[tok_key]
        d.set("trainer.max_token_len_per_gpu", tokens, d.source_or_default(tok_key, tokens), (tok_key,))
    ckey = "critic.ppo_mini_batch_size"
    if d.has(ckey) and d.get(ckey) != mini:
        d.drop(ckey, "the critic updates on the actor's mini-batches")
    elif d.has(ckey):
        d.drop(ckey, "the critic updates on the actor's mini-batches", warn=False, same=True)
    on_policy = "veRL rolls out every step with the weights of the step before"
    d.set("synchronizer.sync_style", "fixed", on_policy)
    d.set("synchronizer.sync_interval", 1, on_policy)
    d.set("synchronizer.sync_offset", 0, on_policy)


def lora(d: Draft) -> None:
    """veRL trains a LoRA adapter when `model.lora_rank` > 0 (its defaults: alpha 16, all-linear)."""
    m = "actor_rollout_ref.model."
    keys = tuple(m + k for k in ("lora_rank", "lora_alpha", "target_modules", "exclude_modules"))
    rank = int(d.get(keys[0], 0) or 0)
    if rank <= 0:
        for key in keys[1:]:
            if d.has(key):
                d.drop(key, f"{keys[0]} is 0 (no LoRA)", warn=False, same=True)
        return
    entry = {
        "lora_rank": rank,
        "lora_alpha": int(d.get(keys[1], 16)),
        "target_modules": d.get(keys[2], "all-linear"),
    }
    if d.get(keys[3]) is not None:
        entry["exclude_modules"] = d.get(keys[3])
    d.set("model.lora_configs", [entry], d.source(*keys), keys)


TRAINING_RULES = (algorithm, kl, batches, lora)
# the veRL keys these rules convert (tests/unit/launch/test_convert_verl_keys.py has a row for each)
TRAINING_KEYS = (
    "algorithm.adv_estimator",
    *ADVANTAGE_ARGS,
    A + "policy_loss.loss_mode",
    "critic.optim.lr",
    "algorithm.use_kl_in_reward",
    "algorithm.kl_penalty",
    *(f"algorithm.kl_ctrl.{name}" for name in KL_CTRL),
    A + "use_kl_loss",
    A + "kl_loss_type",
    A + "kl_loss_coef",
    D + "train_batch_size",
    A + "ppo_mini_batch_size",
    A + "ppo_max_token_len_per_gpu",
    "critic.ppo_mini_batch_size",
    *(
        f"actor_rollout_ref.model.{k}"
        for k in ("lora_rank", "lora_alpha", "target_modules", "exclude_modules")
    ),
)
