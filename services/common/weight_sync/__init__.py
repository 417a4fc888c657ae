"""Weight transfer from the trainer to the explorers: the transport layer under the synchronizer.

Used by the trainer (sender), the explorers (receivers) and the synchronizer (coordination); it
imports only torch, safetensors, zstandard, `services.common` and `rft.v1`. Modules:

- `specs`      `TensorSpec` (name, dtype, shape) <-> `rft.v1.TensorMeta`; `specs_of(state_dict)`, `weights_digest`.
- `buckets`    byte-packed bucket plan shared by sender and receivers.
- `group`      `GroupInfo` (<-> `rft.v1.WeightSyncGroupInfo`), stateless gloo/nccl group, `free_port`.
- `broadcast`  `BroadcastGroup`: rank 0 `send`s bucketed buffers, receivers iterate `receive`.
- `codec`      safetensors bytes with tied weights and zero-copy decoding.
- `memory`     `state_dict_to_chunks` / `chunks_to_state_dict` (`rft.v1.WeightChunk`).
- `delta`      `make_delta` / `apply_delta`: what changed between two payloads (XOR, zstd, crc32).
- `fanout`     `plan_tree`: the k-ary tree explorers relay versions down (`synchronizer.fanout`).
- `relay`      `RelayStore` / `pull_version`: chunks forwarded as they arrive, re-parenting on failure.
- `relay_rpc`  the relay's `PullWeights` server (grpc), `PeerSources`, `RelayNode`, `serve_relay`.
- `relay_fetch` the explorer's fetch through its relay (`explorer_fetch`), falling back to the method's.
- `checkpoint` `CheckpointStore`: atomic versioned files, `latest` marker, pruning.
- `loading`    `load_weights(model, named_tensors)`: in place, dtype cast, tied weights.
- `transport`  `WeightTransport` protocol (prepare, build_group, send, receive, finalize), the
               `nccl`, `memory`, `checkpoint` transports, `make_transport(name)`.
- `method`     `SyncMethod`: one strategy per method (trainer send, explorer fetch, the synchronizer's
               rules, name, aliases, traits, wire dtype, transport), the one `SYNC_METHODS` registry,
               `sync_method(name)`.
- `methods`    the built-in methods `nccl`, `memory`, `checkpoint`; `bf16_wire`: `memory_bf16`.
- `errors`     `WeightSyncError` and its subclasses.
"""

from services.common.weight_sync.broadcast import BroadcastGroup, SendStats
from services.common.weight_sync.checkpoint import CheckpointStore, read_state_dict
from services.common.weight_sync.errors import (
    CheckpointNotFoundError,
    DeltaMismatchError,
    GroupBrokenError,
    MissingChunkError,
    StaleGenerationError,
    WeightSyncError,
)
from services.common.weight_sync.group import GroupInfo, free_port
from services.common.weight_sync.loading import WeightLoadError, load_weights
from services.common.weight_sync.memory import chunks_to_state_dict, state_dict_to_chunks
from services.common.weight_sync.method import (
    SYNC_METHODS,
    Receiver,
    Sender,
    SyncMethod,
    known_methods,
    sync_method,
)
from services.common.weight_sync.specs import (
    TensorSpec,
    specs_from_proto,
    specs_of,
    specs_to_proto,
    weights_digest,
)
from services.common.weight_sync.transport import (
    Delivery,
    TransportOptions,
    WeightTransport,
    make_transport,
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
