"""`rft top` without a run: a hand-built snapshot rendered (the columns, a service that did not answer,
the reward sparkline, the last syncs), and where the services are found in a job folder of `rft run`
(its port and restart files) and from flags."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from rft.v1 import buffer_pb2
from rich.console import Console

from launcher.top.collect import (
    BufferView,
    ExplorerView,
    ServiceView,
    Snapshot,
    SyncEvent,
    SyncView,
    TrainerView,
)
from launcher.top.render import BARS, render, sparkline
from launcher.top.targets import find_targets
from tests.support.rft_run import example, write_config


def _text(snap: Snapshot) -> str:
    console = Console(record=True, width=160, color_system=None)
    console.print(render(snap))
    return console.export_text()


def test_sparkline_spans_the_bars_from_lowest_to_highest():
    assert sparkline([]) == ""
    assert sparkline([0.0, 0.5, 1.0]) == BARS[0] + BARS[4] + BARS[-1]
    assert sparkline([2.0, 2.0]) == BARS[3] * 2  # flat: the middle
    assert sparkline([float(i) for i in range(100)], width=10) == sparkline(
        [float(i) for i in range(90, 100)]
    )


def test_render_shows_every_part_and_a_service_that_did_not_answer():
    snap = Snapshot(
        source="job /tmp/job",
        services=[
            ServiceView(
                "synchronizer",
                "synchronizer",
                "127.0.0.1:5001",
                True,
                unit="model version",
                step=4,
                moved_age_s=3.0,
                heartbeat_age_s=0.4,
                uptime_s=125.0,
                pid=11,
                restarts=0,
                stuck="weight load has not moved for 30 s (limit 20 s)",
            ),
            ServiceView("buffer", "buffer", "127.0.0.1:5002", False, error="UNAVAILABLE", restarts=2),
            ServiceView(
                "trainer",
                "trainer",
                "127.0.0.1:5003",
                True,
                unit="trainer step",
                step=7,
                moved_age_s=1.0,
                heartbeat_age_s=0.2,
                uptime_s=120.0,
                pid=13,
                restarts=1,
            ),
        ],  # fmt: skip
        explorers=[
            ExplorerView("explorer-0", True, "running", 9, 4, 0.5, 812.0, 0.75),
            ExplorerView("explorer-1"),
        ],
        buffer=BufferView(),
        trainer=TrainerView(True, "running", 7, 30, 4, 1.25, 1534.0, ("pg_loss", -0.0123)),
        sync=SyncView(
            True,
            4,
            "memory",
            members=[("explorer-0", "running", 4)],
            events=[SyncEvent(2.0, "publish", "", 4, "/ckpt/global_step_4")],
        ),  # fmt: skip
        rewards=[0.1, 0.2, 0.4, 0.8],
    )
    text = _text(snap)
    for col in ("service", "address", "state", "step", "moved", "uptime", "restarts", "pid"):
        assert col in text
    lines = {
        line.split()[1]: line for line in text.splitlines() if line.startswith("│ ") and len(line.split()) > 2
    }
    assert "stuck: weight" in lines["synchronizer"]  # its loop answers, its work does not move
    assert "no answer (UNAVAILABLE)" in lines["buffer"] and " 2 " in lines["buffer"]
    assert "up" in lines["trainer"] and "7 trainer step" in lines["trainer"] and "2m" in lines["trainer"]
    assert "running" in lines["explorer-0"] and "812" in lines["explorer-0"] and "0.75" in lines["explorer-0"]
    assert "no answer" in lines["explorer-1"]
    assert "step 7/30 (running)" in text and "step time 1.25 s" in text and "pg_loss -0.0123" in text
    assert "tokens/s 1534" in text and "version 4 (memory)" in text
    assert "publish" in text and "/ckpt/global_step_4" in text  # the last syncs
    assert f"reward {sparkline(snap.rewards)}  last 0.8" in text
    assert text.split("pipeline")[1].splitlines()[4].startswith("│ no answer │ step 7/30")  # the buffer
    stats = buffer_pb2.StatsResponse(
        store="redis", size=40, pending_leases=2, pending_experiences=16, oldest_lease_age_s=3.5,
        per_model_version={3: 0, 5: 8, 4: 2},
    )  # fmt: skip
    held = BufferView(True, stats)
    text = _text(dataclasses.replace(snap, buffer=held))
    assert "leases 2 (16 exp), oldest 3.5 s" in text and "oldest version stored 4" in text


def test_targets_from_a_job_folder_and_from_flags(tmp_path: Path):
    run = tmp_path / "run"
    run.mkdir()
    for name, port in (("buffer", 5002), ("trainer", 5003), ("synchronizer", 5001), ("explorer-0", 5004)):
        (run / f"{name}.port").write_text(f"{port}\n")
    (run / "explorer-1.port").write_text("")  # restarting: its port is not written yet
    (run / "trainer.restarts").write_text("2\n")
    targets = find_targets(tmp_path, {"explorer": []})
    assert [(t.name, t.kind, t.address) for t in targets.services] == [
        ("synchronizer", "synchronizer", "127.0.0.1:5001"), ("buffer", "buffer", "127.0.0.1:5002"),
        ("trainer", "trainer", "127.0.0.1:5003"), ("explorer-0", "explorer", "127.0.0.1:5004"),
        ("explorer-1", "explorer", ""),
    ]  # fmt: skip
    assert [t.restarts() for t in targets.services] == [0, 0, 2, 0, 0]
    (run / "explorer-1.port").write_text("5005\n")
    targets.reread_ports()
    assert targets.services[-1].address == "127.0.0.1:5005"
    flagged = find_targets(None, {"buffer": ["b:1"], "explorer": ["e:1", "e:2"]}, auth_token="tok")
    assert [(t.name, t.address, t.restarts()) for t in flagged.services] == [
        ("buffer", "b:1", None), ("explorer-0", "e:1", None), ("explorer-1", "e:2", None)]  # fmt: skip
    assert flagged.auth_token == "tok" and flagged.job_dir is None


def test_targets_from_a_compose_like_config(tmp_path: Path, monkeypatch):
    tree = example("quickstart.yaml")
    tree["checkpoint_root_dir"] = str(tmp_path / "ckpt")  # no job folder: its services.* addresses
    tree["services"] = {"buffer": {"address": "buffer:50051"}, "trainer": {"host": "trainer", "port": 50052}}
    config = write_config(tmp_path / "stack.yaml", tree)
    monkeypatch.setenv("RFT_AUTH_TOKEN", "secret")
    targets = find_targets(config, {"explorer": ["explorer-a:50054"]})
    assert [(t.name, t.address) for t in targets.services] == [
        ("buffer", "buffer:50051"), ("trainer", "trainer:50052"), ("explorer", "explorer-a:50054")]  # fmt: skip
    assert targets.auth_token == "secret" and targets.job_dir is None and targets.source == f"config {config}"
