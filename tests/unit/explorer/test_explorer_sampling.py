"""The sampler draws from the filtered distribution it reports: frequencies match, filtered tokens never."""

from __future__ import annotations

import torch

from services.explorer.engines.sampling import RowParams, filtered_logprobs, sample

from .fakes import sampling


def test_draw_frequencies_match_the_filtered_distribution():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(1, 40, generator=g) * 2
    rows = RowParams.build([sampling(temperature=0.8, top_k=12, max_tokens=1)] * 4000, "cpu")
    batch = logits.expand(4000, -1).contiguous()
    p = filtered_logprobs(
        logits, RowParams.build([sampling(temperature=0.8, top_k=12, max_tokens=1)], "cpu")
    )[0].exp()
    counts = torch.zeros(40)
    for _ in range(5):
        tokens, lp = sample(batch, rows, g)
        counts += torch.bincount(tokens, minlength=40)
        torch.testing.assert_close(lp, p.log()[tokens])
    freq = counts / counts.sum()
    assert (counts[p == 0] == 0).all()  # outside the top 12: never drawn
    # 20,000 draws: every frequency within 5 standard errors of its probability
    se = (p * (1 - p) / counts.sum()).sqrt()
    assert ((freq - p).abs() <= 5 * se + 1e-9).all(), (freq - p).abs().max()


def test_one_token_with_all_the_mass_is_always_drawn():
    logits = torch.full((64, 30), -1e9)
    logits[:, 7] = 0.0
    tokens, lp = sample(logits, RowParams.build([sampling(temperature=1.0, max_tokens=1)] * 64, "cpu"), None)
    assert (tokens == 7).all() and torch.allclose(lp, torch.zeros(64))
