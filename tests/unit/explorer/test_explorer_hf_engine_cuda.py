"""The hf engine on a CUDA device (gpu tier; skipped without CUDA): in float32 its sampled log-probs equal
a teacher-forced forward pass of the same model, seeded generation repeats; in bf16 (the engine's `auto`
dtype on CUDA) it generates finite log-probs within each request's token budget."""

from __future__ import annotations

import pytest
import torch

from services.explorer.engines.hf import HFEngine

from .fakes import sampling

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


def _prompts(engine: HFEngine) -> list[list[int]]:
    return [engine.tokenizer.encode(t) for t in ["1+2=", "the answer is 123+456=", "7", "12*3="]]


def test_cuda_logprobs_equal_teacher_forced_forward(tiny_model_dir):
    engine = HFEngine.from_pretrained(str(tiny_model_dir), device="cuda", dtype="float32", seed=7)
    assert next(engine.model.parameters()).device.type == "cuda"
    prompts = _prompts(engine)
    outs = engine.generate_sync(prompts, sampling(temperature=1.0, max_tokens=12, n=2))
    for prompt, group in zip(prompts, outs, strict=True):
        for o in group:
            assert len(o.token_ids) == len(o.logprobs) > 0
            ids = torch.tensor([prompt + list(o.token_ids)], device="cuda")
            with torch.no_grad():
                logits = engine.model(ids).logits[0, len(prompt) - 1 : -1].double()
            ref = torch.log_softmax(logits, -1).gather(-1, ids[0, len(prompt) :, None]).squeeze(-1)
            torch.testing.assert_close(o.logprobs.cpu().float(), ref.cpu().float(), atol=1e-3, rtol=0)


def test_cuda_seeded_generation_repeats(tiny_model_dir):
    a, b = (HFEngine.from_pretrained(str(tiny_model_dir), device="cuda", seed=11) for _ in range(2))
    assert next(a.model.parameters()).dtype == torch.bfloat16  # auto on CUDA
    params = sampling(temperature=1.0, max_tokens=10, n=3)
    ra, rb = a.generate_sync(_prompts(a), params), b.generate_sync(_prompts(b), params)
    assert [[o.token_ids for o in g] for g in ra] == [[o.token_ids for o in g] for g in rb]
    for group in ra:
        for o in group:
            assert 0 < len(o.token_ids) <= 10
            assert torch.isfinite(o.logprobs).all() and (o.logprobs <= 0).all()
