"""Fleet scale: how the buffer and the synchronizer hold up as the number of explorers N grows.

One real buffer service (`python -m services.buffer`, Redis store on a real `redis-server`) and one
real synchronizer (`python -m services.synchronizer`, `sync_method: memory`, fixed plan, interval 1,
offset 0 by default) run as processes, fresh for each N in 1, 4, 16, 64 (`--quick`: fewer steps).
N simulated explorers run as asyncio tasks in `--procs` worker processes (0 = in this process); each
step an explorer:
  - waits for the version the plan needs the real way (`ExplorerSyncGate` + `MemoryFetch`:
    `WaitForVersion`, `PullWeights` when newer, decode, `ReportSync`; with `--fanout K` > 0 through a
    relay, see below),
  - "generates" its batch with a modelled engine: no model compute, `asyncio.sleep(tokens / rate)`
    (`--tokens-per-s`, per explorer),
  - puts `--groups` groups of 8 real `Experience`s (64 prompt + 192 response tokens) with
    `BufferClient.put`.
A simulated trainer (this process) leases N explorer-steps of experiences per step (`get_batch`),
acks them and publishes weights of `--weights-mb` MB (fp32; `--sync-method memory_bf16` sends them as
bf16) through the synchronizer (`request_sync`, `push_weights`) for all N to pull. Before each push
its weights take a simulated optimizer step (`weight_steps.py`: every weight moves, about
`--bf16-change` of the bf16 words change, by default the fraction measured on the quickstart), so the
explorers' delta pulls (`have_version`, from the second version on) carry a realistic delta.

`--fanout K` (default 0: every explorer pulls from the synchronizer, the star) sets the synchronizer's
`synchronizer.fanout: K`, and each explorer does what the real one does then (`tree.fetch.explorer_fetch`):
it serves a relay beside itself (`tree.server.serve_relay`), sets it as `SyncClient.relay` before it
registers (the registration carries the relay's address, so the synchronizer puts it in its K-ary tree)
and fetches through it (`relay_fetch`: the version along the answer's `weight_sources`, then the same
`MemoryFetch` over the relay's copy; when the relay cannot bring it, a pull from the synchronizer as in
the star). The relay closes with the `SyncClient`. Per N, over all explorers: `relay_loads` (versions
loaded from the relays), `relay_delta_loads` (of those, the ones relayed as a delta; the relays
carry deltas: tree/store.py "Deltas") and `relay_fallbacks` (versions the relay could not bring, pulled from the synchronizer
instead). The byte figures below count what an explorer received, from the synchronizer
(`SyncClient.pulled_bytes_*`) or from its relay's copy (`relayed_bytes_*`).

Measured per N over steps 2..S (step 1 warms up): experiences/s through the buffer (acked), put
latency p50/p99 (each explorer's `put`), lease latency p50/p99 (from the moment the step's last put
returned, or the lease call if later, until the trainer holds the whole step), the time for a weight
version to reach all N explorers (push start to the last explorer's load, median over versions),
synchronizer CPU seconds per step (/proc/<pid>/stat; a delta is computed once per version, whatever
N): `sync_cpu_s_per_step` over the whole run (the members' registration, first waits and leaving
included) and `sync_cpu_s_per_step_steady` from the trainer holding step 1 to holding the last, the bytes an explorer pulled per delta pull (`delta_bytes_per_explorer`, median over explorers;
over `payload_bytes`, one full version: `delta_bytes_ratio`) and in full over the whole run
(`full_bytes_per_explorer`: one payload when every later pull was a delta) and how busy the client processes were (CPU seconds / wall seconds, the busiest process;
near 1.0 = it saturates). The knee (`knee()`) is the
first N where experiences/s per explorer fall below 80% of the smallest N's or a p99 latency jumps.
Last line: one JSON object (docs/conventions.md): the per-N figures, "fanout" (K), "ratio" = total
experiences/s at N=64 over N=4 (the fleet keeps its throughput as it grows) and "target" 0.9, and,
when N=4 and N=64 were both measured (else null), the fan-out issue's figures with their targets:
"reach_all_64_over_4" = reach_all_s at N=64 over N=4's (target <= 2.0), "reach_all_64_s" = reach_all_s
at N=64 (target <= 0.15 s) and "per_explorer_64_over_4" = per_explorer_per_s at N=64 over N=4's
(target >= 0.7); each target is also a key (`<key>_target`).

    python bench/scale.py [--quick] [--ns 1,4,16,64] [--procs 4] [--weights-mb 4] [--steps 12]
                          [--sync-method memory|memory_bf16] [--bf16-change FRACTION] [--fanout K]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import multiprocessing as mp
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "protos"), str(ROOT / "bench")]

import torch  # noqa: E402
from weight_steps import BF16_CHANGE, step_size_for, train_step  # noqa: E402

from services.common.buffer_client import BufferClient  # noqa: E402
from services.common.config.sync_plan import SyncPlan  # noqa: E402
from services.common.experience import Experience, ExperienceId  # noqa: E402
from services.common.log import configure_logging  # noqa: E402
from services.common.rpc import create_channel  # noqa: E402
from services.weight_sync import sync_method  # noqa: E402
from services.weight_sync.member.client import SyncClient  # noqa: E402
from services.weight_sync.member.explorer_gate import ExplorerSyncGate  # noqa: E402
from services.weight_sync.method import Receiver  # noqa: E402
from services.weight_sync.methods.builtin import MemoryFetch  # noqa: E402
from services.weight_sync.tree.fetch import RelayFetch, relay_fetch  # noqa: E402
from services.weight_sync.tree.notices import tree_wait  # noqa: E402
from services.weight_sync.tree.server import serve_relay  # noqa: E402

GROUP, PROMPT, RESPONSE = 8, 64, 192
CLK_TCK = os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class FleetParams:
    steps: int = 12
    groups: int = 2  # groups of GROUP experiences per explorer step
    tokens_per_s: float = 20_000.0  # modelled generation rate of one explorer
    weights_mb: float = 4.0
    sync_offset: int = 0
    method: str = "memory"
    bf16_change: float = BF16_CHANGE  # per version: the fraction of bf16 words the trainer's step changes
    fanout: int = 0  # synchronizer.fanout: 0 = every explorer pulls from the synchronizer; k > 0 = relay tree


@dataclass
class ExplorerLog:
    put_s: list[float] = field(default_factory=list)  # latency of each put, steps 2..S
    put_end: dict[int, float] = field(default_factory=dict)  # step -> when its put returned
    loaded: dict[int, float] = field(default_factory=dict)  # version -> when it was loaded
    cpu_s: float = 0.0
    wall_s: float = 0.0
    pulled_full: int = 0  # bytes pulled as full payloads / as deltas, and how many pulls
    pulled_delta: int = 0
    pulls: int = 0
    fallbacks: int = 0  # deltas that did not apply (pulled again in full)
    relay_loads: int = 0  # fan-out: versions loaded from this explorer's relay
    relay_delta_loads: int = 0  # fan-out: of relay_loads, the versions relayed as a delta
    relay_fallbacks: int = 0  # fan-out: versions the relay could not bring (pulled from the synchronizer)
    waits_at_synchronizer: int = 0  # fan-out: waits the synchronizer answered (the rest: the parent's relay)
    waits_at_parent: int = 0


def cpu_seconds(pid: int) -> float:
    """utime + stime of a process (and its waited-for children) from /proc/<pid>/stat."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return sum(int(x) for x in fields[11:15]) / CLK_TCK


