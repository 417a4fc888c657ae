"""`rft conformance explorer` against real servers: the project's explorer (the tiny model, an arithmetic
taskset and eval taskset, streaming to a real buffer service; both real grpc.aio servers on port 0, auth
on) passes every check with `--drive`, and the read-only checks without it; explorers broken on purpose
(the real servicer with one method overridden) fail the check named for it, with exit code 1. The suite
runs as the `rft` command in a subprocess."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
import torch
from rft.v1 import explorer_pb2

from launcher.conformance.explorer import CHECKS
from launcher.tiny_model import make_tiny_model
from services.buffer.service import build_core as build_buffer_core
from services.buffer.servicer import registration as buffer_registration
from services.common.buffer_client import BufferClient
from services.common.config import load_config
from services.common.rpc import create_channel, start_server
from services.explorer.serve.endpoint import Endpoint
from services.explorer.service import build_core
from services.explorer.servicer import ExplorerServicer, registration
from services.explorer.sink import BufferSink, ListSink
from services.explorer.workflows.arithmetic import make_arithmetic_rows
from tests.support.conformance import conformance, statuses

TOKEN = "conformance-token"
NAMES = [c.name for c in CHECKS]
DRIVEN = {"explore_steps", "eval", "weight_group_calls"}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    torch.set_num_threads(1)
    return make_tiny_model(tmp_path_factory.mktemp("explorer_conformance") / "model")


def _config(tmp_path: Path, model_dir: Path):
    data = tmp_path / "train.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in make_arithmetic_rows(16, seed=1)))
    taskset = f"path: {data}, default_workflow_type: arithmetic, format: {{prompt_key: question, response_key: answer}}"
    return load_config(
        text=f"""
mode: both
checkpoint_root_dir: {tmp_path}/ckpt
algorithm: {{repeat_times: 2}}
model: {{model_path: {model_dir}, max_response_tokens: 4}}
buffer:
  batch_size: 2
  explorer_input:
    taskset: {{{taskset}}}
    eval_tasksets: [{{name: arith, {taskset}, repeat_times: 1}}]
explorer: {{eval_on_startup: false, rollout_model: {{micro_batch_size: 8}}}}
monitor: {{monitor_type: none}}
services: {{buffer: {{consumer_groups: [trainer]}}}}
"""
    )


@asynccontextmanager
async def explorer_server(
    tmp_path: Path, model_dir: Path, servicer_cls=ExplorerServicer
) -> AsyncIterator[str]:
    """A buffer service and an explorer service (servicer `servicer_cls`), both with auth on; the explorer's address."""
    config = _config(tmp_path, model_dir)
    buffer_core = build_buffer_core(config)
    await buffer_core.start()
    buffer = await start_server([buffer_registration(buffer_core)], auth_token=TOKEN)
    channel = create_channel(buffer.address, auth_token=TOKEN, timeout_s=10)
    client = BufferClient(channel, producer_id="ex-cf", consumer_group="trainer", consumer="t0")
    sink = BufferSink(client, vocab_size=512, initial_backoff_s=0.01, max_backoff_s=0.05)
    core = await build_core(config, explorer_id="ex-cf", sink=sink)
    explorer = await start_server([registration(servicer_cls(core))], auth_token=TOKEN)
    try:
        yield explorer.address
    finally:
        await explorer.stop(0)
        await core.close()
        await channel.close()
        await buffer.stop(0)
        await buffer_core.close()


async def test_the_project_explorer_passes_every_check(tmp_path, model_dir):
    async with explorer_server(tmp_path, model_dir) as address:
        code, output = await conformance("explorer", address, "--auth-token", TOKEN, "--drive")
        assert statuses(output) == dict.fromkeys(NAMES, "PASS"), output
        assert code == 0, output
        # read-only: the checks that act on the explorer skip, saying how to run them
        code, output = await conformance("explorer", address, "--auth-token", TOKEN)
        want = {name: "SKIP" if name in DRIVEN else "PASS" for name in NAMES}
        assert code == 0 and statuses(output) == want and "pass --drive" in output, output
        code, output = await conformance("explorer", address)
        assert code == 2 and "--auth-token" in output, output


class StepNotReported(ExplorerServicer):
    """Explore runs the steps but answers step 0 (the count of steps it ran is lost)."""

    async def Explore(self, request, context):
        reply = await super().Explore(request, context)
        reply.step = 0
        return reply


class UnknownTasksetIgnored(ExplorerServicer):
    """Eval drops the taskset names it does not know instead of refusing them."""

    async def Eval(self, request, context):
        known = {ts.name for ts, _ in self.core._eval_sets}
        kept = explorer_pb2.EvalRequest(tasksets=[n for n in request.tasksets if n in known])
        return await super().Eval(kept, context)


@pytest.mark.parametrize(
    ("servicer_cls", "check"), [(StepNotReported, "explore_steps"), (UnknownTasksetIgnored, "eval")]
)
async def test_a_broken_explorer_fails_the_named_check(servicer_cls, check, tmp_path, model_dir):
    async with explorer_server(tmp_path, model_dir, servicer_cls) as address:
        code, output = await conformance("explorer", address, "--auth-token", TOKEN, "--drive")
    found = statuses(output)
    assert found[check] == "FAIL", output
    assert code == 1, output
    assert {n: s for n, s in found.items() if n != check} == {n: "PASS" for n in NAMES if n != check}, output


async def test_an_explorer_in_serve_mode_passes_the_read_only_checks(tmp_path, model_dir):
    """With the served endpoint's backend, `serve_calls` judges the serving branch (unknown sessions
    NOT_FOUND, malformed feedback and commits INVALID_ARGUMENT)."""
    config = load_config(
        text=f"""
mode: serve
checkpoint_root_dir: {tmp_path}/ckpt
model: {{model_path: {model_dir}, max_response_tokens: 4}}
explorer: {{rollout_model: {{micro_batch_size: 8}}}}
monitor: {{monitor_type: none}}
services: {{auth_token: {TOKEN}}}
"""
    )
    core = await build_core(config, sink=ListSink())
    endpoint = Endpoint(config, core)
    endpoint.start()
    server = await start_server([registration(ExplorerServicer(core, serve=endpoint.core))], auth_token=TOKEN)
    try:
        code, output = await conformance("explorer", server.address, "--auth-token", TOKEN)
    finally:
        await server.stop(0)
        await endpoint.stop()
        await core.close()
    assert statuses(output) == {name: "SKIP" if name in DRIVEN else "PASS" for name in NAMES}, output
    assert "serves an endpoint" in output and code == 0, output
