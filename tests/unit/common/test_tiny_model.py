"""Tiny model: a real HF folder that saves, loads with AutoModelForCausalLM, keeps its tokenizer, generates."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

from launcher.tiny_model import make_tiny_model
from services.common.modeling import ModelLoadError, load_model, load_tokenizer


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return make_tiny_model(tmp_path_factory.mktemp("tiny") / "model", size="tiny", seed=0)


def test_loads_with_auto_model_and_weights_equal(tiny_dir):
    model = AutoModelForCausalLM.from_pretrained(tiny_dir)
    again = load_model(tiny_dir)
    assert model.config.model_type == "qwen2"
    n_params = sum(p.numel() for p in model.parameters())
    assert 0.5e6 < n_params < 2e6
    for (k, a), (_, b) in zip(model.state_dict().items(), again.state_dict().items(), strict=True):
        assert torch.equal(a, b), k


def test_saved_tokenizer_is_the_one_loaded(tiny_dir):
    tok = load_tokenizer(tiny_dir)
    assert type(tok).__name__ == "TokenizersBackend"
    model = load_model(tiny_dir)
    assert len(tok) == model.config.vocab_size
    ids = tok("123+456=579")["input_ids"]
    assert tok.decode(ids) == "123+456=579"
    assert len(ids) < len("123+456=579")  # BPE merges learned on arithmetic
    assert tok.pad_token == "<pad>" and tok.eos_token == "<eos>" and tok.padding_side == "left"


def test_generates_left_padded_batch(tiny_dir):
    tok = load_tokenizer(tiny_dir)
    model = load_model(tiny_dir)
    batch = tok(["1+1=", "123+456="], return_tensors="pt", padding=True)
    torch.manual_seed(0)
    out = model.generate(**batch, max_new_tokens=6, min_new_tokens=6, do_sample=True)
    assert out.shape == (2, batch["input_ids"].shape[1] + 6)
    assert int(out.max()) < model.config.vocab_size


def test_same_seed_same_weights(tmp_path, tiny_dir):
    other = make_tiny_model(tmp_path / "again", seed=0)
    a, b = load_model(tiny_dir).state_dict(), load_model(other).state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_missing_folder_is_never_downloaded(tmp_path):
    with pytest.raises(ModelLoadError, match="never downloaded"):
        load_model(tmp_path / "Qwen" / "Qwen2-0.5B")
