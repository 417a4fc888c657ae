"""Weight sync: how a trainer's weights reach the explorers, a wing of its own beside `services.common`.

Used by the trainer (sender), the explorers (receivers) and the synchronizer (coordination). It
imports torch, safetensors, zstandard, grpc, `services.common` and `rft.v1`; `services.common` never
imports it, and it imports no service (tests/unit/common/test_conventions.py). Layout:

- `method.py`     `SyncMethod`: one strategy per method (trainer send, explorer fetch, the
                  synchronizer's rules, name, aliases, traits, wire dtype, transport), the one
                  `SYNC_METHODS` registry, `sync_method(name)`, `make_transport(name)`.
- `transport.py`  `WeightTransport` protocol (prepare, build_group, send, receive, finalize) and the
                  `nccl`, `memory`, `checkpoint` transports; `transport_options(config)`.
- `errors.py`     `WeightSyncError` and its subclasses.
- `methods/`      the built-in methods: `builtin` (`nccl`, `memory`, `checkpoint`), `bf16`
                  (`memory_bf16`), `lora` (`lora_adapter`).
- `wire/`         the bytes: `specs` (`TensorSpec` <-> `rft.v1.TensorMeta`, `weights_digest`),
                  `buckets` (the bucket plan), `group` (`GroupInfo`, the stateless gloo/nccl group),
                  `broadcast` (`BroadcastGroup`), `codec` (safetensors with tied weights, zero-copy),
                  `chunks` (`rft.v1.WeightChunk` streams), `delta` (XOR, zstd, crc32), `files`
                  (`CheckpointStore`: atomic versioned files), `loading` (`load_weights`, in place).
- `tree/`         the memory methods' fan-out (`synchronizer.fanout`): `plan` (`plan_tree`, the k-ary
                  tree), `store` (`RelayStore`, `pull_version`), `server` (the relay's `PullWeights`
                  server, `RelayNode`, `serve_relay`), `notices` (version notices down the tree),
                  `fetch` (the explorer's fetch through its relay).
- `member/`       a member's side of the synchronizer: `client` (`SyncClient`), `away` (back off or
                  register again), `superseded` (a join that gives up on a stale generation),
                  `trainer_hook` (`TrainerSyncHook`), `explorer_gate` (`ExplorerSyncGate`), `follow`
                  (`follow_versions`: the in-flight follower's and serve mode's loop).
"""

from services.weight_sync.errors import (
    CheckpointNotFoundError,
    DeltaMismatchError,
    GroupBrokenError,
    MissingChunkError,
    StaleGenerationError,
    WeightSyncError,
)
from services.weight_sync.method import (
    SYNC_METHODS,
    Receiver,
    Sender,
    SyncMethod,
    known_methods,
    make_transport,
    sync_method,
)
from services.weight_sync.transport import (
    Delivery,
    TransportOptions,
    WeightTransport,
)
from services.weight_sync.wire.broadcast import BroadcastGroup, SendStats
from services.weight_sync.wire.chunks import chunks_to_state_dict, state_dict_to_chunks
from services.weight_sync.wire.files import CheckpointStore, read_state_dict
from services.weight_sync.wire.group import GroupInfo, free_port
from services.weight_sync.wire.loading import WeightLoadError, load_weights
from services.weight_sync.wire.specs import (
    TensorSpec,
    specs_from_proto,
    specs_of,
    specs_to_proto,
    weights_digest,
)

__all__ = [
    "SYNC_METHODS",
    "BroadcastGroup",
    "CheckpointNotFoundError",
    "CheckpointStore",
    "Delivery",
    "DeltaMismatchError",
    "GroupBrokenError",
    "GroupInfo",
    "MissingChunkError",
    "Receiver",
    "SendStats",
    "Sender",
    "StaleGenerationError",
    "SyncMethod",
    "TensorSpec",
    "TransportOptions",
    "WeightLoadError",
    "WeightSyncError",
    "WeightTransport",
    "chunks_to_state_dict",
    "free_port",
    "known_methods",
    "load_weights",
    "make_transport",
    "read_state_dict",
    "specs_from_proto",
    "specs_of",
    "specs_to_proto",
    "state_dict_to_chunks",
    "sync_method",
    "weights_digest",
]

known_methods()  # the built-in methods register on import of the package
