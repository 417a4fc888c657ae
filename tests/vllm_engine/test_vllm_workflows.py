"""The explorer's workflows on the real vLLM engine (the session's `vllm_engine`, tiny model, float32):
GRPO groups of the quickstart's arithmetic task (whole groups, rewards, the engine's log-probs checked
against the model's own, versions recorded), a `multi_turn` tool episode (`tool_arithmetic`: the
model calls the calculator, reads its result and answers), evaluation with pass@k, bench mode over
checkpoints, and serve mode's OpenAI endpoint driven by the official `openai` client.

The tiny model does not call tools or add on its own: `taught` trains it (tens of Adam steps, as the
tool-use example's SFT warm-up does) to answer a few sums and to call the calculator for "3+4=", and
the tests that need that load its weights into the engine and put the model folder's back after.
The tool prompt uses a compact chat template (`TEMPLATE`, it renders tool names) so the episode fits
the tiny model's 512 positions.
"""

from __future__ import annotations

import asyncio
import json
import math
from collections import defaultdict
from pathlib import Path

import httpx2
import openai
import pytest
import pytest_asyncio
import torch

from services.common.config import FormatConfig, load_config
from services.explorer.core import ExplorerCore, find_checkpoints
from services.explorer.engines.base import GenerationOutput, per_prompt_params
from services.explorer.engines.weights import read_safetensors_folder
from services.explorer.model_wrapper import ModelWrapper
from services.explorer.runner import WorkflowRunner
from services.explorer.serve.endpoint import Endpoint
from services.explorer.settings import ExplorerSettings
from services.explorer.sink import ListSink
from services.explorer.tasks import Task
from services.explorer.workflows.arithmetic import arithmetic_reward
from tests.unit.explorer.fakes import sampling
from tests.vllm_engine.conftest import restore_weights
from tests.vllm_engine.teach import teach

# a test's setup may start the session's engine and teach the model: minutes on a busy two-core machine
pytestmark = [pytest.mark.asyncio(loop_scope="session"), pytest.mark.timeout(900)]

ROOT = Path(__file__).resolve().parents[2]
ARITHMETIC = ROOT / "examples" / "data" / "arithmetic.jsonl"  # examples/data/make_arithmetic.py
ROWS = [json.loads(line) for line in ARITHMETIC.read_text().splitlines()]
TAUGHT_ROWS = ROWS[:4]  # `taught` answers these right
TEMPLATE = (
    "{% if tools %}{{ 'tools:' }}{% for t in tools %}{{ ' ' + t.function.name }}{% endfor %}{{ '\\n' }}"
    "{% endif %}{% for m in messages %}{{ m.role + ': ' + m.content + '\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ 'assistant: ' }}{% endif %}"
)
CALCULATOR = {"type": "function", "function": {"name": "calculator", "parameters": {
    "type": "object", "properties": {"expression": {"type": "string"}}}}}  # fmt: skip
CALL = '<tool_call>\n{"name": "calculator", "arguments": {"expression": "3+4"}}\n</tool_call>'
TOOL_ROW = {"question": "3+4=", "answer": "7", "tools": [CALCULATOR]}


# ---------------------------------------------------------------------- the taught model
class _Transcript:
    """Answers each prompt with the next of `replies` (token ids) and records the prompts: what the
    tool workflow sends, so `taught` can learn the continuations the real engine must then sample."""

    name = "transcript"
    model_version = 0

    def __init__(self, tokenizer, replies: list[list[int]]):
        self.tokenizer, self.replies, self.prompts = tokenizer, list(replies), []
        self.vocab_size = len(tokenizer)

    async def generate(self, prompts, params):
        out = []
        for prompt, _ in zip(prompts, per_prompt_params(prompts, params), strict=True):
            self.prompts.append(list(prompt))
            ids = self.replies.pop(0)
            text = self.tokenizer.decode(ids, skip_special_tokens=True)
            lps = torch.zeros(len(ids))
            out.append([GenerationOutput(list(prompt), ids, lps, "stop", text=text)])
        return out


def _tool_task(**kw) -> Task:
    fmt = FormatConfig(prompt_key="question", response_key="answer")
    return Task(task_id="tools/0", index=0, taskset="tools", raw=TOOL_ROW, workflow="tool_arithmetic",
                format=fmt, sampling=sampling(temperature=0.0, max_tokens=80), **kw)  # fmt: skip


