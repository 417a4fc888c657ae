"""The memory method's fan-out, with real processes: a `python -m services.synchronizer` process fed by
a trainer's push, and weight relays (`RelayNode`s) in `bench/relay_fleet.py` processes pulling from it
and from each other along `plan_tree` chains. Every member ends with a state dict hash-equal to the
pushed one; the synchronizer sends only the root's children their copies; a forwarding relay killed
with SIGKILL mid-transfer leaves its children to finish from their grandparent; a late joiner gets
the latest version from a peer. Synchronised on answers and chunk counts, never on sleeps."""

from __future__ import annotations

import contextlib
import itertools

import pytest
import torch

from bench.relay_fleet import FleetProcess, state_hash
from bench.scale import start_service
from services.common.rpc import create_channel
from services.weight_sync.member.client import SyncClient
from services.weight_sync.tree.plan import ROOT, plan_tree

pytestmark = pytest.mark.slow
_versions = itertools.count(1)


@pytest.fixture(scope="module")
def synchronizer(tmp_path_factory):
    """A real memory-method synchronizer process; yields its address."""
    workdir = tmp_path_factory.mktemp("fanout")
    yaml = f"checkpoint_root_dir: {workdir}\nsynchronizer:\n  sync_method: memory\nlog:\n  level: WARNING\n"
    proc, port = start_service("synchronizer", yaml, workdir)
    yield f"127.0.0.1:{port}"
    proc.kill()
    proc.wait()


@pytest.fixture
async def trainer(synchronizer):
    client = SyncClient(create_channel(synchronizer, timeout_s=30), "trainer", "trainer", owns_channel=True)
    await client.register()
    yield client
    await client.close()


@pytest.fixture
async def fleets(synchronizer):
    """`await fleets(stall_s=...)` -> a started `FleetProcess`; all closed (or killed) after the test."""
    started: list[FleetProcess] = []

    async def start(stall_s: float = 30.0) -> FleetProcess:
        fleet = await FleetProcess.start(synchronizer, stall_s=stall_s)
        started.append(fleet)
        return fleet

    yield start
    for fleet in started:
        with contextlib.suppress(ProcessLookupError):
            await fleet.close()


def state(seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {
        "embed.weight": torch.randn(256, 128, generator=g),
        "layer.0.w": torch.randn(128, 128, generator=g).to(torch.bfloat16),
        "layer.0.b": torch.randn(128, generator=g),
        "norm": torch.ones(3, dtype=torch.float16),
    }


async def push(trainer: SyncClient, chunk_bytes: int = 16 << 10) -> tuple[int, str]:
    version = next(_versions)
    sd = state(version)
    await trainer.push_weights(sd, version=version, chunk_bytes=chunk_bytes)
    return version, state_hash(sd)


def chains_to_addresses(plan, addresses):
    return {m: [addresses[a] if a != ROOT else ROOT for a in chain] for m, chain in plan.items()}


async def test_a_tree_of_relays_in_two_processes_gets_the_pushed_version(trainer, fleets):
    procs = [await fleets(), await fleets()]
    names = [f"e{i}" for i in range(7)]
    owner = {n: procs[i % 2] for i, n in enumerate(names)}
    addresses: dict[str, str] = {}
    for p in procs:
        addresses |= (await p.call("start", names=[n for n in names if owner[n] is p]))["addresses"]
    chains = chains_to_addresses(plan_tree(names, fanout=2), addresses)
    before = (await trainer.get_run_state()).weight_bytes_full
    version, want = await push(trainer)
    answers = [
        await f
        for f in [
            owner[n].send("fetch", name=n, version=version, chain=chains[n], decode=True) for n in names
        ]
    ]
    assert [a.get("error") for a in answers] == [None] * 7 and {a["hash"] for a in answers} == {want}
    served = (await trainer.get_run_state()).weight_bytes_full - before
    payload = served // 2
    assert served == 2 * payload > 0  # the synchronizer sent one copy to each of the root's 2 children

    # a late joiner, told the latest version by the synchronizer, gets it from a peer alone
    latest = (await trainer.get_run_state()).model_version.version
    late = (await procs[0].call("start", names=["late"]))["addresses"]
    assert late["late"] not in addresses.values()
    got = await procs[0].call("fetch", name="late", version=latest, chain=[addresses["e6"]], decode=True)
    assert (latest, got.get("error"), got["hash"]) == (version, None, want)
    assert (await trainer.get_run_state()).weight_bytes_full - before == served  # nothing more from it


async def test_sigkill_of_a_forwarding_relay_mid_transfer_children_reparent(trainer, fleets):
    parent_proc, child_proc = await fleets(), await fleets()
    a = (await parent_proc.call("start", names=["a"]))["addresses"]["a"]
    bc = (await child_proc.call("start", names=["b", "c"]))["addresses"]
    version, want = await push(trainer, chunk_bytes=8 << 10)  # ~24 chunks
    held = parent_proc.send("fetch", name="a", version=version, chain=[ROOT], hold_after=3)
    b = child_proc.send("fetch", name="b", version=version, chain=[a, ROOT], decode=True)
    c = child_proc.send("fetch", name="c", version=version, chain=[bc["b"], a, ROOT], decode=True)
    assert (await child_proc.call("progress", name="c", version=version, chunks=3))["held"] == 3
    assert not b.done() and not c.done()  # mid-transfer: a holds 3 chunks and forwards no more
    parent_proc.kill()
    await parent_proc.proc.wait()
    got_b, got_c = await b, await c
    assert (got_b.get("error"), got_b["hash"]) == (None, want)  # b went on from the synchronizer
    assert (got_c.get("error"), got_c["hash"]) == (None, want)  # c never noticed: b kept streaming
    with pytest.raises(ConnectionError):
        await held
