"""The weight-sync methods as strategies: the registry, the `memory_bf16` method (half the bytes, the
values an explorer ends up with), the senders' preconditions, and the rule that no code outside the
component compares method names."""

from __future__ import annotations

import ast
import asyncio
from pathlib import Path

import pytest
import torch

from services.common.registry import UnknownNameError
from services.weight_sync import (
    SYNC_METHODS,
    Receiver,
    Sender,
    SyncMethod,
    TransportOptions,
    WeightSyncError,
    chunks_to_state_dict,
    sync_method,
)

ROOT = Path(__file__).resolve().parents[3]
COMPONENT = ROOT / "services" / "weight_sync"


def _state() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    emb = torch.randn(256, 64, generator=g)
    return {
        "model.embed_tokens.weight": emb,
        "lm_head.weight": emb,  # tied
        "model.norm.weight": torch.randn(64, generator=g),
        "model.position_ids": torch.arange(16),
    }


def test_registry_has_each_method_with_its_traits():
    assert SYNC_METHODS.names() == ["checkpoint", "lora_adapter", "memory", "memory_bf16", "nccl"]
    assert sync_method("online") is sync_method("nccl") and sync_method("offline").name == "checkpoint"
    traits = {n: (sync_method(n).broadcast, sync_method(n).pushed) for n in SYNC_METHODS.names()}
    assert traits == {
        "nccl": (True, False),
        "memory": (False, True),
        "memory_bf16": (False, True),
        "lora_adapter": (False, True),
        "checkpoint": (False, False),
    }
    kinds = {n: sync_method(n).state_kind for n in SYNC_METHODS.names()}
    assert kinds == {n: "adapter" if n == "lora_adapter" else "full" for n in SYNC_METHODS.names()}
    with pytest.raises(UnknownNameError, match="did you mean"):
        sync_method("memroy")
    plugin = sync_method("services.weight_sync.methods.bf16:Bf16WireMethod")
    assert plugin is sync_method("memory_bf16")


def test_one_registry_entry_knows_its_name_aliases_traits_and_wire_dtype():
    """One registry (the former SYNC_METHODS + WEIGHT_TRANSPORTS and their alias tables): each entry
    knows its aliases, whether it pushes / broadcasts / uses checkpoint files, and its wire dtype."""
    entries = {
        n: (
            sync_method(n).aliases,
            sync_method(n).pushed,
            sync_method(n).broadcast,
            sync_method(n).checkpoint,
            sync_method(n).wire_dtype(torch.float32),
        )
        for n in SYNC_METHODS.names()
    }
    assert entries == {
        "nccl": (("online",), False, True, False, torch.float32),
        "memory": ((), True, False, False, torch.float32),
        "memory_bf16": ((), True, False, False, torch.bfloat16),
        "lora_adapter": ((), True, False, False, torch.float32),
        "checkpoint": (("offline",), False, False, True, torch.float32),
    }
    assert SYNC_METHODS.names(include_aliases=True) == sorted([*SYNC_METHODS.names(), "offline", "online"])
    for name in SYNC_METHODS.names(include_aliases=True):
        method = sync_method(name)
        assert SYNC_METHODS.canonical_name(name) == method.name and sync_method(method) is method
    assert sync_method("memory_bf16").wire_dtype(torch.int64) == torch.int64  # integers go as they are


def test_an_unknown_method_lists_the_choices():
    with pytest.raises(UnknownNameError) as info:
        sync_method("broadcast")
    message = str(info.value)
    for name in ("checkpoint", "lora_adapter", "memory", "memory_bf16", "nccl", "offline", "online"):
        assert name in message
    assert "package.module:object" in message


def test_bf16_on_the_wire_halves_the_bytes_and_keeps_ties_and_integers():
    state = _state()
    memory, bf16 = sync_method("memory"), sync_method("memory_bf16")
    # per name (the tied matrix twice): fp32 floats halve, the int64 buffer stays
    assert memory.wire_bytes(state) == 256 * 64 * 4 * 2 + 64 * 4 + 16 * 8
    assert bf16.wire_bytes(state) == 256 * 64 * 2 * 2 + 64 * 2 + 16 * 8
    pushed: list = []

    async def push(chunks):
        pushed.extend(chunks)

    sender = Sender(TransportOptions(chunk_bytes=1 << 14), push=push)
    sizes = {}
    for method in (memory, bf16):
        pushed.clear()
        asyncio.run(method.send(sender, 3, 7, state))
        sizes[method.name] = sum(len(c.data) for c in pushed)
        mv, got = chunks_to_state_dict(pushed)
        assert (mv.version, mv.step) == (3, 7)
        expected = method.as_received(state)
        for name, t in state.items():
            assert torch.equal(got[name].to(t.dtype), expected[name]), name
    assert sizes["memory_bf16"] < 0.52 * sizes["memory"], sizes
    received = sync_method("memory_bf16").as_received(state)
    assert received["model.position_ids"].dtype == torch.int64
    assert torch.equal(received["model.position_ids"], state["model.position_ids"])
    err = (received["lm_head.weight"] - state["lm_head.weight"]).abs() / state["lm_head.weight"].abs()
    assert 0 < err.max() <= 2**-8  # rounded, within bf16's half ulp


