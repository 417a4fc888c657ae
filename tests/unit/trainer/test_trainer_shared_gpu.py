"""One-GPU mode, the trainer's side: on a GPU shared with the rollout engine its settings carry a cap
of 1 - the engine's share - SHARED_GPU_MARGIN (the same resolved share the engine takes), on a GPU
of its own none; the cap and the cache release do nothing on a CPU device (no CUDA call: this torch
may have no CUDA at all). No GPU needed."""

from __future__ import annotations

import dataclasses
import gc
import weakref

import pytest
import torch

from launcher.tiny_model import make_tiny_model
from services.common.config import load_config
from services.common.config.gpus import SHARED_GPU_MARGIN
from services.common.gpu_memory import cap_cuda_memory, freeze_heap, release_cuda_cache
from services.trainer.collate import collate
from services.trainer.distributed import ensure_process_group
from services.trainer.engine import FSDPEngine
from services.trainer.settings import TrainerSettings
from tests.support.trainer_data import make_config, make_experiences

BASE = "model: {max_response_tokens: 4}\n"
ONE_GPU = BASE + "cluster: {gpu_per_node: 1}\n"


@pytest.mark.parametrize(
    "text,fraction",
    [
        (ONE_GPU, round(1 - 0.3 - SHARED_GPU_MARGIN, 6)),  # the default share 0.3: 0.65
        (ONE_GPU + "explorer: {rollout_model: {engine_type: vllm}}\n", 0.65),
        (ONE_GPU + "explorer: {rollout_model: {engine_type: vllm, gpu_memory_utilization: 0.5}}\n", 0.45),
        (BASE + "cluster: {gpu_per_node: 2}\n", None),  # a GPU of its own
        (BASE + "cluster: {gpu_per_node: 2}\nexplorer: {rollout_model: {engine_type: vllm}}\n", None),
        (BASE, None),  # no placement (CPU)
    ],
)
def test_the_trainer_caps_itself_only_on_a_shared_gpu(text, fraction):
    settings = TrainerSettings.from_config(load_config(text=text, environ={}))
    assert settings.cuda_memory_fraction == fraction


def test_a_share_that_leaves_the_trainer_nothing_is_refused_naming_the_key():
    with pytest.raises(
        Exception, match=r"explorer\.rollout_model\.gpu_memory_utilization is 0\.96.*below 0\.95"
    ):
        load_config(text=ONE_GPU + "explorer: {rollout_model: {gpu_memory_utilization: 0.96}}\n", environ={})
    # on a GPU of its own the engine may take nearly all of it
    load_config(
        text=BASE + "cluster: {gpu_per_node: 2}\nexplorer: {rollout_model: {gpu_memory_utilization: 0.96}}\n"
    )


def test_on_the_cpu_cap_and_release_do_nothing():
    assert cap_cuda_memory("cpu", 0.65) is False
    assert cap_cuda_memory(torch.device("cpu"), 0.65) is False
    assert release_cuda_cache(torch.device("cpu")) is False


def test_a_cpu_trainer_with_the_cap_steps_and_gathers_as_without(tmp_path):
    """The shared-GPU settings on a CPU rank: building, a step and the weight gather run (the cap and
    the releases are no-ops there)."""
    config = make_config(make_tiny_model(tmp_path / "tiny"), tmp_path / "run")
    settings = dataclasses.replace(TrainerSettings.from_config(config), cuda_memory_fraction=0.65)
    try:
        engine = FSDPEngine(settings, ensure_process_group())
        assert gc.get_freeze_count() > 0  # the startup heap is frozen: each release's collection is cheap
        metrics = engine.train_step(collate(make_experiences(4, group_size=4, seed=1)))
        assert metrics["actor/grad_norm"] >= 0
        state = dict(engine.iter_state_dict())
        assert state and all(t.device.type == "cpu" for t in state.values())
    finally:
        gc.unfreeze()  # the test process goes on to other tests


def test_after_freeze_heap_a_collection_still_frees_the_cycles_made_since():
    """What the release relies on: a full collection after `freeze_heap` frees new reference cycles
    holding tensors (the frozen startup heap is only left out of the scan)."""
    try:
        freeze_heap()
        gc.disable()  # no automatic collection in between: only the explicit one below frees them
        refs = []
        for _ in range(50):
            a = {"t": torch.ones(4)}
            a["self"] = a
            refs.append(weakref.ref(a["t"]))
        del a
        assert all(r() is not None for r in refs)
        gc.collect()
        assert all(r() is None for r in refs)
    finally:
        gc.enable()
        gc.unfreeze()
