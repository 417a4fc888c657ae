"""`model` and `cluster` sections: which model, its token limits and default sampling arguments."""

from __future__ import annotations

from typing import Any

from pydantic import Field, model_validator

from services.common.config.base import Section


class LoRAConfig(Section):
    """One LoRA adapter trained on the policy (Trinity-RFT's `model.lora_configs` entry; peft `LoraConfig`).

    `path`: a saved peft adapter folder to start from (its own rank, alpha and targets apply);
    empty: a new adapter with `lora_rank`, `lora_alpha`, `target_modules` and `exclude_modules`."""

    name: str = "default"
    path: str = ""
    base_model_name: str | None = None
    lora_rank: int = Field(32, gt=0)
    lora_alpha: int = Field(32, gt=0)
    lora_dtype: str = "auto"
    target_modules: str | list[str] = "all-linear"
    exclude_modules: str | list[str] | None = None


class ModelConfig(Section):
    """The policy model and defaults that tasksets and rollout engines inherit."""

    model_path: str = ""
    critic_model_path: str = ""
    trust_remote_code: bool = False
    custom_chat_template: str | None = None
    chat_template_path: str | None = None
    temperature: float = Field(1.0, ge=0)
    top_p: float = Field(1.0, gt=0, le=1)
    top_k: int = -1
    logprobs: int = Field(0, ge=0)
    max_model_len: int | None = Field(None, gt=0)
    max_prompt_tokens: int | None = Field(None, gt=0)
    max_response_tokens: int | None = Field(None, gt=0)
    min_response_tokens: int = Field(0, ge=0)
    enable_prompt_truncation: bool = True
    repetition_penalty: float = Field(1.0, gt=0)
    enable_thinking: bool | None = None
    rope_scaling: dict[str, Any] | None = None
    rope_theta: float | None = None
    lora_configs: list[LoRAConfig] = []

    @model_validator(mode="after")
    def _one_adapter(self) -> ModelConfig:
        if len(self.lora_configs) > 1:
            raise ValueError(
                f"model.lora_configs has {len(self.lora_configs)} entries; one trained adapter is supported: "
                "keep a single entry"
            )
        return self

    @model_validator(mode="after")
    def _token_limits_fit(self) -> ModelConfig:
        p, r, m = self.max_prompt_tokens, self.max_response_tokens, self.max_model_len
        if p is not None and r is not None and m is not None and p + r > m:
            raise ValueError(
                f"max_prompt_tokens ({p}) + max_response_tokens ({r}) exceeds max_model_len ({m}); "
                "raise max_model_len or lower one of the two"
            )
        return self


class ClusterConfig(Section):
    """Machines of the run. GPUs are split by Trinity-RFT's rule (gpus.py): each explorer takes its engines'
    and auxiliary models' GPUs, the trainer the rest; `gpu_per_node: 0` places nothing; `gpu_per_node: 1`
    with one engine and one trainer rank shares GPU 0; `colocate` time-shares every GPU between the
    trainer and the engines (veRL's hybrid engine). `gpu_memory_gib` is each GPU's memory for the
    memory plan (launcher/memory_plan.py; `rft run` on a CUDA machine uses the device's own size instead)."""

    node_num: int = Field(1, ge=1)
    gpu_per_node: int = Field(0, ge=0)
    gpu_memory_gib: float = Field(80.0, gt=0)
    # veRL's hybrid engine: the trainer's ranks and the explorers' rollout engines time-share the same
    # GPUs (gpus.py `place_colocated`). The engines sleep (vLLM sleep mode; the hf engine moves its
    # weights off the device) while the trainer steps and wake for the next rollout. Applies to mode
    # both (a train or explore stage is placed as usual; serve is refused) and needs a strictly
    # synchronous plan: synchronizer.sync_style fixed or explorer_driven, sync_interval 1, sync_offset 0.
    colocate: bool = False
