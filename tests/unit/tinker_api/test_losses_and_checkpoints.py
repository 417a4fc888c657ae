"""`rft serve tinker` without HTTP: Tinker's loss formulas on our losses, and checkpoints that load as
HF model folders with the trained weights (LoRA merged) and resume the optimizer, and the training
runs a restarted server finds in its checkpoint directory."""

from __future__ import annotations

import time

import numpy as np
import pytest
import torch

from services.common.modeling import load_model
from tests.support.rft_run import tiny_model
from tinker_api import expiry, losses
from tinker_api.server import NotFound, TinkerServer
from tinker_api.training import TrainingModel
from tinker_api.wire import Datum, FwdBwd


def _inputs(bs: int = 3, t: int = 5) -> tuple[torch.Tensor, dict[str, torch.Tensor], torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    lp = -torch.rand(bs, t, generator=g) * 3
    inputs = {
        "weights": torch.rand(bs, t, generator=g),
        "logprobs": lp + (torch.rand(bs, t, generator=g) - 0.5),
        "advantages": torch.randn(bs, t, generator=g),
    }
    mask = torch.ones(bs, t)
    mask[0, 3:] = 0  # a shorter row: its padding must not count
    return lp, {k: v * mask for k, v in inputs.items()}, mask


def test_losses_are_tinkers_formulas_summed_over_tokens() -> None:
    lp, inp, mask = _inputs()
    ce, metrics = losses.compute("cross_entropy", {}, lp, inp, mask)
    assert ce.item() == pytest.approx((-inp["weights"] * lp * mask).sum().item(), rel=1e-5)
    assert metrics["loss:sum"] == pytest.approx(ce.item())
    ratio = torch.exp(lp - inp["logprobs"])
    is_loss, _ = losses.compute("importance_sampling", {}, lp, inp, mask)
    assert is_loss.item() == pytest.approx((-inp["advantages"] * ratio * mask).sum().item(), rel=1e-5)
    a = inp["advantages"]
    clipped = torch.minimum(a * ratio, a * ratio.clamp(0.9, 1.3))
    ppo, _ = losses.compute("ppo", {"clip_low_threshold": 0.9, "clip_high_threshold": 1.3}, lp, inp, mask)
    assert ppo.item() == pytest.approx((-clipped * mask).sum().item(), rel=1e-5)
    # cispo: the clipped ratio is a constant weight on log p; defaults clip to [0, 4]
    cispo, _ = losses.compute("cispo", {}, lp, inp, mask)
    assert cispo.item() == pytest.approx((-ratio.clamp(0.0, 4.0) * a * lp * mask).sum().item(), rel=1e-5)
    g = lp.clone().requires_grad_(True)
    losses.compute("cispo", {"clip_low_threshold": 0.9, "clip_high_threshold": 1.1}, g, inp, mask)[
        0
    ].backward()
    assert torch.allclose(g.grad, -ratio.clamp(0.9, 1.1) * a * mask, atol=1e-6)
    dro, _ = losses.compute("dro", {"beta": 0.3}, lp, inp, mask)
    want = -((lp * a - 0.15 * (lp - inp["logprobs"]) ** 2) * mask).sum()
    assert dro.item() == pytest.approx(want.item(), rel=1e-5)
    losses.check("cispo", {"clip_high_threshold": 2.0})
    with pytest.raises(losses.LossError, match=r"'dro' needs \['beta'\]"):
        losses.check("dro", {})
    with pytest.raises(losses.LossError, match="'stable_reinforce' is not supported"):
        losses.check("stable_reinforce", {})
    with pytest.raises(losses.LossError, match=r"unknown keys \['beta'\]"):
        losses.check("ppo", {"beta": 1.0})


def test_gspo_is_tinkers_sequence_ratio_formula_summed_over_tokens() -> None:
    lp, inp, mask = _inputs()
    ratio_mask = mask.clone()
    ratio_mask[:, 0] = 0  # the prompt's last position: outside the sequence ratio
    inp["sequence_ratio_mask"] = ratio_mask
    a = inp["advantages"]
    # the formula written out: s_i = exp(mean over the ratio mask of (log p - sampler log p)) per row
    log_s = ((lp - inp["logprobs"]) * ratio_mask).sum(-1) / ratio_mask.sum(-1)
    s = torch.exp(log_s).unsqueeze(-1).expand_as(lp)
    for low, high in ((0.9997, 1.0004), (0.8, 1.25)):
        config = {"clip_low_threshold": low, "clip_high_threshold": high}
        g = lp.clone().requires_grad_(True)
        loss, metrics = losses.compute("gspo", config, g, inp, mask)
        want = (-torch.minimum(s * a, s.clamp(low, high) * a) * mask).sum()
        assert loss.item() == pytest.approx(want.item(), rel=1e-5)
        assert metrics["loss:sum"] == pytest.approx(want.item(), rel=1e-5)
        loss.backward()
        # each token: the sequence ratio's value times its own log p's gradient, zero where clipped
        unclipped = (s * a <= s.clamp(low, high) * a).float()
        assert torch.allclose(g.grad, -a * s * unclipped * mask, atol=1e-5)
    assert 0 < (unclipped * mask).sum() < mask.sum()  # the wide range clips some tokens, not all
    losses.check("gspo", {"clip_high_threshold": 1.2})


@pytest.mark.parametrize("rank", [8, None])
def test_a_checkpoint_is_an_hf_folder_and_resumes(tmp_path, rank) -> None:
    model = TrainingModel("m", "tiny", str(tiny_model()), rank)
    tokens = [5, 6, 7, 8, 9]
    data = [Datum(tokens[:-1], {"target_tokens": np.array(tokens[1:]), "weights": np.ones(4, np.float32)})]
    model.forward_backward(FwdBwd("m", "cross_entropy", {}, False, data))
    model.optim_step({"learning_rate": 1e-2})
    model.save(tmp_path / "ck", with_optimizer=True)
    ids = torch.tensor([tokens])
    with torch.no_grad():
        want = model.model(input_ids=ids).logits
        got = load_model(tmp_path / "ck")(input_ids=ids).logits
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    assert TrainingModel.describe(tmp_path / "ck") == ("tiny", rank)
    resumed = TrainingModel("r", "tiny", str(tiny_model()), rank)
    resumed.load(tmp_path / "ck", with_optimizer=True)
    assert resumed.step == 1 and resumed.optimizer is not None
    for a, b in zip(model.optimizer.state.values(), resumed.optimizer.state.values(), strict=True):
        torch.testing.assert_close(a["exp_avg"], b["exp_avg"])


def test_a_restarted_server_lists_the_runs_its_checkpoints_name(tmp_path) -> None:
    TrainingModel("old", "tiny", str(tiny_model()), 4).save(tmp_path / "old" / "weights" / "c1", True)
    (tmp_path / "emptied" / "weights").mkdir(parents=True)  # a run whose checkpoints were all deleted
    server = TinkerServer({"tiny": str(tiny_model())}, tmp_path)
    try:
        runs = server.training_runs(limit=20, offset=0)
        assert [r["training_run_id"] for r in runs["training_runs"]] == ["old"]
        run = runs["training_runs"][0]
        assert (run["base_model"], run["is_lora"], run["lora_rank"]) == ("tiny", True, 4)
        assert run["last_checkpoint"]["tinker_path"] == "tinker://old/weights/c1"
        assert run["last_request_time"] == run["last_checkpoint"]["time"]
        with pytest.raises(NotFound, match="'emptied' has no training client and no checkpoints"):
            server.training_run("emptied")
        with pytest.raises(NotFound, match=r"unknown training run '\.\.'"):
            server.checkpoints("..")
        with pytest.raises(NotFound, match="expected weights/<name>"):
            server.delete_checkpoint("old", "other/c1")
        # a TTL that ran out (its expiry time, kept in the folder, now past): gone when next read
        TrainingModel("old", "tiny", str(tiny_model()), 4).save(tmp_path / "old" / "weights" / "c2", True)
        server.set_ttl("old", "weights/c2", 3600)
        assert server.checkpoints("old")[-1]["expires_at"] is not None
        (tmp_path / "old" / "weights" / "c2" / expiry.FILE).write_text(str(time.time() - 1))
        assert [c["checkpoint_id"] for c in server.checkpoints("old")] == ["weights/c1"]
        assert not (tmp_path / "old" / "weights" / "c2").exists()
        with pytest.raises(expiry.TtlError, match="between 3600"):
            server.set_ttl("old", "weights/c1", 10**10)
        server.delete_checkpoint("old", "weights/c1")
        assert server.training_runs(limit=20, offset=0)["cursor"]["total_count"] == 0
    finally:
        server.futures.shutdown()
