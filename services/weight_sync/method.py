"""`SyncMethod`: one strategy object per weight-sync method (`synchronizer.sync_method`), and the one
registry of methods (`SYNC_METHODS`): each entry knows its name and aliases, whether it pushes,
broadcasts or uses checkpoint files, its wire dtype and its transport (transport.py).

A method owns everything that differs between methods, in one place, for all three roles:

- **the synchronizer's rules** (two traits): `broadcast` - the weights travel through a group the
  synchronizer hands out (ranks, generations, the ready handshake before a publish, and receivers hold
  only what they received, so a (re)joined one gets the published version re-broadcast); `pushed` -
  the trainer pushes the weights to the synchronizer, which keeps the latest version for explorers
  to pull (`PushWeights` / `PullWeights`).
- **the trainer's send**: `state_kind` - what it gathers (the full policy, or only a LoRA adapter);
  `check_sender(sender)` before the gather, `send(sender, version, step,
  state) -> Delivery`, then `published(client, result, generation)` completes the publish with the
  synchronizer (or `failed(...)` after an error).
- **the explorer's receive**: `wants(answer, held)` - does a `WaitForVersion` answer call for a fetch;
  `fetch(client, receiver)` - the callable that fetches and loads one version (`Receiver`: the load,
  the broadcast group member, the model folder).

Methods register in `SYNC_METHODS` (`@register_method`: the class's `name` and `aliases`);
`sync_method(name)` returns the (stateless) instance, and is called once per service, when its settings
record is built from the config (services/*/settings.py), so the rest holds the typed object. The
built-ins are in `methods/builtin.py` (`nccl`, `memory`, `checkpoint`), `methods/bf16.py` (`memory_bf16`) and
`methods/lora.py` (`lora_adapter`); adding a method is one module plus its line in `BUILTIN_MODULES`. A plug-in method is a
`package.module:Class` path. No code outside this component compares method names
(tests/unit/common/test_conventions.py). `make_transport(name, options)` builds an entry's transport.
"""

from __future__ import annotations

import copy
import importlib
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

import torch
from rft.v1 import common_pb2, synchronizer_pb2

from services.common.registry import Registry
from services.weight_sync.transport import Delivery, TransportOptions, WeightTransport

__all__ = [
    "BF16",
    "BUILTIN_MODULES",
    "SYNC_METHODS",
    "Published",
    "Receiver",
    "Sender",
    "SyncMethod",
    "make_transport",
    "register_method",
    "sync_method",
]

BF16 = "bfloat16"
WIRE_DTYPES = ("auto", BF16)  # synchronizer.wire_dtype
WIDE_DTYPES = (torch.float32, torch.float64)  # what a bf16 wire casts
Load = Callable[..., Awaitable[Any]]  # load(named_tensors, version, strict=True): into the engines
WaitAnswer = synchronizer_pb2.WaitForVersionResponse
Fetch = Callable[[WaitAnswer], Awaitable[int]]
PushFn = Callable[[Sequence[common_pb2.WeightChunk]], Awaitable[Any]]
BUILTIN_MODULES = (
    "services.weight_sync.methods.builtin",
    "services.weight_sync.methods.bf16",
    "services.weight_sync.methods.lora",
)


class Published(Protocol):
    version: int
    step: int
    checkpoint_path: str


@dataclass
class Sender:
    """What the trainer offers a method to send with: its transport options, the broadcast transport
    it joined (None until it joins a group) and the push to the synchronizer (None without one)."""

    options: TransportOptions
    group: WeightTransport | None = None
    push: PushFn | None = None


@dataclass
class Receiver:
    """What an explorer offers a method to fetch with: the load into its engines, its broadcast
    group member (`WeightReceiver`: `setup(info, first_rank)`, `receive(version)`) and the model
    folder its engines started from (the base weights)."""

    load: Load
    group: Any = None
    model_path: str = ""