def test_senders_name_what_they_lack():
    state = _state()
    with pytest.raises(WeightSyncError, match="push to"):
        sync_method("memory_bf16").check_sender(Sender(TransportOptions()))
    with pytest.raises(WeightSyncError, match="weight-sync group"):
        sync_method("nccl").check_sender(Sender(TransportOptions()))
    with pytest.raises(WeightSyncError, match="weight receiver"):
        sync_method("nccl").fetch(None, Receiver(load=None))
    sync_method("checkpoint").check_sender(Sender(TransportOptions()))  # needs nothing from the trainer
    assert sync_method("memory").as_received(state) is state


def test_wants_fetch_per_method():
    from rft.v1 import common_pb2, synchronizer_pb2

    newer = synchronizer_pb2.WaitForVersionResponse(model_version=common_pb2.ModelVersion(version=5))
    pending = synchronizer_pb2.WaitForVersionResponse(
        model_version=common_pb2.ModelVersion(version=5), receive_broadcast=True
    )
    assert sync_method("memory").wants(newer, held=4) and not sync_method("memory").wants(newer, held=5)
    assert not sync_method("nccl").wants(newer, held=4)  # broadcast weights come only in a broadcast
    assert sync_method("nccl").wants(pending, held=5)


def _method_names() -> set[str]:
    return set(SYNC_METHODS.names(include_aliases=True))


def _compares_a_method_name(node: ast.AST, names: set[str]) -> bool:
    """`x == "nccl"`, `x != "memory"`, `x in ("nccl", ...)` where x's source mentions a method."""
    if not isinstance(node, ast.Compare):
        return False
    operands = [node.left, *node.comparators]
    consts = set()
    for op in operands:
        if isinstance(op, ast.Constant) and isinstance(op.value, str):
            consts.add(op.value)
        elif isinstance(op, (ast.Tuple, ast.List, ast.Set)):
            consts |= {e.value for e in op.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)}
    others = " ".join(ast.unparse(op) for op in operands if not isinstance(op, ast.Constant))
    return bool(consts & names) and "method" in others.lower()


