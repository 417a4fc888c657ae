"""Smoke: the shared engine answers (a placeholder module while the suite grows)."""

import pytest

pytestmark = pytest.mark.asyncio(loop_scope="session")


async def test_engine_answers(vllm_engine):
    from tests.unit.explorer.fakes import sampling

    outs = await vllm_engine.generate([vllm_engine.tokenizer.encode("1+2=")], sampling(n=2, max_tokens=4))
    assert len(outs[0]) == 2


async def test_engine_answers_again(vllm_engine):
    from tests.unit.explorer.fakes import sampling

    outs = await vllm_engine.generate([vllm_engine.tokenizer.encode("1+2=")], sampling(n=3, max_tokens=4))
    assert len(outs[0]) == 3