async def _tool_examples(tokenizer) -> list[tuple[list[int], list[int]]]:
    """(context, continuation) pairs of the tool episode: the call (ending with EOS), then the answer
    after the tool's result, whether or not the engine keeps the EOS in the sampled ids."""
    eos = tokenizer.eos_token_id
    call = tokenizer.encode(CALL, add_special_tokens=False)
    answer = tokenizer.encode("7", add_special_tokens=False) + [eos]
    examples = []
    for first in (call + [eos], call):
        engine = _Transcript(tokenizer, [first, answer])
        result = await WorkflowRunner(ModelWrapper(engine, chat_template=TEMPLATE), max_retry_times=0).run(
            _tool_task()
        )
        assert result.ok and len(engine.prompts) == 2, result.error
        examples += [(engine.prompts[0], call + [eos]), (engine.prompts[1], answer)]
    return examples


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def taught(vllm_engine, vllm_model_dir, tmp_path_factory) -> Path:
    """The tiny model taught to call the calculator for "3+4=" and to answer `TAUGHT_ROWS`."""
    tok = vllm_engine.tokenizer
    examples = await _tool_examples(tok)
    for row in TAUGHT_ROWS:
        prompt = tok.encode(row["question"], add_special_tokens=False)
        examples.append((prompt, tok.encode(row["answer"], add_special_tokens=False) + [tok.eos_token_id]))
    out = tmp_path_factory.mktemp("vllm_taught") / "model"
    return await asyncio.to_thread(teach, vllm_model_dir, out, examples)


# ---------------------------------------------------------------------- an explorer core on the engine
def _rows_file(tmp_path: Path, rows) -> Path:
    path = tmp_path / f"rows_{len(rows)}.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _config(tmp_path: Path, model_dir: Path, *, mode: str = "explore", train=None, evals=(), **extra):
    """A run config for a core around the shared engine: `train` and `evals` are (name, rows, taskset
    fields) of arithmetic tasksets."""

    def taskset(name, rows, fields):
        return {"name": name, "path": str(_rows_file(tmp_path, rows)), "default_workflow_type": "arithmetic",
                "format": {"prompt_type": "plaintext", "prompt_key": "question", "response_key": "answer"},
                **fields}  # fmt: skip

    tree = {
        "mode": mode,
        "checkpoint_root_dir": str(tmp_path / "ckpt"),
        "algorithm": {"repeat_times": extra.pop("repeat", 4)},
        "model": {"model_path": str(model_dir), "max_prompt_tokens": 64, "max_response_tokens": 4,
                  "temperature": 1.0, **extra.pop("model", {})},
        "buffer": {"batch_size": extra.pop("batch", 3), "total_epochs": 1, "explorer_input": {
            "taskset": taskset(*train) if train else None,
            "eval_tasksets": [taskset(*e) for e in evals]}},
        "explorer": {"eval_on_startup": False, "max_timeout": 120, "max_retry_times": 0, **extra},
        "monitor": {"monitor_type": "none"},
    }  # fmt: skip
    return load_config(text=json.dumps(tree))


async def _core(config, engine, **kw) -> ExplorerCore:
    """A core whose only engine is the shared one (`_close` leaves the engine running)."""
    core = ExplorerCore(ExplorerSettings.from_config(config), engines=[engine], sink=ListSink(),
                        explorer_id="vx", **kw)  # fmt: skip
    if config.mode == "serve":
        core.status = "RUNNING"
    else:
        await core.start()
    return core


async def _close(core: ExplorerCore) -> None:
    await core.stop()
    await core.sink.close()


def _model_logprobs(model, exp, temperature: float) -> torch.Tensor:
    """log_softmax(logits / T) of each sampled token under the HF model (the trainer's definition)."""
    with torch.no_grad():
        logits = model(exp.tokens[None].long()).logits[0, exp.prompt_length - 1 : -1].float()
    logp = torch.log_softmax(logits / temperature, dim=-1)
    return logp.gather(1, exp.tokens[exp.prompt_length :, None].long())[:, 0]


