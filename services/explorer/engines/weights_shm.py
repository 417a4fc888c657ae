"""Weights handed to vLLM's workers through a shared-memory safetensors file, with a plain payload.

vLLM sends `collective_rpc` arguments from the engine's process to its core with msgspec msgpack
(`vllm/v1/serial_utils.py`): `MsgpackEncoder.enc_hook` writes a tensor as `(dtype, shape, data)` and
`MsgpackDecoder.dec_hook` rebuilds tensors only for fields *typed* as tensors, which `collective_rpc`'s
`args` are not, so a worker would get `[dtype, shape, index]` lists. So the engine writes the tensors to
one safetensors file (under /dev/shm when it has room: host memory, one copy, no disk) and passes a
payload of strings, ints and lists only, which any msgpack round trip keeps unchanged. Every worker (one
per tensor-parallel rank, same host) opens the file and reads the tensors straight onto its device.

`write_shared_weights` streams the tensors one at a time (the file is the only full copy; a tensor
on a GPU is copied to the host alone). `read_shared_weights` (worker side, no vLLM needed) checks each
tensor's dtype and shape against the payload and yields `(name, tensor)` in the payload's order.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TypedDict

import torch

from services.weight_sync import WeightLoadError

SHM = Path("/dev/shm")
# torch dtype -> safetensors dtype code (the format's header names)
ST_DTYPES = {
    torch.float64: "F64",
    torch.float32: "F32",
    torch.float16: "F16",
    torch.bfloat16: "BF16",
    torch.int64: "I64",
    torch.int32: "I32",
    torch.int16: "I16",
    torch.int8: "I8",
    torch.uint8: "U8",
    torch.bool: "BOOL",
    torch.float8_e4m3fn: "F8_E4M3",
    torch.float8_e5m2: "F8_E5M2",
}


class SharedWeights(TypedDict):
    """The `collective_rpc` payload: plain values only (msgpack keeps them as they are).
    `tensors`: one `[name, dtype, shape]` per tensor, dtype as torch names it ("bfloat16")."""

    path: str
    tensors: list[list[str | list[int]]]
    strict: bool


def shared_dir(nbytes: int) -> Path:
    """/dev/shm when it exists and has room for `nbytes` (plus a margin); else the temp folder
    (a container's /dev/shm is often 64 MiB)."""
    try:
        if SHM.is_dir() and os.access(SHM, os.W_OK) and shutil.disk_usage(SHM).free > nbytes * 1.1 + 2**20:
            return SHM
    except OSError:
        pass
    return Path(tempfile.gettempdir())


def _raw(t: torch.Tensor) -> memoryview:
    flat = t.detach().to("cpu").contiguous().reshape(-1)
    return memoryview(flat.view(torch.uint8).numpy()) if flat.numel() else memoryview(b"")


def write_shared_weights(
    named: Sequence[tuple[str, torch.Tensor]], *, strict: bool = True, folder: Path | None = None
) -> SharedWeights:
    """Write `named` as one safetensors file (streamed, tensor by tensor) and return its payload.
    The caller deletes the file (`remove_shared_weights`) once every worker has loaded it."""
    header: dict[str, object] = {}
    specs: list[list[str | list[int]]] = []
    offset = 0
    for name, t in named:
        if name in header:
            raise WeightLoadError(f"weight {name!r} is given twice")
        code = ST_DTYPES.get(t.dtype)
        if code is None:
            raise WeightLoadError(f"weight {name!r}: dtype {t.dtype} cannot be written as safetensors")
        size = t.numel() * t.element_size()
        header[name] = {"dtype": code, "shape": list(t.shape), "data_offsets": [offset, offset + size]}
        specs.append([name, str(t.dtype).removeprefix("torch."), [int(s) for s in t.shape]])
        offset += size
    head = json.dumps(header, separators=(",", ":")).encode()
    head += b" " * (-len(head) % 8)  # the data starts 8-byte aligned
    folder = folder or shared_dir(offset + len(head))
    path = folder / f"rft-weights-{os.getpid()}-{uuid.uuid4().hex}.safetensors"
    try:
        with open(path, "wb") as f:
            f.write(len(head).to_bytes(8, "little"))
            f.write(head)
            for _, t in named:
                f.write(_raw(t))
    except BaseException:
        path.unlink(missing_ok=True)
        raise
    return SharedWeights(path=str(path), tensors=specs, strict=bool(strict))


def remove_shared_weights(payload: SharedWeights) -> None:
    Path(payload["path"]).unlink(missing_ok=True)


def read_shared_weights(
    payload: SharedWeights, device: str | torch.device = "cpu"
) -> Iterator[tuple[str, torch.Tensor]]:
    """The payload's tensors, in its order, read from its file onto `device` one at a time."""
    from safetensors import safe_open

    with safe_open(payload["path"], framework="pt", device=str(device)) as f:
        for name, dtype, shape in payload["tensors"]:
            t = f.get_tensor(str(name))
            if str(t.dtype).removeprefix("torch.") != dtype or list(t.shape) != list(shape):
                raise WeightLoadError(
                    f"weight {name!r} in {payload['path']}: {t.dtype} {list(t.shape)}, "
                    f"the payload says {dtype} {shape}"
                )
            yield str(name), t
