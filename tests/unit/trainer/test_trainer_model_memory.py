"""The trainer's model memory on one CPU process: sharded (meta-device) loading gives exactly the
weights `from_pretrained` gives, veRL's offload keys are read and run their code paths, optimizer
state moves between devices unchanged, and gradient checkpointing works without transformers 5's
`activation_checkpointing_enable`.  Two-rank loading is tests/integration/trainer/
test_trainer_sharded_init.py; the CUDA side (memory, bf16 reference, offload) is
tests/integration/trainer/test_trainer_model_memory_cuda.py."""

from __future__ import annotations

import pytest
import torch
from torch.distributed.fsdp import FSDPModule

from launcher.tiny_model import make_tiny_model
from services.common.modeling import load_model
from services.trainer.collate import collate
from services.trainer.distributed import ensure_process_group
from services.trainer.engine import FSDPEngine
from services.trainer.fsdp import full_state_dict, meta_parameters
from services.trainer.optim import move_optimizer_state
from services.trainer.settings import TrainerSettings, unused_trainer_config_keys
from services.trainer.varlen_attention import load_packed_model
from services.trainer.worker import FSDPWorker, enable_gradient_checkpointing
from tests.support.trainer_data import make_config, make_experiences

torch.set_num_threads(1)
OFFLOAD = {
    "trainer_config": {
        "actor_rollout_ref": {
            "actor": {"fsdp_config": {"param_offload": True, "optimizer_offload": True}},
            "ref": {"fsdp_config": {"param_offload": True}},
        }
    }
}
KL = {"kl_loss_fn": "k3"}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return make_tiny_model(tmp_path_factory.mktemp("tiny"))


def worker(model_dir, root, fsdp: bool, algorithm=None, **sections) -> FSDPWorker:
    config = make_config(model_dir, root, algorithm={**KL, **(algorithm or {})}, **sections)
    return FSDPWorker(TrainerSettings.from_config(config), ensure_process_group(), fsdp=fsdp)


def assert_same(state: dict[str, torch.Tensor], expected: dict[str, torch.Tensor]) -> None:
    assert state.keys() == expected.keys()
    for name, value in expected.items():
        assert state[name].dtype == value.dtype, name
        assert torch.equal(state[name], value), name


def test_the_skeleton_matches_from_pretrained_without_weights(model_dir):
    real = load_packed_model(str(model_dir))
    skeleton = load_packed_model(str(model_dir), meta=True)
    assert all(p.is_meta for p in skeleton.parameters())
    assert skeleton.lm_head.weight is skeleton.model.embed_tokens.weight  # the tie survives meta init
    expected = real.state_dict()
    for name, value in skeleton.state_dict().items():
        assert (value.shape, value.dtype) == (expected[name].shape, expected[name].dtype), name
    real_buffers = dict(real.named_buffers())
    for name, buffer in skeleton.named_buffers():  # rotary inv_freq: real, computed from the config
        assert not buffer.is_meta and torch.equal(buffer, real_buffers[name]), name
    assert skeleton.config._attn_implementation == real.config._attn_implementation
    assert skeleton.generation_config == real.generation_config


def test_meta_parameters_keeps_requires_grad_and_restores_the_module_class():
    register = torch.nn.Module.register_parameter
    with meta_parameters():
        frozen = torch.nn.Linear(3, 2).requires_grad_(False)
        layer = torch.nn.Linear(3, 2)
    assert torch.nn.Module.register_parameter is register
    assert layer.weight.is_meta and layer.weight.requires_grad and not frozen.weight.requires_grad
    assert not torch.nn.Linear(3, 2).weight.is_meta


@pytest.mark.parametrize("fsdp", [False, True], ids=["plain", "fsdp2"])
def test_policy_and_reference_after_init_equal_from_pretrained(model_dir, tmp_path, fsdp):
    w = worker(model_dir, tmp_path, fsdp)
    expected = load_model(str(model_dir), dtype="float32").state_dict()
    assert isinstance(w.policy, FSDPModule) == fsdp
    assert_same(full_state_dict(w.policy), expected)
    assert w.ref is not None
    assert_same(full_state_dict(w.ref.module), expected)  # fp32 on the CPU: the numbers do not move
    assert w.policy.lm_head.weight is w.policy.model.embed_tokens.weight
    assert all(p.requires_grad for p in w.policy.parameters())
    assert not any(p.requires_grad for p in w.ref.module.parameters())
    assert w.hf_config.tie_word_embeddings and w.generation_config is not None


def test_sharded_lora_policy_and_critic_equal_the_plain_ones(model_dir, tmp_path):
    lora = {"model": {"model_path": str(model_dir), "lora_configs": [{"lora_rank": 4, "lora_alpha": 8}]}}
    plain = worker(model_dir, tmp_path / "a", False, **lora)
    sharded = worker(model_dir, tmp_path / "b", True, **lora)
    expected = full_state_dict(plain.policy)
    assert any(".lora_A." in k for k in expected)
    assert_same(full_state_dict(sharded.policy), expected)  # the adapter's random init too
    trainable = {n for n, p in sharded.policy.named_parameters() if p.requires_grad}
    assert trainable and all(".lora_" in n for n in trainable)
    # a saved adapter (`path`): rank 0 loads it, the skeleton only takes its shape
    export = tmp_path / "export"
    plain.export_hf(export, full_state_dict(plain.policy))
    saved = {"lora_configs": [{"lora_rank": 4, "lora_alpha": 8, "path": str(export / "lora_adapter")}]}
    resumed = worker(model_dir, tmp_path / "e", True, model={"model_path": str(model_dir), **saved})
    assert_same(full_state_dict(resumed.policy), expected)
    plain = worker(model_dir, tmp_path / "c", False, algorithm={"algorithm_type": "ppo"})
    sharded = worker(model_dir, tmp_path / "d", True, algorithm={"algorithm_type": "ppo"})
    assert plain.critic is not None and sharded.critic is not None
    assert_same(full_state_dict(sharded.critic.module), full_state_dict(plain.critic.module))


