"""A trainer that spans nodes: two torchrun agents on this host, each one node of `--nnodes 2` meeting
at node 0 by torchrun's static rendezvous (what `python -m services.trainer` runs with `trainer.nnodes:
2`), train one FSDP2 group. Its step equals one node's 2-rank step on the same batch; when a node is
SIGKILLed, rank 0's next step fails at once instead of hanging until a collective timeout; when node 0
is, node 1 ends at once.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from launcher.tiny_model import make_tiny_model
from services.trainer.distributed import free_port
from services.trainer.nodes import node_place
from tests.support.rft_run import ROOT, env, poll_until

pytestmark = pytest.mark.slow


def _agent(
    node_rank: int, nnodes: int, nproc: int, port: int, args: list[str], log: Path
) -> subprocess.Popen:
    """One node's torchrun agent, in a process group of its own (so a test can kill the whole node)."""
    if nnodes > 1:
        place = node_place(nnodes, {"RFT_TRAINER_NODE_RANK": str(node_rank), "RFT_TRAINER_MASTER_ADDR": "127.0.0.1",
                                    "RFT_TRAINER_MASTER_PORT": str(port)})  # fmt: skip
        rendezvous = place.torchrun_args()
    else:
        rendezvous = ["--standalone"]
    argv = [sys.executable, "-m", "torch.distributed.run", *rendezvous, f"--nproc_per_node={nproc}",
            "-m", "tests.support.trainer_node_step", *args]  # fmt: skip
    child_env = env() | {"OMP_NUM_THREADS": "1"}
    return subprocess.Popen(argv, cwd=ROOT, env=child_env, stdout=log.open("wb"), stderr=subprocess.STDOUT,
                            start_new_session=True)  # fmt: skip


def _kill_node(agent: subprocess.Popen) -> None:
    """SIGKILL a node as a dying host ends it: the agent and every process under it (torchrun starts
    its workers in sessions of their own, so the agent's process group is not enough)."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            pid, rest = stat.read_text().split(" (", 1)
        except OSError:
            continue
        children.setdefault(int(rest.rsplit(") ", 1)[1].split()[1]), []).append(int(pid))
    todo, tree = [agent.pid], []
    while todo:
        pid = todo.pop()
        tree.append(pid)
        todo.extend(children.get(pid, []))
    for pid in tree:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def _wait(procs: list[subprocess.Popen], logs: list[Path], timeout_s: float = 240) -> list[int]:
    codes = [p.wait(timeout_s) for p in procs]
    assert codes == [0] * len(procs), "\n".join(log.read_text()[-3000:] for log in logs)
    return codes


def test_two_nodes_step_as_one_node_with_two_ranks(tmp_path):
    model = make_tiny_model(tmp_path / "tiny")
    one_log = tmp_path / "one.log"
    one = _agent(0, 1, 2, free_port(), [str(model), str(tmp_path / "r1"), str(tmp_path / "one.pt")], one_log)
    _wait([one], [one_log])
    port = free_port()
    logs = [tmp_path / f"node{k}.log" for k in range(2)]
    nodes = [_agent(k, 2, 1, port, [str(model), str(tmp_path / "r2"), str(tmp_path / "two.pt")], logs[k])
             for k in range(2)]  # fmt: skip
    _wait(nodes, logs)
    a, b = (
        torch.load(tmp_path / "one.pt", weights_only=True),
        torch.load(tmp_path / "two.pt", weights_only=True),
    )
    assert a["world"] == b["world"] == 2
    for key in ("actor/pg_loss", "actor/grad_norm", "actor/entropy"):
        assert b["metrics"][key] == a["metrics"][key], key  # the same ranks and reductions: exactly equal
    for name, w in a["weights"].items():
        assert torch.equal(b["weights"][name], w), name


def test_a_killed_node_fails_rank_0s_next_step_at_once(tmp_path):
    model = make_tiny_model(tmp_path / "tiny")
    fifo = tmp_path / "go"
    os.mkfifo(fifo)
    port, out = free_port(), tmp_path / "two.pt"
    logs = [tmp_path / f"node{k}.log" for k in range(2)]
    nodes = [_agent(k, 2, 1, port, [str(model), str(tmp_path / "r"), str(out), str(fifo)], logs[k])
             for k in range(2)]  # fmt: skip
    try:
        poll_until(lambda: out.exists() or any(p.poll() is not None for p in nodes), 240, "the first step")
        assert out.exists(), "\n".join(log.read_text()[-3000:] for log in logs)
        _kill_node(nodes[1])  # node 1: its agent and its rank, as a host that dies
        nodes[1].wait(30)
        with fifo.open("w") as pipe:
            pipe.write("go")
        assert nodes[0].wait(120) != 0  # node 0 ends (a container restarts, a Job's pod is replaced)
        seconds, outcome = Path(str(out) + ".second").read_text().split("\n", 1)
        assert outcome != "trained"
        assert float(seconds) < 10, outcome  # not the 1800 s collective timeout
    finally:
        for p in nodes:
            if p.poll() is None:
                _kill_node(p)


def test_a_killed_node_0_ends_the_other_nodes_at_once(tmp_path):
    """Node 0 (global rank 0, the one that serves gRPC) dies: node 1's rank, waiting for rank 0's next
    command, sees the group gone and its node ends non-zero, so its container or pod restarts and meets
    the restarted node 0, instead of waiting out a collective timeout."""
    model = make_tiny_model(tmp_path / "tiny")
    fifo = tmp_path / "go"
    os.mkfifo(fifo)  # rank 0 blocks on it after the first step, until it is killed
    port, out = free_port(), tmp_path / "two.pt"
    logs = [tmp_path / f"node{k}.log" for k in range(2)]
    nodes = [_agent(k, 2, 1, port, [str(model), str(tmp_path / "r"), str(out), str(fifo)], logs[k])
             for k in range(2)]  # fmt: skip
    try:
        poll_until(lambda: out.exists() or any(p.poll() is not None for p in nodes), 240, "the first step")
        assert out.exists(), "\n".join(log.read_text()[-3000:] for log in logs)
        _kill_node(nodes[0])
        start = time.monotonic()
        code = nodes[1].wait(60)
        assert code != 0, logs[1].read_text()[-3000:]
        assert time.monotonic() - start < 30, "node 1 outlived node 0 by more than its agent's shutdown"
    finally:
        for p in nodes:
            if p.poll() is None:
                _kill_node(p)