def start_service(module: str, yaml: str, workdir: Path) -> tuple[subprocess.Popen, int]:
    """`python -m services.<module> --config` in `workdir`; returns the process and its port."""
    config, port_file = workdir / f"{module}.yaml", workdir / f"{module}.port"
    config.write_text(yaml)
    proc = subprocess.Popen(
        [sys.executable, "-m", f"services.{module}", "--config", str(config), "--port-file", str(port_file)],
        cwd=ROOT, env={**os.environ, "PYTHONPATH": f"{ROOT}:{ROOT / 'protos'}", "OMP_NUM_THREADS": "1"},
        stdout=open(workdir / f"{module}.log", "w"), stderr=subprocess.STDOUT,  # noqa: SIM115
    )  # fmt: skip
    deadline = time.monotonic() + 90
    while not port_file.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            log = (workdir / f"{module}.log").read_text()[-2000:]
            raise RuntimeError(f"services.{module} did not start: {log}")
        time.sleep(0.05)  # ok-sleep: polling for the port file with a deadline
    return proc, int(port_file.read_text())


def service_configs(redis_url: str, workdir: Path, p: FleetParams) -> dict[str, str]:
    chunk = 4 << 20
    return {
        "buffer": (
            f"checkpoint_root_dir: {workdir}\nservices:\n  buffer:\n    store: redis\n"
            f"    redis_url: {redis_url}\n    stream_prefix: scale{os.getpid()}x{time.monotonic_ns()}\n"
            "buffer:\n  trainer_input:\n    experience_buffer:\n      capacity: 1000000\nlog:\n  level: WARNING\n"
        ),
        "synchronizer": (
            f"checkpoint_root_dir: {workdir}\nsynchronizer:\n  sync_method: {p.method}\n  chunk_bytes: {chunk}\n"
            f"  sync_offset: {p.sync_offset}\n  sync_timeout: 120\n  fanout: {p.fanout}\nlog:\n  level: WARNING\n"
        ),
    }


