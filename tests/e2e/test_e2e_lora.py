"""`rft run` with `model.lora_configs` (all four services as processes): the trainer trains only a LoRA
adapter with the adapter-less policy as its KL reference, the explorer receives the merged weights
after every step (`memory`), or only the adapter, which it merges into its base weights
(`lora_adapter`: fewer bytes than the model), and the HF export holds the merged model and the adapter
folder.

The explorer's model is checked to follow the trainer's: the trainer compares each experience's
rollout log-probs (the explorer's model) with its own policy's (`training/rollout_probs_diff_max`).
The adapter moves the policy away from the base model (`actor/kl_loss`, measured against the adapter-less
reference, grows), while the rollout-vs-policy difference stays at float noise: an explorer still on the
base weights would differ by as much as the policy moved."""

from __future__ import annotations

import json

import pytest
import torch
from peft import PeftModel
from safetensors.torch import load_file

from services.common.modeling import load_model
from tests.support.rft_run import assert_no_orphans, example, jsonl, run_rft, tiny_model, write_config

pytestmark = pytest.mark.slow

STEPS = 4


@pytest.mark.parametrize("method", ["memory", "lora_adapter"])
def test_lora_run_trains_the_adapter_and_the_explorer_follows(tmp_path, method):
    tree = example("quickstart.yaml")
    tree["synchronizer"]["sync_method"] = method
    tree.pop("stages")
    tree.update(checkpoint_root_dir=str(tmp_path / "ckpt"), continue_from_checkpoint=False)
    tree["model"].update(model_path=str(tiny_model()), lora_configs=[{"lora_rank": 8, "lora_alpha": 16}])
    # the SFT loss on the model's own samples moves the policy at every step, whatever the reward
    tree["algorithm"].update(
        policy_loss_fn="sft", kl_loss_fn="k3", optimizer={"lr": 2e-2, "weight_decay": 0.0}
    )
    tree["buffer"].update(batch_size=2, total_steps=STEPS)
    tree["trainer"].update(save_interval=0, save_hf_checkpoint="last")
    tree["monitor"]["monitor_type"] = "none"
    proc = run_rft(write_config(tmp_path / "run.yaml", tree), timeout_s=120)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    assert_no_orphans(out)

    run = tmp_path / "ckpt" / "quickstart" / "arithmetic"
    train = jsonl(run / "metrics" / "trainer.jsonl")
    assert [r["step"] for r in train] == list(range(1, STEPS + 1))
    explore = [r for r in jsonl(run / "metrics" / "explorer.jsonl") if "rollout/reward/mean" in r]
    assert max(r["rollout/model_version"] for r in explore) >= STEPS - 1  # it took the synced weights
    kl = [r["actor/kl_loss"] for r in train]
    assert kl[0] == 0.0 and min(kl[1:]) > 5e-3, kl  # the adapter moved the policy from the base model
    diffs = [r["training/rollout_probs_diff_max"] for r in train]
    assert max(diffs) < 1e-3, diffs  # ... and the explorer generated with the moved policy

    export = run / f"global_step_{STEPS}" / "huggingface"
    model_bytes = sum(
        t.numel() * t.element_size() for t in load_file(str(export / "model.safetensors")).values()
    )
    sent = [
        json.loads(x) for x in (run / "log" / "trainer.log").read_text().splitlines() if '"weights sent"' in x
    ]
    assert len(sent) >= STEPS - 1 and all(x["bytes"] > 0 for x in sent)
    if method == "lora_adapter":  # only A, B and the scaling of each adapted weight travel
        assert max(x["bytes"] for x in sent) < 0.5 * model_bytes, (sent[-1], model_bytes)
    else:
        assert min(x["bytes"] for x in sent) >= model_bytes
    merged = load_model(str(export))
    adapted = PeftModel.from_pretrained(load_model(str(tiny_model())), str(export / "lora_adapter"))
    ids = torch.tensor([[1, 2, 3, 4, 5]])
    with torch.no_grad():
        torch.testing.assert_close(merged(ids).logits, adapted(ids).logits, rtol=0, atol=1e-4)
