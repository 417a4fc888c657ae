"""`model_folder`: a model folder's vocabulary size read from config.json without torch, and clear
errors for a missing folder or a config without a usable vocab_size."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from services.common.model_folder import ModelLoadError, read_vocab_size

ROOT = Path(__file__).resolve().parents[3]


def _folder(tmp_path: Path, config: object) -> Path:
    (tmp_path / "config.json").write_text(json.dumps(config))
    return tmp_path


def test_reads_vocab_size_top_level_or_nested(tmp_path):
    assert read_vocab_size(_folder(tmp_path, {"model_type": "qwen2", "vocab_size": 151936})) == 151936
    nested = {"model_type": "llava", "text_config": {"vocab_size": 32064}}
    assert read_vocab_size(_folder(tmp_path, nested)) == 32064


@pytest.mark.parametrize("config", [{"model_type": "x"}, {"vocab_size": 0}, {"vocab_size": "10"}, [1, 2]])
def test_config_without_a_usable_vocab_size_is_an_error(tmp_path, config):
    with pytest.raises(ModelLoadError, match="config.json"):
        read_vocab_size(_folder(tmp_path, config))


def test_missing_folder_or_config_is_an_error(tmp_path):
    with pytest.raises(ModelLoadError, match="never downloaded"):
        read_vocab_size(tmp_path / "absent")
    with pytest.raises(ModelLoadError, match="cannot read"):
        read_vocab_size(tmp_path)


def test_importing_it_does_not_import_torch():
    code = "import sys, services.common.model_folder; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
