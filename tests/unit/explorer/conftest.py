"""Shared fixtures of the explorer unit tests: one tiny model folder per session, one thread for torch."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from launcher.tiny_model import make_tiny_model


@pytest.fixture(scope="session", autouse=True)
def _one_torch_thread() -> None:
    torch.set_num_threads(1)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_model(tmp_path_factory.mktemp("explorer_tiny") / "model")


@pytest.fixture(scope="session")
def hf_engine(tiny_model_dir: Path):
    from services.explorer.engines.hf import HFEngine

    return HFEngine.from_pretrained(str(tiny_model_dir), device="cpu", seed=7, micro_batch_size=4)
