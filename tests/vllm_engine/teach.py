"""Teach the tiny model fixed continuations (tens of Adam steps of next-token loss on CPU), so the real
engine then samples what a test needs: a tool call, right answers. What `rft run`'s SFT stage does for
the tool-use example, in-process and on a handful of short sequences.

`teach(model_dir, out_dir, examples)` trains a copy of the model on (context ids, target ids) pairs,
all in one right-padded batch, until every target token is the most likely one with probability >=
`min_prob` (so greedy decoding reproduces it on any engine), and saves it as an HF folder
(safetensors) that `read_safetensors_folder` and `find_checkpoints` read.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch

Example = tuple[Sequence[int], Sequence[int]]  # (context ids, the ids that must follow)


def _batch(examples: Sequence[Example]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(ids, attention mask, labels: -100 except where a target token is predicted), right-padded."""
    length = max(len(c) + len(t) for c, t in examples)
    ids = torch.zeros(len(examples), length, dtype=torch.long)
    mask = torch.zeros(len(examples), length, dtype=torch.long)
    labels = torch.full((len(examples), length), -100)
    for i, (context, target) in enumerate(examples):
        seq = [*context, *target]
        ids[i, : len(seq)] = torch.tensor(seq)
        mask[i, : len(seq)] = 1
        labels[i, len(context) : len(seq)] = torch.tensor(list(target))
    return ids, mask, labels


def teach(
    model_dir: Path,
    out_dir: Path,
    examples: Sequence[Example],
    *,
    min_prob: float = 0.8,
    max_steps: int = 300,
    lr: float = 3e-3,
) -> Path:
    """A copy of `model_dir` trained to continue each context with its target; saved to `out_dir`."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    ids, mask, labels = _batch(examples)
    targets = labels[:, 1:]
    scored = targets != -100
    worst = 0.0
    for _ in range(max_steps):
        logits = model(ids, attention_mask=mask).logits[:, :-1][scored]
        logp = torch.log_softmax(logits, dim=-1).gather(1, targets[scored][:, None])[:, 0]
        worst = float(logp.detach().min().exp())
        if worst >= min_prob and bool((logits.argmax(-1) == targets[scored]).all()):
            break
        optimizer.zero_grad()
        (-logp.mean()).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
    else:
        raise AssertionError(
            f"the tiny model did not learn its targets in {max_steps} steps (worst p {worst:.3f})"
        )
    model.save_pretrained(str(out_dir), safe_serialization=True)
    return out_dir
