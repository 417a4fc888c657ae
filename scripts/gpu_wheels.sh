#!/usr/bin/env bash
# Download into .gpu-wheels/ the cp312 manylinux x86_64 wheels that scripts/gpu_check.sh installs offline on a
# GPU machine (python 3.12 + a CUDA torch, no network): the project's runtime and test dependencies at the
# pins of requirements/constraints.txt, less torch/nvidia-*/triton and what the check never imports (see
# scripts/gpu_wheels.py). Run it where PyPI is reachable, then carry .gpu-wheels/ with the working tree.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${RFT_VENV:-.venv}/bin/python
[ -x "$PY" ] || PY=python3
DEST=${RFT_GPU_WHEELS:-.gpu-wheels}
"$PY" scripts/gpu_wheels.py download --dest "$DEST"
"$PY" scripts/gpu_wheels.py check --dest "$DEST"
echo "[gpu-wheels] total size: $(du -sh "$DEST" | cut -f1)"
