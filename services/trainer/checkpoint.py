"""Checkpoints: `<job_dir>/global_step_N/` with everything needed to resume exactly.

Layout (one folder per saved step; `role` is `actor` or `critic`):

    global_step_N/<role>/model.safetensors        gathered weights (world size 1), HF names; with LoRA
                                                  only the adapter (`Role.trainable_only`)
    global_step_N/<role>/optim.pt                 gathered optimizer state (tensors + numbers only)
    global_step_N/<role>/dcp/                     torch.distributed.checkpoint shards of model + optim
                                                  (world size > 1; loads under any world size)
    global_step_N/<role>/extra_state_rank_R.pt    LR scheduler + RNG states of rank R
    global_step_N/trainer_state.json              step, consumed samples, model version, KL coef
    global_step_N/huggingface/                    config + tokenizer + model.safetensors (HF export)
    global_step_N/lineage.jsonl                   uids trained by every step up to N (the trainer core)
    latest_checkpointed_iteration.txt             written last, when every file above is on disk

A step is durable once the marker names it (`durable_step`); the trainer acks a step's batch only
then. Folders of steps after the marker's (a save cut short, or steps of a run that resumed from an
earlier checkpoint) are discarded on resume (`discard_after`).

Saving is split: the collective part (gathering or staging tensors into private CPU copies) runs on
the caller's thread, the file writing in a background thread, so the next step starts at once.
`wait()` joins the pending saves. A save that fails (a full disk, an I/O error) removes its folder and is
raised by `wait()` or the next save as `SaveFailed`, naming the step, the folder, the cause and the
checkpoint that stays the latest.  Loading uses safetensors and `torch.load(weights_only=True)`
only, so a checkpoint folder cannot run code.  Old step folders beyond `max_to_keep` are deleted
after the marker moves on.
"""

from __future__ import annotations

import errno
import json
import os
import random
import re
import shutil
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from safetensors.torch import load_file, save_file
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)

from services.trainer.distributed import DistInfo
from services.trainer.fsdp import full_state_dict, load_full_state_dict

__all__ = ["CheckpointManager", "Role", "SaveFailed", "discard_after", "find_latest", "step_dir"]

MARKER = "latest_checkpointed_iteration.txt"
STATE_FILE = "trainer_state.json"


class SaveFailed(RuntimeError):
    """A checkpoint save that did not complete: its folder is removed, the marker still names `durable`
    (the latest complete checkpoint), and nothing trained after it is acked."""

    def __init__(
        self, step: int, folder: Path, durable: int, cause: BaseException, free_bytes: int | None = None
    ):
        self.step, self.folder, self.durable, self.cause = step, folder, durable, cause
        code = _os_errno(cause)
        if code is None and free_bytes is not None and free_bytes < _NEARLY_FULL:
            code = errno.ENOSPC  # torch.save says only "iostream error"; the disk says why
        if code in _DISK_ERRORS:
            left = f", {free_bytes / 2**20:.1f} MiB left" if free_bytes is not None else ""
            what = f"{os.strerror(code)} ({_DISK_ERRORS[code]}{left}): {cause!r}"
            fix = "free space or fix the disk, then run again (the run resumes from there)"
        else:
            what, fix = repr(cause), "see the error above"
        latest = f"step {durable} stays the latest checkpoint" if durable else "there is no checkpoint yet"
        super().__init__(
            f"the checkpoint save of step {step} to {folder} failed: {what}; {latest} and nothing trained "
            f"after it is acked (the buffer hands those batches out again); {fix}"
        )


