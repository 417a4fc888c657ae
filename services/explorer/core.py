"""The explorer core: explore steps, evaluation, bench mode, weights and status. No gRPC in here.

An explore step takes `buffer.batch_size` tasks (batch_size / n for each of n explorers with
`explorer.split_batch`), runs their workflows concurrently on the rollout
engines (`runner_per_model` runners per engine), stamps the experiences (group id per task, explorer
id, step), streams them to the sink, logs `rollout/*` and `time/*` metrics and saves the position so a
restarted explorer resumes after the last finished step. Every step's position is also appended to a
journal (`explorer/<id>.positions.jsonl`), so a restarted explorer can resume at an earlier step
(`rewind_to`): the step the trainer holds, so it never waits for weights that cannot come and the data
a crash lost is explored again. Each start of the process is an incarnation (saved with the position)
that goes into the batch ids, so experiences explored again never share an id with earlier ones.
Before each step the sync gate may hold it (the synchronizer's sync plan). Eval tasksets run every `explorer.eval_interval` steps and on startup.
Every weight load is logged (`weights loaded`, with a SHA-256 of what the engines hold when
`synchronizer.weight_digest` is on, to compare with the trainer's `weights sent`).
With in-flight weight updates (`inflight`, an `InflightFollower`; inflight.py) new versions are also
fetched while a step samples and land between decode steps; each step logs `rollout/inflight_*`.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from services.common import tracing
from services.common.experience import Experience, ExperienceId
from services.common.log import get_logger
from services.common.monitor import Monitor
from services.explorer.engines.base import RolloutEngine
from services.explorer.group_filter import fill_step
from services.explorer.inflight import InflightFollower, inflight_metrics
from services.explorer.metrics import eval_metrics, rollout_metrics
from services.explorer.model_wrapper import ModelWrapper
from services.explorer.runner import TaskResult, WorkflowRunner
from services.explorer.scheduler import TaskScheduler, all_tasks, open_tasksets
from services.explorer.settings import ExplorerSettings
from services.explorer.sink import ExperienceSink
from services.explorer.sync import NeverWait, SyncGate
from services.explorer.tasks import Task
from services.explorer.workflows import requires_ground_truth
from services.weight_sync import weights_digest

log = get_logger("explorer.core")


class ExplorationFailed(RuntimeError):
    """Every task of an explore step failed: there is nothing to train on, so the run cannot go on."""


@dataclass
class StepResult:
    step: int
    experiences: int
    metrics: dict[str, float]


def tasks_per_step(settings: ExplorerSettings, shard: tuple[int, int]) -> int:
    """Tasks per explore step: `buffer.batch_size`, or this explorer's share of it (`split_batch`)."""
    size, parts = settings.batch_size, shard[1]
    if not settings.split_batch or parts == 1:
        return size
    if size % parts:
        raise ValueError(
            f"explorer.split_batch: buffer.batch_size {size} cannot be split over {parts} explorers; "
            f"use a multiple of {parts}"
        )
    return size // parts


