"""The offline GPU check's wheel set: scripts/gpu_wheels.py's closure walk over wheel METADATA (on wheels
written here), and `scripts/gpu_check.sh --dry-run` against the real .gpu-wheels/ when it was downloaded."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
_spec = importlib.util.spec_from_file_location("gpu_wheels", ROOT / "scripts" / "gpu_wheels.py")
gpu_wheels = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(gpu_wheels)


def write_wheel(folder: Path, name: str, version: str, *requires: str) -> None:
    dist = f"{name.replace('-', '_')}-{version}"
    meta = "".join(f"Requires-Dist: {r}\n" for r in requires)
    with zipfile.ZipFile(folder / f"{dist}-py3-none-any.whl", "w") as z:
        z.writestr(
            f"{dist}.dist-info/METADATA", f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n{meta}"
        )


def test_closure_follows_metadata_for_python_312(tmp_path):
    write_wheel(
        tmp_path,
        "app",
        "1.0",
        "lib-a>=2",
        "torch>=2.6",
        "nvidia-nccl-cu12",
        "old-only; python_version < '3.11'",
    )
    write_wheel(tmp_path, "lib-a", "2.1", "lib-b[fast]", "win-only; sys_platform == 'win32'")
    write_wheel(tmp_path, "lib-b", "0.3", "speedups; extra == 'fast'", "docs-tool; extra == 'docs'")
    # torch / nvidia-* come with the machine; markers are evaluated for CPython 3.12 on Linux x86_64
    assert gpu_wheels.missing(tmp_path, ["app"]) == (["speedups"], [])
    write_wheel(tmp_path, "speedups", "1.0")
    assert gpu_wheels.missing(tmp_path, ["app"]) == ([], [])
    assert gpu_wheels.missing(tmp_path, ["app", "absent-root"]) == (["absent-root"], [])


def test_closure_reports_a_version_conflict(tmp_path):
    write_wheel(tmp_path, "app", "1.0", "lib-a>=3")
    write_wheel(tmp_path, "lib-a", "2.1")
    absent, conflicts = gpu_wheels.missing(tmp_path, ["app"])
    assert absent == [] and conflicts == ["app==1.0 needs lib-a>=3, the folder has lib-a==2.1"]


def test_roots_are_pinned_and_leave_out_torch_the_image_and_unused_packages():
    roots, pins = gpu_wheels.top_level(), gpu_wheels.pins()
    assert {"grpcio", "protobuf", "pydantic", "pytest", "hypothesis", "trl", "datasets"} <= set(roots)
    image = {"torch", "transformers", "numpy", "accelerate", "peft", "pyyaml", "regex", "psutil", "pyarrow"}
    assert not (image | {"matplotlib", "ruff", "setuptools"}) & set(roots)
    assert all(r in pins for r in roots)


def test_the_walk_stops_at_the_image_and_checks_its_known_versions(tmp_path):
    write_wheel(tmp_path, "trl", "1.0", "accelerate>=1", "transformers>=4.56", "datasets")
    write_wheel(tmp_path, "datasets", "5.2", "pyarrow>=24", "numpy", "dill")
    write_wheel(tmp_path, "dill", "0.4")
    assert gpu_wheels.missing(tmp_path, ["trl"]) == ([], [])
    write_wheel(tmp_path, "trl", "1.0", "transformers>=5.20")  # newer than the image's 5.17
    absent, conflicts = gpu_wheels.missing(tmp_path, ["trl"])
    assert absent == [] and conflicts == [
        "trl==1.0 needs transformers>=5.20, the GPU image has transformers==5.17.0"
    ]


def test_check_names_the_missing_list(tmp_path, capsys):
    assert gpu_wheels.check(tmp_path) == 1
    assert "requirements.txt is missing: run `bash scripts/gpu_wheels.sh`" in capsys.readouterr().err


def test_scripts_parse():
    subprocess.run(["bash", "-n", "scripts/gpu_check.sh", "scripts/gpu_wheels.sh"], cwd=ROOT, check=True)


@pytest.mark.skipif(
    not (ROOT / ".gpu-wheels" / "requirements.txt").is_file(),
    reason=".gpu-wheels/ not downloaded here (run `bash scripts/gpu_wheels.sh`, needs PyPI)",
)
def test_dry_run_resolves_the_wheel_folder_offline():
    proc = subprocess.run(
        ["bash", "scripts/gpu_check.sh", "--dry-run"], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "dry run OK" in proc.stdout
    for step in ("setup", "env", "pytest", "quickstart", "trainer", "trainer15", "rollout"):
        assert f"  {step} " in proc.stdout
    assert "bench/trainer_step.py --gpu" in proc.stdout


def test_dry_run_without_the_wheel_folder_says_how_to_make_it(tmp_path):
    env = {**os.environ, "RFT_GPU_WHEELS": str(tmp_path / "absent")}
    proc = subprocess.run(
        ["bash", "scripts/gpu_check.sh", "--dry-run"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 1
    assert "requirements.txt is missing: run 'bash scripts/gpu_wheels.sh'" in proc.stderr


def _write_module_wheel(folder: Path, name: str, version: str) -> None:
    """A pure wheel holding one importable module `name`."""
    dist = f"{name}-{version}"
    with zipfile.ZipFile(folder / f"{dist}-py3-none-any.whl", "w") as z:
        z.writestr(f"{name}/__init__.py", f"VERSION = {version!r}\n")
        z.writestr(f"{dist}.dist-info/METADATA", f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
        z.writestr(
            f"{dist}.dist-info/WHEEL", "Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
        )
        z.writestr(f"{dist}.dist-info/RECORD", "")


def _site_packages(python: Path) -> Path:
    out = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    return Path(out.stdout.strip())


def _python_with_pip() -> str | None:
    for candidate in ("python3", "/usr/bin/python3"):
        ok = subprocess.run([candidate, "-m", "pip", "--version"], capture_output=True).returncode == 0
        venv_ok = (
            subprocess.run([candidate, "-c", "import venv, ensurepip"], capture_output=True).returncode == 0
        )
        if ok and venv_ok:
            return candidate
    return None


@pytest.mark.skipif(
    _python_with_pip() is None, reason="no python3 with pip and ensurepip to make a venv from"
)
def test_setup_works_when_the_machine_python_is_itself_a_venv(tmp_path):
    """The GPU machine's python3 is a virtualenv holding torch. A venv made from it with
    --system-site-packages (the check's old set-up) does not see torch; the --target install does."""
    outer = tmp_path / "machine-venv"
    subprocess.run([_python_with_pip(), "-m", "venv", str(outer)], check=True, timeout=120)
    python = outer / "bin" / "python"
    (_site_packages(python) / "machine_torch.py").write_text("CUDA = True\n")  # stands for the venv's torch
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    _write_module_wheel(wheels, "carried_pkg", "1.2")
    (wheels / "requirements.txt").write_text("carried-pkg==1.2\n")

    # the old way: a venv of the venv does not see what the machine's venv holds
    inner = tmp_path / "inner"
    subprocess.run(
        [str(python), "-m", "venv", "--system-site-packages", "--without-pip", str(inner)], check=True
    )
    old = subprocess.run([str(inner / "bin" / "python"), "-c", "import machine_torch"], capture_output=True)
    assert old.returncode != 0 and b"No module named 'machine_torch'" in old.stderr

    env = {
        **os.environ, "RFT_GPU_PYTHON": str(python), "RFT_GPU_WHEELS": str(wheels),
        "RFT_GPU_DEPS": str(tmp_path / "deps"),
    }  # fmt: skip
    env.pop("PYTHONPATH", None)
    proc = subprocess.run(
        ["bash", "scripts/gpu_check.sh", "--setup-only"], cwd=ROOT, env=env, capture_output=True, text=True,
        timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    prefix = proc.stdout.strip().splitlines()[-1].split("run the project with: ", 1)[1]
    probe = "import machine_torch, carried_pkg, services.common.json_rows; print(carried_pkg.VERSION)"
    ran = subprocess.run(f"{prefix} -c '{probe}'", shell=True, cwd=ROOT, capture_output=True, text=True)
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.strip() == "1.2"