@contextlib.asynccontextmanager
async def in_process_services(redis_url: str, workdir: Path, p: FleetParams):
    """The same buffer and synchronizer, built from the same configs, served in this process (the fast
    variant tests use); yields (buffer address, synchronizer address)."""
    from services.buffer.service import build as build_buffer
    from services.common.config import load_config
    from services.common.rpc import start_server
    from services.synchronizer.service import build as build_sync

    started = []
    try:
        for module, yaml in service_configs(redis_url, workdir, p).items():
            path = workdir / f"{module}.yaml"
            path.write_text(yaml)
            build = build_buffer if module == "buffer" else build_sync
            registrations, close = await build(load_config(str(path)))
            started.append((await start_server(registrations, port=0), close))
        yield started[0][0].address, started[1][0].address
    finally:
        for handle, close in reversed(started):
            await handle.stop(0)
            if close is not None:
                await close()


def weights(mb: float) -> dict[str, torch.Tensor]:
    """A fixed-size float32 state dict: 8 equal tensors."""
    per = max(1, int(mb * 1e6 / 4 / 8))
    gen = torch.Generator().manual_seed(0)
    return {f"layers.{i}.weight": torch.randn(per, generator=gen) for i in range(8)}


def step_batch(explorer: str, step: int, groups: int, version: int) -> list[Experience]:
    tokens = torch.randint(0, 1000, (PROMPT + RESPONSE,))
    logprobs, mask = -torch.rand(RESPONSE), torch.ones(RESPONSE, dtype=torch.bool)
    return [
        Experience(
            tokens=tokens,
            prompt_length=PROMPT,
            logprobs=logprobs,
            action_mask=mask,
            reward=1.0,
            model_version=version,
            eid=ExperienceId(
                group_id=f"{explorer}-s{step}-g{g}", suffix=str(i), explorer_id=explorer, step=step
            ),
        )
        for g in range(groups)
        for i in range(GROUP)
    ]


