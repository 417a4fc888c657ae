"""Sampling clients: the explorer's `hf` engine holding a base model or saved weights.

One engine per base model folder; a sampling session names weights (a `tinker://` sampler path or
the base model) and each sample loads them into the engine when they are not the ones it holds.
Returns the sampled tokens and their log-probs. `saved` hears of each save for the sampler
(explorer_sampler.py publishes it instead, for the explorer's base model).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file

from services.common.sampling import SamplingParams
from services.explorer.engines.hf import HFEngine


class Sampler:
    """Engines by base folder, and the weights each sampling session reads."""

    def __init__(self) -> None:
        self._engines: dict[str, HFEngine] = {}
        self._holding: dict[str, str] = {}  # base folder -> weights key loaded in its engine
        self._versions: dict[str, int] = {}
        self.states: dict[str, dict[str, torch.Tensor]] = {}  # sampler path -> weights (recent saves)

    def keep(self, key: str, state: dict[str, torch.Tensor], snapshots: int = 8) -> None:
        """Hold `state` under `key`; only the newest `snapshots` unnamed snapshots stay in memory."""
        self.states[key] = state
        old = [k for k in self.states if k.startswith("snapshot-")][:-snapshots]
        for k in old:
            del self.states[k]

    def engine(self, base_folder: str) -> HFEngine:
        if base_folder not in self._engines:
            self._engines[base_folder] = HFEngine.from_pretrained(base_folder, device="cpu", dtype="float32")
            self._holding[base_folder] = "base"
        return self._engines[base_folder]

    def saved(
        self, base_folder: str, key: str, state: Callable[[], dict[str, torch.Tensor]], named: bool
    ) -> None:
        """A training client saved weights for the sampler under `key` (a `tinker://` path when
        `named`, read back from its folder; else an in-memory snapshot, kept here)."""
        if not named:
            self.keep(key, {k: v.clone() for k, v in state().items()})

    def weights(self, base_folder: str, key: str, weights_folder: Path | None) -> dict[str, torch.Tensor]:
        """The weights a sampling session names: the base model's, a snapshot, or a saved folder's."""
        if key == "base":
            return load_file(str(Path(base_folder) / "model.safetensors"))
        state = self.states.get(key)
        if state is None and weights_folder is None:
            raise ValueError(f"sampler weights {key} have expired; save weights for the sampler again")
        return state if state is not None else load_file(str(weights_folder / "model.safetensors"))

    def _hold(self, base_folder: str, key: str, weights_folder: Path | None) -> HFEngine:
        engine = self.engine(base_folder)
        if self._holding[base_folder] != key:
            state = self.weights(base_folder, key, weights_folder)
            version = self._versions.get(base_folder, 0) + 1
            self._versions[base_folder] = version
            engine.load_weights_sync(state.items(), version, strict=False)
            self._holding[base_folder] = key
        return engine

    def sample(
        self, base_folder: str, key: str, weights_folder: Path | None, prompt: list[int], n: int, p: Any
    ) -> list[tuple[list[int], list[float], str]]:
        engine = self._hold(base_folder, key, weights_folder)
        stop = p.stop if p.stop is not None else ()
        stop = [stop] if isinstance(stop, str) else list(stop)
        params = SamplingParams(
            temperature=float(p.temperature),
            top_p=float(p.top_p),
            top_k=int(p.top_k),
            max_tokens=int(p.max_tokens or 16),
            min_tokens=0,
            repetition_penalty=1.0,
            ignore_eos=False,
            logprobs=1,
            stop=tuple(s for s in stop if isinstance(s, str)),
            stop_token_ids=tuple(s for s in stop if isinstance(s, int)),
            n=n,
        )
        if p.seed is not None:
            engine.reseed(int(p.seed))
        outs = engine.generate_sync([prompt], params)[0]
        return [(list(o.token_ids), o.logprobs.float().tolist(), o.finish_reason) for o in outs]
