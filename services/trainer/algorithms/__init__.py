"""RFT Mesh algorithms: pure tensor functions for RL fine-tuning, registered by name.

Advantage estimators, policy losses, KL estimators, entropy, value loss, reward scorers and
managers, batch metrics and algorithm presets.  Names and signatures follow veRL's
``core_algos`` so code and configs carry over; presets follow Trinity-RFT's ``algorithm_type``.
Everything here is torch + stdlib (+ math-verify for the math scorer); no service imports.
Formulas, defaults and papers: ``docs/algorithms.md``.
"""

from services.common.registry import Registry, UnknownNameError
from services.common.rewards import (
    countdown_score,
    default_compute_score,
    format_score,
    gsm8k_score,
    math_score,
    scorer_for_data_source,
)

from .advantages_dispatch import compute_advantage
from .advantages_group import (
    compute_gpg_outcome_advantage,
    compute_grpo_outcome_advantage,
    compute_opo_outcome_advantage,
    compute_rloo_outcome_advantage,
)
from .advantages_return import (
    compute_gae_advantage_return,
    compute_reinforce_plus_plus_outcome_advantage,
    compute_remax_outcome_advantage,
)
from .aggregation import LOSS_AGG_MODES, agg_loss
from .batch import TrainBatch
from .entropy import (
    compute_entropy_from_logits,
    entropy_from_logits_chunked,
    logprobs_and_entropy,
    logprobs_from_logits,
)
from .kl import (
    KL_CONTROLLERS,
    AdaptiveKLController,
    FixedKLController,
    KLController,
    apply_kl_penalty,
    compute_kl_loss,
    kl_penalty,
    kl_penalty_forward,
    make_kl_controller,
)
from .masked import masked_mean, masked_sum, masked_var, masked_whiten
from .metrics import compute_data_metrics, rollout_probs_diff
from .params import FrozenParams
from .policy_loss_offline import DPOConfig, SFTConfig, compute_dpo_loss, compute_sft_loss
from .policy_loss_ppo import PPOClipConfig, compute_policy_loss, compute_policy_loss_vanilla
from .policy_loss_variants import (
    CISPOConfig,
    GPGConfig,
    GSPOConfig,
    SAPOConfig,
    compute_policy_loss_cispo,
    compute_policy_loss_gpg,
    compute_policy_loss_gspo,
    compute_policy_loss_sapo,
)
from .presets import PRESETS, AlgorithmPreset, resolve_preset
from .registries import (
    ADVANTAGE_FNS,
    KL_FNS,
    POLICY_LOSS_FNS,
    REWARD_MANAGERS,
    REWARD_SCORERS,
    get_advantage_fn,
    get_kl_fn,
    get_policy_loss_fn,
    get_reward_manager_cls,
    get_scorer,
)
from .reward_managers import (
    DAPORewardManager,
    NaiveRewardManager,
    OverlongBufferConfig,
    RewardResult,
    make_compute_score,
)
from .rollout_correction import (
    ROLLOUT_IS_LEVELS,
    ROLLOUT_IS_MODES,
    RolloutISConfig,
    apply_rollout_correction,
    compute_rollout_importance_weights,
)
from .value_loss import compute_value_loss

__all__ = [
    "ADVANTAGE_FNS",
    "KL_CONTROLLERS",
    "KL_FNS",
    "LOSS_AGG_MODES",
    "POLICY_LOSS_FNS",
    "PRESETS",
    "REWARD_MANAGERS",
    "REWARD_SCORERS",
    "ROLLOUT_IS_LEVELS",
    "ROLLOUT_IS_MODES",
    "AdaptiveKLController",
    "AlgorithmPreset",
    "CISPOConfig",
    "DAPORewardManager",
    "DPOConfig",
    "FixedKLController",
    "FrozenParams",
    "GPGConfig",
    "GSPOConfig",
    "KLController",
    "NaiveRewardManager",
    "OverlongBufferConfig",
    "PPOClipConfig",
    "Registry",
    "RewardResult",
    "RolloutISConfig",
    "SAPOConfig",
    "SFTConfig",
    "TrainBatch",
    "UnknownNameError",
    "agg_loss",
    "apply_kl_penalty",
    "apply_rollout_correction",
    "compute_advantage",
    "compute_data_metrics",
    "rollout_probs_diff",
    "compute_dpo_loss",
    "compute_entropy_from_logits",
    "compute_gae_advantage_return",
    "compute_grpo_outcome_advantage",
    "compute_kl_loss",
    "compute_gpg_outcome_advantage",
    "compute_opo_outcome_advantage",
    "compute_policy_loss",
    "compute_policy_loss_cispo",
    "compute_policy_loss_gpg",
    "compute_policy_loss_gspo",
    "compute_policy_loss_sapo",
    "compute_policy_loss_vanilla",
    "compute_reinforce_plus_plus_outcome_advantage",
    "compute_rollout_importance_weights",
    "compute_remax_outcome_advantage",
    "compute_rloo_outcome_advantage",
    "compute_sft_loss",
    "compute_value_loss",
    "countdown_score",
    "default_compute_score",
    "entropy_from_logits_chunked",
    "format_score",
    "get_advantage_fn",
    "get_kl_fn",
    "get_policy_loss_fn",
    "get_reward_manager_cls",
    "get_scorer",
    "gsm8k_score",
    "kl_penalty",
    "kl_penalty_forward",
    "logprobs_and_entropy",
    "logprobs_from_logits",
    "make_compute_score",
    "make_kl_controller",
    "masked_mean",
    "masked_sum",
    "masked_var",
    "masked_whiten",
    "math_score",
    "resolve_preset",
    "scorer_for_data_source",
]
