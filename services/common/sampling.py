"""The sampling arguments of one rollout request, as one frozen, validated record.

Built once from the config (`Resolved.sampling_params(taskset)`: the taskset's `rollout_args`, falling
back to `model.*` and `explorer.rollout_model.ignore_eos`), carried by each `Task`, and handed through
the workflow and `ModelWrapper` to an engine, which maps it to its backend in one place (the `hf`
engine's per-row tensors, `VLLMEngine.sampling_params` for `vllm.SamplingParams`). A call that needs
other values (`n` = the group size, a greedy baseline's temperature 0, the OpenAI endpoint's request
fields, a multi-turn token budget) derives a copy with `replace(**overrides)`.

The config model is the only place with defaults: every field the config sets is required here, so a
value cannot come from anywhere else. Only `n` (1) and `stop_token_ids` (none), which the config does
not set, have defaults. Names and meaning follow vLLM's `SamplingParams`.
"""

from __future__ import annotations

import dataclasses
import difflib
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, kw_only=True)
class SamplingParams:
    """Per-request sampling arguments (vLLM names and meaning).

    `temperature` 0 = greedy; `top_k` <= 0 = off (kept as -1); `top_p` 1 = off. `n` samples per
    prompt. `stop` strings end a sample (the text is cut before the stop string; its tokens stay in
    `token_ids`), as do `stop_token_ids` and EOS unless `ignore_eos`; none of them can end it before
    `min_tokens`. `repetition_penalty` (1 = off) divides the positive logits and multiplies the
    negative ones of every token already in the prompt or the sample (Keskar et al. 2019, CTRL; HF and
    vLLM meaning). `logprobs` is kept for API parity: the log-prob of every sampled token is always
    returned.
    """

    temperature: float
    top_p: float
    top_k: int
    max_tokens: int
    min_tokens: int
    repetition_penalty: float
    ignore_eos: bool
    logprobs: int
    stop: tuple[str, ...]
    n: int = 1
    stop_token_ids: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        _number(self, "temperature", minimum=0.0, hint="0 samples greedily")
        _number(self, "top_p", minimum=0.0, maximum=1.0, open_min=True, hint="1 turns it off")
        _integer(self, "top_k", hint="-1 turns it off")
        if self.max_tokens is None:
            raise ValueError(
                "SamplingParams.max_tokens: required; set model.max_response_tokens (or the taskset's "
                "rollout_args.max_tokens, or model.max_model_len with model.max_prompt_tokens)"
            )
        _integer(self, "max_tokens", minimum=1)
        _integer(self, "min_tokens", minimum=0)
        _number(self, "repetition_penalty", minimum=0.0, open_min=True, hint="1 turns it off")
        _integer(self, "n", minimum=1)
        _integer(self, "logprobs", minimum=0)
        if not isinstance(self.ignore_eos, bool):
            raise ValueError(f"SamplingParams.ignore_eos: must be true or false, got {self.ignore_eos!r}")
        if self.top_k <= 0:
            object.__setattr__(self, "top_k", -1)
        object.__setattr__(self, "stop", _sequence(self, "stop", str))
        object.__setattr__(self, "stop_token_ids", _sequence(self, "stop_token_ids", int))

    def replace(self, **overrides: Any) -> SamplingParams:
        """A copy with `overrides` applied (validated again); an unknown name is refused with the
        closest field name."""
        fields = [f.name for f in dataclasses.fields(self)]
        for name in overrides:
            if name not in fields:
                close = difflib.get_close_matches(name, fields, n=1)
                hint = f"did you mean {close[0]!r}?" if close else f"known: {', '.join(fields)}"
                raise ValueError(f"SamplingParams has no field {name!r}; {hint}")
        return dataclasses.replace(self, **overrides) if overrides else self


def _number(
    p: SamplingParams,
    name: str,
    *,
    minimum: float,
    maximum: float | None = None,
    open_min: bool = False,
    hint: str = "",
) -> None:
    value = getattr(p, name)
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"SamplingParams.{name}: must be a number, got {value!r}")
    low_ok = value > minimum if open_min else value >= minimum
    if not low_ok or (maximum is not None and value > maximum):
        bound = f"{'>' if open_min else '>='} {minimum}" + (
            f" and <= {maximum}" if maximum is not None else ""
        )
        raise ValueError(
            f"SamplingParams.{name}: must be {bound}, got {value}" + (f" ({hint})" if hint else "")
        )


def _integer(p: SamplingParams, name: str, *, minimum: int | None = None, hint: str = "") -> None:
    value = getattr(p, name)
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"SamplingParams.{name}: must be an integer, got {value!r}")
    if minimum is not None and value < minimum:
        raise ValueError(
            f"SamplingParams.{name}: must be >= {minimum}, got {value}" + (f" ({hint})" if hint else "")
        )


def _sequence(p: SamplingParams, name: str, kind: type) -> tuple[Any, ...]:
    value = getattr(p, name)
    if value is None:
        return ()
    if isinstance(value, str | bytes) or not isinstance(value, list | tuple):
        raise ValueError(f"SamplingParams.{name}: must be a list of {kind.__name__}, got {value!r}")
    bad = [v for v in value if isinstance(v, bool) or not isinstance(v, kind)]
    if bad:
        raise ValueError(f"SamplingParams.{name}: every item must be a {kind.__name__}, got {bad[0]!r}")
    return tuple(value)
