"""Algorithm presets: what ``algorithm.algorithm_type`` means in terms of registered functions.

As in Trinity-RFT, a preset fills every ``*_fn`` and ``*_args`` the config leaves open (``None``
or absent); anything the config sets wins.  Names are checked against the registries and args
against each function's parameters, so a typo fails at config load with a suggestion.

Rule for args: ``*_args`` from the config are merged over the preset's.  When the config names a
different advantage or policy-loss function, the preset's args for it are dropped first (they
belong to the other function).  KL and entropy args are coefficients (``kl_coef`` 0.001,
``entropy_coef`` 0.0) and always kept.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from .advantages_dispatch import check_advantage_args
from .aggregation import check_loss_agg_mode
from .kl import make_kl_controller
from .params import unknown_key_error
from .registries import REWARD_MANAGERS, get_advantage_fn, get_kl_fn, get_policy_loss_fn
from .reward_managers import OverlongBufferConfig

__all__ = ["PRESETS", "AlgorithmPreset", "resolve_preset"]

ENTROPY_LOSS_FNS = ("default", "none")
PAIRWISE_AGG_MODES = ("seq-mean-token-mean", "seq-mean-token-sum")


def _frozen(mapping: Mapping[str, Any] | None = None) -> Mapping[str, Any]:
    return MappingProxyType(dict(mapping or {}))


@dataclasses.dataclass(frozen=True)
class AlgorithmPreset:
    """The resolved algorithm: function names, their args, and what the run needs.

    ``advantage_fn`` is ``None`` for algorithms without advantages (sft, dpo).
    ``kl_*_args`` hold ``kl_coef``; ``entropy_loss_fn_args`` holds ``entropy_coef``.
    """

    algorithm_type: str
    repeat_times: int = 1
    advantage_fn: str | None = "grpo"
    advantage_fn_args: Mapping[str, Any] = dataclasses.field(default_factory=_frozen)
    policy_loss_fn: str = "ppo"
    policy_loss_fn_args: Mapping[str, Any] = dataclasses.field(default_factory=_frozen)
    kl_penalty_fn: str = "none"
    kl_penalty_fn_args: Mapping[str, Any] = dataclasses.field(
        default_factory=lambda: _frozen({"kl_coef": 0.001})
    )
    kl_loss_fn: str = "k2"
    kl_loss_fn_args: Mapping[str, Any] = dataclasses.field(
        default_factory=lambda: _frozen({"kl_coef": 0.001})
    )
    entropy_loss_fn: str = "default"
    entropy_loss_fn_args: Mapping[str, Any] = dataclasses.field(
        default_factory=lambda: _frozen({"entropy_coef": 0.0})
    )
    loss_agg_mode: str = "token-mean"
    reward_manager: str = "naive"
    reward_manager_args: Mapping[str, Any] = dataclasses.field(default_factory=_frozen)
    use_critic: bool = False
    use_reference: bool = True

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            if f.name.endswith("_args"):
                object.__setattr__(self, f.name, _frozen(getattr(self, f.name)))
        self.validate()

    def validate(self) -> None:
        """Check every name against its registry and every ``*_args`` against its function."""
        if self.advantage_fn is not None:
            get_advantage_fn(self.advantage_fn)
            check_advantage_args(self.advantage_fn, self.advantage_fn_args)
        config_cls = getattr(get_policy_loss_fn(self.policy_loss_fn), "config_cls", None)
        if config_cls is not None:  # a plug-in without a params class gets its args unchecked
            config_cls.from_dict(self.policy_loss_fn_args)
        get_kl_fn(self.kl_penalty_fn)
        make_kl_controller(self.kl_penalty_fn_args)  # checks kl_ctrl, target_kl, horizon
        if self.kl_penalty_fn_args.get("kl_ctrl", "fixed") != "fixed" and not self.use_kl_in_reward:
            raise ValueError(
                "kl_penalty_fn_args.kl_ctrl is set but kl_penalty_fn is 'none': the controller adapts "
                "the reward KL penalty; set kl_penalty_fn (e.g. 'kl') or drop kl_ctrl"
            )
        get_kl_fn(self.kl_loss_fn)
        _check_keys(f"args of KL fn {self.kl_loss_fn!r}", self.kl_loss_fn_args, ["kl_coef"])
        if self.entropy_loss_fn not in ENTROPY_LOSS_FNS:
            raise ValueError(
                f"entropy_loss_fn must be one of {ENTROPY_LOSS_FNS}, got {self.entropy_loss_fn!r}"
            )
        _check_keys("entropy_loss_fn_args", self.entropy_loss_fn_args, ["entropy_coef"])
        check_loss_agg_mode(self.loss_agg_mode)
        if self.pairwise and self.loss_agg_mode not in PAIRWISE_AGG_MODES:
            raise ValueError(
                f"policy_loss_fn {self.policy_loss_fn!r} averages over pairs, so micro-batches must be "
                f"weighted by sequences: loss_agg_mode must be one of {PAIRWISE_AGG_MODES}, "
                f"got {self.loss_agg_mode!r}"
            )
        REWARD_MANAGERS.get(self.reward_manager)
        allowed = ["num_examine", "compute_score", "scorer_args"]
        if self.reward_manager == "dapo":
            allowed += ["max_resp_len", "overlong_buffer"]
            OverlongBufferConfig.coerce(self.reward_manager_args.get("overlong_buffer"))
        _check_keys(f"reward_manager_args of {self.reward_manager!r}", self.reward_manager_args, allowed)
        if self.repeat_times < 1:
            raise ValueError(f"repeat_times must be >= 1, got {self.repeat_times}")

    @property
    def reads_reference(self) -> bool:
        """Whether the policy loss reads the reference log-probs (DPO): a reference model is needed."""
        return bool(getattr(get_policy_loss_fn(self.policy_loss_fn), "reads_reference", False))

    @property
    def pairwise(self) -> bool:
        """Whether the policy loss reads adjacent (chosen, rejected) row pairs (DPO)."""
        return bool(getattr(get_policy_loss_fn(self.policy_loss_fn), "pairwise", False))

    @property
    def use_kl_in_reward(self) -> bool:
        """Whether rewards are shaped with a KL penalty."""
        return self.kl_penalty_fn != "none"

    @property
    def use_kl_loss(self) -> bool:
        """Whether the actor adds a KL loss term."""
        return self.kl_loss_fn != "none"


def _check_keys(owner: str, args: Mapping[str, Any], allowed: list[str]) -> None:
    for key in args:
        if key not in allowed:
            raise unknown_key_error(owner, key, allowed)


_NO_KL = {"kl_loss_fn": "none"}
PRESETS: Mapping[str, Mapping[str, Any]] = MappingProxyType(
    {
        "ppo": {"advantage_fn": "gae", "advantage_fn_args": {"gamma": 1.0, "lam": 1.0}, "use_critic": True},
        "grpo": {"repeat_times": 2, "advantage_fn": "grpo"},
        "rloo": {"repeat_times": 2, "advantage_fn": "rloo"},
        "reinforceplusplus": {
            "repeat_times": 2,
            "advantage_fn": "reinforce_plus_plus",
            "advantage_fn_args": {"gamma": 1.0},
        },
        "remax": {"advantage_fn": "remax"},
        "opo": {"repeat_times": 2, "advantage_fn": "opo"},
        "gpg": {"repeat_times": 2, "advantage_fn": "gpg", "policy_loss_fn": "gpg", **_NO_KL},
        "gspo": {"repeat_times": 2, "policy_loss_fn": "gspo", "loss_agg_mode": "seq-mean-token-mean"},
        "cispo": {"repeat_times": 2, "policy_loss_fn": "cispo"},
        "sapo": {"repeat_times": 2, "policy_loss_fn": "sapo", "loss_agg_mode": "seq-mean-token-mean"},
        "dapo": {
            "repeat_times": 16,
            "policy_loss_fn_args": {"clip_ratio_low": 0.2, "clip_ratio_high": 0.28},
            "loss_agg_mode": "token-mean",
            "use_reference": False,
            "reward_manager": "dapo",
            "reward_manager_args": {"overlong_buffer": {"enable": True, "len": 4096, "penalty_factor": 1.0}},
            **_NO_KL,
        },
        "sft": {
            "advantage_fn": None,
            "policy_loss_fn": "sft",
            "use_reference": False,
            "entropy_loss_fn": "none",
            **_NO_KL,
        },
        "dpo": {  # one experience holds a (chosen, rejected) pair; loss is a mean over pairs
            "repeat_times": 1,
            "advantage_fn": None,
            "policy_loss_fn": "dpo",
            "policy_loss_fn_args": {"beta": 0.1, "label_smoothing": 0.0},
            "loss_agg_mode": "seq-mean-token-mean",
        },
    }
)
# fields whose args belong to the function (coefficient args such as kl_coef do not)
_FN_FIELDS = ("advantage_fn", "policy_loss_fn")
_COEF_FIELDS = ("kl_penalty_fn_args", "kl_loss_fn_args", "entropy_loss_fn_args")


def resolve_preset(algorithm_type: str, overrides: Mapping[str, Any] | None = None) -> AlgorithmPreset:
    """The preset of ``algorithm_type`` with the config's ``overrides`` applied.

    ``overrides`` keys are ``AlgorithmPreset`` fields (``advantage_fn``, ``policy_loss_fn_args``,
    ``loss_agg_mode``, …); ``None`` values mean "use the preset".  Unknown keys, names and args
    raise ``ValueError``/``KeyError`` with a close match.
    """
    if algorithm_type not in PRESETS:
        raise unknown_key_error("algorithm", algorithm_type, sorted(PRESETS), what="algorithm_type")
    values: dict[str, Any] = {"algorithm_type": algorithm_type, **PRESETS[algorithm_type]}
    given = {k: v for k, v in (overrides or {}).items() if v is not None}
    allowed = [f.name for f in dataclasses.fields(AlgorithmPreset) if f.name != "algorithm_type"]
    for key in given:
        if key not in allowed:
            raise unknown_key_error("algorithm", key, allowed)
    defaults = {
        f.name: f.default_factory() if callable(f.default_factory) else f.default
        for f in dataclasses.fields(AlgorithmPreset)
    }
    for fn_field in _FN_FIELDS:
        args_field = f"{fn_field}_args"
        preset_fn = values.get(fn_field, defaults[fn_field])
        new_fn = given.get(fn_field, preset_fn)
        if new_fn != preset_fn and not _same_fn(fn_field, new_fn, preset_fn):
            values[args_field] = {}
        if args_field in given:
            values[args_field] = {**values.get(args_field, defaults[args_field]), **given.pop(args_field)}
    for args_field in _COEF_FIELDS:
        if args_field in given:
            values[args_field] = {**values.get(args_field, defaults[args_field]), **given.pop(args_field)}
    if "reward_manager" in given and given["reward_manager"] != values.get("reward_manager", "naive"):
        values["reward_manager_args"] = {}
    if "reward_manager_args" in given:  # merged a level deeper: {overlong_buffer: {len: 512}} keeps enable
        values["reward_manager_args"] = _merge(
            values.get("reward_manager_args", {}), given.pop("reward_manager_args")
        )
    values |= given
    return AlgorithmPreset(**values)


def _merge(base: Mapping[str, Any], update: Mapping[str, Any]) -> dict[str, Any]:
    """`update` over `base`, merging nested mappings instead of replacing them."""
    out = dict(base)
    for key, value in update.items():
        both = isinstance(value, Mapping) and isinstance(out.get(key), Mapping)
        out[key] = _merge(out[key], value) if both else value
    return out


def _same_fn(fn_field: str, a: str | None, b: str | None) -> bool:
    """Whether two names denote the same registered function (``ppo`` and ``vanilla``)."""
    if a is None or b is None:
        return a is b
    lookup = get_policy_loss_fn if fn_field == "policy_loss_fn" else get_advantage_fn
    return lookup(a) is lookup(b)
