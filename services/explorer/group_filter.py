"""DAPO dynamic sampling (Yu et al. 2025, https://arxiv.org/abs/2503.14476, eq. 11; veRL
`algorithm.filter_groups`): a group whose samples all get the same reward has zero advantage under a
group-relative estimator (GRPO: (r - mean) / std with std = 0), so it carries no gradient but still
dilutes the batch. Such groups are dropped and more tasks are sampled until the step has
`buffer.batch_size` groups that differ, at most `max_num_gen_batches` generation rounds (0 = no
bound). When the bound is hit, or the data ends first, the step is filled with dropped groups and a
warning says so: the trainer waits for full batches, so a short step would stall the run.

`metric` picks what must differ within a group (veRL's names): `acc` (the sample's `acc` or
`accuracy` metric, else its reward), `score` / `seq_reward` (the workflow's reward),
`seq_final_reward` (the sum of the token-level rewards when the workflow gives them, else the
reward; the explorer applies no KL penalty, so this is the final reward). Reward shaping the trainer
does later (KL, DAPO's overlong penalty) is not seen here: veRL's DAPO recipe filters on `acc`,
which that shaping does not change either.

It lives in the explorer, before anything is put into the buffer, rather than in the trainer's
lease: a dropped group is never put, so the buffer's exactly-once accounting (leases, acks, lineage)
never sees it; the explorer's step still produces one full batch per model version, so the sync
schedule (`sync_offset`) is unchanged; and the extra generation runs where the rollout engines are.
Metrics: `rollout/num_gen_batches`, `rollout/dropped_groups` (groups dropped and not used to fill),
`rollout/filled_groups` (dropped groups used to fill a step after the bound).
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable, Sequence

from services.common.config.algorithm import FilterGroupsConfig
from services.common.experience import Experience
from services.common.log import get_logger
from services.explorer.runner import TaskResult

__all__ = ["fill_step", "group_has_signal", "sample_metric"]

log = get_logger("explorer.group_filter")


def sample_metric(exp: Experience, metric: str) -> float:
    """The value of `metric` for one sample (see the module docstring)."""
    reward = float(exp.reward) if exp.reward is not None else 0.0
    if metric == "acc":
        return float(exp.metrics.get("acc", exp.metrics.get("accuracy", reward)))
    if metric == "seq_final_reward" and exp.token_level_rewards is not None:
        return float(exp.token_level_rewards.sum())
    return reward


def group_has_signal(result: TaskResult, metric: str) -> bool:
    """Whether the group's `metric` values differ (population std > 0; a single sample never does)."""
    values = [sample_metric(e, metric) for e in result.experiences]
    return len(values) > 1 and any(not math.isclose(v, values[0], abs_tol=1e-12) for v in values)


async def fill_step(
    first: Sequence[TaskResult],
    need: int,
    config: FilterGroupsConfig,
    generate: Callable[[], Awaitable[list[TaskResult]]],
) -> tuple[list[TaskResult], dict[str, float]]:
    """The results to put for one step: `need` groups with signal when they can be found.

    `first` is the step's first generation round; `generate()` runs another round (an empty list
    when the data is used up). Failed tasks are kept in the returned list (they put nothing but
    count in the task metrics); extra groups with signal beyond `need` are discarded, as in veRL.
    """
    failed: list[TaskResult] = []
    kept: list[TaskResult] = []
    dropped: list[TaskResult] = []
    rounds = 0
    batch: Sequence[TaskResult] = first
    while True:
        rounds += 1
        for r in batch:
            (failed if not r.ok else kept if group_has_signal(r, config.metric) else dropped).append(r)
        if len(kept) >= need:
            break
        limit = config.max_num_gen_batches
        if limit and rounds >= limit:
            log.warning("filter_groups: max_num_gen_batches reached; filling the step with groups whose "
                        f"{config.metric} is the same for every sample (no learning signal)",
                        rounds=rounds, kept=len(kept), need=need)  # fmt: skip
            break
        batch = await generate()
        if not batch:
            log.warning("filter_groups: the data ended before the step had enough groups that differ; "
                        "filling it with dropped groups", kept=len(kept), need=need)  # fmt: skip
            break
    filler = dropped[: max(0, need - len(kept))]
    metrics = {
        "rollout/num_gen_batches": float(rounds),
        "rollout/dropped_groups": float(len(dropped) - len(filler)),
        "rollout/filled_groups": float(len(filler)),
    }
    return kept[:need] + filler + failed, metrics