def test_gradient_checkpointing_falls_back_to_the_older_name():
    class OlderModel:  # a transformers model before `activation_checkpointing_enable` existed
        def __init__(self) -> None:
            self.calls: list[dict] = []

        def gradient_checkpointing_enable(self, gradient_checkpointing_kwargs=None) -> None:
            self.calls.append(gradient_checkpointing_kwargs)

    model = OlderModel()
    enable_gradient_checkpointing(model)  # type: ignore[arg-type]
    assert model.calls == [{"use_reentrant": False}]


def test_gradient_checkpointing_uses_the_current_name_when_present(model_dir):
    model = load_packed_model(str(model_dir))
    enable_gradient_checkpointing(model)
    assert model.is_activation_checkpointing


def test_offload_keys_are_read(model_dir, tmp_path):
    config = make_config(model_dir, tmp_path, trainer=OFFLOAD)
    s = TrainerSettings.from_config(config)
    assert (s.param_offload, s.optimizer_offload, s.ref_param_offload) == (True, True, True)
    assert unused_trainer_config_keys(config) == []
    s = TrainerSettings.from_config(make_config(model_dir, tmp_path))
    assert (s.param_offload, s.optimizer_offload, s.ref_param_offload) == (False, False, False)


def _adam_with_state() -> tuple[torch.optim.AdamW, list[torch.nn.Parameter]]:
    params = [torch.nn.Parameter(torch.randn(4, 3)), torch.nn.Parameter(torch.randn(5))]
    opt = torch.optim.AdamW(params, lr=0.1)
    sum((p**2).sum() for p in params).backward()
    opt.step()
    return opt, params


def test_move_optimizer_state_moves_the_moments_and_keeps_the_step_counter():
    opt, params = _adam_with_state()
    moment_bytes = 2 * sum(p.numel() * p.element_size() for p in params)
    assert move_optimizer_state(opt, torch.device("cpu")) == 0  # already there: nothing is copied
    assert move_optimizer_state(opt, torch.device("meta")) == moment_bytes  # another device
    for p in params:
        assert opt.state[p]["exp_avg"].is_meta and opt.state[p]["exp_avg_sq"].is_meta
        assert opt.state[p]["step"].device.type == "cpu"  # a scalar stays where the kernel wants it
    # None: beside each parameter (one on meta takes its state there, one on the CPU keeps it)
    opt, params = _adam_with_state()
    on_meta = torch.nn.Parameter(torch.empty(5, device="meta"))
    opt.state[on_meta] = {"step": torch.tensor(1.0), "exp_avg": torch.ones(5), "exp_avg_sq": torch.ones(5)}
    assert move_optimizer_state(opt) == 2 * 5 * 4
    assert opt.state[on_meta]["exp_avg"].is_meta and opt.state[on_meta]["exp_avg_sq"].is_meta
    assert all(v.device.type == "cpu" for p in params for v in opt.state[p].values())
    opt, params = _adam_with_state()
    before = {id(p): {k: v.clone() for k, v in opt.state[p].items()} for p in params}
    move_optimizer_state(opt, "cpu")
    for p in params:
        for key, value in before[id(p)].items():
            assert torch.equal(opt.state[p][key], value)


@pytest.mark.parametrize("fsdp", [False, True], ids=["plain", "fsdp2"])
def test_steps_with_offload_equal_steps_without(model_dir, tmp_path, fsdp):
    """Plain CPU: both keys are no-ops that still run.  One-rank FSDP2 on the CPU: the shards sit
    under `CPUOffloadPolicy` and the optimizer state is moved around each update."""
    info = ensure_process_group()
    exps = make_experiences(8, group_size=4, seed=7)
    for i, e in enumerate(exps):
        e.reward = float(i % 3 == 0)
    runs = {}
    for name, trainer in (("off", OFFLOAD), ("on_device", {})):
        config = make_config(model_dir, tmp_path / name, algorithm=KL, trainer=trainer)
        engine = FSDPEngine(TrainerSettings.from_config(config), info, fsdp)
        runs[name] = (engine, [engine.train_step(collate(exps)) for _ in range(2)])
    (off, m_off), (_, m_on) = runs["off"], runs["on_device"]
    for a, b in zip(m_off, m_on, strict=True):
        for key in ("actor/pg_loss", "actor/kl_loss", "actor/entropy", "actor/grad_norm"):
            assert a[key] == b[key], key
    assert m_on[1]["actor/kl_loss"] > 0  # the second step moved the policy away from the reference
    state = off.worker.actor.optimizer.state
    assert state and all(v.device.type == "cpu" for s in state.values() for v in s.values())
    if fsdp:
        for module in (off.worker.policy, off.worker.ref.module):
            groups = module._get_fsdp_state()._fsdp_param_group
            assert groups is not None and all(p.offload_to_cpu for p in groups.fsdp_params)
