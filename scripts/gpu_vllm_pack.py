"""vLLM 0.33 for the offline GPU machine, stripped to what one Hopper GPU (sm_90) needs, in <= 2 pieces.

    python scripts/gpu_vllm_pack.py build [--wheel W] [--dest .gpu-vllm]   # needs PyPI (or the cached wheels)
    python scripts/gpu_vllm_pack.py check [--dest .gpu-vllm]               # offline: pieces whole, sizes fit

The GPU machine (scripts/gpu_vllm.sh) has the image's torch 2.11 (CUDA 13) and no vLLM; vLLM 0.33's wheel
(336 MB zipped) pins torch 2.14. Its compiled modules use torch's stable C ABI (`aoti_torch_*`,
`torch_call_dispatcher`): every torch symbol that `_C_stable_libtorch` and `cumem_allocator` import is
exported by torch 2.11.0+cu130 (checked with `nm -D`, docs/performance.md), so they are kept, without the
machine code for other GPUs (`zero_foreign_sass`). Dropped (`DROP`): the FlashAttention builds (the engine
runs the Triton attention backend, TRITON_ATTN), the MoE/MLA/FP4/sm_100 kernels, deep_gemm and its CUTLASS
headers, the Rust frontend. Added: vLLM's runtime dependencies the image and .gpu-wheels/ lack (from
the wheels' METADATA, less `SKIP`: GPU kernel libraries and packages vLLM imports only when asked).
Everything goes into one tar.xz of a `--target`-style folder, cut into pieces of at most `piece_limit()`
bytes, each carried with the tree and .gpu-wheels/ within 64 MiB with 4 MiB spare; `manifest.json` holds
their sizes and sha256.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import lzma
import os
import re
import struct
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name, parse_wheel_filename

sys.path.insert(0, str(Path(__file__).resolve().parent))
import gpu_wheels  # noqa: E402  (the image's set, the target's markers, pip's platform arguments)

ROOT = Path(__file__).resolve().parents[1]
VERSION = "0.33.0"
WHEEL_NAME = f"vllm-{VERSION}-cp38-abi3-manylinux_2_28_x86_64.whl"
CACHE = Path(os.environ.get("RFT_WHEEL_CACHE", Path.home() / ".cache" / "rft" / "wheels"))
CARRY_LIMIT = 64 << 20  # what travels with one call, the tree included
SPARE = 4 << 20  # kept free of it
MAX_PIECES = 2
KEEP_ARCH = 90  # Hopper: the only SASS kept in the fat binaries (PTX of every arch stays)
# Members of the vLLM wheel left out, and why (a regex on the member's path).
DROP = {
    r"^vllm/vllm_flash_attn/.*\.so$": "FlashAttention 2/3 builds (481 MB): the engine runs TRITON_ATTN",
    r"^vllm/third_party/(deep_gemm|fmha_sm100)/": "deep_gemm / sm_100 FMHA kernels and their CUTLASS headers",
    r"^vllm/_(moe_C|qutlass_C|flashmla|flashkda_C|deepselect_C)": "MoE, FP4, MLA, KDA kernels: not a dense Qwen2",
    r"^vllm/vllm-rs$": "the Rust frontend binary (only with VLLM_USE_RUST_FRONTEND)",
    r"\.(cu|cuh)$": "CUDA sources",
}
# vLLM requirements not carried: GPU kernel libraries for other paths, media, and what vLLM imports only
# when asked (a PlaceholderModule or an import inside the function that uses it).
SKIP = {
    "flashinfer-python", "tilelang", "nvidia-cudnn-frontend", "nvtx", "fastsafetensors",
    "instanttensor", "nvidia-cutlass-dsl", "quack-kernels", "tokenspeed-mla", "humming-kernels", "numba",
    "torchaudio", "torchvision", "torchcodec", "pynvvideocodec", "opencv-python-headless", "mistral-common",
    "ninja", "depyf", "lm-format-enforcer", "outlines-core", "mcp", "anthropic",
    "model-hosting-container-standards", "opentelemetry-sdk", "opentelemetry-api", "opentelemetry-exporter-otlp",
    "opentelemetry-semantic-conventions-ai", "watchfiles", "setproctitle", "prometheus-fastapi-instrumentator",
    "compressed-tensors", "tiktoken", "sentencepiece", "lark", "ijson", "python-json-logger", "uvicorn",
    "fastapi-cli", "fastapi-cloud-cli", "rich-toolkit", "httptools", "jinja2", "email-validator",
}  # fmt: skip

# Imported at engine start but not named by vLLM's METADATA without extras: uvloop (vllm/v1/utils.py; it
# comes with fastapi[standard] -> uvicorn[standard]).
EXTRA = ["uvloop"]
# llguidance 1.7 (which vLLM 0.33 pins, imported by its structured-output manager) is tagged
# manylinux_2_31; the GPU image's glibc is newer (its python is 3.12.3).
PLATFORM_ARGS = [*gpu_wheels.PLATFORM_ARGS, "--platform", "manylinux_2_31_x86_64"]


def dropped(member: str) -> str | None:
    """Why `member` of the vLLM wheel is left out, or None when it is kept."""
    return next((why for pat, why in DROP.items() if re.search(pat, member)), None)


def zero_foreign_sass(data: bytes, keep_arch: int = KEEP_ARCH) -> tuple[bytes, int]:
    """`data` (an ELF file) with the payload of every SASS entry of its fat binaries for another GPU arch
    zeroed, offsets unchanged (the CUDA driver reads only the entry it picks for the device: sm_90 SASS, or
    PTX); returns the new bytes and how many bytes were zeroed. SASS of another major version cannot run on
    sm_90, so none of it is ever picked there."""
    out = bytearray(data)
    zeroed = 0
    off = data.find(b"\x50\xed\x55\xba")
    while off >= 0 and off + 16 <= len(data):
        magic, _, hsize, fsize = struct.unpack_from("<IHHQ", data, off)
        if magic != 0xBA55ED50 or hsize != 16 or off + hsize + fsize > len(data):
            off = data.find(b"\x50\xed\x55\xba", off + 4)
            continue
        e, end = off + hsize, off + hsize + fsize
        while e + 32 <= end:
            kind, _, ehsize, size = struct.unpack_from("<HHIQ", data, e)
            arch = struct.unpack_from("<I", data, e + 28)[0]
            if ehsize < 32 or e + ehsize + size > end:
                break
            if kind == 2 and arch != keep_arch:  # 1 = PTX, 2 = SASS (ELF cubin)
                out[e + ehsize : e + ehsize + size] = bytes(size)
                zeroed += size
            e += ehsize + size
        off = data.find(b"\x50\xed\x55\xba", end)
    return bytes(out), zeroed


def piece_limit(tree_bytes: int, wheels_bytes: int) -> int:
    """The largest piece that travels with the tree and .gpu-wheels/ in one call with SPARE left."""
    return CARRY_LIMIT - SPARE - tree_bytes - wheels_bytes


def split(blob: bytes, limit: int, max_pieces: int = MAX_PIECES) -> list[bytes]:
    """`blob` cut into equal-sized pieces of at most `limit` bytes; ValueError when more than `max_pieces`."""
    n = max(1, -(-len(blob) // max(limit, 1)))
    if n > max_pieces:
        raise ValueError(
            f"{len(blob) / 2**20:.1f} MiB needs {n} pieces of <= {limit / 2**20:.1f} MiB (at most {max_pieces})"
        )
    size = -(-len(blob) // n)
    return [blob[i : i + size] for i in range(0, len(blob), size)]


def tree_bytes() -> int:
    """Bytes of the files git carries (tracked and untracked, not ignored)."""
    names = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT, capture_output=True, check=True,
    ).stdout.split(b"\0")  # fmt: skip
    return sum((ROOT / n.decode()).stat().st_size for n in names if n and (ROOT / n.decode()).is_file())


def dir_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) if path.is_dir() else 0


def carried_names(wheels_dir: Path) -> set[str]:
    """Names .gpu-wheels/ already carries (its requirements.txt)."""
    req = wheels_dir / "requirements.txt"
    if not req.is_file():
        return set()
    return {canonicalize_name(line.split("==")[0]) for line in req.read_text().split() if "==" in line}


def needed(wheel: Path, have: set[str]) -> list[Requirement]:
    """The requirements of `wheel` that must travel: not in the image, not in `have`, not skipped."""
    return [
        r
        for r in gpu_wheels.requires(wheel, set())
        if not gpu_wheels.provided(canonicalize_name(r.name)) and canonicalize_name(r.name) not in have | SKIP
    ]


def add_wheel(tar: tarfile.TarFile, wheel: Path, transform=None) -> dict:
    """Every member of `wheel` into `tar` under site/ (an unpacked `pip install --target`), less DROP when
    `transform` is given; returns what was kept and dropped."""
    kept, drops, zeroed = 0, {}, 0
    with zipfile.ZipFile(wheel) as z:
        for info in z.infolist():
            if info.is_dir():
                continue
            data = z.read(info)
            if transform is not None:
                why = dropped(info.filename)
                if why:
                    drops[info.filename] = (info.file_size, why)
                    continue
                data, n = transform(info.filename, data)
                zeroed += n
            ti = tarfile.TarInfo("site/" + info.filename)
            ti.size, ti.mode, ti.mtime = (
                len(data),
                0o755 if info.filename.endswith((".so", "-rs")) else 0o644,
                0,
            )
            tar.addfile(ti, io.BytesIO(data))
            kept += len(data)
    return {"kept_bytes": kept, "dropped": drops, "zeroed_bytes": zeroed}


def archive(wheel: Path, deps: list[Path]) -> tuple[bytes, dict]:
    """One tar.xz of site/ (vLLM less DROP, its fat binaries stripped to KEEP_ARCH, then `deps` whole)."""
    buf = io.BytesIO()
    report: dict = {"vllm": {}, "deps": {}}
    with tarfile.open(fileobj=buf, mode="w") as tar:
        report["vllm"] = add_wheel(tar, wheel, strip_so)
        for w in deps:
            name, version, _, _ = parse_wheel_filename(w.name)
            report["deps"][f"{name}=={version}"] = add_wheel(tar, w)["kept_bytes"]
    raw = buf.getvalue()
    report["tar_bytes"] = len(raw)
    print(f"[gpu-vllm] tar {len(raw) / 2**20:.1f} MiB; compressing (xz -9e)", flush=True)
    return lzma.compress(raw, preset=9 | lzma.PRESET_EXTREME), report


def write_pieces(pieces: list[bytes], dest: Path, report: dict) -> dict:
    """The pieces and manifest.json (sizes and sha256 of each piece and of the whole) into `dest`."""
    dest.mkdir(parents=True, exist_ok=True)
    for old in dest.glob("piece*"):
        old.unlink()
    blob = b"".join(pieces)
    manifest = {
        "vllm": VERSION, "keep_arch": KEEP_ARCH, "archive_bytes": len(blob), "tar_bytes": report["tar_bytes"],
        "sha256": hashlib.sha256(blob).hexdigest(), "pieces": [], "deps": report["deps"],
        "dropped": {k: v[1] for k, v in sorted(report["vllm"]["dropped"].items()) if v[0] > 1 << 20},
        "dropped_bytes": sum(v[0] for v in report["vllm"]["dropped"].values()),
        "zeroed_sass_bytes": report["vllm"]["zeroed_bytes"],
    }  # fmt: skip
    for i, p in enumerate(pieces, 1):
        (dest / f"piece{i}.xz.part").write_bytes(p)
        manifest["pieces"].append(
            {"name": f"piece{i}.xz.part", "bytes": len(p), "sha256": hashlib.sha256(p).hexdigest()}
        )
    (dest / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    return manifest


def find_piece(name: str, dirs: list[Path]) -> Path | None:
    return next((d / name for d in dirs if (d / name).is_file()), None)


def unpack(dirs: list[Path], site: Path) -> int:
    """Join the manifest's pieces (each from the first of `dirs` holding it), check the digest, and
    extract site/ into `site` (as `pip install --target` would lay it out)."""
    mf = find_piece("manifest.json", dirs)
    if mf is None:
        print(f"[gpu-vllm] no manifest.json in {', '.join(map(str, dirs))}", file=sys.stderr)
        return 1
    manifest = json.loads(mf.read_text())
    parts = [find_piece(p["name"], dirs) for p in manifest["pieces"]]
    absent = [p["name"] for p, f in zip(manifest["pieces"], parts, strict=True) if f is None]
    if absent:
        print(f"[gpu-vllm] missing {absent}: run `gpu_vllm.sh stage` in the call before", file=sys.stderr)
        return 1
    blob = b"".join(f.read_bytes() for f in parts)
    if hashlib.sha256(blob).hexdigest() != manifest["sha256"]:
        print("[gpu-vllm] the joined pieces do not match the manifest's digest", file=sys.stderr)
        return 1
    site.mkdir(parents=True, exist_ok=True)
    with tarfile.open(fileobj=io.BytesIO(lzma.decompress(blob)), mode="r:") as tar:
        members = []
        for m in tar.getmembers():
            if not m.name.startswith("site/") or ".." in Path(m.name).parts:
                continue
            m.name = m.name[len("site/") :]
            members.append(m)
        tar.extractall(site, members=members, filter="data")
    print(f"[gpu-vllm] {len(members)} files unpacked into {site}")
    return 0


def strip_so(name: str, data: bytes) -> tuple[bytes, int]:
    return zero_foreign_sass(data) if name.endswith(".so") else (data, 0)


def download(specs: list[str], dest: Path) -> None:
    cmd = [*gpu_wheels.PIP, "download", "-qq", "--no-deps", *PLATFORM_ARGS, "-d", str(dest)]
    subprocess.run([*cmd, *specs], check=True)


def build(wheel: Path, dest: Path, wheels_dir: Path) -> int:
    if not wheel.is_file():
        wheel.parent.mkdir(parents=True, exist_ok=True)
        print(f"[gpu-vllm] downloading vllm=={VERSION} into {wheel.parent}", flush=True)
        download([f"vllm=={VERSION}"], wheel.parent)
    have = carried_names(wheels_dir)
    if not have:
        print(
            f"{wheels_dir}/requirements.txt is missing: run `bash scripts/gpu_wheels.sh` first",
            file=sys.stderr,
        )
        return 1
    deps_dir = Path(tempfile.mkdtemp(prefix="gpu-vllm-deps-"))
    todo, seen, conflicts = needed(wheel, have) + [Requirement(n) for n in EXTRA], set(), []
    while todo:  # the dependency closure, each wheel's own METADATA read as in gpu_wheels.py
        specs = [r for r in todo if canonicalize_name(r.name) not in seen]
        seen |= {canonicalize_name(r.name) for r in specs}
        if specs:
            print("[gpu-vllm] downloading", " ".join(str(r).split(";")[0] for r in specs), flush=True)
            download([str(Requirement(f"{r.name}{r.specifier}")) for r in specs], deps_dir)
        todo = [r for w in deps_dir.glob("*.whl") for r in needed(w, have | seen)]
    for w in [wheel, *deps_dir.glob("*.whl")]:  # torch is 2.11 there, whatever vLLM's wheel pins
        for r in gpu_wheels.requires(w, set()):
            n = canonicalize_name(r.name)
            v = gpu_wheels.IMAGE_VERSIONS.get(n)
            if v and not r.specifier.contains(v, prereleases=True) and n != "torch":
                conflicts.append(f"{w.name} needs {r}, the GPU image has {n}=={v}")
    carried = {canonicalize_name(x.split("==")[0]): x.split("==")[1]
               for x in (wheels_dir / "requirements.txt").read_text().split() if "==" in x}  # fmt: skip
    for r in gpu_wheels.requires(wheel, set()):  # vLLM's own floors against what .gpu-wheels/ carries
        n = canonicalize_name(r.name)
        if n in carried and not r.specifier.contains(carried[n], prereleases=True):
            conflicts.append(f"vllm needs {r}, {wheels_dir.name}/ carries {n}=={carried[n]}")
    blob, report = archive(wheel, sorted(deps_dir.glob("*.whl")))
    limit = piece_limit(tree_bytes(), dir_bytes(wheels_dir))
    try:
        pieces = split(blob, limit)
    except ValueError as e:
        print(f"[gpu-vllm] does not fit: {e}", file=sys.stderr)
        return 1
    manifest = write_pieces(pieces, dest, report)
    manifest["conflicts"] = conflicts
    (dest / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    sizes = ", ".join(f"{p['name']} {p['bytes'] / 2**20:.1f} MiB" for p in manifest["pieces"])
    print(f"[gpu-vllm] {len(pieces)} pieces in {dest}: {sizes} (limit {limit / 2**20:.1f} MiB each)")
    for c in conflicts:
        print(f"[gpu-vllm] warning: {c}", file=sys.stderr)
    return 0


def check(dest: Path, wheels_dir: Path, limit: int | None = None) -> int:
    """Offline: the manifest's pieces are present with their sizes and digests, each within the limit."""
    problems = []
    mf = dest / "manifest.json"
    if not mf.is_file():
        problems.append(
            f"{mf} is missing: run `python scripts/gpu_vllm_pack.py build` where PyPI is reachable"
        )
    else:
        manifest = json.loads(mf.read_text())
        if limit is None:
            limit = piece_limit(tree_bytes(), dir_bytes(wheels_dir))
        if not 1 <= len(manifest["pieces"]) <= MAX_PIECES:
            problems.append(f"{len(manifest['pieces'])} pieces (1 to {MAX_PIECES} travel)")
        whole = hashlib.sha256()
        for p in manifest["pieces"]:
            f = dest / p["name"]
            if not f.is_file():
                problems.append(f"{f} is missing")
                continue
            data = f.read_bytes()
            whole.update(data)
            if len(data) != p["bytes"] or hashlib.sha256(data).hexdigest() != p["sha256"]:
                problems.append(
                    f"{f}: {len(data)} bytes, not the manifest's {p['bytes']} (or another digest)"
                )
            if len(data) > limit:
                problems.append(
                    f"{f}: {len(data) / 2**20:.1f} MiB, over the {limit / 2**20:.1f} MiB that travel with the "
                    f"tree and {wheels_dir.name}/ with {SPARE >> 20} MiB spare"
                )
        if not problems and whole.hexdigest() != manifest["sha256"]:
            problems.append("the pieces joined do not give the manifest's archive digest")
        if not problems:
            sizes = ", ".join(f"{p['name']} {p['bytes'] / 2**20:.1f} MiB" for p in manifest["pieces"])
            print(f"[gpu-vllm] {dest}: {sizes}; each <= {limit / 2**20:.1f} MiB")
    for p in problems:
        print(f"[gpu-vllm] {p}", file=sys.stderr)
    return 1 if problems else 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("action", choices=["build", "check", "unpack"])
    ap.add_argument("--wheel", type=Path, default=CACHE / WHEEL_NAME)
    ap.add_argument("--dest", type=Path, default=ROOT / ".gpu-vllm")
    ap.add_argument("--wheels", type=Path, default=ROOT / ".gpu-wheels", help="the probe's carried wheels")
    ap.add_argument(
        "--stage", type=Path, default=ROOT / ".gpu-vllm-stage", help="unpack: pieces staged before"
    )
    ap.add_argument("--site", type=Path, default=ROOT / ".gpu-vllm-site", help="unpack: the folder to fill")
    args = ap.parse_args()
    if args.action == "unpack":
        return unpack([args.dest, args.stage], args.site)
    if args.action == "build":
        return build(args.wheel, args.dest, args.wheels)
    return check(args.dest, args.wheels)


if __name__ == "__main__":
    sys.exit(main())
