"""The vLLM suite: tests against a real vLLM engine (its CPU build on a machine without a GPU), run from the
vLLM environment (`bash scripts/setup.sh --engine vllm`, then `.venv-vllm/bin/python -m pytest -m vllm`).

Every test here carries the `vllm` marker. An engine takes a minute or more to start on two cores, so
the tests share one: `vllm_engine` (session-scoped, on the session's event loop; modules set
`pytestmark = pytest.mark.asyncio(loop_scope="session")`) runs the tiny model in float32. A test that
loads other weights into it puts the model folder's weights back before it ends (`restore_weights`).
Features the CPU build lacks (sleep mode, NCCL, CUDA IPC, tensor parallelism) are skipped with
`needs_gpu(feature)`, naming the feature.
"""

from __future__ import annotations

import importlib.util
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio
import torch

from services.common.tiny_model import make_tiny_model

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


def engine_config(**fields):
    from services.common.config import InferenceModelConfig

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
