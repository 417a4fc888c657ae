"""The explorer core: steps and groups, failing and hanging workflows retried and counted while the
others finish, resume, evaluation metrics, the sync gate, metrics names and bench mode."""

from __future__ import annotations

import asyncio
import json
import threading

import pytest
import torch
from structlog.testing import capture_logs

from services.common.config import load_config
from services.common.experience import Experience
from services.common.log import get_logger
from services.explorer.core import ExplorationFailed, ExplorerCore, find_checkpoints
from services.explorer.metrics import eval_metrics, pass_at
from services.explorer.runner import TaskResult
from services.explorer.settings import ExplorerSettings
from services.explorer.sink import ListSink
from services.explorer.tasks import Task
from services.explorer.workflows import WORKFLOWS

from .fakes import ScriptedEngine

CALLS: dict[str, int] = {}
NEVER = threading.Event()  # never set: a hang bounded only by the task timeout


class _Base:
    is_async = True
    can_repeat = True
    requires_ground_truth = False

    def __init__(self, *, task, model, auxiliary_models=None):
        self.task, self.model = task, model
        CALLS[task.task_id] = CALLS.get(task.task_id, 0) + 1

    def set_repeat_times(self, n):
        self.n = n


class Failing(_Base):
    async def run_async(self):
        raise RuntimeError("boom")


class Hanging(_Base):
    async def run_async(self):
        await asyncio.Event().wait()  # never set: cancelled by the task timeout


class HangingSync(_Base):
    is_async = False

    def run(self):
        NEVER.wait()


class Flaky(_Base):
    async def run_async(self):
        if CALLS[self.task.task_id] == 1:
            raise ValueError("first try fails")
        return await self.model.generate_async([self.task.prompt_text()], n=self.n)


WORKFLOWS.add("test_explorer_failing", Failing)
WORKFLOWS.add("test_explorer_hanging", Hanging)
WORKFLOWS.add("test_explorer_hanging_sync", HangingSync)
WORKFLOWS.add("test_explorer_flaky", Flaky)


def _config(tmp_path, rows, **extra):
    data = tmp_path / "tasks.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    text = f"""
checkpoint_root_dir: {tmp_path}/ckpt
algorithm: {{repeat_times: {extra.get("repeat", 2)}}}
model: {{max_response_tokens: 8}}
buffer:
  batch_size: {extra.get("batch", 4)}
  total_epochs: {extra.get("epochs", 1)}
  explorer_input:
    taskset: {{name: train, path: {data}, format: {{prompt_key: question, response_key: answer, workflow_key: wf}},
               default_reward_fn_type: gsm8k}}
    eval_tasksets: {extra.get("evals", "[]")}
explorer: {{max_timeout: {extra.get("timeout", 30)}, max_retry_times: 2, eval_interval: {extra.get("eval_interval", 100)},
           eval_on_startup: {extra.get("eval_on_startup", "false")}, split_batch: {extra.get("split", "false")}}}
