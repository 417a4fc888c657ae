"""`rft make-tiny-model DIR`: a real HF model folder built locally, so every loading path is the real
`from_pretrained` and nothing is downloaded.

A small Qwen2 config with random weights and a byte-level BPE tokenizer trained here with `tokenizers`
on generated arithmetic and text (pad/eos/bos set, left padding, a plain chat template).
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM
from transformers.utils import logging as hf_logging

hf_logging.disable_progress_bar()

SPECIAL_TOKENS = ["<pad>", "<eos>", "<bos>"]
CHAT_TEMPLATE = (
    "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant: {% endif %}"
)
WORDS = [
    "the",
    "answer",
    "is",
    "question",
    "what",
    "sum",
    "of",
    "and",
    "plus",
    "minus",
    "times",
    "number",
    "count",
    "to",
    "reach",
    "using",
    "each",
    "once",
    "compute",
    "result",
    "think",
    "step",
    "first",
    "then",
    "so",
    "total",
    "user",
    "assistant",
    "system",
    "you",
    "are",
    "a",
    "helpful",
    "solve",
]


@dataclass(frozen=True)
class TinySize:
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    vocab_size: int


SIZES = {
    "tiny": TinySize(128, 512, 4, 4, 2, 512),  # ~1.1M parameters
    "small": TinySize(384, 1024, 6, 6, 2, 512),  # ~10M parameters
}


def _corpus(seed: int, lines: int = 4000) -> list[str]:
    rng = random.Random(seed)
    out = []
    for _ in range(lines):
        a, b = rng.randint(0, 999), rng.randint(0, 999)
        op = rng.choice("+-*")
        c = a + b if op == "+" else a - b if op == "-" else a * b
        out.append(f"{a}{op}{b}={c}")
        out.append(" ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 9))) + f" {a} {b}.")
    return out


def build_tokenizer(vocab_size: int, seed: int = 0) -> PreTrainedTokenizerFast:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_corpus(seed), trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>", bos_token="<bos>", padding_side="left"
    )
    fast.chat_template = CHAT_TEMPLATE
    return fast


def make_tiny_model(out_dir: str | Path, size: str = "tiny", seed: int = 0) -> Path:
    """Write config, safetensors weights and tokenizer to `out_dir`; returns the folder."""
    if size not in SIZES:
        raise ValueError(f"size {size!r} is not one of {', '.join(SIZES)}")
    spec = SIZES[size]
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer(spec.vocab_size, seed)
    vocab = len(tokenizer)
    config = Qwen2Config(
        vocab_size=vocab,
        hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_hidden_layers,
        num_attention_heads=spec.num_attention_heads,
        num_key_value_heads=spec.num_key_value_heads,
        max_position_embeddings=512,
        tie_word_embeddings=True,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=tokenizer.bos_token_id,
    )
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(config)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out
