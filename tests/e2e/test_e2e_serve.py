"""`rft run` in serve mode (examples/serve.yaml, all four services as processes) with the `openai`
client as the application: the printed endpoint answers, rewarded and committed sessions are exactly
what the trainer trains on (checkpoint lineage, trainer metrics with the given rewards), the endpoint
serves the trained weights after the first sync, and the run ends at total_steps with nothing left."""

from __future__ import annotations

import re

import httpx2
import openai
import pytest

from services.common.lineage import read_lineage
from tests.support.rft_run import (
    assert_no_orphans,
    example,
    jsonl,
    poll_until,
    start_rft,
    tiny_model,
    write_config,
)

pytestmark = pytest.mark.slow


def _session(client: openai.OpenAI, sid: str, rewards: tuple[float, float]) -> list[str]:
    """Two turns (n=2 on the second: a GRPO group), one reward per choice; the expected uids."""
    head = {"X-Session-Id": sid}
    msgs = [{"role": "user", "content": "what is 1 plus 2"}]
    first = client.chat.completions.create(model="p", messages=msgs, max_tokens=3, extra_headers=head)
    msgs += [{"role": "assistant", "content": first.choices[0].message.content},
             {"role": "user", "content": "and 3 plus 4"}]  # fmt: skip
    second = client.chat.completions.create(model="p", messages=msgs, max_tokens=3, n=2, extra_headers=head)
    for i, r in enumerate(rewards):
        client.post("/feedback", body={"response_id": second.id, "choice_index": i, "reward": r},
                    cast_to=httpx2.Response)  # fmt: skip
    return [f"explorer/explorer/serve/{sid}/{second.id}/{i}/" for i in range(2)]


@pytest.mark.timeout(600)  # the waits below are upper bounds for a loaded machine
def test_serve_mode_trains_on_exactly_the_committed_sessions(tmp_path):
    tree = example("serve.yaml")
    tree["checkpoint_root_dir"] = str(tmp_path / "ckpt")
    tree["model"]["model_path"] = str(tiny_model())
    tree["buffer"]["total_steps"] = 2
    tree["monitor"]["monitor_type"] = "none"
    config = write_config(tmp_path / "serve.yaml", tree)
    log = tmp_path / "rft.log"
    proc = start_rft(config, log=log)
    try:
        found = poll_until(
            lambda: re.search(r"endpoint: (http://\S+/v1)", log.read_text()), 240, "the endpoint"
        )
        client = openai.OpenAI(base_url=found.group(1), api_key="none", max_retries=0)
        expected = _session(client, "a", (1.0, 0.0)) + _session(client, "b", (0.5, 0.25))
        _session(client, "never-committed", (9.0, 9.0))
        with pytest.raises(openai.BadRequestError, match="'unrewarded' has no reward"):
            client.chat.completions.create(
                model="p", messages=[{"role": "user", "content": "hi"}], max_tokens=2, user="unrewarded"
            )
            client.post("/commit", body={"session_ids": ["unrewarded"]}, cast_to=httpx2.Response)
        client.post("/commit", body={"session_ids": ["a", "b"]}, cast_to=httpx2.Response)  # step 1
        # the endpoint serves the weights of trainer step 1 once they are published
        health = found.group(1).removesuffix("/v1") + "/health"
        poll_until(lambda: httpx2.get(health).json()["model_version"] >= 1, 240, "version 1 at the endpoint")
        later = client.chat.completions.create(
            model="p", messages=[{"role": "user", "content": "x"}], max_tokens=2
        )
        assert later.model_extra["model_version"] == 1
        expected += _session(client, "c", (2.0, 2.0)) + _session(client, "d", (3.0, 0.0))
        client.post("/commit", body={"session_ids": ["c", "d"]}, cast_to=httpx2.Response)  # step 2: the end
        assert proc.wait(timeout=90) == 0, log.read_text()[-3000:]
    finally:
        if proc.poll() is None:
            proc.terminate()
            proc.wait(timeout=60)
    out = log.read_text()
    assert_no_orphans(out)
    job = tmp_path / "ckpt" / "serve" / "tiny"
    trained = [u for step in read_lineage(job / "global_step_2") for u in step.uids]
    assert sorted(trained) == sorted(expected)
    rows = jsonl(job / "metrics" / "trainer.jsonl")
    assert [r["step"] for r in rows] == [1, 2]
    assert [(r["critic/score/max"], r["critic/score/min"]) for r in rows] == [(1.0, 0.0), (3.0, 0.0)]
    assert [r["critic/score/mean"] for r in rows] == pytest.approx([1.75 / 4, 7.0 / 4])
    # the explorer logs one row per commit, with the rewards of what it committed
    commits = jsonl(job / "metrics" / "explorer.jsonl")
    assert [(r["step"], r["serve/sessions"], r["serve/experiences"]) for r in commits] == [
        (1, 2, 4),
        (2, 2, 4),
    ]
    assert [r["rollout/reward/mean"] for r in commits] == pytest.approx([1.75 / 4, 7.0 / 4])
    assert [r["rollout/model_version"] for r in commits] == [0, 1]  # c and d were answered after v1
