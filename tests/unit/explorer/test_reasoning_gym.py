"""reasoning-gym as a taskset source and a reward, with the library itself (the `reasoning-gym` extra):
rows by name, size, seed and config, deterministic; an unknown dataset or config field named against
the config path with close names; the dataset's own `score_answer` as the reward through the `math`
workflow (by the rows' `data_source`) and by name; resume, shards and eval as for a file; without the
library, an error that names the extra. The config checks need no library."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

from launcher.names import check_config
from services.common.config import ConfigError, FormatConfig, TasksetConfig, load_config, resolve
from services.common.reasoning_gym_tasks import ReasoningGymError, reasoning_gym_score
from services.common.rewards import get_scorer
from services.explorer.model_wrapper import ModelWrapper
from services.explorer.runner import WorkflowRunner
from services.explorer.scheduler import TaskScheduler, all_tasks, open_tasksets
from services.explorer.tasks import Task
from services.explorer.tasksets import Taskset, TasksetError

from .fakes import ScriptedEngine, sampling

SMALL = {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1, "operators": ["+", "-"],
         "allow_parentheses": False, "allow_negation": False}  # fmt: skip
FMT = FormatConfig(prompt_type="plaintext", prompt_key="question", response_key="answer")


def _rg():
    return pytest.importorskip("reasoning_gym", reason="the reasoning-gym extra is not installed")


def _cfg(dataset="basic_arithmetic", size=12, seed=3, config=None, **kw) -> TasksetConfig:
    args = {"dataset": dataset, "size": size, "seed": seed, "config": SMALL if config is None else config}
    return TasksetConfig(source="reasoning_gym", source_args=args, format=kw.pop("format", FMT), **kw)


def _rows(cfg: TasksetConfig, **kw) -> list[dict]:
    ts = Taskset(cfg, name="rg", **kw)
    out = []
    while (got := ts.next_row()) is not None:
        out.append(got[1])
    return out


def test_rows_are_the_named_dataset_of_the_given_size_seed_and_config():
    rg = _rg()
    rows = _rows(_cfg())
    direct = rg.create_dataset("basic_arithmetic", size=12, seed=3, **SMALL)
    assert len(rows) == 12
    assert [(r["question"], r["answer"]) for r in rows] == [(e["question"], e["answer"]) for e in direct]
    # the config reached the generator: two one-digit terms, + or - only
    for r in rows:
        expression = r["extra_info"]["entry"]["metadata"]["expression"]
        a, op, b = expression.split()
        assert op in ("+", "-") and r["question"] == f"Calculate {expression}."
        assert int(r["answer"]) == (int(a) + int(b) if op == "+" else int(a) - int(b))
    assert rows[0]["data_source"] == "reasoning_gym"
    assert rows[0]["extra_info"]["dataset"] == "basic_arithmetic"
    assert rows[0]["extra_info"]["config"] == SMALL


def test_same_seed_same_rows_another_seed_other_rows():
    _rg()
    assert _rows(_cfg(seed=3)) == _rows(_cfg(seed=3))
    assert [r["question"] for r in _rows(_cfg(seed=4))] != [r["question"] for r in _rows(_cfg(seed=3))]
    assert len(_rows(_cfg(size=5))) == 5


def test_rows_use_the_format_keys():
    _rg()
    (row,) = _rows(_cfg(size=1, format=FormatConfig()))  # default keys: prompt, response
    assert set(row) == {"prompt", "response", "data_source", "extra_info"}


def test_an_unknown_dataset_names_the_config_path_and_close_names(tmp_path):
    _rg()
    text = """
model: {max_response_tokens: 4}
buffer: {explorer_input: {tasksets: [
  {name: a, source: reasoning_gym, source_args: {dataset: leg_countin, size: 2}}]}}
