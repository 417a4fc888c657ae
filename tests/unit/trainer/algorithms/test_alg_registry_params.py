"""Registry lookups, aliases, plug-ins and errors; FrozenParams.from_dict strictness."""

from dataclasses import dataclass

import pytest

from services.trainer.algorithms import (
    ADVANTAGE_FNS,
    KL_FNS,
    POLICY_LOSS_FNS,
    PPOClipConfig,
    Registry,
    UnknownNameError,
    compute_gae_advantage_return,
    compute_policy_loss_vanilla,
    get_advantage_fn,
    get_kl_fn,
    get_policy_loss_fn,
)
from services.trainer.algorithms.params import FrozenParams


def test_register_get_and_aliases():
    reg: Registry = Registry("widget")

    @reg.register("alpha", "a")
    def alpha():
        return 1

    assert reg.get("alpha") is alpha and reg.get("a") is alpha
    assert reg.names() == ["alpha"] and reg.names(include_aliases=True) == ["a", "alpha"]
    assert "a" in reg and "b" not in reg and len(reg) == 1
    assert reg.canonical_name("a") == "alpha"


def test_duplicate_name_rejected():
    reg: Registry = Registry("widget")
    reg.add("x", object())
    with pytest.raises(ValueError, match="already registered"):
        reg.add("y", object(), "x")
    with pytest.raises(ValueError, match="':'"):
        reg.add("a:b", object())


def test_unknown_name_lists_known_and_suggests():
    with pytest.raises(UnknownNameError) as info:
        get_advantage_fn("grpoo")
    message = str(info.value)
    assert "unknown advantage estimator 'grpoo'" in message
    assert "did you mean 'grpo'?" in message
    assert "rloo" in message
    assert isinstance(info.value, KeyError)


def test_dotted_path_plugin_is_imported():
    assert get_advantage_fn("services.trainer.algorithms:compute_gae_advantage_return") is (
        compute_gae_advantage_return
    )
    assert get_policy_loss_fn("services.trainer.algorithms.policy_loss_ppo:PPOClipConfig.from_dict")
    with pytest.raises(ImportError, match="no_such_module"):
        get_kl_fn("no_such_module.x:y")
    with pytest.raises(ImportError, match="has no attribute"):
        get_kl_fn("services.trainer.algorithms:nope")


def test_required_names_are_registered():
    for name in ("gae", "ppo", "grpo", "rloo", "reinforce_plus_plus", "remax", "opo"):
        assert name in ADVANTAGE_FNS
    for name in ("vanilla", "ppo", "gspo", "cispo", "sapo", "gpg", "sft", "dpo"):
        assert name in POLICY_LOSS_FNS
    for name in ("kl", "k1", "abs", "mse", "k2", "low_var_kl", "k3", "k1+", "k3+", "none"):
        assert name in KL_FNS
    assert get_advantage_fn("ppo") is get_advantage_fn("gae")
    assert get_policy_loss_fn("ppo") is compute_policy_loss_vanilla


def test_from_dict_rejects_unknown_key_with_suggestion():
    with pytest.raises(ValueError, match=r"unknown key 'clip_ratio_hihg'.*did you mean 'clip_ratio_high'"):
        PPOClipConfig.from_dict({"clip_ratio_hihg": 0.28})


def test_from_dict_accepts_trinity_spelling_and_rejects_duplicates():
    cfg = PPOClipConfig.from_dict({"clip_range_low": 0.1, "clip_ratio_high": 0.3})
    assert (cfg.low, cfg.high, cfg.clip_ratio_c) == (0.1, 0.3, 3.0)
    with pytest.raises(ValueError, match="given twice"):
        PPOClipConfig.from_dict({"clip_range": 0.1, "clip_ratio": 0.3})


def test_params_are_frozen_and_validated():
    cfg = PPOClipConfig()
    with pytest.raises(AttributeError):
        cfg.clip_ratio = 0.3  # type: ignore[misc]
    with pytest.raises(ValueError, match="clip_ratio_c"):
        PPOClipConfig(clip_ratio_c=1.0)
    assert PPOClipConfig.coerce(None) == cfg
    assert PPOClipConfig.coerce({"clip_ratio": 0.3}).low == 0.3
    with pytest.raises(TypeError):
        PPOClipConfig.coerce(0.3)  # type: ignore[arg-type]


def test_empty_params_class_rejects_any_key():
    @dataclass(frozen=True)
    class Nothing(FrozenParams):
        pass

    with pytest.raises(ValueError, match=r"unknown key 'x'; allowed keys: \(none\)"):
        Nothing.from_dict({"x": 1})
