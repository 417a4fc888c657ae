"""One-GPU mode: `cluster.gpu_per_node: 1` with one single-GPU engine and one trainer rank shares GPU 0,
and says so; nothing larger shares. On the shared GPU the nccl method's group is gloo (the /dev/shm
path) for the trainer and every explorer alike, an explicit nccl backend is refused naming the fix, and
the rollout engine's memory share comes from the placement. CPU configs (`gpu_per_node: 0`) resolve as
before. No GPU needed."""

from __future__ import annotations

import pytest

from services.common.config import ConfigError, load_config, resolve
from services.common.config.gpus import GpuDemand, GpuPlacementError, place_gpus
from services.common.config.resolved import SHARED_GPU_ROLLOUT_MEMORY
from services.synchronizer.members import Member, Role
from services.synchronizer.rendezvous import Rendezvous
from services.synchronizer.settings import SynchronizerSettings
from services.weight_sync.transport import transport_options

BASE = "model: {max_response_tokens: 4}\n"
ONE_GPU = BASE + "cluster: {gpu_per_node: 1}\n"


def _demand(engine_num=1, tp=1, aux=0, ranks=1) -> GpuDemand:
    return GpuDemand(engine_num=engine_num, tensor_parallel_size=tp, auxiliary=aux, trainer_ranks=ranks)


def test_one_gpu_one_engine_one_rank_share_gpu_0_and_say_so():
    placement = place_gpus(1, _demand())
    assert placement.shared
    assert placement.explorers == ((0,),) and placement.trainer == (0,) and placement.trainer_ranks == 1
    assert place_gpus(1, _demand(), mode="serve").shared
    # one process alone on the GPU shares nothing
    assert not place_gpus(1, _demand(), mode="train").shared
    assert not place_gpus(1, _demand(), mode="explore").shared


@pytest.mark.parametrize(
    "total,demand,explorers",
    [
        (1, _demand(engine_num=2), 1),
        (1, _demand(tp=2), 1),
        (1, _demand(aux=1), 1),
        (1, _demand(ranks=2), 1),
        (1, _demand(), 2),
        (2, _demand(ranks=2), 1),  # two GPUs: never shared, the misfit stands
    ],
)
def test_nothing_larger_shares_a_gpu(total, demand, explorers):
    with pytest.raises(GpuPlacementError):
        place_gpus(total, demand, explorers=explorers)


def test_a_two_engine_misfit_on_one_gpu_names_the_one_gpu_fix():
    with pytest.raises(GpuPlacementError, match="share the one GPU: one explorer with .*engine_num 1"):
        place_gpus(1, _demand(engine_num=2))


def test_the_shared_gpu_sends_weights_through_gloo_for_the_trainer_and_every_explorer():
    config = load_config(text=ONE_GPU, environ={})
    r = resolve(config)
    assert r.shared_gpu and r.gpu_placement.trainer == (0,)
    assert config.synchronizer.sync_method == "nccl" and r.weight_sync_backend == "gloo"
    # the synchronizer hands the backend to every member in its GroupInfo
    settings = SynchronizerSettings.from_config(config)
    assert settings.backend == "gloo"
    rdv = Rendezvous(backend=settings.backend)
    rdv.rebuild(
        [
            Member("trainer", Role.TRAINER, address="127.0.0.1:50051", seq=1),
            Member("explorer", Role.EXPLORER, address="127.0.0.1:50052", seq=2),
        ]
    )
    trainer, explorer = rdv.assignment("trainer"), rdv.assignment("explorer")
    assert trainer is not None and explorer is not None
    assert (trainer.ranks, explorer.ranks) == ((0,), (1,))
    assert trainer.info.backend == explorer.info.backend == "gloo"
    # a member's own options (the trainer's offer of a group) follow the same rule
    assert transport_options(config, device="cuda:0").backend == "gloo"


def test_an_explicit_nccl_backend_on_the_shared_gpu_is_refused_naming_the_fix():
    with pytest.raises(ConfigError) as err:
        load_config(text=ONE_GPU + "synchronizer: {group_backend: nccl}\n", environ={})
    msg = str(err.value)
    assert "synchronizer.group_backend is nccl" in msg and "share one GPU" in msg
    assert "group_backend: auto" in msg and "cluster.gpu_per_node: 2" in msg
    # gloo is what the shared GPU uses anyway; another method needs no group
    assert (
        resolve(load_config(text=ONE_GPU + "synchronizer: {group_backend: gloo}\n")).weight_sync_backend
        == "gloo"
    )
    load_config(text=ONE_GPU + "synchronizer: {sync_method: memory}\n", environ={})


def test_two_gpus_keep_nccl_and_an_explicit_backend():
    config = load_config(text=BASE + "cluster: {gpu_per_node: 2}\n", environ={})
    r = resolve(config)
    assert not r.shared_gpu and r.weight_sync_backend == "auto"
    assert SynchronizerSettings.from_config(config).backend == "auto"
    forced = load_config(text=BASE + "cluster: {gpu_per_node: 2}\nsynchronizer: {group_backend: nccl}\n")
    assert resolve(forced).weight_sync_backend == "nccl"


def test_cpu_configs_resolve_as_before():
    config = load_config(text=BASE, environ={})
    r = resolve(config)
    assert config.cluster.gpu_per_node == 0 and not r.shared_gpu
    assert r.weight_sync_backend == "auto" and SynchronizerSettings.from_config(config).backend == "auto"
    assert transport_options(config).backend == "auto"
    assert r.rollout_gpu_memory_utilization is None  # the hf engine is not capped
    rollout = r.rollout_model
    assert "gpu_memory_utilization" not in rollout.model_fields_set and not rollout.enable_sleep_mode
    assert r.gpu_placement.explorers == ((),) and r.gpu_placement.trainer == ()


def test_the_rollout_memory_share_comes_from_the_placement_unless_set():
    hf = resolve(load_config(text=ONE_GPU, environ={}))
    assert hf.rollout_gpu_memory_utilization == SHARED_GPU_ROLLOUT_MEMORY == 0.3
    assert hf.rollout_model.gpu_memory_utilization == 0.3
    assert "gpu_memory_utilization" in hf.rollout_model.model_fields_set  # the hf engine caps at it
    assert not hf.rollout_model.enable_sleep_mode
    vllm = resolve(load_config(text=ONE_GPU + "explorer: {rollout_model: {engine_type: vllm}}\n"))
    assert vllm.rollout_model.gpu_memory_utilization == 0.3 and vllm.rollout_model.enable_sleep_mode
    own = resolve(
        load_config(
            text=ONE_GPU
            + "explorer: {rollout_model: {engine_type: vllm, gpu_memory_utilization: 0.4, enable_sleep_mode: false}}\n"
        )
    )
    assert own.rollout_model.gpu_memory_utilization == 0.4 and not own.rollout_model.enable_sleep_mode
    # a dedicated GPU keeps vLLM's default; an hf engine is capped only when the config sets it
    split = resolve(load_config(text=BASE + "cluster: {gpu_per_node: 2}\n"))
    assert split.rollout_gpu_memory_utilization is None
    split_vllm = resolve(
        load_config(
            text=BASE + "cluster: {gpu_per_node: 2}\nexplorer: {rollout_model: {engine_type: vllm}}\n"
        )
    )
    assert split_vllm.rollout_gpu_memory_utilization == 0.9
    assert not split_vllm.rollout_model.enable_sleep_mode
