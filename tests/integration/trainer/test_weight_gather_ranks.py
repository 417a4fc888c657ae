"""`weight_gather`: the full weights of an FSDP2 model, one parameter at a time, in the wire dtype.

CPU: a 2-rank gloo FSDP2 model (spawned processes, as torchrun would start them) gathers exactly
what the distributed state-dict API gives, cast to the requested dtype, in the same order on every
rank, with one private storage per tensor (one host copy). GPU: a 1-rank FSDP2 bf16 model on CUDA
gathers bf16 CUDA tensors, which go through the broadcast path to a receiver in this process.
"""

from __future__ import annotations

import pytest
import torch
import torch.multiprocessing as mp
from torch import nn

from services.trainer.weight_gather import compute_dtype, gather_full, iter_full_tensors
from services.weight_sync import GroupInfo, free_port, specs_of
from services.weight_sync.wire.broadcast import BroadcastGroup

pytestmark = pytest.mark.slow


class Tiny(nn.Module):
    """Decoder-shaped: tied embedding / head, layers with an fp32 norm and an int buffer."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(33, 16)
        self.layers = nn.ModuleList(
            nn.Sequential(nn.Linear(16, 24), nn.LayerNorm(24), nn.Linear(24, 16)) for _ in range(3)
        )
        self.head = nn.Linear(16, 33, bias=False)
        self.head.weight = self.embed.weight
        self.register_buffer("steps", torch.arange(7, dtype=torch.int64))


def _sharded(device: str, param_dtype: torch.dtype | None) -> nn.Module:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    torch.manual_seed(0)
    model = Tiny().to(device)
    mesh = init_device_mesh(device.split(":")[0], (torch.distributed.get_world_size(),))
    mp_policy = MixedPrecisionPolicy(param_dtype=param_dtype)
    for layer in model.layers:
        fully_shard(layer, mesh=mesh, mp_policy=mp_policy)
    fully_shard(model, mesh=mesh, mp_policy=mp_policy)
    return model


def _reference(model: nn.Module) -> dict[str, torch.Tensor]:
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    opts = StateDictOptions(full_state_dict=True, cpu_offload=True)
    return {k: v.detach().clone() for k, v in get_model_state_dict(model, options=opts).items()}


def _env(rank: int, world: int, port: int) -> None:
    from tests.support.rank_env import set_rank_env

    set_rank_env(rank, world, port)


def _two_ranks(rank: int, port: int, out: str) -> None:
    _env(rank, 2, port)
    torch.set_num_threads(1)
    torch.distributed.init_process_group("gloo")
    try:
        model = _sharded("cpu", torch.bfloat16)
        ref = _reference(model)
        every_rank = list(iter_full_tensors(model, dtype=torch.bfloat16, rank0_only=False))
        rank0 = gather_full(model, dtype=torch.bfloat16)
        params = {p.to_local().untyped_storage().data_ptr() for p in model.parameters()}
        torch.save(
            {
                "ref": ref,
                "every_rank": every_rank,
                "rank0": rank0,
                "dtype": compute_dtype(model),
                "shares_param": [t.untyped_storage().data_ptr() in params for t in rank0.values()],
                "storage_bytes": sum(t.untyped_storage().nbytes() for t in rank0.values()),
                "storages": len({t.untyped_storage().data_ptr() for t in rank0.values()}),
            },
            f"{out}.{rank}",
        )
    finally:
        torch.distributed.destroy_process_group()


def test_two_rank_gather_equals_the_full_state_dict_cast_with_one_host_copy(tmp_path):
    out = str(tmp_path / "gather")
    mp.spawn(_two_ranks, args=(free_port(), out), nprocs=2, join=True)
    r0, r1 = (torch.load(f"{out}.{r}", weights_only=False) for r in range(2))
    ref = r0["ref"]
    assert r0["dtype"] == torch.bfloat16  # FSDP2's param_dtype is the wire dtype
    assert [n for n, _ in r0["every_rank"]] == [n for n, _ in r1["every_rank"]] == list(ref)
    want = {k: v.to(torch.bfloat16) if v.is_floating_point() else v for k, v in ref.items()}
    for rank in (r0, r1):
        for name, t in rank["every_rank"]:
            assert t.dtype == want[name].dtype and torch.equal(t, want[name]), name
    assert r1["rank0"] == {}  # the other ranks take part in the gathers and get nothing
    assert list(r0["rank0"]) == list(ref)
    for name, t in r0["rank0"].items():
        assert t.device.type == "cpu" and torch.equal(t, want[name]), name
    # one host copy: each tensor owns exactly its bytes in the wire dtype, shares nothing (tied
    # names get their own copy, as the state-dict API gives) and is no view of a parameter
    wire = sum(t.numel() * t.element_size() for t in want.values())
    fp32 = sum(t.numel() * t.element_size() for t in ref.values())
    assert r0["storage_bytes"] == wire < fp32
    assert r0["storages"] == len(ref) and not any(r0["shares_param"])
    assert "head.weight" in ref and torch.equal(ref["head.weight"], ref["embed.weight"])


def _cuda_rank0(port: int, info: GroupInfo, out: str) -> None:
    _env(0, 1, port)
    torch.cuda.set_device(0)
    torch.distributed.init_process_group("nccl", device_id=torch.device("cuda", 0))
    try:
        model = _sharded("cuda:0", torch.bfloat16)
        ref = _reference(model)
        got = gather_full(model, dtype=compute_dtype(model), device=None)  # left on the GPU
        want = {k: v.to(torch.bfloat16) if v.is_floating_point() else v for k, v in ref.items()}
        checks = {
            "names": list(got) == list(ref),
            "on_cuda": all(t.device.type == "cuda" for t in got.values()),
            "dtypes": all(got[k].dtype == want[k].dtype for k in want),
            "equal": all(torch.equal(got[k].cpu(), want[k]) for k in want),
        }
        torch.save({"checks": checks, "want": want}, out)
        with BroadcastGroup.join(info, 0) as group:  # gloo: CUDA tensors packed straight into buckets
            group.send(1, got)
    finally:
        torch.distributed.destroy_process_group()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_one_rank_bf16_fsdp_on_cuda_gathers_bf16_cuda_tensors_and_broadcasts_them(tmp_path):
    out = str(tmp_path / "cuda")
    ctx = mp.get_context("spawn")
    with torch.device("meta"):
        specs = tuple(
            specs_of(
                {
                    k: v.to(torch.bfloat16) if v.is_floating_point() else v
                    for k, v in Tiny().state_dict().items()
                }
            )
        )
    info = GroupInfo("127.0.0.1", free_port(), 2, specs=specs, timeout_s=120, backend="gloo")
    proc = ctx.Process(target=_cuda_rank0, args=(free_port(), info, out))
    proc.start()
    try:
        with BroadcastGroup.join(info, 1) as group:
            received = {k: v.clone() for k, v in group.receive(1)}
        proc.join(120)
        assert proc.exitcode == 0
        result = torch.load(out, weights_only=False)
        assert all(result["checks"].values()), result["checks"]
        assert list(received) == list(result["want"])
        for name, t in result["want"].items():
            assert received[name].dtype == t.dtype and torch.equal(received[name], t), name
    finally:
        if proc.is_alive():
            proc.kill()
