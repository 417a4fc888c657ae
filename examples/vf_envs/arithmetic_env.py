"""A verifiers environment over local rows: the quickstart's `a+b=` questions as a `vf.SingleTurnEnv`
with verifiers' own parser and a rubric of one reward function (1 for the right number, else 0) and
one metric (whether the answer is a number at all). No download: the dataset is built from
examples/data/arithmetic.jsonl with `datasets.Dataset.from_list`.

`examples/verifiers.yaml` names it as `arithmetic_env:load_environment` with `plugin_dirs: [vf_envs]`;
any verifiers environment module (`load_environment(**env_args) -> vf.Environment`) plugs in the same way.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import verifiers as vf
from datasets import Dataset

DATA = Path(__file__).resolve().parents[1] / "data" / "arithmetic.jsonl"


def _first_number(text: str) -> str | None:
    found = re.search(r"-?\d+", text or "")
    return found.group() if found else None


def load_environment(path: str | None = None, system_prompt: str | None = None) -> vf.Environment:
    rows = [json.loads(line) for line in Path(path or DATA).read_text().splitlines() if line.strip()]
    dataset = Dataset.from_list([{"question": r["question"], "answer": str(r["answer"])} for r in rows])
    parser = vf.Parser()

    def correct_answer(completion, answer, **kwargs) -> float:
        return 1.0 if _first_number(parser.parse_answer(completion) or "") == answer else 0.0

    def is_number(completion, **kwargs) -> float:
        return 0.0 if _first_number(parser.parse_answer(completion) or "") is None else 1.0

    rubric = vf.Rubric(funcs=[correct_answer], weights=[1.0], parser=parser)
    rubric.add_metric(is_number)
    return vf.SingleTurnEnv(dataset=dataset, parser=parser, rubric=rubric, system_prompt=system_prompt)
