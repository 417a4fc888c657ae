"""scripts/gpu_probe.sh's static parts (its --dry-run without the wheel folder or pytest collection): the
planned seconds fit, the test files it names hold gpu-marked tests, the carried set leaves the image's
packages out; the deadline loop both GPU commands share (scripts/gpu_steps.sh) over shell steps."""

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
    assert [name for name, _, _ in plan] == [
        "setup",
        "ranks",
        "colocate",
        "one_gpu_async",
        "memory_mfu",
        "nccl",
        "trl",
    ]
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


def _run_steps(tmp_path: Path, steps: str, fatal: str) -> tuple[str, list[str], int]:
    """scripts/gpu_steps.sh's loop (both GPU commands run it) over shell steps; (summary, records, FAILED)."""
    script = f"""
set -uo pipefail
source scripts/gpu_steps.sh
{steps}
DEADLINE_S=100 MARGIN_S=15
open_outputs {tmp_path}
record() {{ echo "$1 $2" >> {tmp_path}/records; }}
run_steps probe 8 {fatal}
echo "FAILED=$FAILED"
"""
    out = subprocess.run(["bash", "-c", script], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    records = (tmp_path / "records").read_text().splitlines()
    assert (tmp_path / "summary.txt").read_text().splitlines() == [
        ln for ln in out.splitlines() if not ln.startswith(("    | ", "FAILED="))
    ]
    return out, records, int(out.strip().splitlines()[-1].split("=")[1])


def test_the_step_loop_bounds_skips_and_records_each_step(tmp_path):
    steps = """STEPS=(first broken long last)
declare -A PLANNED=([first]=5 [broken]=5 [long]=400 [last]=5)
declare -A CMDS=([first]="echo hello" [broken]="echo oops; exit 3" [long]="true" [last]="true")"""
    out, records, failed = _run_steps(tmp_path, steps, "")
    assert records == ["first ok", "broken failed", "long skipped", "last ok"] and failed == 1
    assert "only 85s left before the 100s deadline; planned 400s" in out  # 2 x 400 > 100 - 15
    assert "    | oops" in out and (tmp_path / "first.log").read_text() == "hello\n"


def test_a_fatal_step_that_fails_skips_every_later_one(tmp_path):
    steps = """STEPS=(setup import engine)
declare -A PLANNED=([setup]=5 [import]=5 [engine]=5)
declare -A CMDS=([setup]="true" [import]="exit 1" [engine]="true")"""
    out, records, failed = _run_steps(tmp_path, steps, "setup import")
    assert records == ["setup ok", "import failed", "engine skipped"] and failed == 1
    assert "[probe] import did not pass: no later step can run" in out
