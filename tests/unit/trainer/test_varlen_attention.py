"""The trainer's varlen attention equals transformers' packed sdpa attention (forward and gradients)."""

from __future__ import annotations

import pytest
import torch

from launcher.tiny_model import make_tiny_model
from services.common.modeling import load_model
from services.trainer import varlen_attention
from services.trainer.collate import ModelShape

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return make_tiny_model(tmp_path_factory.mktemp("tiny"))


def packed_row(lengths: list[int], seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, 500, (1, sum(lengths)), generator=g)
    return ids, torch.cat([torch.arange(n) for n in lengths]).unsqueeze(0)


@pytest.mark.parametrize("lengths", [[5, 7, 6, 40, 3, 1], [12], [9] * 20 + [70, 33]])
def test_varlen_equals_packed_sdpa(model_dir, lengths):
    reference, varlen = load_model(model_dir), load_model(model_dir)
    assert varlen_attention.enable(varlen) and ModelShape.of(varlen).varlen_attention
    ids, pos = packed_row(lengths)
    out = {}
    for name, model in (("ref", reference), ("varlen", varlen)):
        logits = model(input_ids=ids, position_ids=pos, use_cache=False).logits
        logits.log_softmax(-1)[..., :7].sum().backward()
        out[name] = (logits.detach(), {n: p.grad.clone() for n, p in model.named_parameters()})
    torch.testing.assert_close(out["varlen"][0], out["ref"][0], atol=2e-5, rtol=0)
    for n, g in out["ref"][1].items():
        torch.testing.assert_close(out["varlen"][1][n], g, atol=1e-4, rtol=1e-3)


def test_sequences_are_bucketed_by_length():
    _, pos = packed_row([5, 7, 40, 3, 9])
    buckets = varlen_attention.segments(pos)
    assert sorted((b.count, b.longest) for b in buckets) == [(1, 9), (1, 40), (3, 7)]
    covered = torch.sort(torch.cat([b.tokens for b in buckets])).values
    assert torch.equal(covered, torch.arange(pos.numel()))  # every token in exactly one bucket


def test_varlen_attention_refuses_a_batch_without_position_ids(model_dir):
    model = load_model(model_dir)
    varlen_attention.enable(model)
    with pytest.raises(ValueError, match="position_ids"):
        model(input_ids=torch.randint(3, 500, (2, 6)), attention_mask=torch.ones(2, 6, dtype=torch.long))


def grouped_step(seed: int = 0):
    """Three GRPO groups of 4 rows: rows of a group share their prompt, responses vary (one empty)."""
    from services.common.experience import Experience, ExperienceId
    from services.trainer.collate import collate

    g = torch.Generator().manual_seed(seed)
    exps = []
    for group, p in enumerate((5, 3, 9)):
        prompt = torch.randint(3, 500, (p,), generator=g)
        for j, r in enumerate((4, 1, 7, 0 if group == 1 else 2)):
            exps.append(
                Experience(
                    tokens=torch.cat([prompt, torch.randint(3, 500, (r,), generator=g)]),
                    prompt_length=p,
                    eid=ExperienceId(group_id=f"g{group}", run_id=j),
                    reward=float(j % 2),
                )
            )
    return collate(exps)


def test_shared_prompt_packing_equals_separate_sequences(model_dir):
    """One prompt per group, its responses after it: the same log-probs, entropies and gradients as
    every row packed whole, under transformers' own attention."""
    from services.trainer.actor import policy_forward
    from services.trainer.collate import pack

    step = grouped_step()
    reference, shared = load_model(model_dir), load_model(model_dir)
    varlen_attention.enable(shared)
    shape = ModelShape.of(shared)
    assert shape.shared_prompts
    packed_shared, packed_plain = pack(step, share_prompts=True), pack(step)
    assert packed_shared.input_ids.numel() == packed_plain.input_ids.numel() - (3 * 5 + 3 * 3 + 3 * 9)
    cpu = torch.device("cpu")
    lp_ref, ent_ref = policy_forward(reference, step, 0.8, cpu, entropy=True, entropy_grad=True)
    lp, ent = policy_forward(shared, step, 0.8, cpu, entropy=True, entropy_grad=True, shape=shape)
    torch.testing.assert_close(lp, lp_ref, atol=1e-5, rtol=0)
    torch.testing.assert_close(ent, ent_ref, atol=1e-5, rtol=0)
    weights = torch.linspace(-1, 1, lp.numel()).view_as(lp)
    ((lp_ref * weights).sum() + ent_ref.sum()).backward()
    ((lp * weights).sum() + ent.sum()).backward()
    ref_grads = dict(reference.named_parameters())
    for name, p in shared.named_parameters():
        torch.testing.assert_close(p.grad, ref_grads[name].grad, atol=1e-4, rtol=1e-3)


def test_shared_segment_mask_shows_the_prompt_and_the_own_response_only():
    # one segment: prompt of 3 (positions 0-2), a response of 2 (3-4), a response of 3 (3-5)
    pos = torch.tensor([[0, 1, 2, 3, 4, 3, 4, 5]])
    (bucket,) = varlen_attention.segments(pos)
    assert bucket.count == 1 and bucket.longest == 8
    visible = bucket.mask[0, 0]
    expected = torch.tensor(
        [
            [1, 0, 0, 0, 0, 0, 0, 0],
            [1, 1, 0, 0, 0, 0, 0, 0],
            [1, 1, 1, 0, 0, 0, 0, 0],
            [1, 1, 1, 1, 0, 0, 0, 0],  # first response
            [1, 1, 1, 1, 1, 0, 0, 0],
            [1, 1, 1, 0, 0, 1, 0, 0],  # second response: the prompt and itself, not the first
            [1, 1, 1, 0, 0, 1, 1, 0],
            [1, 1, 1, 0, 0, 1, 1, 1],
        ],
        dtype=torch.bool,
    )
    assert torch.equal(visible, expected)
    (plain,) = varlen_attention.segments(torch.tensor([[0, 1, 2, 3]]))
    assert plain.mask is None  # no shared prompt: plain causal attention
