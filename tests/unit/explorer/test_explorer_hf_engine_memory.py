"""The hf engine's memory share: built from a rollout config (as resolved.py fills it), it caps its CUDA
allocator at `gpu_memory_utilization` only where that is set (by the config, or by a GPU shared with
the trainer); on the CPU the cap does nothing. The CUDA test (gpu tier) checks that an allocation
beyond the share fails."""

from __future__ import annotations

import pytest
import torch

from services.common.config import load_config, resolve
from services.explorer.engines.hf import HFEngine, cap_cuda_memory

from .fakes import sampling

ONE_GPU = "model: {max_response_tokens: 4}\ncluster: {gpu_per_node: 1}\n"


def test_on_the_cpu_the_cap_does_nothing_and_the_engine_samples(tiny_model_dir):
    rollout = resolve(load_config(text=ONE_GPU, environ={})).rollout_model
    assert rollout.gpu_memory_utilization == 0.3 and "gpu_memory_utilization" in rollout.model_fields_set
    assert cap_cuda_memory("cpu", 0.3) is False
    engine = HFEngine.from_config(rollout, str(tiny_model_dir), index=2, device="cpu")
    assert engine.name == "hf-2"
    (group,) = engine.generate_sync([[1, 2, 3]], sampling(max_tokens=3))
    assert len(group[0].token_ids) <= 3


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_on_cuda_the_engine_cannot_take_more_than_its_share(tiny_model_dir):
    total = torch.cuda.get_device_properties(0).total_memory
    rollout = resolve(load_config(text=ONE_GPU, environ={})).rollout_model.model_copy(
        update={"gpu_memory_utilization": 0.05}
    )
    try:
        HFEngine.from_config(rollout, str(tiny_model_dir), device="cuda:0")
        with pytest.raises(torch.OutOfMemoryError):
            torch.empty(int(total * 0.10), dtype=torch.uint8, device="cuda:0")
        torch.empty(int(total * 0.01), dtype=torch.uint8, device="cuda:0")  # within the share
    finally:
        torch.cuda.set_per_process_memory_fraction(1.0, 0)
        torch.cuda.empty_cache()
