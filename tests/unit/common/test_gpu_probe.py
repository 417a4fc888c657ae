"""scripts/gpu_probe.sh's static parts (its --dry-run without the wheel folder or pytest collection): the
planned seconds fit, the test files it names hold gpu-marked tests, the carried set leaves the image's
packages out."""

from __future__ import annotations

import importlib.util
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
_spec = importlib.util.spec_from_file_location("gpu_probe_check", ROOT / "scripts" / "gpu_probe_check.py")
gpu_probe_check = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(gpu_probe_check)
gpu_wheels = gpu_probe_check.gpu_wheels


def test_the_script_parses_and_its_planned_seconds_sum_under_480():
    subprocess.run(["bash", "-n", "scripts/gpu_probe.sh"], cwd=ROOT, check=True)
    plan = gpu_probe_check.plan()
    assert [name for name, _, _ in plan] == ["setup", "ranks", "colocate", "one_gpu_async", "memory_mfu", "nccl", "trl"]
    assert all(planned > 0 for _, planned, _ in plan)
    assert sum(planned for _, planned, _ in plan) < gpu_probe_check.PLAN_LIMIT_S


def test_the_named_test_files_exist_and_hold_gpu_marked_tests():
    files = [f for _, _, command in gpu_probe_check.plan() for f in gpu_probe_check.pytest_targets(command)]
    assert "tests/integration/weight_sync/test_failures.py" in files
    for f in files:
        assert "pytest.mark.gpu" in (ROOT / f).read_text(), f


def test_the_carried_set_leaves_out_what_the_image_has():
    roots = set(gpu_wheels.top_level())
    assert not {n for n in roots if gpu_wheels.provided(n)}
    assert not {"numpy", "accelerate", "peft", "pyyaml", "regex", "psutil", "transformers"} & roots
    assert {"trl", "datasets", "pytest"} <= roots
    assert set(gpu_wheels.CARRIED_OVER_IMAGE) <= roots  # the generated protos' runtime floors
