"""The `hf` rollout engine: a transformers model behind the async `RolloutEngine` contract.

Workflows call `generate` concurrently; calls that arrive while a batch is running wait together and
run as the next batch, so many small requests become one batched sampling loop (`hf_generate.py`).
Generation runs in a worker thread (torch releases the GIL), so the event loop keeps serving gRPC.
A lock orders generation and weight loads: a batch sees one set of weights, and its outputs carry
that `model_version`. With in-flight updates on (`set_inflight_updates`, explorer.inflight_weight_update)
a load does not wait for the batch: it offers the weights to the generating thread, which copies them
in between two decode steps (hf_generate.py re-reads the running rows' prefix with them); with no
batch running the load copies them itself. The offered weights are held in full until then (one
copy of the weights beside the model).

Device: the explorer's placement (`device`), else cuda when CUDA is available, else CPU. Memory: on
CUDA, with `gpu_memory_utilization` set (in the config, or by the placement on a GPU shared with the
trainer: resolved.py `rollout_model`), this process's CUDA allocator is capped at that share of the
device (`torch.cuda.set_per_process_memory_fraction`, services/common/gpu_memory.py), so the
trainer beside it keeps the rest.

Sleep (`sleep_mode`: `explorer.rollout_model.enable_sleep_mode`, on for a colocated run, resolved.py):
`sleep` copies every parameter and buffer storage to host memory (pinned on CUDA) and resizes the
device storage to zero, so the weights really leave the device (the tensors, and the lean decoder's
references to them, stay; the KV cache lives only within a batch), then hands the CUDA allocator's
cached blocks back. `wake_up` restores the storages from the host copies; the next generate or weight
load wakes the engine first, as vLLM's.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from services.common import progress
from services.common.config import InferenceModelConfig
from services.common.gpu_memory import cap_cuda_memory
from services.common.modeling import load_model, load_tokenizer, resolve_dtype
from services.explorer.engines.base import EngineState, GenerationOutput, SamplingParams, per_prompt_params
from services.explorer.engines.fault_hook import wedge_hook
from services.explorer.engines.hf_generate import HFGenerator, Row
from services.weight_sync import load_weights


class HFEngine(EngineState):
    """A transformers causal LM as a rollout engine (CPU or CUDA)."""

    # `generate` takes `on_token` (streaming) and `top_logprobs` (the served endpoint checks these)
    supports_streaming = True
    supports_top_logprobs = True

    def __init__(
        self,
        model: torch.nn.Module,
        tokenizer: Any,
        *,
        name: str = "hf",
        micro_batch_size: int = 64,
        seed: int = 42,
        model_version: int = 0,
        lean_decoder: bool = True,
        sleep_mode: bool = False,
    ):
        self.name = name
        self.sleep_mode = sleep_mode
        self._parked: list[tuple[torch.UntypedStorage, torch.Tensor]] = []  # (device storage, host copy)
        self.model = model.eval()
        self._tokenizer = tokenizer
        eos = getattr(model.generation_config, "eos_token_id", None) or tokenizer.eos_token_id
        eos_ids = [eos] if isinstance(eos, int) else list(eos or [])
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else (eos_ids or [0])[0]
        self._generator = HFGenerator(
            model,
            tokenizer,
            micro_batch_size=micro_batch_size,
            seed=seed,
            eos_token_ids=eos_ids,
            pad_token_id=pad,
            lean_decoder=lean_decoder,
        )
        self._version = model_version
        self._lock = threading.Lock()
        self.inflight = False
        self._offer: _Update | None = None  # weights waiting for the generating thread
        self._offered = threading.Condition()
        self._loading = threading.Lock()  # one load at a time
        self._pending: list[tuple[list[Row], asyncio.Future[list[GenerationOutput]]]] = []
        self._draining = False
        self._stats = {
            "generated_tokens": 0.0,
            "generate_seconds": 0.0,
            "requests": 0.0,
            "batches": 0.0,
            "inflight_updates": 0.0,  # versions applied between decode steps of a running batch
        }

    @classmethod
    def from_pretrained(
        cls,
        model_path: str,
        *,
        device: str | None = None,
        dtype: str = "auto",
        micro_batch_size: int = 64,
        seed: int = 42,
        name: str = "hf",
        lean_decoder: bool = True,
        gpu_memory_utilization: float | None = None,
        sleep_mode: bool = False,
    ) -> HFEngine:
        device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        if gpu_memory_utilization is not None:
            cap_cuda_memory(device, gpu_memory_utilization)
        model = load_model(model_path, dtype=resolve_dtype(dtype, device), device=device)
        return cls(
            model,
            load_tokenizer(model_path),
            name=name,
            micro_batch_size=micro_batch_size,
            seed=seed,
            lean_decoder=lean_decoder,
            sleep_mode=sleep_mode,
        )

    @classmethod
    def from_config(
        cls, cfg: InferenceModelConfig, model_path: str, *, index: int = 0, device: str | None = None
    ) -> HFEngine:
        """Engine `index` (seeded `seed + index`) of `explorer.rollout_model` (as resolved.py's
        `rollout_model` fills it); its memory is capped only where `gpu_memory_utilization` is set."""
        return cls.from_pretrained(
            model_path,
            device=device,
            dtype=cfg.dtype,
            micro_batch_size=cfg.micro_batch_size,
            seed=cfg.seed + index,
            name=f"hf-{index}",
            lean_decoder=cfg.lean_decoder,
            sleep_mode=cfg.enable_sleep_mode,
            gpu_memory_utilization=cfg.gpu_memory_utilization
            if "gpu_memory_utilization" in cfg.model_fields_set
            else None,
        )

    @property
    def vocab_size(self) -> int:
        return int(self.model.config.vocab_size)

    def set_inflight_updates(self, enabled: bool) -> None:
        """Apply weight loads between decode steps of a running batch (module docstring)."""
        self.inflight = bool(enabled)
        self._generator.between_steps = self._take_offer if enabled else None
        self._generator.record_versions = self.inflight

    def reseed(self, seed: int) -> None:
        with self._lock:
            self._generator.reseed(seed)

    def generate_sync(
        self, prompts: Sequence[Sequence[int]], params: SamplingParams | Sequence[SamplingParams]
    ) -> list[list[GenerationOutput]]:
        """Blocking form of `generate` (benchmarks, scripts)."""
        rows, counts = _expand(prompts, per_prompt_params(prompts, params))
        return _regroup(self._run(rows), counts)

    async def generate(
        self,
        prompts: Sequence[Sequence[int]],
        params: SamplingParams | Sequence[SamplingParams],
        *,
        on_token: Callable[..., None] | None = None,
        top_logprobs: int = 0,
    ) -> list[list[GenerationOutput]]:
        """`on_token(prompt_index, choice_index, token_id, logprob, top)` is called from the generating
        thread as each token is sampled (`top`: its top-k (id, log-prob) when asked, else None); `top_logprobs` > 0 fills `GenerationOutput.top_logprobs`."""
        rows, counts = _expand(prompts, per_prompt_params(prompts, params), on_token, top_logprobs)
        if not rows:
            return []
        future: asyncio.Future[list[GenerationOutput]] = asyncio.get_running_loop().create_future()
        self._pending.append((rows, future))
        if not self._draining:
            self._draining = True
            asyncio.get_running_loop().create_task(self._drain())
        return _regroup(await future, counts)

    async def _drain(self) -> None:
        """Run everything queued as one batch, repeatedly, until nothing is queued."""
        try:
            while self._pending:
                await asyncio.sleep(0)  # ok-sleep: one loop turn lets concurrent callers join the batch
                batch, self._pending = self._pending, []
                batch = [(rows, fut) for rows, fut in batch if not fut.cancelled()]
                if not batch:
                    continue
                flat = [row for rows, _ in batch for row in rows]
                try:
                    outputs = await asyncio.to_thread(self._run, flat)
                except Exception as exc:  # every waiter sees the failure; the engine keeps serving
                    for _, fut in batch:
                        if not fut.done():
                            fut.set_exception(exc)
                    continue
                start = 0
                for rows, fut in batch:
                    if not fut.done():
                        fut.set_result(outputs[start : start + len(rows)])
                    start += len(rows)
        finally:
            self._draining = False

    # ---- sleep mode (module docstring) ---------------------------------------------------------------
    async def sleep(self) -> None:
        """Weights off the device until the next generate or load (a no-op without `sleep_mode`);
        waits for the running batch."""
        if self.sleep_mode:
            await asyncio.to_thread(self.sleep_sync)

    async def wake_up(self) -> None:
        await asyncio.to_thread(self.wake_up_sync)

    @property
    def asleep(self) -> bool:
        return bool(self._parked)

    def sleep_sync(self) -> None:
        with self._lock:
            if self._parked:
                return
            device = next(self.model.parameters()).device
            pin = device.type == "cuda"
            groups: dict[int, list[torch.Tensor]] = {}
            for t in [*self.model.parameters(), *self.model.buffers()]:
                if t.untyped_storage().nbytes():
                    groups.setdefault(t.untyped_storage().data_ptr(), []).append(t)  # tied: one storage
            parked = []
            for tensors in groups.values():
                st = tensors[0].untyped_storage()
                host = torch.empty(st.nbytes(), dtype=torch.uint8, pin_memory=pin)
                host.copy_(_as_bytes(st))
                if not st.resizable():  # e.g. memory-mapped from safetensors: move to a storage of our own
                    st = _own_storage(tensors, st.nbytes())
                parked.append((st, host))
            for st, _ in parked:
                st.resize_(0)  # the device memory is freed here
            self._parked = parked
            if pin:
                torch.cuda.empty_cache()

    def wake_up_sync(self) -> None:
        with self._lock:
            self._wake_locked()

    def _wake_locked(self) -> None:
        """Restore the parked storages (holding `_lock`)."""
        parked, self._parked = self._parked, []
        for st, host in parked:
            st.resize_(host.numel())
            _as_bytes(st).copy_(host)

    def _run(self, rows: list[Row]) -> list[GenerationOutput]:
        # the unit moves with each sampled token (hf_generate); wedge_hook: a test's fault, off by default
        with progress.work("generate call"), wedge_hook(self._version):
            return self._run_batch(rows)

    def _run_batch(self, rows: list[Row]) -> list[GenerationOutput]:
        try:
            with self._lock:
                self._wake_locked()
                version = self._generator.version = self._version
                t0 = time.perf_counter()
                outputs = self._generator.generate(rows)
                elapsed = time.perf_counter() - t0
        finally:
            if self.inflight:  # a load waiting for the batch to end may take the lock now
                with self._offered:
                    self._offered.notify_all()
        for out in outputs:
            versions = out.token_model_versions
            out.model_version = versions[0] if versions else version
        self._stats["generated_tokens"] += sum(len(o.token_ids) for o in outputs)
        self._stats["generate_seconds"] += elapsed
        self._stats["requests"] += len(rows)
        self._stats["batches"] += 1
        return outputs

    async def load_weights(
        self, named_tensors: Iterable[tuple[str, torch.Tensor]], version: int, strict: bool = True
    ) -> None:
        """Copy the tensors in (between batches; a stream is consumed as it arrives) and set the version.
        `strict`: every parameter must be covered."""
        await asyncio.to_thread(self.load_weights_sync, named_tensors, version, strict)

    def load_weights_sync(
        self, named_tensors: Iterable[tuple[str, torch.Tensor]], version: int, strict: bool = True
    ) -> None:
        with progress.work("weight load"):
            self._load_weights(named_tensors, version, strict)

    def _load_weights(
        self, named_tensors: Iterable[tuple[str, torch.Tensor]], version: int, strict: bool = True
    ) -> None:
        if not self.inflight:
            with self._lock:
                self._apply(_Update(named_tensors, int(version), strict))
            return
        with self._loading:
            update = self.offer_weights(named_tensors, version, strict)
            self._await(update)
        if update.error is not None:
            raise update.error

    @property
    def offered_version(self) -> int | None:
        """The version offered to the running batch and not yet applied (in-flight), else None."""
        offer = self._offer
        return offer.version if offer is not None else None

    def offer_weights(
        self, named_tensors: Iterable[tuple[str, torch.Tensor]], version: int, strict: bool = True
    ) -> _Update:
        """Offer weights to the running batch without waiting (in-flight; one offer at a time): the
        generating thread applies them before its next decode step. `load_weights` offers and waits,
        and applies them itself when no batch runs."""
        if not self.inflight:
            raise RuntimeError("offer_weights needs in-flight updates (set_inflight_updates(True))")
        update = _Update(list(named_tensors), int(version), strict)  # the stream ends here
        with self._offered:
            if self._offer is not None:
                raise RuntimeError(f"version {self._offer.version} is still on offer")
            self._offer = update
        return update

    def _await(self, update: _Update) -> None:
        """Until `update` is applied: by the generating thread, or here once no batch runs."""
        with self._offered:
            while not update.done:
                if self._lock.acquire(blocking=False):  # no batch running: load it here
                    try:
                        if not update.done:
                            self._offer = None
                            self._settle(update)
                    finally:
                        self._lock.release()
                    break
                self._offered.wait()  # the generating thread takes it, or its batch ends

    def _take_offer(self) -> bool:
        """Between two decode steps (the generating thread, holding the lock): apply the weights on
        offer; True when the weights changed."""
        if self._offer is None:
            return False
        with self._offered:
            update, self._offer = self._offer, None
            if update is None:
                return False
            self._settle(update)
            if update.error is None:
                self._stats["inflight_updates"] += 1
            return update.error is None

    def _settle(self, update: _Update) -> None:
        """Apply `update` (holding the condition), record the outcome and wake the loader."""
        try:
            self._apply(update)
        except Exception as exc:  # the loader raises it; generation goes on
            update.error = exc
        finally:
            update.done = True
            self._offered.notify_all()

    def _apply(self, update: _Update) -> None:
        self._wake_locked()  # the caller holds the lock
        load_weights(self.model, update.named_tensors, strict=update.strict)
        self._version = self._generator.version = update.version

    async def close(self) -> None:
        self._pending.clear()


@dataclass
class _Update:
    """A weight load: the tensors, their version, and (in-flight) whether and how it ended."""

    named_tensors: Iterable[tuple[str, torch.Tensor]]
    version: int
    strict: bool = True
    done: bool = False
    error: Exception | None = None


def _as_bytes(storage: torch.UntypedStorage) -> torch.Tensor:
    """A uint8 tensor over the whole of `storage` (copies across devices go through tensors)."""
    return torch.empty(0, dtype=torch.uint8, device=storage.device).set_(storage)


def _own_storage(tensors: list[torch.Tensor], nbytes: int) -> torch.UntypedStorage:
    """Point `tensors` (views of one storage) at a new resizable storage of `nbytes` on their device,
    keeping each one's offset, size and stride; the old storage is dropped with its last reference."""
    own = torch.empty(nbytes, dtype=torch.uint8, device=tensors[0].device).untyped_storage()
    for t in tensors:
        t.data = torch.empty(0, dtype=t.dtype, device=t.device).set_(
            own, t.storage_offset(), t.size(), t.stride()
        )
    return own


def _expand(
    prompts: Sequence[Sequence[int]],
    params: Sequence[SamplingParams],
    on_token: Callable[..., None] | None = None,
    top_logprobs: int = 0,
) -> tuple[list[Row], list[int]]:
    rows: list[Row] = []
    counts = []
    for i, (prompt, p) in enumerate(zip(prompts, params, strict=True)):
        ids = [int(t) for t in prompt]
        rows.extend(Row(ids, p, _bind(on_token, i, c), top_logprobs) for c in range(p.n))
        counts.append(p.n)
    return rows, counts


def _bind(
    on_token: Callable[..., None] | None, prompt: int, choice: int
) -> Callable[[int, float], None] | None:
    if on_token is None:
        return None
    return lambda token, logprob, top=None: on_token(prompt, choice, token, logprob, top)


def _regroup(outputs: list[GenerationOutput], counts: list[int]) -> list[list[GenerationOutput]]:
    grouped, start = [], 0
    for n in counts:
        grouped.append(outputs[start : start + n])
        start += n
    return grouped