# ---------------------------------------------------------------------- GRPO groups
async def test_grpo_steps_make_whole_groups_with_rewards_log_probs_and_versions(
    vllm_engine, vllm_model_dir, tmp_path
):
    from transformers import AutoModelForCausalLM

    repeat, batch = 4, 3
    config = _config(tmp_path, vllm_model_dir, train=("arithmetic", ROWS, {}), repeat=repeat, batch=batch)
    core = await _core(config, vllm_engine)
    try:
        results = await core.explore(2)
        assert [r.step for r in results] == [1, 2] and [r.experiences for r in results] == [12, 12]
        exps = list(core.sink.experiences)
        # the version a step sampled with is recorded: load the same weights as version 3, one more step
        await core.load_weights(read_safetensors_folder(str(vllm_model_dir)), version=3)
        (third,) = await core.explore(1)
        later = core.sink.experiences[len(exps) :]
    finally:
        await _close(core)
        await restore_weights(vllm_engine, vllm_model_dir)

    groups: dict[str, list] = defaultdict(list)
    for e in exps:
        groups[e.eid.group_id].append(e)
    assert len(groups) == 2 * batch and all(len(g) == repeat for g in groups.values())
    answers = {r["question"]: r["answer"] for r in ROWS}
    tok = vllm_engine.tokenizer
    for gid, group in groups.items():
        assert sorted(e.eid.run_id for e in group) == list(range(repeat)), gid
        assert len({e.eid.task_id for e in group}) == 1 and len({e.eid.step for e in group}) == 1
        question = group[0].prompt_text
        # n samples of one request, not n copies of one (vLLM's parallel sampling, FINAL_ONLY)
        assert len({tuple(e.tokens.tolist()) for e in group}) > 1, [e.response_text for e in group]
        for e in group:
            assert e.tokens[: e.prompt_length].tolist() == tok.encode(question, add_special_tokens=False)
            assert 1 <= e.response_length <= 4 and e.logprobs.shape == (e.response_length,)
            assert torch.isfinite(e.logprobs).all() and (e.logprobs <= 0).all()
            assert e.reward == arithmetic_reward(e.response_text, answers[question])
            assert e.model_version == 0 and e.token_model_versions is None
    # the engine's log-probs are the model's: log_softmax(logits / T) of the sampled tokens
    model = AutoModelForCausalLM.from_pretrained(str(vllm_model_dir), dtype=torch.float32).eval()
    worst = max(float((_model_logprobs(model, e, 1.0) - e.logprobs).abs().max()) for e in exps)
    assert worst < 5e-3, f"vLLM's log-probs are off the model's by up to {worst:.4f}"
    assert results[0].metrics["rollout/finished_task_count"] == batch
    assert results[0].metrics["rollout/experience_count"] == batch * repeat
    assert len(later) == batch * repeat and {e.model_version for e in later} == {3}
    assert third.metrics["rollout/model_version"] == 3.0 and {e.eid.step for e in later} == {3}


# ---------------------------------------------------------------------- multi_turn with tools
async def test_a_tool_episode_calls_the_calculator_and_answers(vllm_engine, vllm_model_dir, taught):
    await vllm_engine.load_weights(read_safetensors_folder(str(taught)), version=1)
    try:
        model = ModelWrapper(vllm_engine, chat_template=TEMPLATE)
        result = await WorkflowRunner(model, max_retry_times=0).run(_tool_task())
    finally:
        await restore_weights(vllm_engine, vllm_model_dir)
    assert result.ok, result.error
    [e] = result.experiences
    assert e.metrics["tool_calls"] == 1.0 and e.metrics["tool_parse_errors"] == 0.0
    assert e.metrics["turns"] == 2.0 and e.reward == 1.0 and e.metrics["accuracy"] == 1.0
    assert e.model_version == 1 and not e.truncated
    tok = vllm_engine.tokenizer
    response = e.tokens[e.prompt_length :].tolist()
    mask = e.action_mask.tolist()
    said = tok.decode([t for t, m in zip(response, mask, strict=True) if m], skip_special_tokens=True)
    shown = tok.decode([t for t, m in zip(response, mask, strict=True) if not m])
    assert said == CALL + "7" and shown == "\ntool: 7\nassistant: "  # the tool's result is masked out
    lp = e.logprobs
    assert lp.shape == (len(response),) and (lp[~e.action_mask] == 0).all()
    # greedy over taught tokens: each sampled token's log-prob is that of a likely token (p > 0.5)
    assert torch.isfinite(lp).all() and (lp[e.action_mask] > math.log(0.5)).all(), lp[e.action_mask]


