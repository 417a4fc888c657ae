#!/usr/bin/env bash
# Set everything up, then run the checks CI runs: ruff, the docs site build, the proto drift check, the import rule, the vLLM
# constraints' resolves, the unit, integration and end-to-end tests and the deploy test of the compose
# stack on a real Docker engine (GPU-marked tests skip without CUDA), then the vLLM suite against a real
# vLLM engine from the vLLM environment (.venv-vllm: vLLM's CPU build on a machine without a GPU).
# Arguments go to the main test run.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
RFT_VENV=${RFT_VLLM_VENV:-.venv-vllm} bash scripts/setup.sh --engine vllm
PY=${RFT_VENV:-.venv}/bin
VPY=${RFT_VLLM_VENV:-.venv-vllm}/bin
# bytecode: each module is compiled once for the whole run, not again in every process the tests start (a
# run of `rft run` starts five; torch, transformers and vLLM are thousands of modules: a vLLM import is ~36 s
# of CPU uncompiled, ~16 s compiled). The .pyc files go to .cache/pycache (git-ignored, outside the image's
# build context), never next to the sources or into the venvs, so PYTHONDONTWRITEBYTECODE is lifted here.
unset PYTHONDONTWRITEBYTECODE
export PYTHONPYCACHEPREFIX="${PYTHONPYCACHEPREFIX:-$PWD/.cache/pycache}"

echo "== ruff"
"$PY/ruff" check .
echo "== docs site (mkdocs build --strict: broken links and missing pages fail; the config reference is current)"
"$PY/python" scripts/gen_config_reference.py --check
NO_MKDOCS_2_WARNING=1 "$PY/mkdocs" build --strict --quiet --site-dir "$(mktemp -d)"
echo "== proto drift check"
"$PY/python" scripts/gen_protos.py --check
echo "== import rule (a service never imports another service)"
"$PY/python" -m pytest -q -p no:cacheprovider tests/unit/common/test_conventions.py
echo "== vLLM constraints resolve (the CUDA wheel for GPU machines and deploy/Dockerfile.gpu; the CPU build)"
bash scripts/check_vllm_resolve.sh
echo "== tests"
# two workers (RFT_TEST_WORKERS): most tests wait on the processes they start, so two at once fill the
# machine; tests/conftest.py makes each file a unit of work and sends the longest groups (deploy, e2e) out first
"$PY/python" -m pytest -q -p no:cacheprovider -n "${RFT_TEST_WORKERS:-2}" --dist loadfile --no-loadscope-reorder \
  --durations=40 tests/unit tests/integration tests/e2e tests/deploy "$@"
echo "== vLLM tests (a real vLLM engine)"
"$VPY/python" -m pytest -q -p no:cacheprovider -m vllm tests/vllm_engine