# ---- explorers -------------------------------------------------------------------------------------
async def explorer(name: str, buffer_addr: str, sync_addr: str, p: FleetParams) -> ExplorerLog:
    out, method = ExplorerLog(), sync_method(p.method)  # typed once, as ExplorerSettings does
    sync = SyncClient(create_channel(sync_addr, timeout_s=120), name, "explorer", timeout_s=60,
                      sync_timeout_s=120, owns_channel=True)  # fmt: skip
    channel = create_channel(buffer_addr, timeout_s=60)
    buffer = BufferClient(channel, producer_id=name, timeout_s=60)

    async def load(named, version: int) -> None:  # the modelled engine keeps the decoded weights
        dict(named)
        out.loaded.setdefault(version, time.monotonic())
        out.pulls += 1

    if p.fanout > 0:  # as explorer_fetch: a relay beside the explorer, registered with it, fetched through
        sync.relay = await serve_relay(sync.channel, name, host="127.0.0.1", sync_timeout_s=120)
        fetch = relay_fetch(method, sync, Receiver(load), sync.relay.node)
    else:
        fetch = MemoryFetch(sync, load)
    # with fan-out the waits go to the parent's relay, as in the explorer service (tree/notices.py)
    tree = tree_wait(sync, SyncPlan(offset=p.sync_offset)) if p.fanout > 0 else None
    gate = ExplorerSyncGate(sync, fetch=fetch, timeout_s=120, method=method, tree=tree)
    await sync.register()  # after the relay is set: the registration carries its address
    gen_s = p.groups * GROUP * RESPONSE / p.tokens_per_s
    for step in range(1, p.steps + 1):
        await gate.before_step(step, gate.held)
        await asyncio.sleep(gen_s)  # ok-sleep: the modelled engine generating this step's tokens
        batch = step_batch(name, step, p.groups, gate.held)
        t0 = time.monotonic()
        await buffer.put(batch, vocab_size=1000)
        out.put_end[step] = time.monotonic()
        if step > 1:
            out.put_s.append(out.put_end[step] - t0)
    await gate.settle()
    # what the explorer received, from the synchronizer or from a relay's copy (fan-out)
    out.pulled_full = sync.pulled_bytes_full + sync.relayed_bytes_full
    out.pulled_delta = sync.pulled_bytes_delta + sync.relayed_bytes_delta
    out.fallbacks = sync.delta_fallbacks
    if isinstance(fetch, RelayFetch):
        out.relay_loads, out.relay_fallbacks = fetch.puller.from_relay, fetch.fallbacks
        out.relay_delta_loads = getattr(fetch.puller, "delta_loads", 0)
    if tree is not None:
        out.waits_at_synchronizer, out.waits_at_parent = tree.via_synchronizer, tree.via_parent
    await sync.leave(ok=True)
    await sync.close()  # closes the relay too (SyncClient.relay)
    await channel.close()
    return out


async def explorer_fleet(
    names: list[str], buffer_addr: str, sync_addr: str, p: FleetParams
) -> list[ExplorerLog]:
    t0, c0 = time.monotonic(), time.process_time()
    logs = list(await asyncio.gather(*(explorer(n, buffer_addr, sync_addr, p) for n in names)))
    logs[0].cpu_s, logs[0].wall_s = time.process_time() - c0, time.monotonic() - t0
    return logs


def _explorer_process(names, buffer_addr, sync_addr, p, queue) -> None:
    torch.set_num_threads(1)
    configure_logging("scale-explorers", level="WARNING")  # not a line per explorer per relayed version
    queue.put(asyncio.run(explorer_fleet(names, buffer_addr, sync_addr, p)))


# ---- trainer ---------------------------------------------------------------------------------------
@dataclass
class TrainerLog:
    lease_call: dict[int, float] = field(default_factory=dict)  # step -> first get_batch call
    lease_done: dict[int, float] = field(default_factory=dict)  # step -> whole step held
    push: dict[int, tuple[float, float]] = field(default_factory=dict)  # version -> (start, end)
    acked: int = 0
    payload_bytes: int = 0  # one version on the wire
    bf16_changed: list[float] = field(default_factory=list)  # per version after the first
    sync_cpu: dict[int, float] = field(default_factory=dict)  # step -> synchronizer CPU s when it was held


