"""The vLLM suite: tests against a real vLLM engine (its CPU build on a machine without a GPU), run from the
vLLM environment (`bash scripts/setup.sh --engine vllm`, then `.venv-vllm/bin/python -m pytest -m vllm`).

Every test here carries the `vllm` marker. An engine takes a minute or more to start on two cores, so
the tests share one: `vllm_engine` (session-scoped, on the session's event loop; modules set
`pytestmark = pytest.mark.asyncio(loop_scope="session")`) runs the tiny model in float32. A test that
loads other weights into it puts the model folder's weights back before it ends (`restore_weights`).
Features the CPU build lacks (sleep mode, NCCL, CUDA IPC, tensor parallelism) are skipped with
`needs_gpu(feature)`, naming the feature. The engine is held to the trainer's numbers with
`trainer_logprobs` (the HF model of the same weights in float32, as the trainer computes log-probs),
`engine_logprobs` (the engine's on fixed tokens) and `assert_engine_holds` (both agree within 1e-5).
"""

from __future__ import annotations

import importlib.util
import os
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio
import torch

from launcher.tiny_model import make_tiny_model

HAS_VLLM = importlib.util.find_spec("vllm") is not None
ON_GPU = torch.cuda.is_available()


def needs_gpu(feature: str) -> pytest.MarkDecorator:
    """Skip on vLLM's CPU build, which lacks `feature`."""
    return pytest.mark.skipif(not ON_GPU, reason=f"vLLM's CPU build has no {feature}")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        if here in Path(item.fspath).parents:
            item.add_marker(pytest.mark.vllm)


@pytest.fixture(scope="session")
def vllm_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny model (tied embeddings, float32), one folder for the session."""
    return make_tiny_model(tmp_path_factory.mktemp("vllm_tiny") / "model")


# RFT_VLLM_ENFORCE_EAGER=1: the engines run eager (scripts/gpu_vllm.sh sets it: vLLM 0.33's compile path
# is built against torch 2.14, the GPU image has 2.11)
EAGER = os.environ.get("RFT_VLLM_ENFORCE_EAGER") == "1"


def engine_config(**fields):
    from services.common.config import InferenceModelConfig

    fields = {"enforce_eager": EAGER, **fields}
    return InferenceModelConfig(engine_type="vllm", dtype="float32", gpu_memory_utilization=0.3, **fields)


@pytest_asyncio.fixture(scope="session", loop_scope="session")
async def vllm_engine(vllm_model_dir: Path) -> AsyncIterator:
    """One real vLLM engine on the tiny model for the whole session."""
    from services.explorer.engines.vllm import VLLMEngine

    engine = VLLMEngine.from_config(engine_config(), str(vllm_model_dir))
    try:
        yield engine
    finally:
        await engine.close()


async def restore_weights(engine, model_dir: Path, version: int = 0) -> None:
    """Put the model folder's weights back into `engine` (after a test loaded others)."""
    from services.explorer.engines.weights import read_safetensors_folder

    engine.set_inflight_updates(False)
    await engine.load_weights(read_safetensors_folder(str(model_dir)), version=version)


# ---- the trainer's log-probs and the engine's, on the same tokens -----------------------------------
FIXED_TEXTS = (
    "12+34=46, then 7*8=56 and 9-3=6.",
    "Tom has 3 apples; he eats 1, so 3-1=2 are left over.",
)
PROMPT_TOKENS = 4  # the first tokens of a fixed text prompt the rest


def fixed_sequences(tokenizer) -> list[tuple[list[int], list[int]]]:
    """(prompt, continuation) token ids of `FIXED_TEXTS`."""
    out = []
    for text in FIXED_TEXTS:
        ids = tokenizer.encode(text)
        out.append((ids[:PROMPT_TOKENS], ids[PROMPT_TOKENS:]))
    return out


def hf_model(model_dir: Path, state=None, strict: bool = True):
    """The trainer's view of the policy: the HF model of `model_dir` in float32, with `state` (a state
    dict or (name, tensor) pairs) loaded over the folder's weights."""
    from services.common.modeling import load_model
    from services.weight_sync import load_weights

    model = load_model(model_dir, dtype="float32").eval()
    if state is not None:
        load_weights(model, state, strict=strict)
    return model


def trainer_logprobs(model, prompt, tokens, temperature: float = 1.0) -> torch.Tensor:
    """Log-probs of `tokens` after `prompt` as the trainer computes them (services/trainer/actor.py
    `policy_forward`): float32 logits at the positions that predict them, divided by the temperature,
    log_softmax gathered at the tokens (`logprobs_from_logits`)."""
    from services.trainer.algorithms import logprobs_from_logits

    ids = torch.tensor([[int(t) for t in prompt] + [int(t) for t in tokens]])
    with torch.no_grad():
        logits = model(input_ids=ids, use_cache=False).logits[0, len(prompt) - 1 : -1].float()
    if temperature != 1.0:
        logits = logits / temperature
    return logprobs_from_logits(logits, torch.tensor([int(t) for t in tokens]))


async def engine_logprobs(engine, prompt, tokens) -> torch.Tensor:
    """The engine's log-probs of the fixed `tokens` after `prompt` at temperature 1: vLLM's prompt
    log-probs of the whole sequence (log_softmax of the model's logits, the same lm_head as sampling)."""
    import vllm
    from vllm.inputs import TokensPrompt

    ids = [int(t) for t in prompt] + [int(t) for t in tokens]
    params = vllm.SamplingParams(max_tokens=1, prompt_logprobs=0)
    final = None
    async for out in engine.llm.generate(
        TokensPrompt(prompt_token_ids=ids), params, f"score-{uuid.uuid4().hex}"
    ):
        final = out
    assert final is not None and final.prompt_logprobs is not None
    return torch.tensor(
        [final.prompt_logprobs[len(prompt) + i][t].logprob for i, t in enumerate(ids[len(prompt) :])]
    )


TOLERANCE = 1e-5  # float32 engine vs float32 trainer, on the same tokens
CHANGED = 1e-3  # a load that took: the log-probs moved by more than this somewhere


async def assert_engine_holds(engine, model, old=None) -> None:
    """The engine's log-probs on the fixed sequences equal `model`'s (the trainer's, within
    `TOLERANCE`) and, given `old`, differ from `old`'s (the weights changed)."""
    moved = 0.0
    for prompt, tokens in fixed_sequences(engine.tokenizer):
        got = await engine_logprobs(engine, prompt, tokens)
        torch.testing.assert_close(got, trainer_logprobs(model, prompt, tokens), rtol=0, atol=TOLERANCE)
        if old is not None:
            moved = max(moved, float((got - trainer_logprobs(old, prompt, tokens)).abs().max()))
    if old is not None:
        assert moved > CHANGED, f"the engine's log-probs moved by only {moved:.2e} from the old weights'"


@pytest.fixture(scope="session")
def hf_base(vllm_model_dir: Path):
    """The trainer's model of the session's folder (the engine's weights between tests)."""
    return hf_model(vllm_model_dir)
