"""The hook between explore steps and weight sync: "before explore step N, wait until allowed (and
fetch new weights if needed)". The synchronizer's gate (`services.weight_sync.member.explorer_gate.ExplorerSyncGate`)
plugs in here; it asks the synchronizer, the one place that holds the sync plan. `NeverWait`, the
default, never waits: an explorer without a synchronizer runs on the weights it has.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable


@runtime_checkable
class SyncGate(Protocol):
    async def before_step(self, step: int, model_version: int) -> None:
        """Return when step `step` may run; raise to stop exploring."""
        ...

    def notify_version(self, model_version: int) -> None: ...

    def step_metrics(self) -> dict[str, float]:
        """Seconds the last `before_step` spent blocked on the plan (`time/wait_for_weights`) and
        fetching + loading new weights (`time/load_weights`)."""
        ...


class NeverWait:
    async def before_step(self, step: int, model_version: int) -> None:
        return None

    def step_metrics(self) -> dict[str, float]:
        return {"time/wait_for_weights": 0.0, "time/load_weights": 0.0}

    def notify_version(self, model_version: int) -> None:
        return None
