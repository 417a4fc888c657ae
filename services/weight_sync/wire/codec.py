"""Safetensors encoding of a state dict, shared by the `memory` and `checkpoint` methods.

Two things plain `safetensors.torch.save` does not do for us:
- Tied weights. A trainer state dict may hold `lm_head.weight` and `model.embed_tokens.weight` as
  one storage; safetensors refuses shared tensors. We store each storage once and record the other
  names in the header metadata (`rft.aliases`, JSON `{alias: stored_name}`); decoding restores them.
- Copies. `decode_state_dict` views tensors straight out of the payload buffer with
  `torch.frombuffer` (zero copies after the chunks are joined), instead of `safetensors.torch.load`,
  which copies every tensor once more. The header is validated (dtypes, shapes, offsets in bounds).
- Speed. `encode_state_dict_buffer` writes the same format itself: the header, then every tensor
  copied once (a torch memcpy) into one preallocated `bytearray` - `safetensors.torch.save` goes
  through an intermediate copy per tensor and a final `bytes`. `encode_state_dict_segments` gives the
  same bytes as views of the tensors themselves, for writers that copy anyway (gRPC chunks). Tensors are laid out by element size
  (largest first), so every tensor starts aligned to its dtype.
Nothing is ever unpickled.
"""

from __future__ import annotations

import json
import math
import struct
import warnings
from collections.abc import Mapping

import safetensors.torch
import torch

ALIASES_KEY = "rft.aliases"
_ST_DTYPES: dict[str, torch.dtype] = {
    "F64": torch.float64,
    "F32": torch.float32,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "I64": torch.int64,
    "I32": torch.int32,
    "I16": torch.int16,
    "I8": torch.int8,
    "U8": torch.uint8,
    "BOOL": torch.bool,
}


class CodecError(ValueError):
    """A payload that is not a well-formed safetensors state dict."""


