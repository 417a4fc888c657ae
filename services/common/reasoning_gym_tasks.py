"""reasoning-gym (https://github.com/open-thought/reasoning-gym): its procedural datasets as taskset rows
(the `reasoning_gym` taskset source) and each dataset's own `score_answer` as the reward (the
`reasoning_gym` reward scorer, also chosen by the rows' `data_source`).

    taskset:
      source: reasoning_gym
      source_args: {dataset: basic_arithmetic, size: 32, seed: 1, config: {max_terms: 2}}

`dataset` is a name in `reasoning_gym.factory.DATASETS`, `size` the number of rows, `seed` the
generator's seed (the same seed and config give the same rows everywhere), `config` the dataset's own
config fields (its `*Config` dataclass). A row is
`{<prompt_key>: question, <response_key>: answer, "data_source": "reasoning_gym", "extra_info": {...}}`,
where `extra_info` carries the dataset name, its config and the whole entry (metadata included) that
`score_answer(answer, entry)` needs. Nothing is downloaded: reasoning-gym generates its tasks locally.

The library is an optional extra (`rft-mesh[reasoning-gym]`) and is imported only when rows are made or
scored; without it the error names the extra.
"""

from __future__ import annotations

import difflib
import json
import warnings
from collections.abc import Callable, Mapping
from functools import lru_cache
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["ReasoningGymArgs", "ReasoningGymError", "reasoning_gym_rows", "reasoning_gym_score"]

DATA_SOURCE = "reasoning_gym"
INSTALL_HINT = (
    "install the `reasoning-gym` extra (scripts/setup.sh does): "
    "`uv pip install -e '.[reasoning-gym]' -c requirements/constraints.txt`"
)


class ReasoningGymError(ValueError):
    """The library is missing, or a dataset name or config it cannot use; the message says which."""


class ReasoningGymArgs(BaseModel):
    """`source_args` of a `reasoning_gym` taskset (frozen, unknown keys refused, as a config section)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    dataset: str = Field(min_length=1)
    size: int = Field(500, ge=1)
    seed: int = 0
    config: dict[str, Any] = {}


def import_reasoning_gym(what: str = "a reasoning_gym taskset") -> Any:
    try:
        with warnings.catch_warnings():  # its dependency cellpylib's compile-time SyntaxWarnings, not ours
            warnings.simplefilter("ignore", SyntaxWarning)
            import reasoning_gym
    except ImportError as exc:
        raise ReasoningGymError(f"{what} needs the reasoning-gym package ({exc}); {INSTALL_HINT}") from None
    return reasoning_gym


def _create(name: str, config: Mapping[str, Any], size: int, seed: int, where: str) -> Any:
    """`reasoning_gym.create_dataset`, with an unknown name or config field reported against the config
    (`where`: the config path of the source's arguments)."""
    rg = import_reasoning_gym()
    known = sorted(rg.factory.DATASETS)
    if name not in known:
        close = difflib.get_close_matches(name, known, n=5, cutoff=0.5)
        hint = f"; did you mean {', '.join(map(repr, close))}?" if close else ""
        raise ReasoningGymError(
            f"{where}.dataset: {name!r} is not a reasoning-gym dataset{hint} (known: {', '.join(known)})"
        )
    try:
        return rg.create_dataset(name, size=size, seed=seed, **dict(config))
    except (TypeError, ValueError, AssertionError) as exc:  # a bad field or value of the dataset's config
        config_cls = rg.factory.DATASETS[name][1]
        fields = ", ".join(
            f for f in getattr(config_cls, "__dataclass_fields__", {}) if f not in ("size", "seed")
        )
        raise ReasoningGymError(
            f"{where}.config: {name} does not accept {dict(config)}: {exc} "
            f"({config_cls.__name__} fields: {fields})"
        ) from None


def reasoning_gym_rows(args: ReasoningGymArgs, fmt: Any, where: str) -> list[dict[str, Any]]:
    """`args.size` rows of dataset `args.dataset` (see the module docstring for their keys)."""
    data = _create(args.dataset, args.config, args.size, args.seed, where)
    info = {"dataset": args.dataset, "config": dict(args.config)}
    rows = []
    for i in range(args.size):
        entry = dict(data[i])
        rows.append(
            {
                fmt.prompt_key: entry["question"],
                fmt.response_key: entry["answer"],
                "data_source": DATA_SOURCE,
                "extra_info": {**info, "entry": entry},
            }
        )
    return rows


@lru_cache(maxsize=64)
def _score_answer(name: str, config_json: str) -> Callable[..., float]:
    """The bound `score_answer` of dataset `name` built with its config (it may read the config)."""
    return _create(name, json.loads(config_json), 1, 0, "extra_info").score_answer


Extract = Literal["strip", "answer_tag", "none"]


def reasoning_gym_score(
    solution_str: str,
    ground_truth: Any,
    extra_info: Mapping[str, Any] | None = None,
    extract: Extract = "strip",
) -> float:
    """The dataset's own `score_answer(answer, entry)` in [0, 1], `entry` and the dataset from
    `extra_info` (a `reasoning_gym` taskset's row). `extract`: what of the response is the answer:
    `strip` (the response without surrounding whitespace), `answer_tag` (the last
    `<answer>...</answer>`, as reasoning-gym's own evaluations ask; none: 0) or `none` (as is).
    `ground_truth` is the entry's answer, already in `entry`."""
    del ground_truth
    if not extra_info or "entry" not in extra_info or "dataset" not in extra_info:
        raise ReasoningGymError(
            "the reasoning_gym reward needs a reasoning_gym taskset's row (its extra_info holds the "
            "dataset and the entry); set `source: reasoning_gym` on the taskset"
        )
    if extract == "answer_tag":
        answer = import_reasoning_gym("the reasoning_gym reward").utils.extract_answer(solution_str)
        if answer is None:
            return 0.0
    elif extract == "strip":
        answer = solution_str.strip()
    elif extract == "none":
        answer = solution_str
    else:
        raise ReasoningGymError(f"reward_fn_args.extract {extract!r}: use 'strip', 'answer_tag' or 'none'")
    config = json.dumps(dict(extra_info.get("config") or {}), sort_keys=True)
    score = _score_answer(str(extra_info["dataset"]), config)(answer, dict(extra_info["entry"]))
    return float(score)
