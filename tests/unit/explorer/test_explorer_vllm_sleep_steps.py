"""One-GPU mode with a sleeping engine (vLLM `enable_sleep_mode`): the explorer puts its engines to sleep
once an explore step's generation is done, before the trainer gets the batch, and again after an eval
that woke them; an engine without `sleep` (hf) is left alone."""

from __future__ import annotations

import json

from services.common.config import load_config
from services.explorer.core import ExplorerCore
from services.explorer.settings import ExplorerSettings
from services.explorer.sink import ListSink

from .fakes import ScriptedEngine


class SleepyEngine(ScriptedEngine):
    def __init__(self, events: list[str]):
        super().__init__(["#### 1"])
        self.events = events

    async def generate(self, prompts, params):
        self.events.append("generate")
        return await super().generate(prompts, params)

    async def sleep(self) -> None:
        self.events.append("sleep")


class RecordingSink(ListSink):
    def __init__(self, events: list[str]):
        super().__init__()
        self.events = events

    async def put(self, experiences) -> None:
        self.events.append("put")
        await super().put(experiences)


def _config(tmp_path, eval_interval: int = 100):
    data = tmp_path / "tasks.jsonl"
    data.write_text("".join(json.dumps({"question": f"{i}+0", "answer": str(i)}) + "\n" for i in range(4)))
    evals = f"[{{name: ev, path: {data}, format: {{prompt_key: question, response_key: answer}}}}]"
    return load_config(
        text=f"""
checkpoint_root_dir: {tmp_path}/ckpt
algorithm: {{repeat_times: 2}}
model: {{max_response_tokens: 8}}
buffer:
  batch_size: 2
  total_epochs: 1
  explorer_input:
    taskset: {{name: train, path: {data}, format: {{prompt_key: question, response_key: answer}},
               default_reward_fn_type: gsm8k}}
    eval_tasksets: {evals}
explorer: {{eval_interval: {eval_interval}}}
"""
    )


async def _core(tmp_path, engine, sink, eval_interval: int = 100) -> ExplorerCore:
    core = ExplorerCore(
        ExplorerSettings.from_config(_config(tmp_path, eval_interval)),
        engines=[engine],
        sink=sink,
        explorer_id="ex1",
    )
    await core.start()
    return core


def _collapse(events: list[str]) -> list[str]:
    out: list[str] = []
    for e in events:
        if not (out and out[-1] == e == "generate"):
            out.append(e)
    return out


async def test_engines_sleep_after_each_steps_generation_before_the_batch_is_sent(tmp_path):
    events: list[str] = []
    core = await _core(tmp_path, SleepyEngine(events), RecordingSink(events))
    results = await core.explore(steps=2)
    assert [r.step for r in results] == [1, 2]
    assert _collapse(events) == ["generate", "sleep", "put", "generate", "sleep", "put"]


async def test_an_eval_after_a_step_sleeps_again(tmp_path):
    events: list[str] = []
    core = await _core(tmp_path, SleepyEngine(events), RecordingSink(events), eval_interval=1)
    await core.explore(steps=1)
    assert _collapse(events) == ["generate", "sleep", "put", "generate", "sleep"]


async def test_an_engine_without_sleep_is_left_alone(tmp_path):
    events: list[str] = []
    engine = ScriptedEngine(["#### 1"])
    core = await _core(tmp_path, engine, RecordingSink(events))
    await core.explore(steps=1)
    assert events == ["put"] and engine.generated > 0