async def trainer(n: int, buffer_addr: str, sync_addr: str, p: FleetParams, sync_pid: int = 0) -> TrainerLog:
    out, sd = TrainerLog(), weights(p.weights_mb)
    method, gen = sync_method(p.method), torch.Generator().manual_seed(1)
    step_size = step_size_for(p.bf16_change)
    sync = SyncClient(create_channel(sync_addr, timeout_s=120), "trainer", "trainer", timeout_s=60,
                      sync_timeout_s=120, owns_channel=True)  # fmt: skip
    channel = create_channel(buffer_addr, timeout_s=60)
    buffer = BufferClient(channel, consumer_group="default", timeout_s=60)
    await sync.register()
    per_step = n * p.groups * GROUP
    for step in range(1, p.steps + 1):
        got, out.lease_call[step] = 0, time.monotonic()
        while got < per_step:
            leased = await buffer.get_batch(per_step - got, timeout_ms=60_000)
            if leased.lease_id:
                await buffer.ack(leased.lease_id)
                got += len(leased.experiences)
        out.lease_done[step], out.acked = time.monotonic(), out.acked + got
        if sync_pid:
            out.sync_cpu[step] = cpu_seconds(sync_pid)
        if step < p.steps and (await sync.request_sync(step)).accepted:
            if out.push:  # the weights move between versions as a training step moves them
                out.bf16_changed.append(train_step(sd.values(), step_size, gen)[1])
            t0 = time.monotonic()
            resp = await sync.push_weights(method.encode(sd), version=step, step=step)
            out.push[step] = (t0, time.monotonic())
            out.payload_bytes = resp.bytes
    await sync.close()
    await channel.close()
    return out


# ---- one fleet ---------------------------------------------------------------------------------------
def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else float("nan")


async def run_fleet(
    n: int, buffer_addr: str, sync_addr: str, p: FleetParams, *, procs: int = 0, sync_pid: int = 0
) -> dict:
    """Run N explorers and one trainer for `p.steps` steps against running services; the figures."""
    names = [f"explorer-{i}" for i in range(n)]
    c0 = cpu_seconds(sync_pid) if sync_pid else 0.0
    tr_task = asyncio.create_task(trainer(n, buffer_addr, sync_addr, p, sync_pid))
    if procs <= 0:
        logs = await explorer_fleet(names, buffer_addr, sync_addr, p)
        client_busy = [logs[0].cpu_s / logs[0].wall_s]
    else:
        ctx = mp.get_context("spawn")
        queue = ctx.Queue()
        parts = [names[i::procs] for i in range(min(procs, n))]
        workers = [ctx.Process(target=_explorer_process, args=(part, buffer_addr, sync_addr, p, queue))
                   for part in parts]  # fmt: skip
        for w in workers:
            w.start()
        results = [await asyncio.to_thread(queue.get, True, 600) for _ in workers]
        for w in workers:  # joined off the loop: the trainer may still be leasing its last step
            await asyncio.to_thread(w.join, 30)
        logs = [log for r in results for log in r]
        client_busy = [r[0].cpu_s / r[0].wall_s for r in results]
    tr = await tr_task
    sync_cpu = (cpu_seconds(sync_pid) - c0) if sync_pid else float("nan")
    steps = range(2, p.steps + 1)
    window = tr.lease_done[p.steps] - tr.lease_done[1]
    lease = [tr.lease_done[s] - max(tr.lease_call[s], max(lg.put_end[s] for lg in logs)) for s in steps]
    reach = [max(min(t for v2, t in lg.loaded.items() if v2 >= v) for lg in logs) - start
             for v, (start, _) in tr.push.items() if all(any(v2 >= v for v2 in lg.loaded) for lg in logs)]  # fmt: skip
    puts = [x for lg in logs for x in lg.put_s]
    pulls = [lg.pulls for lg in logs]
    delta_per = [lg.pulled_delta / max(lg.pulls - 1, 1) for lg in logs]  # the first pull is full
    full_per = [lg.pulled_full for lg in logs]
    rate = n * p.groups * GROUP * (p.steps - 1) / window
    return {
        "n": n,
        "experiences_per_s": round(rate, 1),
        "per_explorer_per_s": round(rate / n, 2),
        "put_p50_ms": round(1e3 * pct(puts, 0.5), 2),
        "put_p99_ms": round(1e3 * pct(puts, 0.99), 2),
        "lease_p50_ms": round(1e3 * pct(lease, 0.5), 2),
        "lease_p99_ms": round(1e3 * pct(lease, 0.99), 2),
        "push_s": round(statistics.median(e - s for s, e in tr.push.values()), 4),
        "reach_all_s": round(statistics.median(reach), 4) if reach else None,
        "sync_cpu_s_per_step": round(sync_cpu / p.steps, 4),
        "sync_cpu_s_per_step_steady": (
            round((tr.sync_cpu[p.steps] - tr.sync_cpu[1]) / (p.steps - 1), 4) if tr.sync_cpu else None
        ),
        "payload_bytes": tr.payload_bytes,
        "delta_bytes_per_explorer": round(statistics.median(delta_per)),
        "full_bytes_per_explorer": round(statistics.median(full_per)),
        "delta_bytes_ratio": round(statistics.median(delta_per) / max(tr.payload_bytes, 1), 4),
        "pulls_per_explorer": statistics.median(pulls),
        "delta_fallbacks": sum(lg.fallbacks for lg in logs),
        "relay_loads": sum(lg.relay_loads for lg in logs),
        "relay_delta_loads": sum(lg.relay_delta_loads for lg in logs),
        "relay_fallbacks": sum(lg.relay_fallbacks for lg in logs),
        "waits_at_synchronizer": sum(lg.waits_at_synchronizer for lg in logs),
        "waits_at_parent": sum(lg.waits_at_parent for lg in logs),
        "bf16_changed": round(statistics.median(tr.bf16_changed), 4) if tr.bf16_changed else None,
        "client_busy": round(max(client_busy), 2),
        "acked": tr.acked,
    }


