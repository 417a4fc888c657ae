"""A run that drives itself across five processes (synchronizer, buffer, trainer, two explorers) for
each weight-sync method: weights arrive bit for bit (SHA-256 of what the trainer sent == of what each
explorer's engine holds after loading, per version; `memory_bf16`, named as a plug-in would be by its
class path, and `nccl` and `checkpoint` with `wire_dtype: bfloat16` send the bf16-rounded weights; the
latter also as deltas beside the files), `model_version` advances, the sync plan's
interleaving holds (read from the synchronizer's event history: with `sync_offset` 0 every explore
step s runs on weights >= s - 1; with 1 an explorer runs step 2 before the first version exists),
the explorers stop when their data ends, the trainer drains the buffer, saves the final step with
its HF export and ends the run, and every process exits 0. The nccl (gloo) run also loses an
explorer in the middle of a sync: the others give up within `sync_timeout`, the run goes on, and
the explorer, restarted, rejoins and receives newer weights."""

from __future__ import annotations

import signal
import time

import pytest

from tests.integration.sync_e2e.conftest import RunHarness, held_before_steps

pytestmark = pytest.mark.slow


def _check_weights(run: RunHarness, explorers) -> dict[str, dict[int, str]]:
    sent = run.sent()
    assert sent and all(sent.values()), f"trainer sent no digests: {sent}"
    got = {}
    for proc in explorers:
        loaded = run.loaded(proc)
        assert loaded, f"{proc.name} loaded no weights:\n{proc.tail()}"
        for version, digest in loaded.items():
            assert digest == sent[version], f"{proc.name} v{version}: {digest} != trainer's {sent[version]}"
        got[proc.name] = loaded
    return got


def _check_end(run: RunHarness, trainer_steps: int) -> None:
    events = run.events()
    left = [e["member_id"] for e in events if e["kind"] == "left" and e["detail"] == "STOPPED"]
    assert left[-1] == "trainer" and {"explorer-0", "explorer-1"} <= set(left[:-1]), left
    finished = [x for x in run.procs["trainer"].lines() if x["event"] == "run finished"]
    assert finished and finished[0]["step"] == trainer_steps
    assert list((run.job_dir / f"global_step_{trainer_steps}" / "huggingface").glob("*.safetensors"))


BF16_AS_PLUGIN = "services.weight_sync.methods.bf16:Bf16WireMethod"  # `memory_bf16`, by its class path


@pytest.mark.parametrize(
    ("method", "offset", "wire"),
    [
        ("memory", 0, "auto"),
        (BF16_AS_PLUGIN, 0, "auto"),
        ("nccl", 0, "bfloat16"),
        # a pipeline (offset 1) on bf16 files: about half the bf16 words change, so deltas beside them
        ("checkpoint", 1, "bfloat16"),
    ],
)
def test_sync_run_delivers_bit_exact_weights_on_plan(run: RunHarness, method: str, offset: int, wire: str):
    steps = 3
    run.write_config(method, steps_per_explorer=steps, offset=offset, wire_dtype=wire)
    run.start_core()
    procs = [run.start_trainer(), run.start_explorer(0), run.start_explorer(1)]
    for proc in procs:
        assert proc.wait(240) == 0, proc.tail()

    loaded = _check_weights(run, procs[1:])
    for versions in loaded.values():
        assert max(versions) >= steps - 1 - offset  # model_version advanced as the plan needs
    events = run.events()
    publishes = [e["version"] for e in events if e["kind"] == "publish"]
    if method == "nccl":  # a broadcast needs every explorer in the group: none once their data ended
        assert publishes[:2] == [1, 2] and publishes == sorted(set(publishes)), publishes
    else:
        assert publishes == list(range(1, 2 * steps + 1))
    held = {i: held_before_steps(events, f"explorer-{i}", steps) for i in range(2)}
    for h in held.values():
        for step, version in h.items():
            assert version >= max(step - 1 - offset, 0), (step, held)
    if offset == 1:  # the explorer that fed the first batch ran its step 2 on version 0: a pipeline
        assert min(h[2] for h in held.values()) == 0, held
    _check_end(run, 2 * steps)
    if method == "checkpoint" and wire == "bfloat16":  # the explorers read deltas (bit-exact above)
        folder = run.job_dir / "state_dicts"
        assert list(folder.glob("*.delta")), sorted(p.name for p in folder.iterdir())


def test_sync_nccl_member_dies_mid_sync_then_rejoins(run: RunHarness):
    sync_timeout = 8.0
    steps = 5
    run.write_config("nccl", steps_per_explorer=steps, sync_timeout=sync_timeout, heartbeat_timeout=6)
    run.start_core()
    trainer = run.start_trainer()
    # explorers wait at most sync_timeout for weights: start them once the trainer is in the run
    run.wait_event(
        lambda e: e["kind"] == "register" and e["member_id"] == "trainer", 180, "trainer registered"
    )
    # explorer-1 must be the one that blocks on weights below: start it first, explorer-0 once it is in
    # (started together, a slow start-up of explorer-1 let explorer-0 run ahead and explorer-1 never wait)
    e1 = run.start_explorer(1)
    run.wait_event(
        lambda e: e["kind"] == "register" and e["member_id"] == "explorer-1", 180, "explorer-1 registered"
    )
    e0 = run.start_explorer(0)
    first = run.wait_event(lambda e: e["kind"] == "publish", 120, "a first broadcast")["version"]

    # explorer-1 blocks for a version not yet published: freeze it there, so the synchronizer tells
    # it to receive the broadcast but it never joins the group; kill it once it was told
    wanted = run.wait_event(
        lambda e: e["kind"] == "wait" and e["member_id"] == "explorer-1" and e["version"] > first,
        60, "explorer-1 waiting for weights",
    )  # fmt: skip
    e1.proc.send_signal(signal.SIGSTOP)
    ready = run.wait_event(
        lambda e: e["kind"] == "ready" and e["member_id"] == "explorer-1" and e["version"] >= wanted["version"],
        60, "the broadcast to explorer-1 to begin",
    )  # fmt: skip
    e1.kill()
    killed_at = time.monotonic()
    outcome = run.wait_event(
        lambda e: e["kind"] == "reported" and e["member_id"] == "trainer" and e["time"] > ready["time"],
        sync_timeout + 30,
        "the trainer's outcome of that broadcast",
    )  # fmt: skip
    assert outcome["detail"].startswith("failed"), outcome
    assert time.monotonic() - killed_at < sync_timeout + 20  # gave up on the dead member, no hang

    # the run goes on without explorer-1; restarted, it rejoins and receives newer weights
    after = run.wait_event(
        lambda e: e["kind"] == "publish" and e["version"] >= ready["version"],
        60,
        "a broadcast without explorer-1",
    )["version"]
    e1b = run.start_explorer(1, name="explorer-1-restarted")
    for proc in (trainer, e0, e1b):
        assert proc.wait(240) == 0, proc.tail()

    loaded = _check_weights(run, [e0, e1b])
    assert max(loaded["explorer-0"]) >= after
    assert max(loaded["explorer-1-restarted"]) >= after
    events = run.events()
    assert any(e["kind"] == "lost" and e["member_id"] == "explorer-1" for e in events)
    assert len([e for e in events if e["kind"] == "register" and e["member_id"] == "explorer-1"]) == 2
    _check_end(run, 2 * steps)
