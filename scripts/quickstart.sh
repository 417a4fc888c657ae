#!/usr/bin/env bash
# Set everything up and run the main job: the quickstart. Builds the local tiny model when it is missing,
# checks the example configs, then `rft run --config examples/quickstart.yaml` (SFT warm-up, then GRPO
# on the tiny model; a few minutes on a 2-core CPU). Extra arguments go to `rft run`, e.g.
#   bash scripts/quickstart.sh --set buffer.total_steps=60
#
# `--engine vllm`: the same run with vLLM as the rollout engine: `scripts/setup.sh --engine vllm` makes
# .venv-vllm (vLLM's CPU build without an NVIDIA GPU), everything runs from it, and the explorer gets
# `explorer.rollout_model.engine_type=vllm`; the run is named `arithmetic-vllm` (checkpoints/quickstart/
# arithmetic-vllm/), so the two engines' runs never continue from each other's checkpoints. `--engine hf`
# (the default) is the run above, from .venv. RFT_VENV overrides the environment in both cases.
set -euo pipefail
cd "$(dirname "$0")/.."

ENGINE=hf
RUN_ARGS=()
ENGINE_SETS=()
while [ $# -gt 0 ]; do
  case "$1" in
    --engine) ENGINE=${2:?--engine needs hf or vllm}; shift 2 ;;
    --engine=*) ENGINE=${1#--engine=}; shift ;;
    *) RUN_ARGS+=("$1"); shift ;;
  esac
done
case "$ENGINE" in
  hf) VENV=${RFT_VENV:-.venv} ;;
  vllm)
    VENV=${RFT_VENV:-.venv-vllm}
    ENGINE_SETS=(--set explorer.rollout_model.engine_type=vllm --set name=arithmetic-vllm) ;;
  *) echo "[quickstart] --engine $ENGINE: expected hf or vllm" >&2; exit 2 ;;
esac

bash scripts/setup.sh --engine "$ENGINE"
PY=$VENV/bin

"$PY/rft" make-tiny-model models/tiny
[ -f examples/data/arithmetic.jsonl ] || "$PY/python" examples/data/make_arithmetic.py
"$PY/rft" config check "${ENGINE_SETS[@]}" examples/quickstart.yaml
"$PY/rft" config check examples/ppo.yaml
# configs for GPU machines: their models and data are not here, so only the config itself is checked
for cfg in examples/gsm8k_grpo.yaml examples/verl_mapping/*.yaml; do
  "$PY/rft" config check --skip-paths "$cfg"
done
echo "[quickstart] rft run --config examples/quickstart.yaml ${ENGINE_SETS[*]} ${RUN_ARGS[*]} (from $VENV)"
exec "$PY/rft" run --config examples/quickstart.yaml "${ENGINE_SETS[@]}" "${RUN_ARGS[@]}"
