"""Trainer step time across nodes: one FSDP2 group of 2 ranks as 2 nodes x 1 rank (two torchrun agents
meeting by the static rendezvous `trainer.nnodes: 2` uses) vs 1 node x 2 ranks (`--standalone`).

    python bench/trainer_nodes.py [--steps N] [--rounds R] [--quick]

Both groups train the same batches of the tiny model (gloo, CPU) interleaved in this run (R rounds of
each); rank 0 times each step after a warm-up step and the median over all rounds is reported. On one machine both groups talk over
loopback, so the ratio shows what the multi-node launch and rendezvous cost per step, not a network: across
hosts each layer's all-gather and reduce-scatter cross the link between them. The last line is one JSON
object; "ratio" is the 1-node median over the 2-node median (1.0: the same).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def rank_main(model_dir: str, root: str, out: str, steps: int) -> None:
    """One rank (run by torchrun): build the engine, train warm-up + `steps` steps, rank 0 writes timings."""
    import torch

    torch.set_num_threads(1)
    from services.common.config import load_config
    from services.trainer.collate import collate
    from services.trainer.distributed import ensure_process_group, exit_rank, leave_process_group
    from services.trainer.engine import FSDPEngine
    from services.trainer.settings import TrainerSettings
    from tests.support.trainer_data import make_experiences

    tree = {
        "checkpoint_root_dir": root,
        "model": {"model_path": model_dir},
        "algorithm": {"algorithm_type": "grpo", "repeat_times": 4, "kl_loss_fn": "none"},
        "buffer": {"batch_size": 4},
        "trainer": {"use_dynamic_bsz": False, "micro_batch_size_per_gpu": 8},
        "monitor": {"monitor_type": "none"},
    }
    import yaml

    path = Path(root) / "bench.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(tree))
    engine = FSDPEngine(TrainerSettings.from_config(load_config(path)), ensure_process_group())
    if engine.info.rank:
        engine.serve_workers()
        leave_process_group(engine.info)
        exit_rank(0)
    times = []
    for step in range(steps + 1):
        batch = collate(make_experiences(16, group_size=4, seed=step))
        start = time.perf_counter()
        engine.train_step(batch)
        times.append(time.perf_counter() - start)
    Path(out).write_text(json.dumps(times[1:]))
    engine.close()
    exit_rank(0)


def _group(nnodes: int, nproc: int, model: Path, tmp: Path, steps: int) -> list[float]:
    port = _free_port()
    out = tmp / f"times-{nnodes}x{nproc}.json"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": f"{ROOT}:{ROOT / 'protos'}"}
    procs = []
    for node in range(nnodes):
        rendezvous = (
            [f"--nnodes={nnodes}", f"--node_rank={node}", "--master_addr=127.0.0.1", f"--master_port={port}"]
            if nnodes > 1
            else ["--standalone"]
        )
        argv = [sys.executable, "-m", "torch.distributed.run", *rendezvous, f"--nproc_per_node={nproc}",
                __file__, "--rank-main", str(model), str(tmp / f"r{nnodes}"), str(out), str(steps)]  # fmt: skip
        procs.append(
            subprocess.Popen(argv, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        )
    for p in procs:
        _, err = p.communicate(timeout=600)
        if p.returncode != 0:
            raise SystemExit(f"a {nnodes}-node group failed:\n{err.decode()[-3000:]}")
    return json.loads(out.read_text())


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--rank-main":
        rank_main(*sys.argv[2:5], int(sys.argv[5]))
        return 0
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=3, help="interleaved runs of each group")
    parser.add_argument("--quick", action="store_true", help="3 steps, 1 round")
    args = parser.parse_args()
    steps = 3 if args.quick else args.steps
    if args.quick:
        args.rounds = 1
    from launcher.tiny_model import make_tiny_model

    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        model = make_tiny_model(tmp / "tiny")
        ones, twos = [], []
        for _ in range(args.rounds):  # interleaved: the machine's load drifts alike for both
            ones += _group(1, 2, model, tmp, steps)
            twos += _group(2, 1, model, tmp, steps)
        one, two = statistics.median(ones), statistics.median(twos)
    print(f"1 node x 2 ranks: {one * 1000:.1f} ms/step; 2 nodes x 1 rank: {two * 1000:.1f} ms/step")
    result = {"bench": "trainer_nodes", "steps": steps, "one_node_s": round(one, 4), "two_nodes_s": round(two, 4),
              "ratio": round(one / two, 3), "note": "one machine, loopback: launch and rendezvous, not a network"}  # fmt: skip
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
