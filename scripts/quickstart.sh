#!/usr/bin/env bash
# Set everything up and run the main job: the quickstart. Builds the local tiny model when it is missing,
# checks the example configs, then `rft run --config examples/quickstart.yaml` (SFT warm-up, then GRPO
# on the tiny model; a few minutes on a 2-core CPU). Extra arguments go to `rft run`, e.g.
#   bash scripts/quickstart.sh --set buffer.total_steps=60
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
PY=${RFT_VENV:-.venv}/bin

"$PY/rft" make-tiny-model models/tiny
[ -f examples/data/arithmetic.jsonl ] || "$PY/python" examples/data/make_arithmetic.py
for cfg in examples/quickstart.yaml examples/ppo.yaml; do
  "$PY/rft" config check "$cfg"
done
# configs for GPU machines: their models and data are not here, so only the config itself is checked
for cfg in examples/gsm8k_grpo.yaml examples/verl_mapping/*.yaml; do
  "$PY/rft" config check --skip-paths "$cfg"
done
exec "$PY/rft" run --config examples/quickstart.yaml "$@"
