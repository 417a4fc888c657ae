"""Weight sync: time to move a 10M- and a 50M-parameter model (fp32) from the trainer into an explorer's
model, for each `synchronizer.sync_method`, against a raw transfer of the same bytes.

- nccl (gloo on CPU): two processes; rank 0 `BroadcastGroup.send`s the state dict (64 MiB buckets),
  rank 1 `load_weights(model, group.receive())`; timed on rank 0 until every receiver acknowledged
  having loaded everything. Baseline: `torch.distributed.broadcast` of one flat buffer of the same
  bytes in a regular gloo process group, plus the same one-integer all-reduce as completion.
- memory: a `python -m services.synchronizer` process (sync_method memory); the trainer client
  `push_weights` (safetensors chunks of 4 MiB), the explorer client `pull_weights` and `load_weights`.
  Baseline: a bare grpc.aio server in its own process; the same number of bytes streamed to it in
  4 MiB messages (client stream) and streamed back (server stream), no (de)serialization.
- memory_bf16: the same path with the fp32 weights cast to bfloat16 on the trainer's side before the
  push (`sync_method: memory_bf16`; half the bytes), loaded (cast back) into the fp32 explorer model;
  compared with memory.
- memory_delta, memory_bf16_delta: delta pulls (`services/weight_sync/wire/delta.py`). Before each of these rows the
  trainer model takes a simulated training step (`weight_steps.py`: every weight moves a little, about
  `--bf16-change` of the bf16 words change, by default the fraction measured on the quickstart), the
  explorer holds the previous version, and the row times push + delta pull + load; the full rows
  (`memory`, `memory_bf16`: pulls without have_version) are their baseline. Reported: bytes on the
  wire (delta vs full payload) and times; target: delta bytes <= 0.5x the full bf16 payload.
- checkpoint: `CheckpointStore.save` (atomic, fsynced) then `read_state_dict` + `load_weights`
  (no baseline; reported for comparison).
- memory_star4, memory_tree4: fan-out (`synchronizer.fanout`): the trainer pushes once and 4 explorers'
  relays (`tree.server.serve_relay`, in this process) fetch the version, each then joining, decoding and
  loading its copy; timed until the last is loaded. Star: all 4 pull from the synchronizer (fanout 0,
  the baseline); tree: `plan_tree(fanout 2)`, the synchronizer sends 2 copies and each of those relays
  forwards chunks as they arrive to its child. Full payloads (no deltas), each mode its own relays.
Interleaved repetitions, median. Last line: one JSON object with the figures, the baselines, "ratio"
(baseline time / ours; top-level = the nccl method) and "target" (nccl <= 1.5x raw: 0.67; memory <=
2x raw: 0.5; "delta_bytes_ratio" = bf16 delta bytes / full bf16 bytes, "delta_target" 0.5).

    python bench/weight_sync.py [--quick] [--bf16-change FRACTION]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "protos"), str(ROOT / "bench")]

import grpc  # noqa: E402
import torch  # noqa: E402
from transformers import Qwen2Config, Qwen2ForCausalLM  # noqa: E402
from weight_steps import BF16_CHANGE, step_size_for, train_step  # noqa: E402

from services.common.rpc import create_channel  # noqa: E402
from services.weight_sync import (  # noqa: E402
    BroadcastGroup,
    CheckpointStore,
    GroupInfo,
    free_port,
    load_weights,
    read_state_dict,
    specs_of,
    sync_method,
)
from services.weight_sync.member.client import SyncClient  # noqa: E402
from services.weight_sync.tree.plan import ROOT as SYNCHRONIZER  # noqa: E402
from services.weight_sync.tree.plan import plan_tree  # noqa: E402
from services.weight_sync.tree.server import serve_relay  # noqa: E402
from services.weight_sync.wire.chunks import join_raw_chunks  # noqa: E402
from services.weight_sync.wire.codec import decode_state_dict  # noqa: E402

SIZES = {  # name -> (vocab, hidden, intermediate, layers, heads, kv heads)
    "10M": (8192, 256, 1024, 8, 4, 2),
    "50M": (16384, 512, 2048, 10, 8, 2),
}
_T0 = time.perf_counter()
CHUNK = 4 << 20
BUCKET = 64 << 20
RAW_SERVICE = "bench.RawBytes"


def progress(msg: str) -> None:
    print(f"[{time.perf_counter() - _T0:7.1f}s] {msg}", file=sys.stderr, flush=True)


def build_model(size: str, seed: int) -> Qwen2ForCausalLM:
    vocab, hidden, inter, layers, heads, kv = SIZES[size]
    cfg = Qwen2Config(
        vocab_size=vocab, hidden_size=hidden, intermediate_size=inter, num_hidden_layers=layers,
        num_attention_heads=heads, num_key_value_heads=kv, tie_word_embeddings=True, max_position_embeddings=512,
    )  # fmt: skip
    torch.manual_seed(seed)
    return Qwen2ForCausalLM(cfg).eval()


def nbytes_of(sd) -> int:
    seen, total = set(), 0
    for t in sd.values():
        if t.data_ptr() not in seen:
            seen.add(t.data_ptr())
            total += t.numel() * t.element_size()
    return total


def unique_state_dict(model) -> dict[str, torch.Tensor]:
    """What a trainer sends: one entry per tensor (the tied lm_head is the embedding)."""
    seen, out = set(), {}
    for name, t in model.state_dict().items():
        if t.data_ptr() not in seen:
            seen.add(t.data_ptr())
            out[name] = t
    return out


# ---- nccl method: two worker processes -------------------------------------------------------------
def _dist_worker(rank: int, conn, raw_port: int) -> None:
    torch.set_num_threads(1)
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{raw_port}", rank=rank, world_size=2)
    models = {s: build_model(s, seed=1 if rank == 0 else 2) for s in SIZES}
    sds = {s: unique_state_dict(m) for s, m in models.items()}
    groups: dict[str, BroadcastGroup] = {}
    while True:
        cmd = conn.recv()
        if cmd is None:
            break
        what, size, arg = cmd
        if what == "join":
            groups[size] = BroadcastGroup.join(arg, rank)
            conn.send(None)
            continue
        sd, total = sds[size], nbytes_of(sds[size])
        dist.barrier()
        t0 = time.perf_counter()
        if what == "ours":
            if rank == 0:
                groups[size].send(arg, sd)
            else:
                load_weights(models[size], groups[size].receive(arg))
        else:  # raw: one flat buffer of the same bytes, then the same completion all-reduce
            flat = torch.empty(total, dtype=torch.uint8) if rank else _flat(sd)
            dist.broadcast(flat, 0)
            dist.all_reduce(torch.ones(1, dtype=torch.int64), op=dist.ReduceOp.MIN)
        conn.send(time.perf_counter() - t0)
    for g in groups.values():
        g.close()
    dist.destroy_process_group()


def _flat(sd) -> torch.Tensor:
    return torch.cat([t.reshape(-1).view(torch.uint8) for t in sd.values()])


class DistPair:
    def __init__(self):
        ctx = mp.get_context("spawn")
        port = free_port()
        self.conns, self.procs = [], []
        for rank in (0, 1):
            parent, child = ctx.Pipe()
            p = ctx.Process(target=_dist_worker, args=(rank, child, port), daemon=True)
            p.start()
            self.conns.append(parent)
            self.procs.append(p)

    def run(self, what: str, size: str, arg) -> float:
        for c in self.conns:
            c.send((what, size, arg))
        times = [c.recv() for c in self.conns]
        return times[0] if what != "join" else 0.0

    def close(self) -> None:
        for c in self.conns:
            c.send(None)
        for p in self.procs:
            p.join(30)


# ---- memory method: synchronizer process + raw gRPC byte server ---------------------------------------
def _raw_server(port_queue) -> None:
    async def main():
        store: list[bytes] = []

        async def push(request_iterator, context):
            store.clear()
            async for data in request_iterator:
                store.append(data)
            return b""

        async def pull(request, context):
            for data in store:
                yield data

        ident = dict(request_deserializer=lambda b: b, response_serializer=lambda b: b)
        handlers = {
            "Push": grpc.stream_unary_rpc_method_handler(push, **ident),
            "Pull": grpc.unary_stream_rpc_method_handler(pull, **ident),
        }
        opts = [("grpc.max_send_message_length", 64 << 20), ("grpc.max_receive_message_length", 64 << 20)]
        server = grpc.aio.server(options=opts)
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(RAW_SERVICE, handlers),))
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        port_queue.put(port)
        await server.wait_for_termination()

    asyncio.run(main())


def start_synchronizer(workdir: Path) -> tuple[subprocess.Popen, int]:
    config, port_file = workdir / "sync.yaml", workdir / "sync.port"
    config.write_text(
        f"synchronizer:\n  sync_method: memory\n  chunk_bytes: {CHUNK}\nlog:\n  level: WARNING\n"
    )
    proc = subprocess.Popen(
        [sys.executable, "-m", "services.synchronizer", "--config", str(config), "--port-file", str(port_file)],
        cwd=ROOT, env={**os.environ, "PYTHONPATH": f"{ROOT}:{ROOT / 'protos'}", "OMP_NUM_THREADS": "1"},
    )  # fmt: skip
    deadline = time.monotonic() + 60
    while not port_file.exists():
        if time.monotonic() > deadline or proc.poll() is not None:
            raise RuntimeError("the synchronizer did not start")
        time.sleep(0.05)  # ok-sleep: polling for the port file with a deadline
    return proc, int(port_file.read_text())


async def memory_ours(
    trainer: SyncClient,
    explorer: SyncClient,
    sd,
    model,
    version: int,
    method: str = "memory",
    delta: bool = False,
) -> float:
    """Push `sd` as `method` puts it on the wire, pull it (with `delta`: a delta from the version
    `explorer` holds when the synchronizer keeps it; without: the full payload), load it."""
    t0 = time.perf_counter()
    wire = sync_method(method).encode(sd)
    await trainer.push_weights(wire, version=version, chunk_bytes=CHUNK)
    _, got = await explorer.pull_weights(delta=delta)
    load_weights(model, got)
    return time.perf_counter() - t0


FANOUT_N, FANOUT_K = 4, 2  # the fan-out rows: explorers, tree fanout


async def fanout_ours(
    trainer: SyncClient, relays: list, chains: list[list[str]], sd, model, version: int
) -> float:
    """Push `sd` once; every relay fetches it along its chain, then each copy is joined, decoded and
    loaded (into `model`, one after the other in this process); until the last is loaded."""
    t0 = time.perf_counter()
    await trainer.push_weights(sd, version=version, chunk_bytes=CHUNK)

    async def one(relay, chain: list[str]) -> None:
        stream = await relay.node.fetch(version, chain)
        got, base, data = join_raw_chunks(stream.chunks)
        assert base is None and got.version == version
        load_weights(model, decode_state_dict(data)[0])

    await asyncio.gather(*(one(r, c) for r, c in zip(relays, chains, strict=True)))
    return time.perf_counter() - t0


async def memory_raw(channel: grpc.aio.Channel, pieces: list[bytes]) -> float:
    push = channel.stream_unary(f"/{RAW_SERVICE}/Push", request_serializer=None, response_deserializer=None)
    pull = channel.unary_stream(f"/{RAW_SERVICE}/Pull", request_serializer=None, response_deserializer=None)
    t0 = time.perf_counter()
    await push(iter(pieces))
    received = [d async for d in pull(b"")]
    assert sum(map(len, received)) == sum(map(len, pieces))
    return time.perf_counter() - t0


def checkpoint_ours(store: CheckpointStore, sd, model, version: int) -> float:
    t0 = time.perf_counter()
    path = store.save(version, sd)
    load_weights(model, read_state_dict(path))
    return time.perf_counter() - t0


# ---- driver ----------------------------------------------------------------------------------------
async def run(reps: int, step_size: float) -> dict:
    torch.set_num_threads(1)
    gen = torch.Generator().manual_seed(0)
    wire_bytes: dict[str, dict[str, list[float]]] = {s: {} for s in SIZES}
    trainers = {s: build_model(s, 1) for s in SIZES}
    explorers = {s: build_model(s, 2) for s in SIZES}
    sds = {s: unique_state_dict(m) for s, m in trainers.items()}
    pieces = {s: [b.numpy().tobytes() for b in _flat(sd).split(CHUNK)] for s, sd in sds.items()}
    times: dict[str, dict[str, list[float]]] = {s: {} for s in SIZES}
    progress("models built")
    pair = DistPair()
    for i, size in enumerate(SIZES):
        info = GroupInfo("127.0.0.1", free_port(), 2, tuple(specs_of(sds[size])), generation=i + 1,
                         backend="gloo", timeout_s=600, bucket_bytes=BUCKET)  # fmt: skip
        pair.run("join", size, info)
    progress("broadcast groups joined")
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    raw_proc = ctx.Process(target=_raw_server, args=(q,), daemon=True)
    raw_proc.start()
    raw_channel = create_channel(f"127.0.0.1:{q.get(timeout=120)}", timeout_s=600)
    with tempfile.TemporaryDirectory() as tmp:
        sync_proc, port = start_synchronizer(Path(tmp))
        mk = lambda mid, role: SyncClient(  # noqa: E731
            create_channel(f"127.0.0.1:{port}", timeout_s=600), mid, role, timeout_s=60, sync_timeout_s=600,
            owns_channel=True,
        )  # fmt: skip
        trainer, explorer = mk("trainer", "trainer"), mk("explorer", "explorer")
        deltas = {(s, m): mk(f"delta-{s}-{m}", "explorer") for s in SIZES for m in ("memory", "memory_bf16")}
        for c in (trainer, explorer, *deltas.values()):
            await c.register()
        relays, chains = {}, {}  # the fan-out rows: each mode its own relays, so a chain never changes
        relay_channel = create_channel(f"127.0.0.1:{port}", timeout_s=600)
        for mode, k in (("star", 0), ("tree", FANOUT_K)):
            names = [f"{mode}-e{i}" for i in range(FANOUT_N)]
            relays[mode] = [
                await serve_relay(relay_channel, n, timeout_s=60, sync_timeout_s=600) for n in names
            ]
            address = {n: r.address for n, r in zip(names, relays[mode], strict=True)} | {
                SYNCHRONIZER: SYNCHRONIZER
            }
            plan = plan_tree(names, k)
            chains[mode] = [[address[a] for a in plan[n]] for n in names]
        progress("servers up")
        store = CheckpointStore(Path(tmp) / "state_dicts", keep=1)
        version, pushed = 0, 0

        def nxt() -> int:  # every push a new, higher version
            nonlocal pushed
            pushed += 1
            return pushed

        async def delta_row(size: str, method: str) -> tuple[float, float, float]:
            """(seconds, delta bytes, changed fraction): the explorer holds the current version,
            the trainer steps, pushes, the explorer pulls the delta and loads it."""
            client = deltas[size, method]
            await memory_ours(trainer, client, sds[size], explorers[size], nxt(), method, True)  # the base
            changed = train_step(trainers[size].parameters(), step_size, gen)[method == "memory_bf16"]
            before = client.pulled_bytes_delta
            seconds = await memory_ours(trainer, client, sds[size], explorers[size], nxt(), method, True)
            got = client.pulled_bytes_delta - before
            assert got, f"{method} {size}: the pull was not a delta"
            return seconds, got, changed

        try:
            for rep in range(reps + 1):  # repetition 0 warms up and is dropped
                for size in SIZES:
                    version += 1
                    row = {
                        "nccl": pair.run("ours", size, version),
                        "nccl_raw": pair.run("raw", size, None),
                        "memory": await memory_ours(trainer, explorer, sds[size], explorers[size], nxt()),
                        "memory_raw": await memory_raw(raw_channel, pieces[size]),
                        "memory_bf16": await memory_ours(
                            trainer, explorer, sds[size], explorers[size], nxt(), "memory_bf16"
                        ),
                    }
                    for method in ("memory", "memory_bf16"):
                        t, nbytes, changed = await delta_row(size, method)
                        row[f"{method}_delta"] = t
                        if rep:
                            wire_bytes[size].setdefault(f"{method}_delta", []).append(nbytes)
                            wire_bytes[size].setdefault(f"{method}_changed", []).append(changed)
                    row["checkpoint"] = checkpoint_ours(store, sds[size], explorers[size], version)
                    for mode in ("star", "tree") if rep % 2 == 0 else ("tree", "star"):
                        row[f"memory_{mode}{FANOUT_N}"] = await fanout_ours(
                            trainer, relays[mode], chains[mode], sds[size], explorers[size], nxt()
                        )
                    progress(f"rep {rep} {size}: " + " ".join(f"{k}={v:.3f}" for k, v in row.items()))
                    if rep:
                        for k, v in row.items():
                            times[size].setdefault(k, []).append(v)
            assert all(torch.equal(a, b) for a, b in zip(trainers["50M"].state_dict().values(),
                                                           explorers["50M"].state_dict().values(), strict=True))  # fmt: skip
        finally:
            progress("closing")
            for c in (trainer, explorer, *deltas.values()):
                await c.close()
            for r in (*relays["star"], *relays["tree"]):
                await r.close()
            await relay_channel.close()
            await raw_channel.close()
            sync_proc.terminate()
            sync_proc.wait(30)
            raw_proc.terminate()
            pair.close()
    med = {s: {k: statistics.median(v) for k, v in t.items()} for s, t in times.items()}
    return med, {s: {k: statistics.median(v) for k, v in b.items()} for s, b in wire_bytes.items()}, sds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="3 repetitions instead of 7")
    parser.add_argument(
        "--bf16-change", type=float, default=BF16_CHANGE,
        help="fraction of bf16 words a simulated training step changes (default: measured on the quickstart)",
    )  # fmt: skip
    args = parser.parse_args()
    reps = 3 if args.quick else 7
    step_size = step_size_for(args.bf16_change)
    med, nbytes, sds = asyncio.run(run(reps, step_size))
    progress("done")
    out: dict = {"unit": "seconds (median)", "repetitions": reps, "dtype": "float32", "sizes": {}}
    print(f"{'model':>6} {'MB':>7} {'nccl(gloo)':>11} {'raw bcast':>10} {'ratio':>6} "
          f"{'memory':>8} {'raw grpc':>9} {'ratio':>6} {'checkpoint':>11}")  # fmt: skip
    for size, m in med.items():
        mb = nbytes_of(sds[size]) / 1e6
        rn, rm = m["nccl_raw"] / m["nccl"], m["memory_raw"] / m["memory"]
        print(f"{size:>6} {mb:7.1f} {m['nccl']:11.3f} {m['nccl_raw']:10.3f} {rn:6.2f} "
              f"{m['memory']:8.3f} {m['memory_raw']:9.3f} {rm:6.2f} {m['checkpoint']:11.3f}")  # fmt: skip
        out["sizes"][size] = {
            "megabytes": round(mb, 1),
            "nccl": {"ours_s": m["nccl"], "baseline_s": m["nccl_raw"], "ratio": round(rn, 3), "target": 0.67},
            "memory": {
                "ours_s": m["memory"],
                "baseline_s": m["memory_raw"],
                "ratio": round(rm, 3),
                "target": 0.5,
            },
            "memory_bf16": {
                "ours_s": m["memory_bf16"],
                "wire_megabytes": round(sync_method("memory_bf16").wire_bytes(sds[size]) / 1e6, 1),
                "speedup_vs_memory": round(m["memory"] / m["memory_bf16"], 3),
            },
            "checkpoint": {"ours_s": m["checkpoint"]},
        }
        print(f"{'':>6} memory_bf16 {m['memory_bf16']:.3f} s "
              f"({m['memory'] / m['memory_bf16']:.2f}x memory, half the bytes)")  # fmt: skip
        for method in ("memory", "memory_bf16"):
            full_b = sync_method(method).wire_bytes(sds[size])
            d_b, changed = nbytes[size][f"{method}_delta"], nbytes[size][f"{method}_changed"]
            out["sizes"][size][f"{method}_delta"] = {
                "ours_s": m[f"{method}_delta"], "full_s": m[method],
                "delta_megabytes": round(d_b / 1e6, 2), "full_megabytes": round(full_b / 1e6, 1),
                "bytes_ratio": round(d_b / full_b, 4), "changed_fraction": round(changed, 4),
                "speedup_vs_full": round(m[method] / m[f"{method}_delta"], 3),
            }  # fmt: skip
            print(f"{'':>6} {method}_delta {m[f'{method}_delta']:.3f} s (full {m[method]:.3f} s), "
                  f"{d_b / 1e6:.2f} MB on the wire vs {full_b / 1e6:.1f} MB full ({d_b / full_b:.3f}x), "
                  f"{changed:.1%} of the words changed")  # fmt: skip
        star, tree = m[f"memory_star{FANOUT_N}"], m[f"memory_tree{FANOUT_N}"]
        out["sizes"][size]["fanout"] = {
            "explorers": FANOUT_N, "fanout": FANOUT_K, "star_s": star, "tree_s": tree,
            "ratio": round(star / tree, 3), "one_explorer_s": m["memory"],
        }  # fmt: skip
        print(f"{'':>6} fan-out to {FANOUT_N}: star {star:.3f} s, tree (fanout {FANOUT_K}) {tree:.3f} s "
              f"({star / tree:.2f}x); one explorer {m['memory']:.3f} s")  # fmt: skip
    big = out["sizes"]["50M"]
    out["ratio"] = big["nccl"]["ratio"]
    out["target"] = 0.67
    out["memory_ratio"] = big["memory"]["ratio"]
    out["memory_target"] = 0.5
    out["memory_bf16_speedup"] = big["memory_bf16"]["speedup_vs_memory"]
    out["bf16_change"] = args.bf16_change
    out["delta_bytes_ratio"] = big["memory_bf16_delta"]["bytes_ratio"]
    out["delta_bytes_ratio_fp32"] = big["memory_delta"]["bytes_ratio"]
    out["delta_target"] = 0.5
    out["fanout_ratio"] = big["fanout"]["ratio"]  # star / tree time to load 4 explorers, 50M
    print(json.dumps(out))


if __name__ == "__main__":
    main()