def measure(ns: list[int], p: FleetParams, procs: int) -> list[dict]:
    from tests.support.redis_server import RedisServer

    rows = []
    with RedisServer.start() as redis, tempfile.TemporaryDirectory(prefix="rft-scale-") as tmp:
        for n in ns:
            work = Path(tmp) / f"n{n}"
            work.mkdir()
            yamls = service_configs(redis.url, work, p)
            started = [start_service(m, y, work) for m, y in yamls.items()]
            (buf, bport), (syn, sport) = started
            try:
                row = asyncio.run(run_fleet(n, f"127.0.0.1:{bport}", f"127.0.0.1:{sport}", p,
                                            procs=procs, sync_pid=syn.pid))  # fmt: skip
            finally:
                for proc, _ in started:
                    proc.terminate()
                    proc.wait(30)
            print(f"[N={n}] {json.dumps(row)}", file=sys.stderr, flush=True)
            rows.append(row)
    return rows


def knee(rows: list[dict]) -> int | None:
    """The first N whose experiences/s per explorer fall below 80% of the smallest N's, or whose put or
    lease p99 exceeds both twice the smallest N's and it plus 50 ms (a p99 of ~11 samples is noisy)."""
    base = rows[0]

    def jumped(key: str, r: dict) -> bool:
        return r[key] > max(2 * base[key], base[key] + 50)

    for r in rows[1:]:
        if r["per_explorer_per_s"] < 0.8 * base["per_explorer_per_s"] or any(
            jumped(k, r) for k in ("put_p99_ms", "lease_p99_ms")
        ):
            return r["n"]
    return None


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="6 steps per N instead of 12")
    parser.add_argument("--ns", default="1,4,16,64", help="comma-separated fleet sizes")
    parser.add_argument("--procs", type=int, default=4, help="explorer processes (0: in the trainer's)")
    parser.add_argument("--steps", type=int, default=0, help="steps per N (overrides --quick)")
    parser.add_argument("--groups", type=int, default=2, help="groups of 8 per explorer step")
    parser.add_argument("--tokens-per-s", type=float, default=20_000.0, help="modelled rate per explorer")
    parser.add_argument("--weights-mb", type=float, default=4.0, help="published weights, MB")
    parser.add_argument("--sync-offset", type=int, default=0)
    parser.add_argument("--sync-method", default="memory", choices=["memory", "memory_bf16"])
    parser.add_argument(
        "--bf16-change", type=float, default=BF16_CHANGE,
        help="fraction of bf16 words the simulated trainer's step changes per version (default: measured)",
    )  # fmt: skip
    parser.add_argument(
        "--fanout", type=int, default=0,
        help="synchronizer.fanout: 0 = every explorer pulls from the synchronizer; k > 0 = through relays",
    )  # fmt: skip
    args = parser.parse_args()
    ns = [int(x) for x in args.ns.split(",")]
    if not ns or min(ns) < 1:
        parser.error(f"--ns must list fleet sizes >= 1, got {args.ns!r}")
    if args.fanout < 0:
        parser.error(f"--fanout must be >= 0, got {args.fanout}")
    p = FleetParams(args.steps or (6 if args.quick else 12), args.groups, args.tokens_per_s,
                    args.weights_mb, args.sync_offset, args.sync_method, args.bf16_change, args.fanout)  # fmt: skip
    rows = measure(ns, p, args.procs)
    cols = ["n", "experiences_per_s", "per_explorer_per_s", "put_p50_ms", "put_p99_ms", "lease_p50_ms",
            "lease_p99_ms", "push_s", "reach_all_s", "sync_cpu_s_per_step", "sync_cpu_s_per_step_steady", "delta_bytes_ratio", "client_busy"]  # fmt: skip
    if p.fanout > 0:
        cols += [
            "relay_loads",
            "relay_delta_loads",
            "relay_fallbacks",
            "waits_at_synchronizer",
            "waits_at_parent",
        ]
    print(f"fleet scale: {p.steps} steps per N, {p.groups * GROUP} experiences of {PROMPT + RESPONSE} tokens "
          f"per explorer step, {p.weights_mb:g} MB weights, explorer processes: {args.procs}, "
          f"fanout: {p.fanout}")  # fmt: skip
    print(" ".join(f"{c:>14}" for c in cols))
    for r in rows:
        print(" ".join(f"{r[c]!s:>14}" for c in cols))
    by_n = {r["n"]: r for r in rows}
    k = knee(rows)
    print(f"knee: N={k}" if k else "knee: none within the measured N")
    both = 4 in by_n and 64 in by_n
    ratio = by_n[64]["experiences_per_s"] / by_n[4]["experiences_per_s"] if both else None

    def over(key: str) -> float | None:  # N=64's figure over N=4's
        a, b = (by_n[64][key], by_n[4][key]) if both else (None, None)
        return round(a / b, 3) if a is not None and b else None

    result = {"bench": "scale", "quick": args.quick, "steps": p.steps, "groups": p.groups,
              "tokens_per_s": p.tokens_per_s, "weights_mb": p.weights_mb, "procs": args.procs,
              "sync_method": p.method, "bf16_change": p.bf16_change, "fanout": p.fanout,
              "per_n": rows, "knee": k, "ratio": round(ratio, 3) if ratio else None, "target": 0.9,
              "reach_all_64_over_4": over("reach_all_s"), "reach_all_64_over_4_target": 2.0,
              "reach_all_64_s": by_n[64]["reach_all_s"] if both else None, "reach_all_64_s_target": 0.15,
              "per_explorer_64_over_4": over("per_explorer_per_s"), "per_explorer_64_over_4_target": 0.7}  # fmt: skip
    print(json.dumps(result))


if __name__ == "__main__":
    main()