# ---------------------------------------------------------------------- eval and bench
async def test_eval_reports_pass_at_k_over_k_samples_per_task(vllm_engine, vllm_model_dir, tmp_path):
    k, rows = 4, ROWS[:6]
    config = _config(tmp_path, vllm_model_dir, evals=[("arith", rows, {"repeat_times": k})])
    core = await _core(config, vllm_engine)
    try:
        m = await core.eval()
    finally:
        await _close(core)
    base = "eval/arith"
    assert m[f"{base}/finished_task_count"] == len(rows) and m[f"{base}/failed_task_count"] == 0
    assert m[f"{base}/experience_count"] == len(rows) * k
    assert 0 < m[f"{base}/response_length/mean@{k}"] <= 4
    passes = [m[f"{base}/pass@{j}"] for j in (1, 2, 4)]
    assert all(0.0 <= p <= 1.0 for p in passes) and passes == sorted(passes)
    assert passes[0] == pytest.approx(m[f"{base}/accuracy/mean@{k}"])  # pass@1 is the mean accuracy
    assert core.sink.experiences == []  # evaluation sends nothing


async def test_bench_evaluates_the_base_and_every_checkpoint_with_its_version(
    vllm_engine, vllm_model_dir, taught, tmp_path
):
    greedy = {"repeat_times": 1, "rollout_args": {"temperature": 0.0}}
    config = _config(tmp_path, vllm_model_dir, mode="bench", evals=[("taught", TAUGHT_ROWS, greedy)])
    job = ExplorerSettings.from_config(config).job_dir
    export = job / "global_step_2" / "huggingface"
    export.mkdir(parents=True)
    for f in taught.iterdir():
        (export / f.name).write_bytes(f.read_bytes())
    core = await _core(config, vllm_engine)
    try:
        found = find_checkpoints(job)
        assert found == [(2, str(export))]
        out = await core.bench(found)
        version = vllm_engine.model_version
    finally:
        await _close(core)
        await restore_weights(vllm_engine, vllm_model_dir)
    assert sorted(out) == [0, 2] and version == 2
    key = "bench/taught/accuracy/mean@1"
    assert out[2][key] == 1.0 and out[2]["bench/taught/pass@1"] == 1.0  # the checkpoint's weights answer
    assert out[0][key] < 1.0, out[0]  # the base model does not
    for m in out.values():
        assert (
            m["bench/taught/experience_count"] == len(TAUGHT_ROWS)
            and m["bench/taught/failed_task_count"] == 0
        )


async def test_greedy_tasks_with_several_samples_each(vllm_engine, vllm_model_dir, tmp_path):
    """An eval taskset at temperature 0 with repeat_times 2 (vLLM itself refuses n > 1 when greedy): every
    task gets its two samples, the same answer twice."""
    greedy = {"repeat_times": 2, "rollout_args": {"temperature": 0.0}}
    config = _config(tmp_path, vllm_model_dir, evals=[("greedy", ROWS[:2], greedy)])
    core = await _core(config, vllm_engine)
    try:
        m = await core.eval()
    finally:
        await _close(core)
    assert m["eval/greedy/failed_task_count"] == 0 and m["eval/greedy/experience_count"] == 4
    assert m["eval/greedy/response_length/std@2"] == 0.0 and m["eval/greedy/reward/std@2"] == 0.0


# ---------------------------------------------------------------------- serve mode
@pytest_asyncio.fixture(loop_scope="session")
async def served(vllm_engine, vllm_model_dir, tmp_path):
    # room for the tool call (max_model_len is max_prompt_tokens + max_response_tokens)
    model = {"custom_chat_template": TEMPLATE, "max_response_tokens": 80}
    config = _config(
        tmp_path, vllm_model_dir, mode="serve", model=model, serve={"max_tokens": 80, "max_n": 4}
    )
    core = await _core(config, vllm_engine)
    endpoint = Endpoint(config, core)
    endpoint.start()
    client = openai.AsyncOpenAI(base_url=endpoint.http.url, api_key="unused", max_retries=0)
    try:
        yield endpoint, client, core.sink
    finally:
        await client.close()
        await endpoint.stop()
        await _close(core)


