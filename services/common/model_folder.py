"""Facts about a local HF model folder that need neither torch nor transformers: where it is (models are
never downloaded at run time) and its vocabulary size from `config.json`.

`modeling.py` loads models and tokenizers from the same folders; this module is what a service without
torch (the buffer, which checks token ids against the vocabulary) can import.
"""

from __future__ import annotations

import json
import os
from pathlib import Path


class ModelLoadError(RuntimeError):
    pass


def local_folder(path: str | os.PathLike[str], allow_download: bool = False) -> str:
    """`path` as a local folder; with `allow_download`, a hub id passes through unchanged."""
    p = Path(path).expanduser()
    if p.is_dir():
        return str(p)
    if allow_download:
        return str(path)
    raise ModelLoadError(
        f"model folder {str(path)!r} does not exist; give a local HF folder "
        "(e.g. made by `rft make-tiny-model DIR`) — models are never downloaded at run time"
    )


def read_vocab_size(path: str | os.PathLike[str]) -> int:
    """`vocab_size` of the folder's config.json (or of its `text_config`, as multimodal configs nest it)."""
    config_file = Path(local_folder(path)) / "config.json"
    try:
        config = json.loads(config_file.read_text())
    except (OSError, ValueError) as exc:
        raise ModelLoadError(f"cannot read {config_file}: {exc}") from exc
    if not isinstance(config, dict):
        raise ModelLoadError(f"{config_file} is not a JSON object")
    text_config = config.get("text_config")
    value = config.get("vocab_size") or (
        text_config.get("vocab_size") if isinstance(text_config, dict) else None
    )
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise ModelLoadError(f"{config_file} has no positive integer vocab_size (found {value!r})")
    return value
