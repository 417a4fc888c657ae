"""bench/trainer_step.py's MFU path, run as a real process on the CPU with the tiny shape: the JSON last line
carries tokens/s and an MFU consistent with 8·N FLOPs per token over the peak passed in, and the options
refuse what the trainer does not run; on CUDA (gpu tier) the tiny shape runs the FSDP2 bf16 step. The
Qwen2-0.5B run, `--gpu`, is step `trainer` of scripts/gpu_check.sh."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from bench.trainer_step import parse_args

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "bench" / "trainer_step.py"


def run_bench(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(BENCH), *args], cwd=ROOT, capture_output=True, text=True, timeout=240
    )


def test_mfu_on_cpu_with_tiny_shape():
    proc = run_bench("--device", "cpu", "--shape", "tiny", "--reps", "1", "--peak-tflops", "0.5")
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["device"] == "cpu" and result["shape"] == "tiny" and result["dtype"] == "fp32"
    assert result["tokens_per_s"] > 0 and result["tokens_per_s"] == result["ours_tokens_per_s"]
    assert result["flops_per_token"] == 8 * result["params"]
    expected = result["flops_per_token"] * result["tokens_per_s"] / 0.5e12
    assert result["mfu"] == pytest.approx(expected, rel=0.01, abs=1e-4)
    assert result["ratio"] == pytest.approx(result["mfu"] / 0.35, rel=0.02, abs=1e-3)
    assert result["target"] == 1.0 and result["mfu_target"] == 0.35 and result["peak_tflops"] == 0.5
    assert result["ratio_vs_bare"] > 0 and result["baseline"]["bare_tokens_per_s"] > 0
    assert "MFU ours" in proc.stdout
    assert result["logits_chunk_tokens"] == 4096 and result["full_logits"]["tokens_per_s"] > 0
    assert result["chunked_vs_full"] == pytest.approx(
        result["tokens_per_s"] / result["full_logits"]["tokens_per_s"], rel=0.01
    )


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--device", "cpu", "--dtype", "bf16"], "--dtype bf16 with --device cpu"),
        (["--device", "cpu", "--peak-tflops", "0"], "--peak-tflops must be > 0"),
        (["--device", "cpu", "--reps", "0"], "--reps must be >= 1"),
        (["--device", "cpu", "--logits-chunk", "0"], "--logits-chunk must be >= 1"),
        (["--shape", "qwen3"], "invalid choice: 'qwen3'"),
    ],
)
def test_bad_options_are_refused_by_name(args, message, capsys):
    with pytest.raises(SystemExit) as exc:
        parse_args(args)
    assert exc.value.code == 2
    assert message in capsys.readouterr().err


def test_gpu_is_the_qwen2_shape_in_bf16():
    args = parse_args(["--gpu"])
    assert (args.device, args.dtype, args.shape) == ("cuda", "bf16", "qwen2-0.5b")
    assert parse_args(["--device", "cpu", "--quick"]).shape == "tiny"


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_fsdp2_bf16_step_on_cuda_with_tiny_shape():
    proc = run_bench("--device", "cuda", "--shape", "tiny", "--reps", "1")
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["device"].startswith("cuda") and result["fsdp"] is True and result["dtype"] == "bf16"
    assert result["tokens_per_s"] > 0 and result["device_name"]
    if any(k in result["device_name"] for k in ("H100", "H200")):
        assert result["peak_tflops"] == 989.0 and 0 < result["mfu"] < 1