async def test_serve_a_conversation_with_feedback_and_commit_becomes_one_masked_experience(served):
    endpoint, client, sink = served
    head = {"X-Session-Id": "conv-1"}
    messages = [{"role": "user", "content": "what is 2 plus 3"}]
    first = await client.chat.completions.create(
        model="policy", messages=messages, max_tokens=5, logprobs=True, temperature=1.0, extra_headers=head
    )
    lp = first.choices[0].logprobs.content
    assert len(lp) == first.usage.completion_tokens > 0
    assert all(math.isfinite(t.logprob) and t.logprob <= 0 for t in lp)
    messages += [{"role": "assistant", "content": first.choices[0].message.content},
                 {"role": "user", "content": "and times 2"}]  # fmt: skip
    second = await client.chat.completions.create(
        model="policy", messages=messages, max_tokens=4, extra_headers=head
    )
    await client.post("/feedback", body={"session_id": "conv-1", "reward": 0.5}, cast_to=httpx2.Response)
    done = await client.post("/commit", body={"session_ids": ["conv-1"]}, cast_to=httpx2.Response)
    assert done.json() == {"committed": ["conv-1"], "experiences": 1, "model_versions": [0]}
    [exp] = sink.experiences
    n1, n2 = first.usage.completion_tokens, second.usage.completion_tokens
    assert exp.prompt_length == first.usage.prompt_tokens and exp.reward == 0.5
    assert len(exp.tokens) == second.usage.prompt_tokens + n2
    between = second.usage.prompt_tokens - first.usage.prompt_tokens - n1
    assert between > 0 and exp.action_mask.tolist() == [True] * n1 + [False] * between + [True] * n2
    assert torch.allclose(exp.logprobs[:n1], torch.tensor([t.logprob for t in lp]))
    assert (exp.logprobs[n1 : n1 + between] == 0).all() and torch.isfinite(exp.logprobs).all()
    # exactly once: the same commit again is a retry (the first answer, nothing stored); another request
    # committing the session (its own idempotency key) is refused
    again = await client.post("/commit", body={"session_ids": ["conv-1"]}, cast_to=httpx2.Response)
    assert again.json() == done.json() and again.headers["idempotent-replayed"] == "true"
    with pytest.raises(openai.ConflictError):
        await client.post("/commit", body={"session_ids": ["conv-1"]}, cast_to=httpx2.Response,
                          options={"headers": {"Idempotency-Key": "another"}})  # fmt: skip
    assert len(sink.experiences) == 1


async def test_serve_n_choices_and_a_stream_commit_as_one_group_and_one_session(served):
    _, client, sink = served
    resp = await client.chat.completions.create(
        model="policy", messages=[{"role": "user", "content": "count to three"}], n=3, max_tokens=4,
        temperature=1.0, user="grp",
    )  # fmt: skip
    assert [c.index for c in resp.choices] == [0, 1, 2]
    for i in range(3):
        await client.post("/feedback", body={"response_id": resp.id, "choice_index": i, "reward": float(i)},
                          cast_to=httpx2.Response)  # fmt: skip
    stream = await client.chat.completions.create(
        model="policy", messages=[{"role": "user", "content": "hello"}], max_tokens=4, stream=True,
        stream_options={"include_usage": True}, extra_headers={"X-Session-Id": "streamed"},
    )  # fmt: skip
    usage = None
    async for chunk in stream:
        usage = chunk.usage or usage
    await client.post("/feedback", body={"session_id": "streamed", "reward": 1.0}, cast_to=httpx2.Response)
    await client.post("/commit", body={"session_ids": ["grp", "streamed"]}, cast_to=httpx2.Response)
    group, streamed = sink.experiences[:3], sink.experiences[3]
    assert [e.reward for e in group] == [0.0, 1.0, 2.0] and len({e.eid.group_id for e in group}) == 1
    assert len({tuple(e.tokens.tolist()) for e in group}) > 1  # three samples, not one thrice
    for e in group:
        assert e.response_length == len(e.logprobs) > 0 and torch.isfinite(e.logprobs).all()
    assert usage is not None and streamed.response_length == usage.completion_tokens > 0
    assert streamed.info["session_id"] == "streamed" and streamed.reward == 1.0


async def test_serve_parses_the_models_tool_call(served, vllm_engine, vllm_model_dir, taught):
    await vllm_engine.load_weights(read_safetensors_folder(str(taught)), version=4)
    try:
        resp = await served[1].chat.completions.create(
            model="policy", messages=[{"role": "user", "content": "3+4="}], tools=[CALCULATOR],
            temperature=0.0, max_tokens=80, logprobs=True,
        )  # fmt: skip
    finally:
        await restore_weights(vllm_engine, vllm_model_dir)
    choice = resp.choices[0]
    assert choice.finish_reason == "tool_calls" and not choice.message.content
    [call] = choice.message.tool_calls
    assert call.function.name == "calculator" and json.loads(call.function.arguments) == {"expression": "3+4"}
    assert all(t.logprob > math.log(0.5) for t in choice.logprobs.content)
