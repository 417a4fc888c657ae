"""One training client's model: forward_backward with a named loss, AdamW steps, checkpoints.

A LoRA client wraps the base model with our peft adapter (services/trainer/lora.py); a full client
trains every weight. Gradients add up over forward_backward calls until `optim_step` applies AdamW
(services/trainer/optim.py) with the request's parameters and zeroes them, as Tinker does.
A checkpoint folder holds the HF export of the (merged) weights and tokenizer, plus `trainer.pt`
with the trainable weights, the optimizer state and the step count, so `load_weights` resumes.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import save_file

from services.common.modeling import load_model, load_tokenizer
from services.trainer.lora import LoraSettings, apply_lora, is_lora, merged_state_dict
from services.trainer.optim import build_optimizer
from services.trainer.settings import OptimSettings

from . import losses
from .wire import FwdBwd


class TrainingModel:
    """The weights, optimizer and step count behind one Tinker `model_id`."""

    def __init__(self, model_id: str, base_model: str, folder: str, lora_rank: int | None, seed: int = 0):
        torch.manual_seed(seed)
        self.model_id, self.base_model, self.folder = model_id, base_model, folder
        self.tokenizer = load_tokenizer(folder)
        model = load_model(folder, dtype="float32", device="cpu")
        self.lora_rank = lora_rank
        if lora_rank:
            model = apply_lora(model, LoraSettings(rank=lora_rank, alpha=32))
        self.model = model
        self.optimizer: torch.optim.Optimizer | None = None
        self.step = 0
        self.pending = 0  # forward_backward calls since the last optim_step

    def _optimizer(self) -> torch.optim.Optimizer:
        if self.optimizer is None:
            self.optimizer = build_optimizer(self.model, OptimSettings(lr=1e-4, weight_decay=0.0))
        return self.optimizer

    def forward_backward(self, req: FwdBwd) -> tuple[list[dict[str, np.ndarray]], dict[str, float]]:
        losses.check(req.loss_fn, req.config)
        if not req.data:
            raise losses.LossError("forward_backward: no data")
        need = losses.NEEDS[req.loss_fn]
        for i, d in enumerate(req.data):
            missing = [k for k in need if k not in d.inputs]
            if missing:
                raise losses.LossError(f"datum {i}: loss {req.loss_fn!r} needs loss_fn_inputs {missing}")
            for k, v in d.inputs.items():
                if len(v) != len(d.tokens):
                    raise losses.LossError(
                        f"datum {i}: loss_fn_inputs[{k!r}] has {len(v)} values for {len(d.tokens)} input "
                        "tokens; every per-token input must have one value per model_input token"
                    )
        vocab = int(self.model.get_input_embeddings().weight.shape[0])
        bs, width = len(req.data), max(len(d.tokens) for d in req.data)
        ids = torch.zeros(bs, width, dtype=torch.long)
        mask = torch.zeros(bs, width)
        inputs: dict[str, torch.Tensor] = {}
        for i, d in enumerate(req.data):
            n = len(d.tokens)
            ids[i, :n] = torch.tensor(d.tokens)
            mask[i, :n] = 1.0
            for k, v in d.inputs.items():
                t = inputs.setdefault(
                    k, torch.zeros(bs, width, dtype=torch.long if k == "target_tokens" else torch.float32)
                )
                t[i, :n] = torch.from_numpy(np.asarray(v)).to(t.dtype)
        if int(ids.max()) >= vocab or int(inputs["target_tokens"].max()) >= vocab:
            raise losses.LossError(f"token ids must be below the model's vocabulary size {vocab}")
        self.model.train(not req.forward_only)
        with torch.set_grad_enabled(not req.forward_only):
            logits = self.model(input_ids=ids, attention_mask=mask.long()).logits.float()
            log_prob = (
                torch.log_softmax(logits, -1).gather(-1, inputs["target_tokens"].unsqueeze(-1)).squeeze(-1)
            )
            loss, metrics = losses.compute(req.loss_fn, req.config, log_prob, inputs, mask)
            if not req.forward_only:
                loss.backward()
                self.pending += 1
        lp = log_prob.detach().numpy()
        outputs = []
        for i, d in enumerate(req.data):
            n = len(d.tokens)
            out = {"logprobs": lp[i, :n]}
            if req.loss_fn == "cross_entropy":
                w = d.inputs.get("weights", np.ones(n, dtype=np.float32))
                out["elementwise_loss"] = -lp[i, :n] * w
            outputs.append(out)
        return outputs, metrics

    def optim_step(self, params: dict[str, Any]) -> dict[str, float]:
        opt = self._optimizer()
        for group in opt.param_groups:
            group["lr"] = float(params.get("learning_rate", 1e-4))
            group["betas"] = (float(params.get("beta1", 0.9)), float(params.get("beta2", 0.95)))
            group["eps"] = float(params.get("eps", 1e-12))
            group["weight_decay"] = float(params.get("weight_decay", 0.0))
        trainable = [p for p in self.model.parameters() if p.requires_grad]
        clip = float(params.get("grad_clip_norm", 0.0))
        norm = torch.nn.utils.clip_grad_norm_(trainable, clip if clip > 0 else float("inf"))
        opt.step()
        opt.zero_grad(set_to_none=True)
        self.step += 1
        self.pending = 0
        return {"grad_norm:mean": float(norm), "step:max": float(self.step)}

    def full_state(self) -> dict[str, torch.Tensor]:
        """The plain model's weights (LoRA merged in), as an engine or an HF export reads them."""
        state = {k: v.detach() for k, v in self.model.state_dict().items()}
        return merged_state_dict(self.model, state) if is_lora(self.model) else state

    def save(self, folder: Path, with_optimizer: bool) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        state = {k: v.detach().clone().contiguous() for k, v in self.full_state().items()}
        save_file(state, str(folder / "model.safetensors"), metadata={"format": "pt"})
        for name in ("config.json", "generation_config.json"):
            if (Path(self.folder) / name).is_file():
                shutil.copyfile(Path(self.folder) / name, folder / name)
        self.tokenizer.save_pretrained(folder)
        trainable = {n: p.detach().clone() for n, p in self.model.named_parameters() if p.requires_grad}
        blob: dict[str, Any] = {
            "trainable": trainable,
            "step": self.step,
            "base_model": self.base_model,
            "lora_rank": self.lora_rank,
        }
        if with_optimizer and self.optimizer is not None:
            blob["optimizer"] = self.optimizer.state_dict()
        torch.save(blob, folder / "trainer.pt")

    @staticmethod
    def describe(folder: Path) -> tuple[str, int | None]:
        """The base model name and LoRA rank (None: full) of the checkpoint in `folder`."""
        blob = torch.load(folder / "trainer.pt", weights_only=False)
        return blob["base_model"], blob.get("lora_rank")

    def load(self, folder: Path, with_optimizer: bool) -> None:
        blob = torch.load(folder / "trainer.pt", weights_only=False)
        params = dict(self.model.named_parameters())
        wrong = sorted(set(blob["trainable"]) - set(params))
        if wrong:
            raise losses.LossError(f"{folder}: its weights do not fit this model ({wrong[:3]} ...)")
        with torch.no_grad():
            for name, value in blob["trainable"].items():
                params[name].copy_(value)
        self.step = int(blob["step"])
        self.pending = 0
        if with_optimizer and "optimizer" in blob:
            self._optimizer().load_state_dict(blob["optimizer"])
