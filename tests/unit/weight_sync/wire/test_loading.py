"""load_weights on the tiny Qwen2: bit-equal parameters, ties kept, dtype cast, named errors."""

from __future__ import annotations

import pytest
import torch

from launcher.tiny_model import make_tiny_model
from services.common.modeling import load_model
from services.weight_sync import WeightLoadError, load_weights


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return make_tiny_model(tmp_path_factory.mktemp("tiny"))


def _perturbed(model: torch.nn.Module, seed: int) -> dict[str, torch.Tensor]:
    """New values for every state-dict name; the tied pair gets one value under both names."""
    g = torch.Generator().manual_seed(seed)
    out = {n: t + torch.randn(t.shape, generator=g).to(t.dtype) for n, t in model.state_dict().items()}
    out["lm_head.weight"] = out["model.embed_tokens.weight"]
    return out


def _tied(model) -> bool:
    return model.lm_head.weight is model.model.embed_tokens.weight


def test_loads_bit_equal_and_keeps_the_tie_with_both_names(model_dir):
    model = load_model(model_dir, dtype="float32")
    assert _tied(model)
    params_before = {n: p for n, p in model.named_parameters()}
    new = _perturbed(model, 0)
    loaded = load_weights(model, new)
    assert loaded == list(new)
    for name, t in model.state_dict().items():
        assert torch.equal(t, new[name]), name
    assert _tied(model)
    assert all(p is params_before[n] for n, p in model.named_parameters())  # in place


@pytest.mark.parametrize("drop", ["lm_head.weight", "model.embed_tokens.weight"])
def test_one_name_of_a_tied_pair_is_enough(model_dir, drop):
    model = load_model(model_dir, dtype="float32")
    new = _perturbed(model, 1)
    keep = "model.embed_tokens.weight" if drop == "lm_head.weight" else "lm_head.weight"
    del new[drop]
    load_weights(model, iter(new.items()))  # a stream works too
    assert _tied(model) and torch.equal(model.lm_head.weight, new[keep])


def test_values_are_cast_to_the_model_dtype(model_dir):
    model = load_model(model_dir, dtype="bfloat16")
    new = {n: t.float() for n, t in _perturbed(model, 2).items()}
    load_weights(model, new)
    for name, t in model.state_dict().items():
        assert t.dtype == torch.bfloat16 and torch.equal(t, new[name].to(torch.bfloat16))


def test_unknown_missing_and_misshaped_tensors_are_named(model_dir):
    model = load_model(model_dir, dtype="float32")
    sd = model.state_dict()
    with pytest.raises(WeightLoadError, match="unknown tensor 'model.bogus'"):
        load_weights(model, {"model.bogus": torch.zeros(1)})
    partial = {k: v for k, v in sd.items() if k != "model.norm.weight"}
    with pytest.raises(WeightLoadError, match="missing .*model.norm.weight"):
        load_weights(model, partial)
    assert load_weights(model, partial, strict=False)
    with pytest.raises(WeightLoadError, match="model.norm.weight.*shape"):
        load_weights(model, {"model.norm.weight": torch.zeros(3)}, strict=False)
