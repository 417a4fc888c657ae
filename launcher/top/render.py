"""A `Snapshot` as a rich renderable for `rft top`: the services (state, step, how long since it moved,
uptime, restarts), the explorers (status, held version, rollout rate, tokens/s, reward), the buffer, the
trainer, the synchronizer's last syncs, and the reward curve as a sparkline. A service that did not
answer shows `no answer` with the gRPC code."""

from __future__ import annotations

import time

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from launcher.top.collect import Snapshot

BARS = "▁▂▃▄▅▆▇█"
NO_ANSWER = "no answer"


def sparkline(values: list[float], width: int = 60) -> str:
    """The last `width` values as block characters, lowest to highest ('' for none)."""
    values = values[-width:]
    if not values:
        return ""
    lo, hi = min(values), max(values)
    span = hi - lo
    top = len(BARS) - 1
    return "".join(BARS[round((v - lo) / span * top) if span > 0 else top // 2] for v in values)


def _num(value: float | None, spec: str = ".3g") -> str:
    return "-" if value is None else format(value, spec)


def _age(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f}s"
    if seconds < 5400:
        return f"{seconds / 60:.0f}m"
    return f"{seconds / 3600:.1f}h"


def _services(snap: Snapshot) -> Table:
    table = Table(title="services", title_justify="left", expand=False)
    for col in ("service", "address", "state", "step", "moved", "uptime", "restarts", "pid"):
        table.add_column(col, justify="left" if col in ("service", "address", "state") else "right")
    for s in snap.services:
        restarts = "-" if s.restarts is None else str(s.restarts)
        if not s.answered:
            state = Text(f"{NO_ANSWER} ({s.error})" if s.error else NO_ANSWER, style="bold red")
            table.add_row(s.name, s.address or "-", state, "-", "-", "-", restarts, "-")
            continue
        state = Text("up", style="green") if s.heartbeat_age_s < 5 else Text(
            f"loop late {s.heartbeat_age_s:.0f}s", style="yellow")  # fmt: skip
        if s.stuck:  # the loop answers, the work does not move
            state = Text(f"stuck: {s.stuck}", style="bold red")
        step = f"{s.step} {s.unit}".strip() if s.unit else str(s.step)
        table.add_row(
            s.name, s.address, state, step, _age(s.moved_age_s), _age(s.uptime_s), restarts, str(s.pid)
        )
    return table


def _explorers(snap: Snapshot) -> Table:
    table = Table(title="explorers", title_justify="left")
    for col in ("explorer", "status", "step", "version held", "steps/s", "tokens/s", "reward"):
        table.add_column(col, justify="left" if col in ("explorer", "status") else "right")
    for e in snap.explorers:
        if not e.answered:
            table.add_row(e.name, Text(NO_ANSWER, style="bold red"), "-", "-", "-", "-", "-")
            continue
        table.add_row(e.name, e.status, str(e.step), str(e.version), _num(e.steps_per_s),
                      _num(e.tokens_per_s, ".0f"), _num(e.reward))  # fmt: skip
    return table


def _pipeline(snap: Snapshot) -> Table:
    """Buffer, trainer and synchronizer side by side, one key/value column each."""
    table = Table(title="pipeline", title_justify="left", show_header=True)
    cells: list[list[str]] = []
    b, t, s = snap.buffer, snap.trainer, snap.sync
    if b is not None:
        table.add_column("buffer")
        st = b.stats
        cells.append([NO_ANSWER] if not b.answered else [
            f"depth {st.size}" + (f"/{st.capacity}" if st.capacity else "") + f" ({st.store})",
            f"leases {st.pending_leases} ({st.pending_experiences} exp)"
            + (f", oldest {st.oldest_lease_age_s:.1f} s" if st.pending_leases else ""),
            f"accepted {st.accepted}  acked {st.acked}",
            f"dropped stale {st.dropped_stale}",
            f"oldest version stored {_num(b.oldest_version, 'd')}",
        ])  # fmt: skip
    if t is not None:
        table.add_column("trainer")
        total = f"/{t.total_steps}" if t.total_steps else ""
        loss = f"{t.loss[0]} {t.loss[1]:.4g}" if t.loss else "loss -"
        lines = [f"step {t.step}{total} ({t.status})" if t.answered else NO_ANSWER]
        if t.answered or t.step_time_s is not None:  # else nothing from its metrics file either
            lines += [f"version {t.version}", f"step time {_num(t.step_time_s)} s",
                      f"tokens/s {_num(t.tokens_per_s, '.0f')}", loss]  # fmt: skip
        cells.append(lines)
    if s is not None:
        table.add_column("synchronizer")
        lines = [NO_ANSWER] if not s.answered else [
            f"version {s.version} ({s.method})" + (" syncing" if s.in_progress else "")
            + (" finished" if s.finished else ""),
            *(f"{m} {st} v{v}" for m, st, v in s.members[:4]),
        ]  # fmt: skip
        cells.append(lines)
    rows = max((len(c) for c in cells), default=0)
    for i in range(rows):
        table.add_row(*(c[i] if i < len(c) else "" for c in cells))
    return table


def _syncs(snap: Snapshot) -> RenderableType | None:
    if snap.sync is None or not snap.sync.events:
        return None
    table = Table(title="last syncs", title_justify="left")
    for col in ("ago", "event", "member", "version", "detail"):
        table.add_column(col)
    for e in reversed(snap.sync.events):
        table.add_row(_age(e.age_s), e.kind, e.member or "-", str(e.version), e.detail[:50])
    return table


def render(snap: Snapshot, width: int = 60) -> RenderableType:
    """The whole frame."""
    when = time.strftime("%H:%M:%S", time.localtime(snap.taken_at))
    parts: list[RenderableType] = [Text(f"rft top  {snap.source}  {when}", style="bold")]
    parts.append(_services(snap))
    if snap.explorers:
        parts.append(_explorers(snap))
    if snap.buffer is not None or snap.trainer is not None or snap.sync is not None:
        parts.append(_pipeline(snap))
    syncs = _syncs(snap)
    if syncs is not None:
        parts.append(syncs)
    if snap.rewards:
        last = snap.rewards[-1]
        parts.append(Text(f"reward {sparkline(snap.rewards, width)}  last {last:.3g} "
                          f"(min {min(snap.rewards):.3g}, max {max(snap.rewards):.3g}, "
                          f"{len(snap.rewards)} steps)"))  # fmt: skip
    else:
        parts.append(Text("reward (no explore step yet)"))
    return Group(*parts)
