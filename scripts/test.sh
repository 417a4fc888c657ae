#!/usr/bin/env bash
# Set everything up, then run the checks CI runs: ruff, the proto drift check, the import rule and the
# unit, integration and end-to-end tests and the deploy test of the compose stack on a real Docker engine
# (GPU-marked tests skip without CUDA).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
PY=${RFT_VENV:-.venv}/bin

echo "== ruff"
"$PY/ruff" check .
echo "== proto drift check"
"$PY/python" scripts/gen_protos.py --check
echo "== import rule (a service never imports another service)"
"$PY/python" -m pytest -q -p no:cacheprovider tests/unit/common/test_conventions.py
echo "== tests"
"$PY/python" -m pytest -q -p no:cacheprovider tests/unit tests/integration tests/e2e tests/deploy "$@"