def split_aliases(state_dict: Mapping[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """CPU contiguous tensors with each shared storage kept once, plus `{alias: kept_name}`."""
    unique: dict[str, torch.Tensor] = {}
    aliases: dict[str, str] = {}
    seen: dict[tuple[int, int, tuple[int, ...], tuple[int, ...], torch.dtype], str] = {}
    for name, tensor in state_dict.items():
        t = tensor.detach()
        key = (t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape), t.stride(), t.dtype)
        if t.numel() and key in seen:
            aliases[name] = seen[key]
            continue
        seen[key] = name
        unique[name] = t.to("cpu").contiguous()
    return unique, aliases


def metadata_of(aliases: Mapping[str, str], extra: Mapping[str, str] | None = None) -> dict[str, str]:
    meta = dict(extra or {})
    if aliases:
        meta[ALIASES_KEY] = json.dumps(dict(aliases), sort_keys=True)
    return meta


def restore_aliases(
    tensors: dict[str, torch.Tensor], metadata: Mapping[str, str] | None
) -> dict[str, torch.Tensor]:
    raw = (metadata or {}).get(ALIASES_KEY)
    if raw:
        for alias, target in json.loads(raw).items():
            if target not in tensors:
                raise CodecError(f"alias {alias!r} points at {target!r}, which is not in the payload")
            tensors[alias] = tensors[target]
    return tensors


def encode_state_dict(
    state_dict: Mapping[str, torch.Tensor], metadata: Mapping[str, str] | None = None
) -> bytes:
    """Safetensors bytes of `state_dict` (any device; tied tensors stored once)."""
    unique, aliases = split_aliases(state_dict)
    return safetensors.torch.save(unique, metadata=metadata_of(aliases, metadata) or None)


_ST_NAMES = {dtype: name for name, dtype in _ST_DTYPES.items()}


def _layout(
    state_dict: Mapping[str, torch.Tensor], metadata: Mapping[str, str] | None
) -> tuple[bytes, list[torch.Tensor]]:
    """The safetensors prefix (8-byte length + JSON header) and the tensors in payload order."""
    unique, aliases = split_aliases(state_dict)
    order = sorted(unique, key=lambda n: (-unique[n].element_size(), n))
    header: dict[str, object] = {}
    meta = metadata_of(aliases, metadata)
    if meta:
        header["__metadata__"] = meta
    offset = 0
    for name in order:
        t = unique[name]
        if t.dtype not in _ST_NAMES:
            raise CodecError(f"tensor {name!r}: dtype {t.dtype} has no safetensors name")
        n = t.numel() * t.element_size()
        header[name] = {
            "dtype": _ST_NAMES[t.dtype],
            "shape": list(t.shape),
            "data_offsets": [offset, offset + n],
        }
        offset += n
    head = json.dumps(header, separators=(",", ":")).encode()
    head += b" " * (-len(head) % 8)
    return struct.pack("<Q", len(head)) + head, [unique[name] for name in order]


def encode_state_dict_buffer(
    state_dict: Mapping[str, torch.Tensor], metadata: Mapping[str, str] | None = None
) -> bytearray:
    """Safetensors bytes of `state_dict` in one buffer, each tensor copied into it exactly once."""
    prefix, tensors = _layout(state_dict, metadata)
    start = len(prefix)
    buf = bytearray(start + sum(t.numel() * t.element_size() for t in tensors))
    buf[:start] = prefix
    if len(buf) > start:
        flat = torch.frombuffer(buf, dtype=torch.uint8)
        pos = start
        for t in tensors:
            n = t.numel() * t.element_size()
            if n:
                flat[pos : pos + n].copy_(t.reshape(-1).view(torch.uint8))
            pos += n
    return buf


def encode_state_dict_segments(
    state_dict: Mapping[str, torch.Tensor], metadata: Mapping[str, str] | None = None
) -> list[memoryview]:
    """The same safetensors bytes as `encode_state_dict_buffer`, as zero-copy views: the header, then
    each CPU tensor's own memory. Joining them (e.g. into wire chunks) is then the only copy."""
    prefix, tensors = _layout(state_dict, metadata)
    segments = [memoryview(prefix)]
    for t in tensors:
        if t.numel():
            flat = t.detach().to("cpu").contiguous().reshape(-1).view(torch.uint8)
            segments.append(memoryview(flat.numpy()))
    return segments


def read_header(payload: bytes | bytearray | memoryview) -> tuple[dict, int]:
    """Parsed JSON header and the offset where tensor data starts."""
    view = memoryview(payload)
    if len(view) < 8:
        raise CodecError(f"payload of {len(view)} bytes is too short for a safetensors header")
    (n,) = struct.unpack("<Q", view[:8])
    if 8 + n > len(view):
        raise CodecError(f"safetensors header claims {n} bytes but the payload has {len(view) - 8}")
    try:
        header = json.loads(bytes(view[8 : 8 + n]))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CodecError(f"safetensors header is not valid JSON: {exc}") from exc
    if not isinstance(header, dict):
        raise CodecError("safetensors header is not a JSON object")
    return header, 8 + n


def decode_state_dict(
    payload: bytes | bytearray, device: str | torch.device = "cpu"
) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """`(state_dict, metadata)` from safetensors bytes. On CPU the tensors are views into `payload`
    (pass a `bytearray` to get writable tensors; `bytes` gives read-only memory - copy before writing)."""
    header, start = read_header(payload)
    metadata = header.pop("__metadata__", None) or {}
    data_len = len(payload) - start
    out: dict[str, torch.Tensor] = {}
    for name, info in header.items():
        try:
            dtype = _ST_DTYPES[info["dtype"]]
            shape = [int(s) for s in info["shape"]]
            begin, end = (int(x) for x in info["data_offsets"])
        except (KeyError, TypeError, ValueError) as exc:
            raise CodecError(f"tensor {name!r}: bad header entry {info!r}") from exc
        nbytes = math.prod(shape) * dtype.itemsize
        if not 0 <= begin <= end <= data_len or end - begin != nbytes:
            raise CodecError(
                f"tensor {name!r}: offsets {begin}..{end} do not fit {dtype}{shape} in {data_len} bytes"
            )
        if nbytes == 0:
            t = torch.empty(shape, dtype=dtype)
        else:
            with warnings.catch_warnings():  # read-only `bytes` is documented above
                warnings.simplefilter("ignore", UserWarning)
                t = torch.frombuffer(payload, dtype=torch.uint8, count=nbytes, offset=start + begin)
            t = t.view(dtype).view(shape)
        out[name] = t if torch.device(device).type == "cpu" else t.to(device)
    return restore_aliases(out, metadata), metadata