"""
    resolved = resolve(load_config(text=text))
    with pytest.raises(TasksetError) as err:
        open_tasksets(resolved, resolved.tasksets, is_eval=False, needs_response=lambda w: True)
    message = str(err.value)
    assert message.startswith(
        "buffer.explorer_input.tasksets[0].source_args.dataset: 'leg_countin' is not a reasoning-gym "
        "dataset; did you mean 'leg_counting'"
    ), message
    assert "known: " in message and "basic_arithmetic" in message


def test_a_bad_dataset_config_names_the_path_and_the_fields():
    _rg()
    with pytest.raises(TasksetError) as err:
        Taskset(_cfg(config={"max_termz": 2}), name="rg", where="buffer.explorer_input.taskset")
    message = str(err.value)
    assert message.startswith("buffer.explorer_input.taskset.source_args.config: basic_arithmetic does not")
    assert "max_termz" in message and "max_terms" in message  # the fields it does accept
    with pytest.raises(TasksetError, match="max_terms must be >= min_terms"):
        Taskset(_cfg(config={"min_terms": 4, "max_terms": 2}), name="rg")


def test_the_config_checks_source_and_source_args_at_load_without_the_library():
    def problems(taskset: str) -> str:
        with pytest.raises(ConfigError) as err:
            load_config(text=f"buffer: {{explorer_input: {{taskset: {taskset}}}}}")
        return str(err.value)

    assert "unknown taskset source 'reasoning_gm'" in problems("{source: reasoning_gm}")
    assert "did you mean 'reasoning_gym'?" in problems("{source: reasoning_gm}")
    message = problems("{source: reasoning_gym, source_args: {dataset: gcd, sise: 3}}")
    assert "buffer.explorer_input.taskset: source_args: sise: unknown key; did you mean `size`?" in message
    assert "size: Input should be greater than or equal to 1" in problems(
        "{source: reasoning_gym, source_args: {dataset: gcd, size: 0}}"
    )
    assert "dataset: Field required" in problems("{source: reasoning_gym}")
    assert "path: not read with `source: reasoning_gym`" in problems(
        "{source: reasoning_gym, path: x.jsonl, source_args: {dataset: gcd}}"
    )
    assert "source_args is read only with a `source` other than `file`" in problems(
        "{path: x.jsonl, source_args: {dataset: gcd}}"
    )


def test_score_answer_of_the_dataset_is_the_reward():
    rg = _rg()
    (row,) = _rows(_cfg(size=1))
    entry, info = row["extra_info"]["entry"], row["extra_info"]
    answer, wrong = row["answer"], str(int(row["answer"]) + 1)
    dataset = rg.create_dataset("basic_arithmetic", size=1, seed=0, **SMALL)
    score = get_scorer("reasoning_gym")
    for response in (answer, f" {answer}\n", wrong, f"{answer}{answer}", ""):
        assert score(response, answer, info) == dataset.score_answer(response.strip(), entry)
    assert score(answer, answer, info) == 1.0 and score(wrong, answer, info) == 0.0
    assert score(f"{answer}0", answer, info) == pytest.approx(len(answer) / (len(answer) + 1))  # its own rule
    tagged = f"so <answer>{answer}</answer>"
    assert score(tagged, answer, info, extract="answer_tag") == 1.0
    assert score(answer, answer, info, extract="answer_tag") == 0.0  # no tag, no answer
    assert score(f" {answer}", answer, info, extract="none") == dataset.score_answer(f" {answer}", entry)
    with pytest.raises(ReasoningGymError, match="needs a reasoning_gym taskset's row"):
        reasoning_gym_score(answer, answer, None)


def test_a_scorer_that_reads_the_dataset_config_gets_it():
    _rg()
    # chain_sum compares numbers (compute_decimal_reward): "+07" is 7
    (row,) = _rows(_cfg(dataset="chain_sum", size=1, config={"max_terms": 2, "max_digits": 1}))
    padded = f"+0{row['answer']}" if not row["answer"].startswith("-") else row["answer"]
    assert get_scorer("reasoning_gym")(padded, None, row["extra_info"]) == 1.0


async def test_the_math_workflow_scores_rows_by_their_data_source():
    _rg()
    (row,) = _rows(_cfg(size=1))
    answer = row["answer"]
    engine = ScriptedEngine([answer, f"{int(answer) + 1}", f"{answer}<"])
    task = Task(task_id="rg/0", index=0, taskset="rg", raw=row, workflow="math", format=FMT,
                repeat_times=3, sampling=sampling(max_tokens=8))  # fmt: skip
    result = await WorkflowRunner(ModelWrapper(engine)).run(task)
    assert result.ok, result
    exps = result.runs[0]
    assert [e.reward for e in exps] == [1.0, 0.0, pytest.approx(len(answer) / (len(answer) + 1))]
    assert [e.metrics["accuracy"] for e in exps] == [1.0, 0.0, 0.0]
    assert ModelWrapper(engine).tokenizer.decode(engine.calls[0][0]) == row["question"]


def test_positions_resume_shards_and_eval_as_for_a_file():
    _rg()
    text = """