"""
    return load_config(text=text)


def _rows(n, wf=None):
    return [{"question": f"{i}+0", "answer": str(i), **({"wf": wf} if wf else {})} for i in range(n)]


async def _core(config, engine=None, explorer_id="ex1", **kw):
    core = ExplorerCore(
        ExplorerSettings.from_config(config),
        engines=[engine or ScriptedEngine(["#### 1"])],
        sink=ListSink(),
        explorer_id=explorer_id,
        **kw,
    )
    await core.start()
    return core


async def test_steps_group_and_stamp_experiences(tmp_path):
    core = await _core(_config(tmp_path, _rows(6)))
    results = await core.explore()
    assert [r.step for r in results] == [1, 2] and core.exhausted
    exps = core.sink.experiences
    assert len(exps) == 12  # 6 tasks x repeat 2
    groups: dict[str, list[Experience]] = {}
    for e in exps:
        groups.setdefault(e.eid.group_id, []).append(e)
    assert len(groups) == 6 and all(len(g) == 2 for g in groups.values())
    assert sorted(e.eid.run_id for e in next(iter(groups.values()))) == [0, 1]
    first = exps[0]
    assert first.eid.explorer_id == "ex1" and first.eid.step == 1 and first.eid.task_id == "train/0"
    assert first.reward == (1.0 if first.eid.task_id == "train/1" else 0.0)
    m = results[0].metrics
    for key in (
        "rollout/reward/mean",
        "rollout/reward/max",
        "rollout/reward/min",
        "rollout/model_version",
        "rollout/finished_task_count",
        "rollout/tokens_per_s",
        "time/explore_step",
        "time/run_execution",
    ):
        assert key in m, key
    assert m["rollout/finished_task_count"] == 4 and results[1].metrics["rollout/finished_task_count"] == 2
    lines = (core.settings.job_dir / "explorer" / "ex1.json").read_text()
    assert json.loads(lines)["step"] == 2


async def test_split_batch_gives_each_explorer_its_share_of_a_step(tmp_path):
    """Two explorers with `split_batch`: each explores batch_size / 2 tasks of its own shard per step."""
    config = _config(tmp_path, _rows(8), batch=4, split="true")
    seen = []
    for index in (0, 1):
        core = await _core(config, explorer_id=f"ex{index}", shard=(index, 2))
        assert core.tasks_per_step == 2
        results = await core.explore()
        assert [r.metrics["rollout/finished_task_count"] for r in results] == [2, 2]
        seen += sorted({e.eid.task_id for e in core.sink.experiences})
    assert sorted(seen) == sorted(f"train/{i}" for i in range(8))  # the shards cover the taskset once
    assert (await _core(_config(tmp_path, _rows(8), batch=4), shard=(0, 2))).tasks_per_step == 4
    with pytest.raises(ValueError, match="explorer.split_batch: buffer.batch_size 4 cannot be split over 3"):
        await _core(config, shard=(0, 3))


async def test_failing_and_hanging_workflows_are_retried_and_counted_while_others_finish(tmp_path):
    rows = _rows(3) + [
        {"question": "f", "answer": "0", "wf": "test_explorer_failing"},
        {"question": "h", "answer": "0", "wf": "test_explorer_hanging"},
        {"question": "s", "answer": "0", "wf": "test_explorer_hanging_sync"},
        {"question": "r", "answer": "0", "wf": "test_explorer_flaky"},
    ]
    core = await _core(_config(tmp_path, rows, batch=7, timeout=0.3))
    (result,) = await core.explore(1)
    m = result.metrics
    assert m["rollout/finished_task_count"] == 4  # 3 math + the flaky one on its second try
    assert m["rollout/failed_task_count"] == 3
    assert CALLS["train/3"] == 3 and CALLS["train/4"] == 3 and CALLS["train/5"] == 3  # 1 + max_retry_times
    assert CALLS["train/6"] == 2
    assert m["rollout/retry_count"] == 2 + 2 + 2 + 1
    ids = {e.eid.task_id for e in core.sink.experiences}
    assert ids == {"train/0", "train/1", "train/2", "train/6"}


async def test_a_step_whose_every_task_fails_ends_exploration_with_the_first_error(tmp_path):
    """Nothing to train on would leave the trainer waiting for that step forever: the explorer stops
    and says why (the run's failure message shows it) instead of hanging."""
    rows = [{"question": "f", "answer": "0", "wf": "test_explorer_failing"}] * 2
    core = await _core(_config(tmp_path, rows, batch=2, timeout=0.3))
    with pytest.raises(ExplorationFailed, match=r"every task of explore step 1 failed \(2 of 2") as err:
        await core.explore(1)
    assert "first error, task train/0" in str(err.value) and core.step == 0 and not core.sink.experiences
    with capture_logs() as logs:  # the entry points' end on that error (service._auto_run, serve)
        assert core.failed(err.value, get_logger("explorer"), step=core.step) == 1
    assert core.status == "FAILED" and logs[0]["event"] == "explorer failed"
    assert logs[0]["error"].startswith("ExplorationFailed: every task") and logs[0]["step"] == 0


async def test_resume_continues_after_the_last_step(tmp_path):
    config = _config(tmp_path, _rows(10), batch=3)
    core = await _core(config)
    await core.explore(2)
    seen = [e.eid.task_id for e in core.sink.experiences[::2]]
    again = await _core(config)
    assert again.step == 2
    await again.explore()
    rest = [e.eid.task_id for e in again.sink.experiences[::2]]
    assert seen + rest == [f"train/{i}" for i in range(10)] and again.step == 4


async def test_rewind_to_the_trainers_step_explores_again_with_new_ids(tmp_path):
    config = _config(tmp_path, _rows(12), batch=3)
    core = await _core(config)
    await core.explore(3)
    first = core.sink.experiences
    again = await _core(config)  # a restart: the trainer holds only step 1
    assert again.step == 3 and again.incarnation == 1
    assert again.rewind_to(1) and again.step == 1
    assert not again.rewind_to(2)  # never forward
    await again.explore(2)  # steps 2 and 3 again: the same tasks, new batch ids
    redone = again.sink.experiences
    assert [e.eid.task_id for e in redone] == [e.eid.task_id for e in first[6:18]]
    assert [e.eid.step for e in redone[::6]] == [2, 3]
    assert {e.eid.batch_id for e in redone} == {"2.1", "3.1"}
    assert not {e.eid.uid for e in redone} & {e.eid.uid for e in first}
    third = await _core(config)
    assert third.step == 3 and third.incarnation == 2 and not third.rewind_to(5)


async def test_total_steps_stops_exploring(tmp_path):
    config = _config(tmp_path, _rows(10), batch=2, epochs=5)
    config = config.model_copy(update={"buffer": config.buffer.model_copy(update={"total_steps": 3})})
    core = await _core(config)
    assert len(await core.explore()) == 3 and core.step == 3


async def test_eval_on_startup_and_interval_with_k_metrics(tmp_path):
    evals = tmp_path / "eval.jsonl"
    evals.write_text("".join(json.dumps(r) + "\n" for r in _rows(3)))
    spec = f"[{{name: small, path: {evals}, repeat_times: 3, default_reward_fn_type: gsm8k, format: {{prompt_key: question, response_key: answer}}}}]"
    config = _config(tmp_path, _rows(4), batch=2, evals=spec, eval_interval=1, eval_on_startup="true")
    engine = ScriptedEngine(["#### 1", "#### 0", "#### 2"])
    core = await _core(config, engine)
    logged = []
    core.monitor = type(
        "M", (), {"log": lambda self, m, s: logged.append((s, dict(m))), "close": lambda self: None}
    )()
    await core.explore()
    evals_logged = [(s, m) for s, m in logged if any(k.startswith("eval/") for k in m)]
    assert [s for s, _ in evals_logged] == [0, 1, 2]
    m = evals_logged[0][1]
    for key in ("mean@3", "std@3", "best@3", "worst@3"):
        assert f"eval/small/reward/{key}" in m
    assert "eval/small/pass@1" in m and "eval/small/pass@2" in m and "eval/small/pass@3" in m
    assert all(e.eid.batch_id != "eval" for e in core.sink.experiences)  # eval sends nothing
    assert len(core.sink.experiences) == 8


def _result(rewards):
    exps = [
        Experience(tokens=[1, 2], prompt_length=1, reward=r, metrics={"accuracy": float(r >= 1)})
        for r in rewards
    ]
    return TaskResult(task=Task("t/0", 0, "t", {}, "math"), runs=[exps])


def test_eval_metrics_values():
    m = eval_metrics("ts", [_result([1, 0, 0, 0]), _result([1, 1, 0, 1]), _result([0, 0, 0, 0])])
    assert m["eval/ts/reward/mean@4"] == pytest.approx((0.25 + 0.75 + 0) / 3)
    assert m["eval/ts/reward/best@4"] == pytest.approx(2 / 3) and m["eval/ts/reward/worst@4"] == 0
    assert m["eval/ts/pass@1"] == pytest.approx((0.25 + 0.75 + 0) / 3)
    assert m["eval/ts/pass@4"] == pytest.approx(2 / 3)
    assert pass_at(4, 1, 2) == pytest.approx(0.5) and pass_at(5, 0, 1) == 0.0


async def test_steps_wait_on_the_synchronizer_for_the_version_the_plan_needs(tmp_path):
    """The explorer's real gate against a real synchronizer (in-process gRPC server, `checkpoint`
    method, fixed plan with offset 1): steps 1 and 2 run on version 0, step 3 waits for version 1 and
    runs once the trainer publishes it (the plan's formula lives only in the synchronizer)."""
    from safetensors.torch import save_file

    from services.common.config.sync_plan import SyncPlan
    from services.common.rpc import create_channel, start_server
    from services.synchronizer.core import SynchronizerCore
    from services.synchronizer.servicer import registration
    from services.synchronizer.settings import SynchronizerSettings
    from services.weight_sync import Receiver, sync_method
    from services.weight_sync.member.client import SyncClient
    from services.weight_sync.member.explorer_gate import ExplorerSyncGate

    sync = SynchronizerCore(
        SynchronizerSettings(method=sync_method("checkpoint"), plan=SyncPlan("fixed", 1, 1))
    )
    await sync.start()
    server = await start_server([registration(sync)], port=0)
    clients = [
        SyncClient(create_channel(server.address), mid, role, timeout_s=10, sync_timeout_s=30, owns_channel=True)
        for mid, role in (("ex1", "explorer"), ("trainer", "trainer"))
    ]  # fmt: skip
    explorer, trainer = clients
    try:
        for c in clients:
            await c.register()
        core = await _core(_config(tmp_path, _rows(8), batch=2))
        method = sync_method("checkpoint")
        core.gate = ExplorerSyncGate(
            explorer, method.fetch(explorer, Receiver(core.load_weights)), method=method
        )
        await core.explore(2)  # steps 1, 2 need version 0
        next_step = asyncio.ensure_future(core.explore_step())
        await sync.wait_until(lambda: sync.members["ex1"].status.name == "REQUIRE_SYNC", 10)
        assert sync.members["ex1"].wants_version == 1 and not next_step.done()  # step 3 needs version 1
        weights = tmp_path / "v1.safetensors"
        save_file({"w": torch.zeros(1)}, str(weights))
        await trainer.notify_checkpoint(1, 1, str(weights))
        assert (await asyncio.wait_for(next_step, 30)).step == 3
        assert core.status_info()["model_version"] == 1
    finally:
        for c in clients:
            await c.close()
        await server.stop(0)
        await sync.close()


async def test_bench_evaluates_checkpoints(tmp_path, tiny_model_dir):
    from safetensors.torch import save_file

    from services.explorer.engines.hf import HFEngine

    evals = tmp_path / "eval.jsonl"
    evals.write_text("".join(json.dumps(r) + "\n" for r in _rows(2)))
    spec = f"[{{name: b, path: {evals}, default_workflow_type: arithmetic, format: {{prompt_key: question, response_key: answer}}}}]"
    config = _config(tmp_path, _rows(2), evals=spec)
    engine = HFEngine.from_pretrained(str(tiny_model_dir), device="cpu")
    job = tmp_path / "ckpt" / "rft-mesh" / "rft"
    for step in (2, 4):
        folder = job / f"global_step_{step}" / "huggingface"
        folder.mkdir(parents=True)
        save_file(
            {n: p.detach().clone() * 0.5 for n, p in engine.model.named_parameters()},
            str(folder / "model.safetensors"),
        )
    found = find_checkpoints(job)
    assert [s for s, _ in found] == [2, 4] and find_checkpoints(job, latest_only=True)[0][0] == 4
    core = await _core(config, engine)
    out = await core.bench(found)
    assert sorted(out) == [0, 2, 4] and "bench/b/reward/mean@1" in out[4]
    assert engine.model_version == 4
    assert torch.isfinite(torch.tensor(list(out[4].values()))).all()
