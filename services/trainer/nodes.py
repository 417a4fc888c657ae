"""Where this trainer node sits in a trainer that spans hosts: its node rank and the rendezvous address.

`trainer.nnodes` N > 1 runs `trainer.nproc` ranks on each of N hosts as one FSDP2 group. Every node runs
the same command (`python -m services.trainer --config run.yaml`); what differs per node comes from the
environment, as the orchestrators give it:

- the node rank: `RFT_TRAINER_NODE_RANK`, else a Kubernetes indexed Job's `JOB_COMPLETION_INDEX`;
- the rendezvous: `RFT_TRAINER_MASTER_ADDR` (node 0's address, reachable from every node: the compose
  service name of node 0, or the pod's DNS name under a headless Service) and `RFT_TRAINER_MASTER_PORT`
  (default 29500).

The rendezvous is torchrun's static one: node K's ranks are K*nproc .. K*nproc+nproc-1, so global rank 0,
the one that serves gRPC and talks to the buffer and the synchronizer, is always on node 0, at the address
the other services know as the trainer's.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

DEFAULT_MASTER_PORT = 29500


class NodeError(ValueError):
    """The environment does not say where this node sits (the message says what to set)."""


@dataclass(frozen=True)
class NodePlace:
    nnodes: int
    node_rank: int
    master_addr: str
    master_port: int

    def torchrun_args(self) -> list[str]:
        return [
            f"--nnodes={self.nnodes}",
            f"--node_rank={self.node_rank}",
            f"--master_addr={self.master_addr}",
            f"--master_port={self.master_port}",
        ]


def node_place(nnodes: int, environ: Mapping[str, str] | None = None) -> NodePlace:
    """This node's place among `nnodes` trainer nodes, read from `environ` (default: os.environ)."""
    env = os.environ if environ is None else environ
    raw = env.get("RFT_TRAINER_NODE_RANK", env.get("JOB_COMPLETION_INDEX"))
    if raw is None:
        raise NodeError(
            f"trainer.nnodes is {nnodes}, so each trainer node needs its node rank: set RFT_TRAINER_NODE_RANK "
            f"(0 .. {nnodes - 1}; a Kubernetes indexed Job sets JOB_COMPLETION_INDEX)"
        )
    try:
        rank = int(raw)
    except ValueError:
        raise NodeError(f"the trainer node rank must be an integer, got {raw!r}") from None
    if not 0 <= rank < nnodes:
        raise NodeError(
            f"the trainer node rank is {rank}, but trainer.nnodes is {nnodes}: use 0 .. {nnodes - 1}"
        )
    addr = env.get("RFT_TRAINER_MASTER_ADDR", "")
    if not addr:
        raise NodeError(
            "a multi-node trainer meets at node 0: set RFT_TRAINER_MASTER_ADDR to node 0's address as "
            "every node reaches it (its compose service name, or its pod DNS name under the headless Service)"
        )
    port_raw = env.get("RFT_TRAINER_MASTER_PORT", str(DEFAULT_MASTER_PORT))
    try:
        port = int(port_raw)
    except ValueError:
        raise NodeError(f"RFT_TRAINER_MASTER_PORT must be a port number, got {port_raw!r}") from None
    if not 0 < port < 65536:
        raise NodeError(f"RFT_TRAINER_MASTER_PORT must be a port number, got {port}")
    return NodePlace(nnodes, rank, addr, port)
