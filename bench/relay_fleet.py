"""A process hosting weight relays (`RelayNode`s), driven by JSON lines, for bench/fanout.py and tests.

    python bench/relay_fleet.py --synchronizer HOST:PORT [--stall-s 10]

Each relay is what an explorer runs beside its service: a `PullWeights` server on its own port (0 =
free) and a `fetch` along its chain of sources (`fanout.plan_tree`). Requests on stdin, one JSON
object a line; answers on stdout, one JSON object a line, tagged with the request's `id`:
  {"op": "start", "names": [...]}                       -> {"addresses": {name: "127.0.0.1:port"}}
  {"op": "fetch", "name", "version", "chain": [addr, ..., ""], "hold_after": k?, "decode": bool?,
   "hash_payload": bool?}
      -> {"ok": true, "hash", "done": time.time() when complete, checked and joined} | {"ok": false, "error"}
      `""` in a chain is the synchronizer; `hold_after` k: this relay stops pulling after k chunks
      (until killed) - how tests make a forwarding relay die mid-transfer; `decode`: the state dict is
      decoded and hashed (`state_hash`), else the payload's sha256 (None with `hash_payload` false:
      timed runs skip the hash, which would delay the other relays of the process).
  {"op": "progress", "name", "version", "chunks": k}    -> {} once the relay holds k chunks of it
  {"op": "cpu"}                                          -> {"cpu_s": this process's CPU seconds}
Answers come as requests finish, not in order. stdout carries nothing else (logs go to stderr).
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import sys
import time
from pathlib import Path

ROOT_DIR = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT_DIR), str(ROOT_DIR / "protos")]

import torch  # noqa: E402

from services.common.log import configure_logging  # noqa: E402
from services.common.rpc import create_channel, start_server  # noqa: E402
from services.weight_sync.tree.server import PeerSources, RelayNode, peer_channel  # noqa: E402
from services.weight_sync.tree.store import RelayStore, Source, pull_version  # noqa: E402
from services.weight_sync.wire.chunks import join_raw_chunks  # noqa: E402
from services.weight_sync.wire.codec import decode_state_dict  # noqa: E402


def state_hash(state_dict: dict[str, torch.Tensor]) -> str:
    """sha256 over the names, dtypes, shapes and bytes of a state dict, in name order."""
    h = hashlib.sha256()
    for name in sorted(state_dict):
        t = state_dict[name].detach().contiguous().cpu()
        h.update(f"{name}|{t.dtype}|{tuple(t.shape)}|".encode())
        h.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()


def held(source: Source, after: int) -> Source:
    """`source`, stopping for good after `after` chunks (the relay looks alive and stuck)."""

    async def open_stream(version: int, have: int | None = None):
        i = 0
        async for raw in source(version, have):
            if i == after:
                await asyncio.Event().wait()
            yield raw
            i += 1

    return open_stream


class Fleet:
    def __init__(self, synchronizer: str, stall_s: float):
        self.sync_channel = create_channel(synchronizer, timeout_s=60)
        self.stall_s = stall_s
        self.nodes: dict[str, RelayNode] = {}
        self.handles: list = []

    async def start(self, names: list[str]) -> dict:
        addresses = {}
        for name in names:
            peers = PeerSources(self.sync_channel, lambda a: peer_channel(a, timeout_s=60), name)
            node = RelayNode(peers, stall_s=self.stall_s)
            handle = await start_server([node.registration()], port=0)
            self.nodes[name], addresses[name] = node, handle.address
            self.handles.append(handle)
        return {"addresses": addresses}

    async def fetch(
        self, name: str, version: int, chain: list[str], hold_after=None, decode=False, hash_payload=True
    ) -> dict:
        node = self.nodes[name]
        if hold_after is not None:
            sources = [(a, held(s, hold_after)) for a, s in node.peers.chain(chain)]
            stream = await pull_version(node.store, version, sources, node.stall_s)
            return {"ok": stream.complete, "error": stream.error}
        try:
            stream = await node.fetch(version, chain)
            _, _, payload = join_raw_chunks(stream.chunks)  # checked again, as a receiver does
            done = time.time()
            if decode:
                sd, _ = await asyncio.to_thread(decode_state_dict, payload, "cpu")
                digest = await asyncio.to_thread(state_hash, sd)
            else:
                digest = hashlib.sha256(payload).hexdigest() if hash_payload else None
        except Exception as exc:  # noqa: BLE001 - reported to the driver
            return {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
        return {"ok": True, "hash": digest, "done": done}

    async def progress(self, name: str, version: int, chunks: int) -> dict:
        store: RelayStore = self.nodes[name].store
        stream = await store.stream_for(version, wait_s=60)
        async with stream.changed:
            await stream.changed.wait_for(lambda: len(stream.chunks) >= chunks or stream.done)
        return {"held": len(stream.chunks)}


def cpu_seconds() -> float:
    t = os.times()
    return t.user + t.system


class FleetProcess:
    """The driver's side: one `relay_fleet.py` process, its requests answered by id.

    fleet = await FleetProcess.start(sync_address); await fleet.call("start", names=[...])
    """

    def __init__(self, proc: asyncio.subprocess.Process):
        self.proc = proc
        self.pid = proc.pid
        self._next = 0
        self._waiting: dict[int, asyncio.Future] = {}
        self._reading = asyncio.ensure_future(self._read())

    @classmethod
    async def start(cls, synchronizer: str, stall_s: float = 10.0, stderr=None) -> FleetProcess:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, __file__, "--synchronizer", synchronizer, "--stall-s", str(stall_s),
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=stderr,
            env={**os.environ, "PYTHONPATH": f"{ROOT_DIR}:{ROOT_DIR / 'protos'}", "OMP_NUM_THREADS": "1"},
        )  # fmt: skip
        return cls(proc)

    async def _read(self) -> None:
        assert self.proc.stdout is not None
        while line := await self.proc.stdout.readline():
            try:
                msg = json.loads(line)
            except ValueError:
                sys.stderr.write(f"relay fleet {self.pid}: {line.decode(errors='replace')}")
                continue
            fut = self._waiting.pop(msg.pop("id"), None)
            if fut is not None and not fut.done():
                fut.set_result(msg)
        for fut in self._waiting.values():  # the process is gone
            if not fut.done():
                fut.set_exception(ConnectionError(f"relay fleet process {self.pid} exited"))

    def send(self, op: str, **kw) -> asyncio.Future:
        """Send one request; the future resolves to its answer."""
        self._next += 1
        fut = asyncio.get_running_loop().create_future()
        self._waiting[self._next] = fut
        assert self.proc.stdin is not None
        self.proc.stdin.write((json.dumps({"op": op, "id": self._next, **kw}) + "\n").encode())
        return fut

    async def call(self, op: str, timeout_s: float = 120.0, **kw) -> dict:
        return await asyncio.wait_for(self.send(op, **kw), timeout_s)

    def kill(self) -> None:
        self.proc.kill()  # SIGKILL

    async def close(self) -> None:
        if self.proc.returncode is None:
            assert self.proc.stdin is not None
            self.proc.stdin.close()
            try:
                await asyncio.wait_for(self.proc.wait(), 30)
            except asyncio.TimeoutError:
                self.proc.kill()
                await self.proc.wait()
        await self._reading


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--synchronizer", required=True)
    ap.add_argument("--stall-s", type=float, default=10.0)
    args = ap.parse_args()
    configure_logging("relay_fleet", level="WARNING", fmt="json")  # stderr: stdout carries the answers
    fleet = Fleet(args.synchronizer, args.stall_s)
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    tasks = set()

    def answer(req_id, body: dict) -> None:
        sys.stdout.write(json.dumps({"id": req_id, **body}) + "\n")
        sys.stdout.flush()

    async def handle(req: dict) -> None:
        op, req_id = req.pop("op"), req.pop("id", None)
        try:
            if op == "cpu":
                body = {"cpu_s": cpu_seconds()}
            else:
                body = await getattr(fleet, op)(**req)
        except Exception as exc:  # noqa: BLE001 - reported to the driver
            body = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
        answer(req_id, body)

    while line := await reader.readline():
        task = asyncio.ensure_future(handle(json.loads(line)))
        tasks.add(task)
        task.add_done_callback(tasks.discard)
    for handle_ in fleet.handles:
        await handle_.stop(0)


if __name__ == "__main__":
    asyncio.run(main())