def _os_errno(exc: BaseException) -> int | None:
    """The errno of an OS error, also inside a library's wrapper (safetensors says `(os error 28)`)."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, OSError) and seen.errno:
            return seen.errno
        found = re.search(r"\(os error (\d+)\)", str(seen))
        if found:
            return int(found.group(1))
        seen = seen.__cause__ or seen.__context__
    return None


_NEARLY_FULL = 16 << 20  # bytes free under which a failed write is taken for a full disk


def _free_bytes(path: Path) -> int | None:
    try:
        return shutil.disk_usage(path).free
    except OSError:
        return None


_DISK_ERRORS = {
    errno.ENOSPC: "the disk is full",
    errno.EDQUOT: "the disk quota is used up",
    errno.EIO: "the disk failed a read or write",
    errno.EROFS: "the disk is read-only",
}


def _marker_step(job_dir: Path) -> int:
    """The step the marker names on disk (0: none, or unreadable)."""
    try:
        text = (Path(job_dir) / MARKER).read_text().strip()
    except OSError:
        return 0
    return int(text) if text.isdigit() else 0


def step_dir(job_dir: Path, step: int) -> Path:
    return Path(job_dir) / f"global_step_{step}"


def find_latest(job_dir: Path) -> Path | None:
    """The step folder named by the marker file, or None when there is no complete checkpoint."""
    marker = Path(job_dir) / MARKER
    if not marker.is_file():
        return None
    text = marker.read_text().strip()
    if not text.isdigit():
        raise ValueError(f"{marker} holds {text!r}, not a step number")
    folder = step_dir(job_dir, int(text))
    if not (folder / STATE_FILE).is_file():
        raise FileNotFoundError(f"{marker} names step {text} but {folder / STATE_FILE} is missing")
    return folder


def discard_after(job_dir: Path, step: int) -> list[int]:
    """Delete every `global_step_N` folder with N > `step`; returns the steps deleted."""
    gone = []
    for folder in Path(job_dir).glob("global_step_*"):
        suffix = folder.name.removeprefix("global_step_")
        if suffix.isdigit() and int(suffix) > step:
            shutil.rmtree(folder, ignore_errors=True)
            gone.append(int(suffix))
    return sorted(gone)


@dataclass
class Role:
    """A trained model of the run: its module, optimizer and LR scheduler."""

    name: str
    module: nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    # LoRA: save and restore only the trainable (adapter) weights; the frozen base weights are the
    # model folder's own, loaded again when the trainer starts
    trainable_only: bool = False

    def model_options(self, **kw: Any) -> StateDictOptions | None:
        return StateDictOptions(ignore_frozen_params=True, **kw) if self.trainable_only else None

    def trainable(self, weights: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        if not self.trainable_only:
            return weights
        names = {n for n, p in self.module.named_parameters() if p.requires_grad}
        return {k: v for k, v in weights.items() if k in names}


def _rng_state() -> dict[str, Any]:
    state: dict[str, Any] = {"torch": torch.get_rng_state(), "python": random.getstate()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _clone(tree: Any) -> Any:
    if isinstance(tree, torch.Tensor):
        return tree.detach().cpu().clone()
    if isinstance(tree, dict):
        return {k: _clone(v) for k, v in tree.items()}
    if isinstance(tree, list):
        return [_clone(v) for v in tree]
    return tree


@dataclass
class CheckpointManager:
    """Saves and loads step folders; every method is collective over the ranks."""

    job_dir: Path
    info: DistInfo
    max_to_keep: int | None = None
    sharded: bool | None = None  # None: sharded iff world size > 1
    _threads: list[threading.Thread] = field(default_factory=list)
    # the marker's writes and a failed save's cleanup, which background saves of the same step (a save,
    # then the same step again with its HF export) or of two steps may reach at once
    _marker_lock: threading.Lock = field(default_factory=threading.Lock)
    _in_flight: dict[int, int] = field(default_factory=dict)  # step -> saves of it not finished
    _errors: list[BaseException] = field(default_factory=list)
    _ckpt_group: Any = None
    durable_step: int = -1  # the newest step this manager made durable (marker written; rank 0)

    def __post_init__(self) -> None:
        self.job_dir = Path(self.job_dir)
        if self.sharded is None:
            self.sharded = self.info.world_size > 1
        if self.sharded and self.info.world_size > 1:
            # background DCP writes talk over their own group, never racing the training collectives
            self._ckpt_group = dist.new_group(backend="gloo")

    # ---- saving -------------------------------------------------------------------------------
    def save(
        self,
        step: int,
        roles: list[Role],
        trainer_state: dict[str, Any],
        hf_export: Callable[[Path, dict[str, torch.Tensor]], None] | None = None,
        hf_role: str = "actor",
    ) -> Path:
        """Stage everything for `step` and write it in the background; returns the step folder."""
        self.raise_pending_error()
        folder = step_dir(self.job_dir, step)
        futures: list[Any] = []
        writes: list[Callable[[], None]] = []
        for role in roles:
            out = folder / role.name
            out.mkdir(parents=True, exist_ok=True)
            extra = {"scheduler": role.scheduler.state_dict(), "rng": _rng_state()}
            torch.save(extra, out / f"extra_state_rank_{self.info.rank}.pt")
            if self.sharded:
                state = {
                    "model": role.trainable(get_model_state_dict(role.module, options=role.model_options())),
                    "optim": get_optimizer_state_dict(role.module, role.optimizer),
                }
                futures.append(
                    dcp.async_save(state, checkpoint_id=str(out / "dcp"), process_group=self._ckpt_group)
                )
            else:
                weights = role.trainable(full_state_dict(role.module))
                optim = _clone(
                    get_optimizer_state_dict(
                        role.module,
                        role.optimizer,
                        options=StateDictOptions(full_state_dict=True, cpu_offload=True),
                    )
                )
                if self.info.is_main:
                    writes.append(lambda out=out, w=weights: save_file(w, str(out / "model.safetensors")))
                    writes.append(lambda out=out, o=optim: torch.save(o, out / "optim.pt"))
        if hf_export is not None:
            module = next(r.module for r in roles if r.name == hf_role)
            weights = full_state_dict(module)
            if self.info.is_main:
                writes.append(lambda w=weights: hf_export(folder / "huggingface", w))
        with self._marker_lock:
            self._in_flight[step] = self._in_flight.get(step, 0) + 1
        thread = threading.Thread(
            target=self._finish, args=(step, folder, futures, writes, dict(trainer_state)), daemon=False
        )
        thread.start()
        self._threads.append(thread)
        return folder

    def _finish(
        self, step: int, folder: Path, futures: list[Any], writes: list[Callable[[], None]], state: dict
    ) -> None:
        try:
            for fut in futures:
                fut.result()
            for write in writes:
                write()
            if self.info.is_main:
                (folder / STATE_FILE).write_text(json.dumps(state, indent=1, sort_keys=True))
                with self._marker_lock:
                    if step >= self.durable_step:  # never back to an earlier step
                        tmp = self.job_dir / f"{MARKER}.{threading.get_ident()}.tmp"
                        tmp.write_text(str(step))
                        with tmp.open("rb+") as fh:  # durable means on disk, not in the page cache
                            os.fsync(fh.fileno())
                        tmp.replace(self.job_dir / MARKER)
                        self.durable_step = step
                self._prune(step)
        except BaseException as exc:  # surfaced by wait() / the next save
            free = _free_bytes(self.job_dir)  # before the cleanup gives the folder's space back
            with self._marker_lock:
                alone = self._in_flight.get(step, 0) <= 1  # no other save of this step still writing
                if self.info.is_main and alone and step > max(self.durable_step, _marker_step(self.job_dir)):
                    shutil.rmtree(folder, ignore_errors=True)  # never durable: give its space back
            self._errors.append(SaveFailed(step, folder, self.durable_step, exc, free))
        finally:
            with self._marker_lock:
                self._in_flight[step] -= 1
                if not self._in_flight[step]:
                    del self._in_flight[step]

    def _prune(self, latest: int) -> None:
        if not self.max_to_keep:
            return
        steps = sorted(
            int(p.name.removeprefix("global_step_"))
            for p in self.job_dir.glob("global_step_*")
            if p.name.removeprefix("global_step_").isdigit()
        )
        for old in [s for s in steps if s <= latest][: -self.max_to_keep]:
            shutil.rmtree(step_dir(self.job_dir, old), ignore_errors=True)

    def wait(self) -> None:
        """Block until every pending save is on disk (and the marker written)."""
        threads, self._threads = self._threads, []
        for t in threads:
            t.join()
        self.raise_pending_error()

    def raise_pending_error(self) -> None:
        if self._errors:
            errors, self._errors = self._errors, []
            raise errors[0] from errors[0].cause

    # ---- loading ------------------------------------------------------------------------------
    def load(self, folder: Path, roles: list[Role]) -> dict[str, Any]:
        """Restore every role from `folder`; returns the trainer state (step, data position, ...)."""
        state = json.loads((folder / STATE_FILE).read_text())
        for role in roles:
            src = folder / role.name
            if (src / "dcp").is_dir():
                msd = role.trainable(get_model_state_dict(role.module, options=role.model_options()))
                osd = get_optimizer_state_dict(role.module, role.optimizer)
                loaded = {"model": msd, "optim": osd}
                dcp.load(loaded, checkpoint_id=str(src / "dcp"))
                set_model_state_dict(role.module, loaded["model"], options=role.model_options(strict=False))
                set_optimizer_state_dict(role.module, role.optimizer, loaded["optim"])
            else:
                weights = load_file(str(src / "model.safetensors")) if self.info.is_main else {}
                load_full_state_dict(role.module, weights, strict=not role.trainable_only)
                optim = torch.load(src / "optim.pt", weights_only=True) if self.info.is_main else {}
                set_optimizer_state_dict(
                    role.module,
                    role.optimizer,
                    optim,
                    options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=True),
                )
            extra_file = src / f"extra_state_rank_{self.info.rank}.pt"
            if not extra_file.is_file():  # resumed under another world size: rank 0's schedule
                extra_file = src / "extra_state_rank_0.pt"
            extra = torch.load(extra_file, weights_only=True)
            role.scheduler.load_state_dict(extra["scheduler"])
            _set_rng_state(extra["rng"])
        return state