model: {max_response_tokens: 4}
buffer:
  batch_size: 3
  explorer_input:
    taskset: {name: t, source: reasoning_gym, source_args: {dataset: gcd, size: 10, seed: 5},
              data_selector: {selector_type: shuffle, seed: 2}}
    eval_tasksets:
      - {name: e, source: reasoning_gym, source_args: {dataset: gcd, size: 4, seed: 99}}
"""
    resolved = resolve(load_config(text=text))

    def scheduler(shard=(0, 1)):
        return TaskScheduler(
            open_tasksets(
                resolved, resolved.tasksets, is_eval=False, needs_response=lambda w: True, shard=shard
            )
        )

    first = scheduler()
    head = [t.raw["prompt"] for t in first.next_batch(3)]
    state = first.state()
    rest = [t.raw["prompt"] for t in first.next_batch(7)]
    resumed = scheduler()
    resumed.load_state(state)
    assert [t.raw["prompt"] for t in resumed.next_batch(7)] == rest
    assert sorted(head + rest) == sorted(r["prompt"] for r in _rows(resolved.tasksets[0]))
    # two explorers split the rows without overlap
    shards = [{t.task_id for t in scheduler((i, 2)).next_batch(10)} for i in range(2)]
    assert len(shards[0]) == len(shards[1]) == 5 and not shards[0] & shards[1]
    ((evalset, factory),) = open_tasksets(
        resolved, list(resolved.config.buffer.explorer_input.eval_tasksets), is_eval=True,
        needs_response=lambda w: True,
    )  # fmt: skip
    tasks = all_tasks(evalset, factory)
    assert len(tasks) == 4 and all(t.is_eval for t in tasks)
    assert {t.raw["prompt"] for t in tasks}.isdisjoint(head + rest)


def test_without_the_library_the_error_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "reasoning_gym", None)  # `import reasoning_gym` raises ImportError
    with pytest.raises(TasksetError) as err:
        Taskset(_cfg(), name="rg", where="buffer.explorer_input.taskset")
    assert "needs the reasoning-gym package" in str(err.value)
    assert "reasoning-gym" in str(err.value) and "extra" in str(err.value)
    info = {"dataset": "basic_arithmetic", "config": {}, "entry": {"answer": "1"}}
    with pytest.raises(ReasoningGymError, match=r"\[reasoning-gym\]"):
        reasoning_gym_score("<answer>1</answer>", "1", info, extract="answer_tag")


def test_the_examples_sft_rows_are_the_generators_answers_to_its_taskset():
    _rg()
    root = Path(__file__).resolve().parents[3]
    spec = importlib.util.spec_from_file_location("make_rg", root / "examples/data/make_reasoning_gym.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    config = load_config(root / "examples" / "reasoning_gym.yaml")
    assert (
        check_config(config, root / "examples" / "reasoning_gym.yaml")[1] == []
    )  # `rft config check`'s names
    rows, path = module.sft_rows(config)
    assert path == "examples/data/reasoning_gym_sft.jsonl"
    committed = [json.loads(line) for line in (root / path).read_text().splitlines()]
    assert committed == rows and len(rows) == 32
    (taskset,) = resolve(config).tasksets
    generated = Taskset(taskset, name="rg").data  # in generation order (the selector shuffles per epoch)
    assert [(r["question"], r["answer"]) for r in generated] == [(r["question"], r["answer"]) for r in rows]


def test_a_plugin_source_by_dotted_path(tmp_path, monkeypatch):
    (tmp_path / "rg_test_source.py").write_text(
        "from pydantic import BaseModel, ConfigDict\n"
        "from services.common.taskset_sources import TasksetSource\n"
        "class Args(BaseModel):\n"
        "    model_config = ConfigDict(extra='forbid')\n"
        "    n: int\n"
        "def rows(args, fmt, where):\n"
        "    return [{fmt.prompt_key: f'{i}+1=', fmt.response_key: str(i + 1)} for i in range(args.n)]\n"
        "SOURCE = TasksetSource(Args, rows)\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    cfg = TasksetConfig(source="rg_test_source:SOURCE", source_args={"n": 3}, format=FMT)
    assert _rows(cfg) == [{"question": f"{i}+1=", "answer": str(i + 1)} for i in range(3)]
    bad = TasksetConfig(source="rg_test_source:SOURCE", source_args={"m": 3}, format=FMT)
    with pytest.raises(TasksetError, match=r"taskset\.source_args: n: Field required; m: unknown key"):
        Taskset(bad, name="p", where="taskset")