class ExplorerCore:
    def __init__(
        self,
        settings: ExplorerSettings,
        *,
        engines: Sequence[RolloutEngine],
        sink: ExperienceSink,
        explorer_id: str,
        auxiliary_models: Sequence[Any] = (),
        gate: SyncGate | None = None,
        monitor: Monitor | None = None,
        shard: tuple[int, int] = (0, 1),
    ):
        if not engines:
            raise ValueError("the explorer needs at least one rollout engine")
        self.settings = settings
        self.engines = list(engines)
        self.sink = sink
        self.explorer_id = explorer_id
        self.auxiliary_models = list(auxiliary_models)
        self.gate = gate or NeverWait()
        self.inflight: InflightFollower | None = None  # in-flight weight updates (inflight.py)
        self.monitor = monitor
        self.shard = shard
        self.tasks_per_step = tasks_per_step(settings, shard)
        self.step = 0
        self.incarnation = 0  # starts of this explorer id in this job (batch ids carry it)
        self.status = "STARTING"
        self.last_metrics: dict[str, float] = {}
        self.exhausted = False
        # `sync_style: fully_async` with a synchronizer: explore past `total_steps` until the run
        # finishes (the trainer drops stale data, so it may need more steps than it trains)
        self.until_run_ends = False
        self._scheduler: TaskScheduler | None = None
        self._eval_sets: list[Any] = []
        self._next_engine = 0
        self._slots = asyncio.Semaphore(settings.runner_per_model * len(self.engines))
        self._step_lock = asyncio.Lock()
        self._stopping = False
        self._evaluated = False
        self._chat_template = settings.chat_template

    # ------------------------------------------------------------------ lifecycle
    @property
    def state_file(self) -> Path:
        return self.settings.job_dir / "explorer" / f"{self.explorer_id}.json"

    @property
    def journal_file(self) -> Path:
        return self.settings.job_dir / "explorer" / f"{self.explorer_id}.positions.jsonl"

    @property
    def model_version(self) -> int:
        return min(e.model_version for e in self.engines)

    async def start(self) -> None:
        """Open the tasksets (and restore the saved position when resuming)."""
        need = requires_ground_truth
        s = self.settings
        train = list(s.tasksets)
        self._scheduler = TaskScheduler(
            await asyncio.to_thread(
                open_tasksets, s.resolved, train, is_eval=False, needs_response=need, shard=self.shard
            )
        )
        evals = list(s.eval_tasksets)
        self._eval_sets = await asyncio.to_thread(
            open_tasksets, s.resolved, evals, is_eval=True, needs_response=need
        )
        resumed = s.continue_from_checkpoint and self.state_file.is_file()
        if resumed:
            state = json.loads(self.state_file.read_text())
            self.step = int(state["step"])
            self.incarnation = int(state.get("incarnation", 0)) + 1
            self._scheduler.load_state(state["scheduler"])
            log.info("resumed", explorer=self.explorer_id, step=self.step, incarnation=self.incarnation)
        else:
            self.journal_file.unlink(missing_ok=True)
            self._journal(0)  # where step 1 starts
        self._save_state()
        self.status = "RUNNING"

    def rewind_to(self, step: int) -> bool:
        """Resume after `step` instead of the saved step when `step` is earlier (the trainer holds
        only that many steps); True when it rewound. The journal gives the position."""
        assert self._scheduler is not None, "call start() first"
        if step >= self.step:
            return False
        position = None
        if self.journal_file.is_file():
            for line in self.journal_file.read_text().splitlines():
                try:
                    entry = json.loads(line)
                except ValueError:  # a line cut short by a crash
                    continue
                if int(entry["step"]) == step:
                    position = entry["scheduler"]
        if position is None:
            log.warning("no journal position to rewind to; resuming at the saved step",
                        explorer=self.explorer_id, step=self.step, wanted=step)  # fmt: skip
            return False
        log.info("rewound to the trainer's step", explorer=self.explorer_id, saved_step=self.step, step=step)
        self._scheduler.load_state(position)
        self.step = step
        self.exhausted = False
        self._save_state()
        return True

    def _journal(self, step: int) -> None:
        assert self._scheduler is not None
        self.journal_file.parent.mkdir(parents=True, exist_ok=True)
        with self.journal_file.open("a") as fh:
            fh.write(json.dumps({"step": step, "scheduler": self._scheduler.state()}) + "\n")

    def _save_state(self) -> None:
        assert self._scheduler is not None
        self.state_file.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.state_file.with_suffix(".tmp")
        state = {"step": self.step, "incarnation": self.incarnation, "scheduler": self._scheduler.state()}
        tmp.write_text(json.dumps(state))
        os.replace(tmp, self.state_file)

    def _done(self) -> bool:
        total = self.settings.total_steps
        ended = total is not None and self.step >= total and not self.until_run_ends
        return self._stopping or self.exhausted or ended

    def failed(self, exc: BaseException, logger: Any, **fields: Any) -> int:
        """The run ended by `exc`: mark this explorer FAILED, log it to `logger` (the entry's own, as
        the launcher reads it) and return the exit code, 1."""
        self.status = "FAILED"
        logger.exception("explorer failed", **fields, error=f"{type(exc).__name__}: {exc}")
        return 1

    async def stop(self) -> None:
        self._stopping = True
        self.status = "STOPPED"
        if self.inflight is not None:
            await self.inflight.stop()

    # ------------------------------------------------------------------ running tasks
    def _model(self) -> ModelWrapper:
        engine = self.engines[self._next_engine % len(self.engines)]
        self._next_engine += 1
        return ModelWrapper(
            engine,
            loop=asyncio.get_running_loop(),
            max_prompt_tokens=self.settings.max_prompt_tokens,
            enable_prompt_truncation=self.settings.enable_prompt_truncation,
            chat_template=self._chat_template,
            enable_thinking=self.settings.enable_thinking,
            tool_call_parser=self.settings.tool_call_parser,
        )

    async def _run_task(self, task: Task) -> TaskResult:
        async with self._slots:
            model = self._model()
            # a workflow that passes no sampling params samples with its taskset's (token limit included)
            model.sampling = task.sampling
            if task.format.chat_template or task.format.enable_thinking is not None:
                model.chat_template = task.format.chat_template or model.chat_template
                if task.format.enable_thinking is not None:
                    model.enable_thinking = task.format.enable_thinking
            runner = WorkflowRunner(
                model,
                auxiliary_models=self.auxiliary_models,
                timeout_s=self.settings.max_timeout,
                max_retry_times=self.settings.max_retry_times,
            )
            return await runner.run(task)

    def _stamp(self, result: TaskResult, step: int, batch_id: str) -> list[Experience]:
        task = result.task
        group = f"{self.explorer_id}/{batch_id}/{task.task_id}/e{task.epoch}"
        out = []
        single = len(result.runs) == 1
        for run_index, run in enumerate(result.runs):
            for j, exp in enumerate(run):
                exp.eid = ExperienceId(
                    batch_id=batch_id,
                    task_id=task.task_id,
                    run_id=j if single else run_index,
                    step=step,
                    suffix="" if single or len(run) == 1 else str(j),
                    group_id=group,
                    explorer_id=self.explorer_id,
                )
                exp.info.setdefault("taskset", task.taskset)
                out.append(exp)
        return out

    def _engine_totals(self) -> tuple[float, float]:
        stats = [e.stats() for e in self.engines]
        return sum(s.get("generated_tokens", 0.0) for s in stats), sum(
            s.get("generate_seconds", 0.0) for s in stats
        )

    def _inflight_updates(self) -> float:
        return sum(e.stats().get("inflight_updates", 0.0) for e in self.engines)

    # ------------------------------------------------------------------ explore
    async def explore_step(self) -> StepResult | None:
        """One explore step; None when the data or `total_steps` is used up (or stop was asked)."""
        with tracing.span("explorer.step") as span:
            result = await self._explore_step()
            if span is not None and result is not None:
                span.set_attribute("rft.step", result.step)
            return result

    async def _explore_step(self) -> StepResult | None:
        assert self._scheduler is not None, "call start() first"
        async with self._step_lock:
            if self._done():
                return None
            step = self.step + 1
            t0 = time.perf_counter()
            self.status = "WAITING_SYNC"
            with tracing.span("explorer.wait_weights"):
                await self.gate.before_step(step, self.model_version)
            self.status = "RUNNING"
            if self.inflight is not None:
                self.inflight.start()  # new versions land while this step samples
            t_wait = time.perf_counter() - t0
            tasks = self._scheduler.next_batch(self.tasks_per_step)
            if not tasks:
                self.exhausted = True
                return None
            tokens0, gen0 = self._engine_totals()
            updates0 = self._inflight_updates()
            t1 = time.perf_counter()
            with tracing.span("explorer.rollout", {"rft.tasks": len(tasks)}):  # generate + reward
                results = await asyncio.gather(*(self._run_task(t) for t in tasks))
                filter_metrics: dict[str, float] = {}
                if self.settings.filter_groups.enable:  # DAPO dynamic sampling
                    results, filter_metrics = await fill_step(
                        results, len(tasks), self.settings.filter_groups, self._next_gen_batch
                    )
            t_run = time.perf_counter() - t1
            if results and not any(r.ok for r in results):
                # nothing to train on: the trainer would wait for this step forever; say why instead
                first = results[0]
                raise ExplorationFailed(
                    f"every task of explore step {step} failed ({len(results)} of {len(results)}, "
                    f"each after {first.attempts} attempt(s)); first error, task {first.task.task_id}: "
                    f"{first.error}"
                )
            batch_id = str(step) if not self.incarnation else f"{step}.{self.incarnation}"
            experiences = [e for r in results if r.ok for e in self._stamp(r, step, batch_id)]
            t_sleep = time.perf_counter()
            await self._engines_sleep()  # before the trainer gets the batch
            t2 = time.perf_counter()
            t_sleep = t2 - t_sleep
            asleep = sum(1 for e in self.engines if getattr(e, "asleep", False))
            if experiences:
                with tracing.span("explorer.put", {"rft.experiences": len(experiences)}):
                    tracing.stamp(experiences)  # the trainer's get-batch span links back here
                    await self.sink.put(experiences)
            t_put = time.perf_counter() - t2
            self.step = step
            tokens1, gen1 = self._engine_totals()
            metrics = rollout_metrics(results)
            metrics.setdefault("rollout/model_version", float(self.model_version))
            metrics["rollout/generated_tokens"] = tokens1 - tokens0
            metrics["rollout/tokens_per_s"] = (tokens1 - tokens0) / max(t_run, 1e-9)
            if gen1 > gen0:
                metrics["rollout/engine_tokens_per_s"] = (tokens1 - tokens0) / (gen1 - gen0)
            metrics["rollout/bad_rows"] = float(self._scheduler.bad_rows)
            metrics |= filter_metrics
            if self.inflight is not None:
                metrics |= inflight_metrics(experiences, self._inflight_updates() - updates0)
            metrics.update(
                {
                    "time/wait_explore_step": t_wait,
                    **self.gate.step_metrics(),  # t_wait split: blocked on the sync plan / loading weights
                    "time/run_execution": t_run,
                    "time/put_experiences": t_put,
                    "time/engine_sleep": t_sleep,
                    "rollout/engines_asleep": float(
                        asleep
                    ),  # sleep mode: all of them, while the trainer steps
                    "time/explore_step": time.perf_counter() - t0,
                }
            )
            self._journal(step)
            self._save_state()
            self._log(metrics, step)
            if self._scheduler.exhausted:
                self.exhausted = True
        interval = self.settings.eval_interval
        if self._eval_sets and interval and step % interval == 0:
            await self.eval()
            await self._engines_sleep()
        return StepResult(step=step, experiences=len(experiences), metrics=metrics)

    async def _engines_sleep(self) -> None:
        """Engines in sleep mode (`enable_sleep_mode`: vLLM on a GPU shared with the trainer; every
        engine of a colocated run, `SyncPlan.engines_sleep_after_step`) free their device memory until
        their next generate or weight load wakes them (the hf engine: hf.py `sleep`)."""
        for engine in self.engines:
            sleep = getattr(engine, "sleep", None)
            if sleep is not None:
                await sleep()

    async def _next_gen_batch(self) -> list[TaskResult]:
        """One more generation round of a step (dynamic sampling); empty when the data is used up."""
        assert self._scheduler is not None
        tasks = self._scheduler.next_batch(self.tasks_per_step)
        return list(await asyncio.gather(*(self._run_task(t) for t in tasks)))

    async def explore(self, steps: int = 0) -> list[StepResult]:
        """Run `steps` explore steps (0 or less: until done); evaluate on startup first if asked."""
        if self.step == 0 and self.settings.eval_on_startup and self._eval_sets and not self._evaluated:
            await self.eval()
        out: list[StepResult] = []
        try:
            while steps <= 0 or len(out) < steps:
                result = await self.explore_step()
                if result is None:
                    break
                out.append(result)
        finally:
            if self.inflight is not None and (steps <= 0 or self._done()):
                await self.inflight.stop()  # nothing more to explore: stop fetching mid-step
        return out

    # ------------------------------------------------------------------ eval and bench
    async def eval(
        self, names: Iterable[str] = (), prefix: str = "eval", step: int | None = None
    ) -> dict[str, float]:
        """Evaluate the eval tasksets (all, or those named) with the current weights; nothing is sent."""
        self._evaluated = True
        wanted = set(names)
        unknown = wanted - {ts.name for ts, _ in self._eval_sets}
        if unknown:
            raise KeyError(f"no eval taskset named {', '.join(sorted(unknown))}")
        t0 = time.perf_counter()
        metrics: dict[str, float] = {}
        for ts, factory in self._eval_sets:
            if wanted and ts.name not in wanted:
                continue
            tasks = all_tasks(ts, factory)
            results = await asyncio.gather(*(self._run_task(t) for t in tasks))
            metrics.update(eval_metrics(ts.name, results, prefix=prefix))
        metrics[f"time/{prefix}"] = time.perf_counter() - t0
        self._log(metrics, self.step if step is None else step)
        return metrics

    async def bench(
        self, checkpoints: Sequence[tuple[int, str]], include_base: bool = True
    ) -> dict[int, dict[str, float]]:
        """Evaluate the current weights (step 0) and every (step, HF folder) checkpoint, as `bench/...`."""
        from services.explorer.engines.weights import read_safetensors_folder

        out: dict[int, dict[str, float]] = {}
        if include_base:
            out[0] = await self.eval(prefix="bench", step=0)
        for step, folder in checkpoints:
            named = await asyncio.to_thread(read_safetensors_folder, folder)
            await self.load_weights(named, version=step)
            out[step] = await self.eval(prefix="bench", step=step)
        return out

    # ------------------------------------------------------------------ weights and status
    async def load_weights(
        self, named_tensors: Iterable[tuple[str, torch.Tensor]], version: int, strict: bool = True
    ) -> None:
        """Load the same weights into every engine (between batches) and record the new version.
        `strict` False: the tensors are a subset of the model's (the rest stay as they are)."""
        named = list(named_tensors)
        self.status = "SYNCING"
        try:
            with tracing.span("explorer.sync.apply", {"rft.model_version": version}):
                for engine in self.engines:
                    if strict:
                        await engine.load_weights(named, version)
                    else:
                        await engine.load_weights(named, version, strict=False)
        finally:
            self.status = "RUNNING" if not self._stopping else "STOPPED"
        self.gate.notify_version(version)
        await self.weights_loaded(version, [n for n, _ in named])

    async def weights_loaded(self, version: int, names: Sequence[str]) -> None:
        """Log a finished load; with `synchronizer.weight_digest`, the digest of the loaded `names`
        as the first engine holds them (engines without a local model log none)."""
        digest = None
        model = getattr(self.engines[0], "model", None)
        if self.settings.weight_digest and model is not None:
            held = model.state_dict()
            digest = await asyncio.to_thread(weights_digest, [(n, held[n]) for n in names if n in held])
        log.info("weights loaded", version=version, tensors=len(names), digest=digest)

    def status_info(self) -> Mapping[str, Any]:
        return {
            "explorer_id": self.explorer_id,
            "status": self.status,
            "step": self.step,
            "model_version": self.model_version,
            "rollout_workers": len(self.engines),
            "last_metrics": dict(self.last_metrics),
            "exhausted": self.exhausted,
        }

    def _log(self, metrics: Mapping[str, float], step: int) -> None:
        self.last_metrics = dict(metrics)
        if self.monitor is not None:
            self.monitor.log(metrics, step)

    async def close(self) -> None:
        await self.stop()
        await self.sink.close()
        for engine in self.engines:
            await engine.close()
        if self.monitor is not None:
            self.monitor.close()


def find_checkpoints(job_dir: Path, latest_only: bool = False) -> list[tuple[int, str]]:
    """(step, folder) of every `global_step_N` holding an HF export (`huggingface/` or safetensors)."""
    found = []
    for d in Path(job_dir).glob("global_step_*"):
        try:
            step = int(d.name.rsplit("_", 1)[1])
        except ValueError:
            continue
        for cand in (d / "huggingface", d / "actor" / "huggingface", d):
            if any(cand.glob("*.safetensors")):
                found.append((step, str(cand)))
                break
    found.sort()
    return found[-1:] if latest_only else found
