"""scripts/gpu_vllm_pack.py on a small synthetic vLLM wheel made here (never the real one): what is kept
and dropped, the fat binary's SASS for other GPUs zeroed in place, the archive cut into pieces that
`check` holds to their limit and digests and `unpack` joins back; `gpu_vllm.sh --dry-run` without pieces
fails and says why."""

from __future__ import annotations

import importlib.util
import os
import struct
import subprocess
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
_spec = importlib.util.spec_from_file_location("gpu_vllm_pack", ROOT / "scripts" / "gpu_vllm_pack.py")
pack = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(pack)


def fatbin(entries: list[tuple[int, int, bytes]]) -> bytes:
    """A fat binary of (kind 1 PTX / 2 SASS, arch, payload) entries with 64-byte entry headers."""
    body = b""
    for kind, arch, payload in entries:
        head = struct.pack("<HHIQ", kind, 0x101, 64, len(payload)) + bytes(12) + struct.pack("<I", arch)
        body += head + bytes(64 - len(head)) + payload
    return struct.pack("<IHHQ", 0xBA55ED50, 1, 16, len(body)) + body


SASS80, SASS90, PTX80 = b"\x80" * 4096, b"\x90" * 4096, os.urandom(2048)
SO = (
    b"\x7fELF-text"
    + os.urandom(20_000)
    + fatbin([(2, 80, SASS80), (2, 90, SASS90), (1, 80, PTX80)])
    + b"tail"
)


def wheel(path: Path, members: dict[str, bytes]) -> Path:
    with zipfile.ZipFile(path, "w") as z:
        for name, data in members.items():
            z.writestr(name, data)
    return path


@pytest.fixture(scope="module")
def packed(tmp_path_factory: pytest.TempPathFactory):
    tmp = tmp_path_factory.mktemp("gpu_vllm")
    vllm = wheel(
        tmp / "vllm-0.33.0-cp38-abi3-manylinux_2_28_x86_64.whl",
        {
            "vllm/__init__.py": b"__version__ = '0.33.0'\n",
            "vllm/_C_stable_libtorch.abi3.so": SO,
            "vllm/cumem_allocator.abi3.so": b"\x7fELF" + os.urandom(1000),
            "vllm/vllm_flash_attn/__init__.py": b"",
            "vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so": os.urandom(30_000),
            "vllm/third_party/deep_gemm/include/cute/mma.hpp": os.urandom(10_000),
            "vllm/third_party/pynvml.py": b"# kept\n",
            "vllm/_moe_C_stable_libtorch.abi3.so": os.urandom(10_000),
            "vllm/vllm-rs": os.urandom(10_000),
            "vllm-0.33.0.dist-info/METADATA": b"Name: vllm\nVersion: 0.33.0\n",
        },
    )
    dep = wheel(tmp / "cbor2-5.7.0-py3-none-any.whl", {"cbor2/__init__.py": b"x = 1\n"})
    blob, report = pack.archive(vllm, [dep])
    return tmp, blob, report


def test_the_wheel_loses_what_one_hopper_gpu_with_triton_attention_never_loads(packed):
    tmp, blob, report = packed
    dropped = set(report["vllm"]["dropped"])
    assert dropped == {
        "vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so",
        "vllm/third_party/deep_gemm/include/cute/mma.hpp",
        "vllm/_moe_C_stable_libtorch.abi3.so",
        "vllm/vllm-rs",
    }
    assert report["vllm"]["zeroed_bytes"] == len(SASS80)
    assert report["deps"] == {"cbor2==5.7.0": 6}
    # an incompressible blob this small: the dropped 60 KB are not in it
    assert len(blob) < 40_000


def test_pieces_are_checked_and_join_back_into_the_stripped_folder(packed):
    tmp, blob, report = packed
    limit = len(blob) // 2 + 1
    pieces = pack.split(blob, limit)
    assert len(pieces) == 2 and all(len(p) <= limit for p in pieces) and b"".join(pieces) == blob
    dest, stage = tmp / "pieces", tmp / "stage"
    pack.write_pieces(pieces, dest, report)
    assert pack.check(dest, tmp, limit=limit) == 0
    assert pack.check(dest, tmp, limit=limit - 1000) == 1  # over the limit: refused

    # call 1 stages piece 1, call 2 brings piece 2 only
    stage.mkdir()
    (dest / "piece1.xz.part").rename(stage / "piece1.xz.part")
    assert pack.check(dest, tmp, limit=limit) == 1  # a piece is missing here
    site = tmp / "site"
    assert pack.unpack([dest, stage], site) == 0
    so = (site / "vllm/_C_stable_libtorch.abi3.so").read_bytes()
    assert len(so) == len(SO) and payloads(so) == (bytes(len(SASS80)), SASS90, PTX80)
    assert (site / "vllm/third_party/pynvml.py").is_file() and (site / "cbor2/__init__.py").is_file()
    assert not (site / "vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so").exists()

    (stage / "piece1.xz.part").write_bytes(b"x" + pieces[0][1:])  # a damaged piece is refused
    assert pack.unpack([dest, stage], tmp / "site2") == 1


def payloads(so: bytes) -> tuple[bytes, bytes, bytes]:
    """The three payloads of SO's fat binary, read back at their offsets."""
    start = so.index(b"\x50\xed\x55\xba") + 16
    out = []
    for n in (len(SASS80), len(SASS90), len(PTX80)):
        out.append(so[start + 64 : start + 64 + n])
        start += 64 + n
    return tuple(out)


def test_more_than_two_pieces_do_not_travel():
    with pytest.raises(ValueError, match="needs 3 pieces"):
        pack.split(b"x" * 30, 10)
    assert pack.piece_limit(5 << 20, 23 << 20) == 32 << 20


def test_the_dry_run_without_pieces_fails_and_says_what_to_run(tmp_path):
    subprocess.run(["bash", "-n", "scripts/gpu_vllm.sh"], cwd=ROOT, check=True)
    env = {**os.environ, "RFT_GPU_VLLM": str(tmp_path / "none")}
    r = subprocess.run(
        ["bash", "scripts/gpu_vllm.sh", "--dry-run"], cwd=ROOT, env=env, capture_output=True, text=True
    )
    assert r.returncode == 1
    assert "manifest.json is missing" in r.stderr and "gpu_vllm_pack.py build" in r.stderr
    assert "the named test files exist" in r.stdout and "dry run FAILED" in r.stderr
