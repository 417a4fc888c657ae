"""`SynchronizerCore`: the run's state machine, with no gRPC in sight (the servicer adapts it).

State: the members (`members.py`: one trainer, any number of explorers, each with a status enum,
steps and the version it holds), the published `model_version` (monotonic; bumped only when the
trainer's new weights are complete: a whole memory push, a checkpoint notice, or an nccl broadcast
the trainer reports done), the sync plan (`services/common/config/sync_plan.py`), the memory method's latest weights
(`weights.py`: `pull_weights` answers a pull, the whole version or a cached delta), the pushed
methods' fan-out tree (`weight_tree.py`: `register` notes a member's relay, `weight_sources` names its
chain) and the nccl rendezvous with its generation (`rendezvous.py`).

Weight-sync methods differ here only by their strategy's two traits (`services.weight_sync.
method.SyncMethod`): `broadcast` (nccl: a group with ranks and generations, the ready handshake, and
receivers that hold only what they received) and `pushed` (memory, memory_bf16: `PushWeights` keeps
the latest version for explorers to pull); below, "nccl" stands for any broadcast method.

One method per role and call, every wait an `asyncio.Condition` wait bounded by a timeout
(`sync_timeout` unless given):
- trainer: `request_sync(step)` after each step -> publish now or not (nccl: also waits until every
  explorer of the group is ready to receive, Trinity's handshake), then `publish_memory`,
  `notify_checkpoint` or, for nccl, `report_sync(ok)` once the broadcast ended;
- explorer: `wait_for_version(step)` before each step -> returns once it may run (the plan's
  required version is available) or must join a pending nccl broadcast; after loading it calls
  `report_sync(version, ok)`;
- both: `register`, `heartbeat`, `group_info` (nccl ranks), and anyone: `run_state`.
A member silent for `heartbeat_timeout` is marked LOST by the watchdog task that `start()` launches
(nothing starts in the constructor). An explorer that joins, leaves or is lost, or a failed
broadcast, starts a new group generation and aborts a broadcast that has not begun; a broadcast
whose sender or receiver left, was lost, registered again (a restarted process) or failed to receive
it is called off, and heartbeats say so (`broadcast_generation`) to the members blocked in it. With
nccl an explorer holds only what it received, so a (re)joined explorer waiting for the published
version gets it re-broadcast (same version, no bump) at the trainer's next `request_sync`.
Every state change is an `Event` in `history`; `on_event` (optional) sees each one as it happens
(the service appends them to `<job_dir>/synchronizer/events.jsonl`).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import replace

from services.synchronizer.errors import InvalidArgument, NotKept, NotRegistered, WrongState
from services.synchronizer.members import Event, Member, MemberStatus, Role
from services.synchronizer.records import (
    Broadcast,
    Published,
    RunState,
    SyncDecision,
    WaitResult,
)
from services.synchronizer.rendezvous import Assignment, Rendezvous
from services.synchronizer.settings import SynchronizerSettings
from services.synchronizer.weight_tree import WeightTree
from services.synchronizer.weights import StoredWeights, WeightDeltas
from services.weight_sync import TensorSpec


class SynchronizerCore:
    def __init__(
        self,
        settings: SynchronizerSettings,
        clock: Callable[[], float] = time.monotonic,
        on_event: Callable[[Event], None] | None = None,
    ):
        self.method = settings.method  # resolved from the config's name once, in SynchronizerSettings
        self.settings = settings
        self.plan = settings.plan
        self.clock = clock
        self.members: dict[str, Member] = {}
        self.published = Published()
        self.last_published_step = 0
        self.trainer_step = 0
        self.finished = False
        self.weights: StoredWeights | None = None
        self.weight_deltas = WeightDeltas()  # memory: deltas from recently pulled versions to `weights`
        self.tree = WeightTree(settings.tree_fanout)  # a pushed method's relay tree; fanout 0: star
        self.rendezvous = Rendezvous(
            backend=settings.backend, timeout_s=settings.sync_timeout, bucket_bytes=settings.bucket_bytes
        )
        self.history: deque[Event] = deque(maxlen=10_000)
        self.on_event = on_event
        self._broadcast: Broadcast | None = None
        self._cond = asyncio.Condition()
        self._seq = 0
        self._watchdog: asyncio.Task[None] | None = None
        self._closing = False

    # ---- lifecycle ------------------------------------------------------------------------------
    async def start(self) -> None:
        """Start the heartbeat watchdog (idempotent)."""
        if self._watchdog is None:
            self._watchdog = asyncio.get_running_loop().create_task(self._watch(), name="sync-watchdog")

    async def close(self) -> None:
        """Stop the watchdog (it exits on the flag; no cancellation race) and release every waiter."""
        async with self._cond:
            self.finished = self._closing = True
            self._cond.notify_all()
        if self._watchdog is not None:
            task, self._watchdog = self._watchdog, None
            try:
                await asyncio.wait_for(task, 5)
            except TimeoutError:
                task.cancel()

    async def shutdown(self) -> None:
        """The run is over: waiters return `finished`."""
        async with self._cond:
            self.finished = True
            self._record("finished")
            self._cond.notify_all()

    async def _watch(self) -> None:
        timeout = self.settings.heartbeat_timeout
        while not self._closing:
            async with self._cond:
                self._check_lost()
                beats = [m.last_heartbeat for m in self.members.values() if m.alive]
                wait = (min(beats) + timeout - self.clock()) if beats else timeout
                # wakes on any change (a new member) or at the next possible expiry
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._cond.wait(), max(wait, 0.01))

    async def check_lost(self) -> list[str]:
        """Mark members silent for longer than `heartbeat_timeout` LOST now; returns their ids."""
        async with self._cond:
            return self._check_lost()

    def _check_lost(self) -> list[str]:
        now, lost = self.clock(), []
        for m in self.members.values():
            if m.alive and now - m.last_heartbeat > self.settings.heartbeat_timeout:
                m.status = MemberStatus.LOST
                lost.append(m.member_id)
                self._record("lost", m.member_id, detail=f"silent {now - m.last_heartbeat:.1f}s")
        for member_id in lost:
            self._call_off(member_id, "was marked LOST")
        if any(self.members[i].role == Role.EXPLORER for i in lost):
            self._rebuild(f"lost {', '.join(lost)}")
        if lost:
            self._cond.notify_all()
        return lost

    # ---- helpers ----------------------------------------------------------------------------------
    def _record(
        self, kind: str, member_id: str = "", version: int = 0, step: int = 0, detail: str = ""
    ) -> None:
        event = Event(kind, member_id, version, step, detail)
        self.history.append(event)
        if self.on_event is not None:
            self.on_event(event)

    def _member(self, member_id: str, role: Role | None = None) -> Member:
        m = self.members.get(member_id)
        if m is None or m.status == MemberStatus.LOST:
            state = "unknown" if m is None else "marked LOST"
            raise NotRegistered(f"member {member_id!r} is {state}; register again")
        if role is not None and m.role != role:
            raise WrongState(f"member {member_id!r} is a {m.role.name.lower()}, not a {role.name.lower()}")
        m.last_heartbeat = self.clock()
        return m

    def _rebuild(self, reason: str) -> None:
        """A new broadcast-group generation (nccl); a broadcast that has not begun is aborted."""
        if not self.method.broadcast:
            return
        if self._broadcast is not None and not self._broadcast.accepted:
            self._broadcast = None
        gen = self.rendezvous.rebuild(list(self.members.values()))
        self._record("generation", version=gen, detail=reason)

    @property
    def broadcast_generation(self) -> int:
        """Generation of the broadcast announced or under way (nccl; 0 = none), sent with heartbeats."""
        b = self._broadcast
        return b.generation if b is not None else 0

    def _call_off(self, member_id: str, why: str) -> None:
        """`member_id` left, was lost, registered again (a new process) or failed to receive: when it
        sends the broadcast in progress (the trainer) or receives it, that broadcast can never complete. It is dropped, so
        the members blocked in it see no broadcast of their generation with their heartbeats and give
        it up (`superseded.broadcast_unless_called_off`) instead of waiting out the group's timeout."""
        b, m = self._broadcast, self.members.get(member_id)
        if b is None or m is None or (m.role != Role.TRAINER and member_id not in b.participants):
            return
        self._broadcast = None
        self._record(
            "called off", member_id, b.version, b.step, f"generation {b.generation}: {member_id} {why}"
        )

    def _publish(self, version: int, step: int, path: str = "") -> Published:
        if version <= self.published.version:
            raise WrongState(f"version {version} is not newer than the published {self.published.version}")
        self.published = Published(version, step, path)
        self.last_published_step = step
        for m in self.members.values():
            if m.role == Role.TRAINER and m.alive:
                m.model_version = version
        self._record("publish", version=version, step=step, detail=path)
        self._cond.notify_all()
        return self.published

    def _explorer_requires(self, version: int) -> bool:
        return any(
            m.role == Role.EXPLORER and m.status == MemberStatus.REQUIRE_SYNC and m.wants_version <= version
            for m in self.members.values()
        )

    @property
    def explorer_step(self) -> int:
        return max((m.step for m in self.members.values() if m.role == Role.EXPLORER), default=0)

    # ---- registration and heartbeats -------------------------------------------------------------------
    async def register(
        self,
        member_id: str,
        role: Role,
        *,
        address: str = "",
        workers: int = 1,
        step: int = 0,
        model_version: int = 0,
        weight_sync_port: int = 0,
        relay_address: str = "",
    ) -> Published:
        """Join (or rejoin after a restart or LOST) the run; `relay_address` ('' = none): the relay
        this explorer serves to its children in the fan-out tree (`weight_sources`)."""
        if not member_id:
            raise InvalidArgument("member.member_id must not be empty")
        if workers < 0:
            raise InvalidArgument(f"member.workers must be >= 0, got {workers}")
        async with self._cond:
            old = self.members.get(member_id)
            if old is not None and old.role != role:
                raise InvalidArgument(f"member.role: {member_id!r} registered as {old.role.name.lower()}")
            if role == Role.TRAINER:
                other = [m.member_id for m in self.members.values() if m.role == Role.TRAINER and m.alive]
                if other and other != [member_id]:
                    raise WrongState(f"trainer {other[0]!r} is already registered and alive")
                # a restarted trainer resumed from its checkpoint: its step may be behind the old one
                self.trainer_step = step
            if old is not None:  # a new process: whatever broadcast the old one took part in is over
                self._call_off(member_id, "registered again")
            self._seq += 1
            self.members[member_id] = Member(
                member_id, role, MemberStatus.RUNNING, step, model_version, address, max(1, workers),
                weight_sync_port, self.clock(), last_sync_step=step, seq=self._seq,
            )  # fmt: skip
            self.tree.note(member_id, relay_address)
            self._record("register", member_id, model_version, step, role.name.lower())
            self._rebuild(f"{member_id} registered")
            self._cond.notify_all()
            return self.published

    async def heartbeat(
        self,
        member_id: str,
        status: MemberStatus | None = None,
        step: int | None = None,
        model_version: int | None = None,
    ) -> tuple[Published, bool, int]:
        """Keep the member alive; STOPPED/FAILED leave the run. Returns (published, sync_pending, generation)."""
        async with self._cond:
            m = self._member(member_id)
            if step is not None:
                m.step = max(m.step, step)
                if m.role == Role.TRAINER:
                    self.trainer_step = max(self.trainer_step, step)
            if model_version is not None:
                m.model_version = max(m.model_version, model_version)
            if status is not None and not status.alive:
                m.status = status
                self._record("left", member_id, m.model_version, detail=status.name)
                self._call_off(member_id, status.name.lower())
                if m.role == Role.TRAINER and status == MemberStatus.STOPPED:
                    self.finished = True
                else:
                    self._rebuild(f"{member_id} {status.name.lower()}")
                self._cond.notify_all()
            elif m.status == MemberStatus.STARTING and status is not None:
                m.status = MemberStatus.RUNNING
            return self.published, self._sync_pending(m), self.rendezvous.generation

    def _sync_pending(self, m: Member) -> bool:
        if m.role == Role.TRAINER:
            return self._explorer_requires(self.trainer_step)
        b = self._broadcast
        if b is not None:
            return m.member_id in b.participants and m.member_id not in b.told
        return not self.method.broadcast and self.published.version > m.model_version

    # ---- trainer ------------------------------------------------------------------------------------
    async def request_sync(
        self, member_id: str, step: int, version: int = 0, timeout: float | None = None
    ) -> SyncDecision:
        """Trainer, after step `step`: publish now? nccl: also waits until every receiver is ready."""
        version = version or step
        async with self._cond:
            m = self._member(member_id, Role.TRAINER)
            m.step = self.trainer_step = max(self.trainer_step, step)
            rebroadcast = self.method.broadcast and self._explorer_requires(version)
            if version < self.published.version or (version == self.published.version and not rebroadcast):
                return SyncDecision(False, self.published, reason=f"version {version} is already published")
            if not self.plan.trainer_should_publish(
                step, self.last_published_step, self._explorer_requires(version)
            ):
                return SyncDecision(
                    False, self.published, reason=f"the {self.plan.style} plan has no sync after step {step}"
                )
            if not self.method.broadcast:
                return SyncDecision(True, self.published)
            return await self._handshake(m, version, step, timeout or self.settings.sync_timeout)

    async def _handshake(self, m: Member, version: int, step: int, timeout: float) -> SyncDecision:
        parts = self.rendezvous.participants()
        if not parts or not self.rendezvous.specs:
            why = (
                "no explorer in the weight-sync group" if not parts else "no tensor specs (GetWeightSyncInfo)"
            )
            return SyncDecision(False, self.published, reason=why)
        b = Broadcast(version, step, self.rendezvous.generation, frozenset(parts))
        self._broadcast, m.status = b, MemberStatus.WAITING_SYNC
        self._record("handshake", m.member_id, version, step)
        self._cond.notify_all()
        try:
            await asyncio.wait_for(
                self._cond.wait_for(lambda: self._broadcast is not b or b.told >= b.participants), timeout
            )
        except TimeoutError:
            missing = sorted(b.participants - b.told)
            self._broadcast, m.status = None, MemberStatus.RUNNING
            self._record("timeout", m.member_id, version, detail=f"not ready: {missing}")
            self._rebuild("receivers not ready")
            return SyncDecision(
                False, self.published, reason=f"explorers {missing} not ready within {timeout:g}s"
            )
        except asyncio.CancelledError:
            # the trainer's call went away (it was killed mid-handshake): nobody will host this
            # broadcast's group, so the explorers already told to join it are sent to a new generation
            if self._broadcast is b:
                self._broadcast, m.status = None, MemberStatus.RUNNING
                self._record("abandoned", m.member_id, version, detail=f"told: {sorted(b.told)}")
                if b.told:
                    self._rebuild("the trainer left the handshake")
                self._cond.notify_all()
            raise
        if self._broadcast is not b:
            m.status = MemberStatus.RUNNING
            return SyncDecision(False, self.published, reason="the group changed before the broadcast began")
        b.accepted, m.status = True, MemberStatus.SYNCING
        return SyncDecision(True, self.published, generation=b.generation)

    async def publish_memory(self, weights: StoredWeights) -> Published:
        """A complete memory push: keep it and bump model_version."""
        async with self._cond:
            if not self.method.pushed:
                raise WrongState(
                    f"PushWeights needs a pushed sync_method (memory, memory_bf16), the run uses {self.method.name}"
                )
            published = self._publish(weights.version, weights.step)
            self.weights = weights
            return published

    async def pull_weights(self, version: int = 0, have_version: int | None = None) -> tuple[bytes, ...]:
        """The chunks to stream for a pull of the kept weights (`version` 0: whichever is latest): the
        whole version, or the cached delta from `have_version` when that one is kept (`WeightDeltas`)."""
        stored = self.weights
        if stored is None:
            raise NotKept("no weights were pushed yet")
        if version and version != stored.version:
            raise NotKept(f"version {version} is not kept; the latest is {stored.version}")
        chunks, _ = await self.weight_deltas.chunks_for(stored, have_version)
        return chunks

    async def notify_checkpoint(self, version: int, step: int, path: str) -> Published:
        if not path:
            raise InvalidArgument("checkpoint_path must name the published state dict")
        async with self._cond:
            return self._publish(version, step or version, path)

    # ---- explorer -------------------------------------------------------------------------------
    async def wait_for_version(
        self, member_id: str, min_version: int = 0, step: int = 0, timeout: float | None = None
    ) -> WaitResult:
        """Return once `member_id` may run step `step` (or must join a broadcast), or after `timeout`."""
        deadline = self.clock() + (timeout or self.settings.sync_timeout)
        async with self._cond:
            m = self._member(member_id)
            required = min_version
            if m.role == Role.EXPLORER and step > 0:
                m.step = max(m.step, step - 1)
                required = max(
                    required, self.plan.explorer_required_version(step, m.model_version, m.last_sync_step)
                )
            while True:
                answer = self._answer(m, required)
                if answer is not None:
                    return answer
                if m.status != MemberStatus.REQUIRE_SYNC:
                    m.status, m.wants_version = MemberStatus.REQUIRE_SYNC, required
                    self._record("wait", member_id, required, step)
                    self._cond.notify_all()
                remaining = deadline - self.clock()
                if remaining <= 0:
                    m.status = MemberStatus.RUNNING
                    self._record("timeout", member_id, required, step)
                    return WaitResult(
                        self.published, required, timed_out=True, generation=self.rendezvous.generation
                    )
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._cond.wait(), remaining)

    def _answer(self, m: Member, required: int) -> WaitResult | None:
        if not m.alive:
            raise NotRegistered(f"member {m.member_id!r} left the run ({m.status.name}) while waiting")
        gen = self.rendezvous.generation
        if self.finished:
            return WaitResult(self.published, required, finished=True, generation=gen)
        b = self._broadcast
        if b is not None and not b.accepted and m.member_id in b.participants and m.member_id not in b.told:
            b.told.add(m.member_id)
            m.status = MemberStatus.SYNCING
            self._record("ready", m.member_id, b.version, m.step)
            self._cond.notify_all()
            pending = Published(b.version, b.step)
            return WaitResult(pending, required, receive_broadcast=True, generation=b.generation)
        # a broadcast receiver holds only what it received; the others may fetch what is published
        have = m.model_version if self.method.broadcast else self.published.version
        if have >= required:
            if m.status == MemberStatus.REQUIRE_SYNC:
                m.status = MemberStatus.RUNNING
            return WaitResult(self.published, required, generation=gen)
        return None

    def weight_sources(self, member_id: str) -> tuple[str, ...]:
        """The relays `member_id` pulls a pushed version from, nearest first (empty: the synchronizer
        only): its chain in the fan-out tree over the alive explorers that registered a relay, which
        follows the members as they are now (a member that left or was lost frees its slot here)."""
        return self.tree.sources(self.members.values(), member_id)

    # ---- both -------------------------------------------------------------------------------------
    async def report_sync(
        self, member_id: str, version: int, ok: bool, generation: int = 0, message: str = ""
    ) -> tuple[Published, int]:
        """Trainer: its nccl broadcast ended (ok publishes). Explorer: it loaded `version` (or failed)."""
        async with self._cond:
            m = self._member(member_id)
            self._record("reported", member_id, version, m.step, ("ok " if ok else "failed ") + message)
            if m.role == Role.TRAINER:
                b, self._broadcast = self._broadcast, None
                m.status = MemberStatus.RUNNING
                if ok and version == self.published.version:  # a re-broadcast to a (re)joined explorer
                    self._record("rebroadcast", member_id, version, m.step)
                elif ok:
                    self._publish(version, b.step if b is not None and b.version == version else m.step)
                else:
                    self._rebuild(f"broadcast of version {version} failed: {message}")
            else:
                m.status, m.wants_version = MemberStatus.RUNNING, 0
                if ok:
                    m.model_version = max(m.model_version, version)
                    m.last_sync_step = m.step
                else:
                    b = self._broadcast
                    if b is not None and generation in (0, b.generation):
                        # its peers in a ring collective may wait on it alone and never hear of the
                        # failure: the broadcast is called off, so their heartbeats tell them
                        self._call_off(member_id, f"failed to receive version {version}")
                    if self.method.broadcast and generation in (0, self.rendezvous.generation):
                        self._rebuild(f"{member_id} failed to receive version {version}: {message}")
            self._cond.notify_all()
            return self.published, self.rendezvous.generation

    async def group_info(self, member_id: str, specs: Sequence[TensorSpec] = ()) -> Assignment:
        """nccl: this member's ranks in the current group generation (the trainer supplies specs)."""
        async with self._cond:
            m = self._member(member_id)
            if not self.method.broadcast:
                raise WrongState(
                    f"GetWeightSyncInfo needs a broadcast sync_method (nccl), the run uses {self.method.name}"
                )
            if specs and m.role == Role.TRAINER and self.rendezvous.set_specs(specs):
                self._rebuild("the trainer's tensor specs changed")
            if not self.rendezvous.specs:
                raise WrongState(
                    "the trainer has not sent its tensor specs yet (GetWeightSyncInfo with tensors)"
                )
            assignment = self.rendezvous.assignment(member_id)
            if assignment is None:
                raise WrongState(
                    f"{member_id!r} has no rank: the group needs a trainer and at least one explorer"
                )
            return assignment

    async def wait_until(self, predicate: Callable[[], bool], timeout: float) -> None:
        """Wait until `predicate()` holds (checked on every state change); `TimeoutError` after `timeout`."""
        async with self._cond:
            await asyncio.wait_for(self._cond.wait_for(predicate), timeout)

    def run_state(self) -> RunState:
        b = self._broadcast
        return RunState(
            members=tuple(replace(m) for m in self.members.values()),
            published=self.published,
            trainer_step=self.trainer_step,
            explorer_step=self.explorer_step,
            settings=self.settings,
            sync_in_progress=b is not None,
            finished=self.finished,
            generation=self.rendezvous.generation,
            pending_version=b.version if b is not None else 0,
        )
