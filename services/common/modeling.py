"""Load any HF model folder and the tokenizer that was saved with it.

transformers 5 pitfall: `AutoTokenizer.from_pretrained(dir)` on a folder whose `config.json` says
`qwen2` returns `Qwen2Tokenizer` even when a different tokenizer was saved (different ids, vocab + 1).
We read `tokenizer_config.json` and load exactly the class it names. Nothing is downloaded: a path
that is not a local folder is refused unless `allow_download=True` (see `model_folder.py`, which needs no torch).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import torch
import transformers
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel
from transformers.utils import logging as hf_logging

from services.common.model_folder import ModelLoadError as ModelLoadError  # re-exported
from services.common.model_folder import local_folder

hf_logging.disable_progress_bar()

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def resolve_dtype(dtype: str | torch.dtype, device: str | torch.device = "cpu") -> torch.dtype:
    """`auto` means bfloat16 on CUDA and float32 on CPU."""
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype == "auto":
        return torch.bfloat16 if torch.device(device).type == "cuda" else torch.float32
    try:
        return DTYPES[dtype]
    except KeyError:
        raise ValueError(f"dtype {dtype!r} is not one of auto, {', '.join(DTYPES)}") from None


def load_tokenizer(path: str | os.PathLike[str], *, allow_download: bool = False, **kwargs: Any) -> Any:
    """The tokenizer class named in the folder's tokenizer_config.json, else AutoTokenizer."""
    folder = local_folder(path, allow_download)
    cfg_file = Path(folder) / "tokenizer_config.json"
    name = None
    if cfg_file.is_file():
        name = json.loads(cfg_file.read_text()).get("tokenizer_class")
    cls = getattr(transformers, name, None) if name else None
    if cls is None:
        return AutoTokenizer.from_pretrained(folder, **kwargs)
    return cls.from_pretrained(folder, **kwargs)


def load_model(
    path: str | os.PathLike[str],
    *,
    dtype: str | torch.dtype = "auto",
    device: str | torch.device = "cpu",
    allow_download: bool = False,
    trust_remote_code: bool = False,
) -> PreTrainedModel:
    folder = local_folder(path, allow_download)
    model = AutoModelForCausalLM.from_pretrained(
        folder, dtype=resolve_dtype(dtype, device), trust_remote_code=trust_remote_code
    )
    return model.to(device)


def load_model_and_tokenizer(
    path: str | os.PathLike[str], *, dtype: str | torch.dtype = "auto", device: str | torch.device = "cpu"
) -> tuple[PreTrainedModel, Any]:
    return load_model(path, dtype=dtype, device=device), load_tokenizer(path)
