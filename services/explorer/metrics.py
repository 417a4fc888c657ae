"""Explorer metric names and aggregation (Trinity-RFT's layout).

Rollout: each experience's `metrics` (reward, accuracy, response_length, ...) are averaged per task,
then summarised over the step's tasks as `rollout/<metric>/{mean,max,min}`; plus task counts,
`rollout/model_version` and timing. Evaluation: with k samples per task,
`eval/<taskset>/<metric>/{mean@k,std@k,best@k,worst@k}` are the means over tasks of the mean, std, max
and min of the task's k values, and `eval/<taskset>/pass@j` (j = 1, 2, 4, ... <= k) is the unbiased
estimate 1 - C(n-c, j)/C(n, j) of "one of j samples is correct" (c = samples with accuracy 1).
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from collections.abc import Iterable, Sequence

from services.common.experience import Experience
from services.explorer.runner import TaskResult


def _values(exps: Iterable[Experience]) -> dict[str, list[float]]:
    out: dict[str, list[float]] = defaultdict(list)
    for e in exps:
        metrics = dict(e.metrics)
        if e.reward is not None:
            metrics.setdefault("reward", e.reward)
        for k, v in metrics.items():
            if math.isfinite(float(v)):
                out[k].append(float(v))
    return out


def rollout_metrics(results: Sequence[TaskResult]) -> dict[str, float]:
    per_task: dict[str, list[float]] = defaultdict(list)
    versions: list[int] = []
    for r in results:
        if not r.ok:
            continue
        for k, vs in _values(r.experiences).items():
            per_task[k].append(statistics.fmean(vs))
        versions.extend(e.model_version for e in r.experiences)
    out: dict[str, float] = {}
    for k, vs in sorted(per_task.items()):
        out[f"rollout/{k}/mean"] = statistics.fmean(vs)
        out[f"rollout/{k}/max"] = max(vs)
        out[f"rollout/{k}/min"] = min(vs)
    out.update(task_counts(results, "rollout"))
    if versions:
        out["rollout/model_version"] = float(max(versions))
    return out


def task_counts(results: Sequence[TaskResult], prefix: str) -> dict[str, float]:
    done = [r for r in results if r.ok]
    out = {
        f"{prefix}/finished_task_count": float(len(done)),
        f"{prefix}/failed_task_count": float(len(results) - len(done)),
        f"{prefix}/retry_count": float(sum(r.retries for r in results)),
        f"{prefix}/experience_count": float(sum(len(r.experiences) for r in done)),
    }
    if results:
        times = [r.seconds for r in results]
        out[f"time/{prefix}/task_execution/mean"] = statistics.fmean(times)
        out[f"time/{prefix}/task_execution/max"] = max(times)
    return out


def pass_at(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from n samples with c correct (Chen et al. 2021, https://arxiv.org/abs/2107.03374)."""
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def eval_metrics(taskset: str, results: Sequence[TaskResult], prefix: str = "eval") -> dict[str, float]:
    per_metric: dict[str, list[list[float]]] = defaultdict(list)
    passes: list[tuple[int, int]] = []
    k = 0
    for r in results:
        if not r.ok:
            continue
        values = _values(r.experiences)
        for name, vs in values.items():
            per_metric[name].append(vs)
        correct = values.get("accuracy") or [float(v >= 1.0) for v in values.get("reward", [])]
        if correct:
            passes.append((len(correct), int(sum(v >= 1.0 for v in correct))))
            k = max(k, len(correct))
    base = f"{prefix}/{taskset}"
    out: dict[str, float] = {}
    for name, groups in sorted(per_metric.items()):
        n = max(len(g) for g in groups)
        out[f"{base}/{name}/mean@{n}"] = statistics.fmean(statistics.fmean(g) for g in groups)
        out[f"{base}/{name}/std@{n}"] = statistics.fmean(statistics.pstdev(g) for g in groups)
        out[f"{base}/{name}/best@{n}"] = statistics.fmean(max(g) for g in groups)
        out[f"{base}/{name}/worst@{n}"] = statistics.fmean(min(g) for g in groups)
    j = 1
    while passes and j <= k:
        usable = [(n, c) for n, c in passes if n >= j]
        out[f"{base}/pass@{j}"] = statistics.fmean(pass_at(n, c, j) for n, c in usable)
        j *= 2
    if passes and k not in {2**i for i in range(k.bit_length())}:
        out[f"{base}/pass@{k}"] = statistics.fmean(pass_at(n, c, k) for n, c in passes if n >= k)
    for key, value in task_counts(results, base).items():
        out[key] = value
    return out
