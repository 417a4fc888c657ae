"""The `import` step of scripts/gpu_vllm.sh: vLLM's compiled ops load on the GPU image's torch and one of them
(`_C.rms_norm`, through torch's stable ABI) gives torch's own result on the device. One JSON line: versions,
device, the op's largest difference from the reference; exit 1 when it does not load or disagrees."""

from __future__ import annotations

import json
import sys

import torch


def main() -> int:
    import transformers
    import triton
    import vllm
    import vllm._C_stable_libtorch  # noqa: F401  (registers torch.ops._C)
    import vllm.cumem_allocator  # noqa: F401  (sleep mode)

    out = {
        "vllm": vllm.__version__, "torch": torch.__version__, "triton": triton.__version__,
        "transformers": transformers.__version__, "device": torch.cuda.get_device_name(0),
        "capability": list(torch.cuda.get_device_capability(0)),
    }  # fmt: skip
    x = torch.randn(8, 256, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(256, device="cuda", dtype=torch.bfloat16)
    got = torch.empty_like(x)
    torch.ops._C.rms_norm(got, x, w, 1e-6)
    ref = (x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-6) * w.float()).to(x.dtype)
    out["rms_norm_max_diff"] = (got.float() - ref.float()).abs().max().item()
    print(json.dumps(out), flush=True)
    return 0 if out["rms_norm_max_diff"] < 0.1 else 1


if __name__ == "__main__":
    sys.exit(main())