class SyncMethod:
    """Base of every method; subclasses set the traits and implement `send` and `fetch`."""

    name = ""
    wire = "auto"  # the wire dtype (`with_wire`, `synchronizer.wire_dtype`)
    aliases: tuple[str, ...] = ()  # other names the config may use (Trinity-RFT's online, offline)
    broadcast = False  # the weights travel through a synchronizer-coordinated group
    pushed = False  # the trainer pushes the weights to the synchronizer; explorers pull them
    checkpoint = False  # the weights travel as safetensors files under the run folder
    state_kind = "full"  # what the trainer gathers to send: "full" (HF names) | "adapter" (LoRA A, B)
    # the `WeightTransport` class under this method (transport.py; None: a plug-in without one)
    transport: type[WeightTransport] | None = None

    def tree_fanout(self, fanout: int) -> int:
        """The fan-out of the relay tree this method's versions travel down with `synchronizer.fanout:
        fanout`: `fanout` for a pushed method with fanout > 0 (explorers pull, so they can relay to one
        another), else 0 (star: every member on the synchronizer). The one place this is decided; the
        synchronizer's and the explorer's settings records hold the answer."""
        return fanout if self.pushed and fanout > 0 else 0

    def make_transport(self, options: TransportOptions | None = None) -> WeightTransport:
        """This method's transport, built with `options`."""
        if self.transport is None:
            raise TypeError(f"weight sync method {self.name!r} has no transport")
        return self.transport(options or TransportOptions())

    def wire_dtype(self, dtype: torch.dtype) -> torch.dtype:
        """The dtype a tensor of `dtype` has on the wire: bf16 for fp32/fp64 when `wire` is
        "bfloat16", else `dtype` (what the trainer gathered: its training compute dtype)."""
        return torch.bfloat16 if self.wire == BF16 and dtype in WIDE_DTYPES else dtype

    def with_wire(self, wire: str) -> SyncMethod:
        """This method with `wire` ("auto": the training dtype; "bfloat16": floating tensors wider
        than bf16 are cast to bf16 before they are sent, `synchronizer.wire_dtype`)."""
        if wire not in WIRE_DTYPES:
            raise ValueError(f"wire dtype {wire!r} is not one of {', '.join(WIRE_DTYPES)}")
        if wire == self.wire:
            return self
        clone = copy.copy(self)
        clone.wire = wire
        return clone

    def encode(self, state: Mapping[str, torch.Tensor]) -> Mapping[str, torch.Tensor]:
        """The tensors as they go on the wire (`wire_dtype`); tied weights stay one tensor."""
        if all(self.wire_dtype(t.dtype) == t.dtype for t in state.values()):
            return state
        out: dict[str, torch.Tensor] = {}
        cast: dict[tuple, torch.Tensor] = {}  # tied weights stay one tensor (the codec sends it once)
        for name, t in state.items():
            dtype = self.wire_dtype(t.dtype)
            if dtype == t.dtype:
                out[name] = t
                continue
            key = (t.data_ptr(), t.dtype, tuple(t.shape), t.stride())
            if key not in cast:
                cast[key] = t.to(dtype)
            out[name] = cast[key]
        return out

    # ---- trainer ---------------------------------------------------------------------------------
    def check_sender(self, sender: Sender) -> None:
        """Raise `WeightSyncError` naming what is missing before anything is gathered."""

    async def send(
        self, sender: Sender, version: int, step: int, state: Mapping[str, torch.Tensor]
    ) -> Delivery:
        raise NotImplementedError

    def wire_bytes(self, state: Mapping[str, torch.Tensor]) -> int:
        """Bytes of weights this method puts on the wire for `state` (counted from the wire dtypes)."""
        return sum(t.numel() * self.wire_dtype(t.dtype).itemsize for t in state.values())

    def as_received(self, state: Mapping[str, torch.Tensor]) -> Mapping[str, torch.Tensor]:
        """`state` as an explorer holding the same dtypes ends up with (for digests): itself unless
        the wire dtype rounds it on the way."""
        wire = self.encode(state)
        return state if wire is state else {k: wire[k].to(t.dtype) for k, t in state.items()}

    async def published(self, client: Any, result: Published, generation: int) -> None:
        """The send succeeded: complete the publish with the synchronizer (`SyncClient`)."""

    async def failed(self, client: Any, generation: int, error: BaseException) -> None:
        """The send (or the join before it) failed: tell the synchronizer what it must know."""

    # ---- explorer --------------------------------------------------------------------------------
    def wants(self, answer: WaitAnswer, held: int) -> bool:
        """Does this `WaitForVersion` answer call for a fetch by an explorer holding `held`?"""
        return answer.receive_broadcast or (not self.broadcast and answer.model_version.version > held)

    def fetch(self, client: Any, receiver: Receiver) -> Fetch:
        """The explorer's fetch-and-load of one version through `client` (its `SyncClient`)."""
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"<sync method {self.name}>"


SYNC_METHODS: Registry[type[SyncMethod]] = Registry("weight sync method")
_INSTANCES: dict[type[SyncMethod], SyncMethod] = {}
_M = TypeVar("_M", bound=type[SyncMethod])


def register_method(cls: _M) -> _M:
    """Class decorator: register a method under its `name` and `aliases` (its own: a subclass of a
    method does not inherit the parent's aliases)."""
    cls.aliases = tuple(vars(cls).get("aliases", ()))
    SYNC_METHODS.add(cls.name, cls, *cls.aliases)
    return cls


def known_methods() -> list[str]:
    """Canonical names of the built-in methods (and of any registered plug-in)."""
    for module in BUILTIN_MODULES:
        importlib.import_module(module)
    return SYNC_METHODS.names()


def sync_method(name: str | SyncMethod, wire_dtype: str = "auto") -> SyncMethod:
    """The method named `name` (a name, an alias such as online -> nccl, offline -> checkpoint, or
    `pkg.mod:Class`); an unknown name lists the known ones. `wire_dtype` "bfloat16" sends fp32/fp64
    tensors as bf16 whatever the method (`SyncMethod.with_wire`); "auto" keeps the method's own."""
    if isinstance(name, SyncMethod):
        return name if wire_dtype == "auto" else name.with_wire(wire_dtype)
    known_methods()
    cls = SYNC_METHODS.get(name)
    if not (isinstance(cls, type) and issubclass(cls, SyncMethod)):
        raise TypeError(f"weight sync method {name!r} is {cls!r}, not a SyncMethod subclass")
    if cls not in _INSTANCES:
        _INSTANCES[cls] = cls()
    method = _INSTANCES[cls]
    return method if wire_dtype == "auto" else method.with_wire(wire_dtype)


def make_transport(name: str, options: TransportOptions | None = None) -> WeightTransport:
    """`make_transport("nccl", TransportOptions(device="cuda:0"))`: the transport of the method of that
    name in the one method registry (`SYNC_METHODS`); unknown names list the known ones."""
    return sync_method(name).make_transport(options)
