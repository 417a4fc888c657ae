"""The memory method with `synchronizer.fanout: 1` across five processes (synchronizer, buffer,
trainer, two explorers): each explorer serves a weight relay, the synchronizer chains them (the first
to register pulls from the synchronizer, the other from the first's relay), and every version still
arrives bit for bit (SHA-256 of what the trainer sent == of what each explorer's engine holds). The
second explorer asks the first's relay for the version each step needs (tree/notices.py), and neither
reports its loads each step: the synchronizer hears the held version from their heartbeats. SIGKILL of
the parent explorer mid-run: the child asks the synchronizer instead and goes on, the restarted parent
rejoins with a new relay, and every version still arrives bit for bit."""

from __future__ import annotations

import pytest

from tests.integration.sync_e2e.conftest import RunHarness, wait_until
from tests.integration.sync_e2e.test_sync_run_processes import _check_end, _check_weights

pytestmark = pytest.mark.slow


def test_sync_run_fanout_relays_bit_exact_weights(run: RunHarness):
    steps = 3
    # each trainer step takes one step of each explorer, so the two run side by side (else the first
    # to start could finish before the other registers, and both would be children of the root)
    run.write_config("memory", steps_per_explorer=steps, fanout=1, train_batch_size=8)
    run.start_core()
    procs = [run.start_trainer(), run.start_explorer(0), run.start_explorer(1)]
    for proc in procs:
        assert proc.wait(240) == 0, proc.tail()
    _check_weights(run, procs[1:])
    chains = set()
    for proc in procs[1:]:
        events = [line.get("event") for line in proc.lines()]
        assert "weight relay serving" in events, proc.tail()
        assert "relay fetch failed; pulling from the synchronizer" not in events, proc.tail()
        chains |= {line["relays"] for line in proc.lines() if line.get("event") == "weights relayed"}
    assert chains == {0, 1}  # one explorer pulled from the synchronizer, the other from its relay
    notices = [
        any(line.get("event") == "version notices from the parent relay" for line in proc.lines())
        for proc in procs[1:]
    ]
    assert sorted(notices) == [False, True], notices  # the child asked its parent's relay
    events = run.events()
    reported = [e for e in events if e["kind"] == "reported" and e["member_id"].startswith("explorer")]
    assert not [e for e in reported if e["detail"].startswith("ok")], reported
    for i, proc in enumerate(procs[1:]):
        relayed = max(line["version"] for line in proc.lines() if line.get("event") == "weights relayed")
        left = [e for e in events if e["kind"] == "left" and e["member_id"] == f"explorer-{i}"]
        assert left and left[-1]["version"] == relayed, (left, relayed)  # the heartbeat said it
    _check_end(run, steps)


def test_sigkill_of_the_parent_explorer_the_child_goes_on_and_the_restarted_parent_rejoins(run: RunHarness):
    steps = 5
    run.write_config("memory", steps_per_explorer=steps, fanout=1, train_batch_size=8)
    run.start_core()
    trainer = run.start_trainer()
    # explorer-0 registers first (the root's child, the parent), explorer-1 under it
    e0 = run.start_explorer(0)
    run.wait_event(lambda e: e["kind"] == "register" and e["member_id"] == "explorer-0", 180, "explorer-0 in")
    e1 = run.start_explorer(1)
    notice = "version notices from the parent relay"
    wait_until(
        lambda: any(x.get("event") == notice for x in e1.lines()), 180, "the child asking its parent", [e1]
    )
    e0.kill()  # the parent dies between (or in) the child's waits
    e0b = run.start_explorer(0, name="explorer-0-restarted")
    for proc in (trainer, e1, e0b):
        assert proc.wait(240) == 0, proc.tail()
    loaded = _check_weights(run, [e1, e0b])
    assert max(loaded["explorer-1"]) >= steps - 1 and max(loaded["explorer-0-restarted"]) >= steps - 1
    # the child's next ask found the dead parent and went to the synchronizer, which named the
    # restarted parent's new relay; the run lost nothing
    events = [x.get("event") for x in e1.lines()]
    assert "parent relay did not answer; asking the synchronizer" in events, e1.tail()
    assert len([e for e in run.events() if e["kind"] == "register" and e["member_id"] == "explorer-0"]) == 2
    _check_end(run, steps)