def test_no_code_outside_the_component_branches_on_a_method_name():
    names = _method_names()
    found = []
    for folder in ("services", "launcher"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            if COMPONENT in path.parents or path.name.endswith(("_pb2.py", "_pb2_grpc.py")):
                continue
            tree = ast.parse(path.read_text(), str(path))
            found += [
                f"{path.relative_to(ROOT)}:{node.lineno}: {ast.unparse(node)}"
                for node in ast.walk(tree)
                if _compares_a_method_name(node, names)
            ]
    assert found == [], "weight-sync method branches outside services/weight_sync:\n" + "\n".join(found)


def test_the_rule_catches_a_branch():
    names = _method_names()
    for source in ('method == "nccl"', 'self.settings.method != "memory"', 'sync_method in ("online", "x")'):
        assert _compares_a_method_name(ast.parse(source, mode="eval").body, names), source
    for source in ('store == "memory"', 'backend == "nccl"'):
        assert not _compares_a_method_name(ast.parse(source, mode="eval").body, names), source


# The method is resolved from its name once per service, in its settings record; everything after holds
# the typed `SyncMethod` (no re-resolution, no look-up of a wire string, no literal method name).
SETTINGS_RECORDS = {f"services/{s}/settings.py" for s in ("trainer", "explorer", "synchronizer")}
RESOLVERS = {"sync_method", "make_transport"}


def _resolutions(tree: ast.AST) -> list[ast.Call]:
    """Calls of `sync_method(...)` (as a name or an attribute) and of the function `make_transport(name)`
    (not a typed method's own `method.make_transport(options)`)."""
    return [
        node
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and (
            getattr(node.func, "id", None) in RESOLVERS
            or (isinstance(node.func, ast.Attribute) and node.func.attr == "sync_method")
        )
    ]


def test_the_method_is_resolved_only_in_the_settings_records():
    found: dict[str, int] = {}
    for path in sorted((ROOT / "services").rglob("*.py")):
        rel = str(path.relative_to(ROOT))
        if rel in SETTINGS_RECORDS or path == COMPONENT / "method.py":  # method.py defines them
            continue
        calls = _resolutions(ast.parse(path.read_text(), rel))
        if calls:
            found[rel] = len(calls)
    assert found == {}, "resolve the sync method once, in the settings record, and pass it on typed"


def test_the_resolution_rule_catches_a_look_up():
    for source in (
        "sync_method(answer.sync_method)",
        'method = sync_method("nccl")',
        "self.method = sync_method(method)",
        'make_transport("nccl", options)',
        "weight_sync.sync_method(name)",
    ):
        assert len(_resolutions(ast.parse(source))) == 1, source
    assert _resolutions(ast.parse("self.make_transport(options); settings.sync_method.broadcast")) == []


def test_a_new_method_is_one_subclass_and_a_registry_entry():
    @SYNC_METHODS.register("memory_test_only")
    class Doubling(type(sync_method("memory"))):
        name = "memory_test_only"

        def encode(self, state):
            return {k: t * 2 for k, t in state.items()}

    try:
        method = sync_method("memory_test_only")
        assert isinstance(method, SyncMethod) and method.pushed and not method.broadcast
        state = {"w": torch.ones(4)}
        assert torch.equal(method.as_received(state)["w"], torch.full((4,), 2.0))
    finally:
        SYNC_METHODS._entries.pop("memory_test_only")
        SYNC_METHODS._canonical.pop("memory_test_only")


def test_lora_adapter_merge_checks_names_and_shapes(tmp_path):
    from safetensors.torch import save_file

    from services.weight_sync.methods.lora import merge_adapter, read_base_weights

    w = torch.randn(6, 4)
    save_file({"layer.weight": w, "other.weight": torch.zeros(2)}, str(tmp_path / "model.safetensors"))
    a, b = torch.randn(2, 4), torch.randn(6, 2)
    adapter = {"layer.weight#lora_A": a, "layer.weight#lora_B": b,
               "layer.weight#lora_scaling": torch.tensor([0.5], dtype=torch.float64)}  # fmt: skip
    base = read_base_weights(tmp_path, ["layer.weight"])
    assert set(base) == {"layer.weight"}  # only what the adapter needs is read
    assert torch.equal(merge_adapter(base, adapter)["layer.weight"], w + (b @ a) * 0.5)
    with pytest.raises(WeightSyncError, match="not in"):
        read_base_weights(tmp_path, ["missing.weight"])
    with pytest.raises(WeightSyncError, match="does not have"):
        merge_adapter({}, adapter)
    with pytest.raises(WeightSyncError, match=r"update is \(6, 4\), the weight \(4, 6\)"):
        merge_adapter({"layer.weight": torch.zeros(4, 6)}, adapter)
    with pytest.raises(WeightSyncError, match="model folder"):
        sync_method("lora_adapter").fetch(None, Receiver(load=None))


def test_a_bf16_wire_is_a_property_of_every_method_and_leaves_the_registered_one_alone():
    state = _state()
    for name in ("memory", "checkpoint", "nccl", "lora_adapter"):
        plain, bf16 = sync_method(name), sync_method(name, "bfloat16")
        assert plain.wire == "auto" and bf16.wire == "bfloat16" and bf16 is not plain
        assert type(bf16) is type(plain) and sync_method(name) is plain  # the shared instance unchanged
        assert (
            bf16.wire_dtype(torch.float32) == torch.bfloat16
            and plain.wire_dtype(torch.float32) == torch.float32
        )
        assert bf16.wire_dtype(torch.int64) == torch.int64 and bf16.wire_dtype(torch.float16) == torch.float16
        wire = bf16.encode(state)
        assert wire["lm_head.weight"] is wire["model.embed_tokens.weight"]  # ties stay one tensor
        assert (
            wire["lm_head.weight"].dtype == torch.bfloat16 and wire["model.position_ids"].dtype == torch.int64
        )
        assert plain.encode(state) is state
    assert sync_method(sync_method("memory"), "bfloat16").wire == "bfloat16"  # a resolved method too
    assert sync_method("memory_bf16").wire == "bfloat16"  # memory_bf16 is memory with a bf16 wire
    with pytest.raises(ValueError, match="wire dtype 'float16' is not one of auto, bfloat16"):
        sync_method("memory", "float16")


def test_the_checkpoint_method_with_a_bf16_wire_writes_bf16_files(tmp_path):
    from services.weight_sync.wire.files import read_state_dict

    state = _state()
    sender = Sender(TransportOptions(checkpoint_dir=str(tmp_path)))
    sizes = {}
    for wire in ("auto", "bfloat16"):
        method = sync_method("checkpoint", wire)
        delivery = asyncio.run(method.send(sender, 1 if wire == "auto" else 2, 1, state))
        got = read_state_dict(delivery.path, "cpu")
        sizes[wire] = Path(delivery.path).stat().st_size
        expected = method.as_received(state)
        for name, t in state.items():
            assert got[name].dtype == method.wire_dtype(t.dtype), name
            assert torch.equal(got[name].to(t.dtype), expected[name]), name
    assert sizes["bfloat16"] < 0.55 * sizes["auto"], sizes


def test_the_config_names_a_wire_dtype_it_does_not_know():
    from services.common.config import ConfigError, load_config

    assert load_config(text="synchronizer: {wire_dtype: bfloat16}\n").synchronizer.wire_dtype == "bfloat16"
    with pytest.raises(ConfigError, match=r"synchronizer\.wire_dtype") as err:
        load_config(text="synchronizer: {wire_dtype: float16}\n")
    assert "bfloat16" in str(err.value)
