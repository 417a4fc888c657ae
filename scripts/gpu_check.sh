#!/usr/bin/env bash
# The GPU check in one call, for a machine with one NVIDIA GPU (H100/H200), python 3.12 and a CUDA build of
# torch, and NO network. Run from the repository root after `bash scripts/gpu_wheels.sh` filled
# .gpu-wheels/ on a machine with PyPI, and the working tree (with .gpu-wheels/) was carried over:
#
#   bash scripts/gpu_check.sh               # install offline into .gpu-deps, then run the steps below
#   bash scripts/gpu_check.sh STEP ...      # only these steps (e.g. `pytest quickstart`)
#   bash scripts/gpu_check.sh --dry-run     # print the plan; check offline that .gpu-wheels/ is complete and
#                                           # that it travels with the tree (<= 64 MiB together)
#   bash scripts/gpu_check.sh --setup-only  # install, then print the command prefix that runs the project
#
# Setup: the GPU machine's python3 is itself a virtualenv holding torch, so a venv made from it would not
# see torch. The pinned wheels of .gpu-wheels/requirements.txt go into a plain folder instead
# (`pip install --no-deps --target .gpu-deps`, never reaching an index), put first on PYTHONPATH with the
# repository and its generated protos after it, and that python runs every step.
# Steps, each reported, the next run even when one fails; the exit status is non-zero if any failed:
#   env         nvidia-smi; python, torch, CUDA, NCCL, cuDNN, device and the wire stack's versions
#   pytest      `pytest -m gpu` over the test files that hold gpu-marked tests (trainer on CUDA: bf16 FSDP2,
#               gradient checkpointing, LoRA, reference + KL, critic, save / bit-exact resume, HF export,
#               the bf16 gather; NCCL probes; the hf engine on CUDA)
#   quickstart  `rft run` of the quickstart on one GPU, trainer and explorer sharing cuda:0
#               (bench/gpu_quickstart.py): reward curve, tokens/s, GPU memory peak
#   trainer     one bf16 FSDP2 trainer step on a Qwen2.5-0.5B-shaped random model (bench/trainer_step.py
#               --gpu): tokens/s and MFU, its JSON last line with "ratio" = MFU / 0.35
#   trainer15   the same on the Qwen2.5-1.5B shape
#   rollout     the explorer's hf engine on CUDA (bench/rollout.py --quick --device cuda), tokens/s
# With $OUT set, everything printed is also written under $OUT/gpu_check/ (one log per step, summary.json).
# Measured on an H100 (docs/performance.md): setup ~20 s, quickstart 194 s, trainer 49 s, trainer15 60 s; a
# command is limited to 10 minutes, so give the quickstart its own call or a `timeout` of 300 s or more.
set -uo pipefail
cd "$(dirname "$0")/.."

DRY_RUN=0
SETUP_ONLY=0
ONLY=()
for arg in "$@"; do
  case "$arg" in
    --dry-run) DRY_RUN=1 ;;
    --setup-only) SETUP_ONLY=1 ;;
    env|pytest|quickstart|trainer|trainer15|rollout) ONLY+=("$arg") ;;
    *) echo "usage: bash scripts/gpu_check.sh [--dry-run | --setup-only | STEP ...] (unknown argument: $arg;" \
         "steps: env pytest quickstart trainer trainer15 rollout)" >&2; exit 2 ;;
  esac
done
WHEELS=${RFT_GPU_WHEELS:-.gpu-wheels}
DEPS=${RFT_GPU_DEPS:-.gpu-deps}
PY3=${RFT_GPU_PYTHON:-python3}
# The GPU machine's python3 is itself a virtualenv holding torch: a venv made from it would not see torch.
# So the carried wheels go into a plain folder (pip --target) put first on PYTHONPATH, with the repository
# and its generated protos after it, and that python runs everything.
case "$DEPS" in /*) ;; *) DEPS=$PWD/$DEPS ;; esac
VPY="env PYTHONPATH=$DEPS:$PWD:$PWD/protos${PYTHONPATH:+:$PYTHONPATH} PATH=$DEPS/bin:$PATH $PY3"
LOG_DIR=""
if [ -n "${OUT:-}" ]; then
  LOG_DIR=$OUT/gpu_check
  mkdir -p "$LOG_DIR"
  exec > >(tee -a "$LOG_DIR/gpu_check.log") 2>&1
fi

# The test files holding gpu-marked tests: collecting only them keeps the wheel set small (the whole tree
# imports data and plotting packages the GPU steps never use; see scripts/gpu_wheels.py).
mapfile -t GPU_TESTS < <(grep -rlE 'pytest\.mark\.gpu|pytestmark *=.*gpu' tests --include='*.py' | sort)

STEPS=(env pytest quickstart trainer trainer15 rollout)
[ ${#ONLY[@]} -gt 0 ] && STEPS=("${ONLY[@]}")
declare -A CMDS=(
  [env]="rc=0; nvidia-smi || rc=1; $VPY scripts/gpu_env_probe.py || rc=1; exit \$rc"
  [pytest]="$VPY -m pytest -q -p no:cacheprovider -rs -m gpu ${GPU_TESTS[*]}"
  [quickstart]="$VPY bench/gpu_quickstart.py"
  [trainer]="$VPY bench/trainer_step.py --gpu"
  [trainer15]="$VPY bench/trainer_step.py --gpu --shape qwen2.5-1.5b --reps 3"
  [rollout]="$VPY bench/rollout.py --quick --device cuda"
)

plan() {
  echo "[gpu-check] plan (wheels: $WHEELS, deps: $DEPS, python: $PY3${LOG_DIR:+, logs: $LOG_DIR})"
  echo "  setup    $PY3 -m pip install --no-index --no-deps --target $DEPS --find-links $WHEELS -r $WHEELS/requirements.txt"
  for s in "${STEPS[@]}"; do printf '  %-11s %s\n' "$s" "${CMDS[$s]}"; done
}

# A python that has pip (a uv-made venv has none): the --dry-run's offline resolution uses it.
pip_python() {
  for p in "$PY3" python3 .venv/bin/python; do
    if command -v "$p" >/dev/null 2>&1 && "$p" -m pip --version >/dev/null 2>&1; then echo "$p"; return 0; fi
  done
  return 1
}

if [ "$DRY_RUN" = 1 ]; then
  plan
  if [ ! -f "$WHEELS/requirements.txt" ]; then
    echo "[gpu-check] $WHEELS/requirements.txt is missing: run 'bash scripts/gpu_wheels.sh' where PyPI is reachable" >&2
    exit 1
  fi
  [ ${#GPU_TESTS[@]} -gt 0 ] || { echo "[gpu-check] no gpu-marked tests found under tests/" >&2; exit 1; }
  CHECK_PY=.venv/bin/python
  [ -x "$CHECK_PY" ] || CHECK_PY=$PY3
  "$CHECK_PY" scripts/gpu_wheels.py check --dest "$WHEELS" || exit 1
  PIP_PY=$(pip_python) || { echo "[gpu-check] no python with pip found for the offline resolution" >&2; exit 1; }
  TARGET=$(mktemp -d)
  trap 'rm -rf "$TARGET"' EXIT
  # cp312 manylinux wheels for every pin, from the folder alone (--isolated: no pip config, no index)
  if ! "$PIP_PY" -m pip --isolated install --dry-run --quiet --no-index --find-links "$WHEELS" --no-deps \
      --only-binary=:all: --python-version 3.12 --implementation cp --abi cp312 \
      --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64 \
      --target "$TARGET" -r "$WHEELS/requirements.txt"; then
    echo "[gpu-check] $WHEELS does not satisfy $WHEELS/requirements.txt offline: run 'bash scripts/gpu_wheels.sh' again" >&2
    exit 1
  fi
  wheel_bytes=$(du -sb "$WHEELS" | cut -f1)
  tree_bytes=$(git ls-files -z | du -cb --files0-from=- 2>/dev/null | tail -n 1 | cut -f1)
  if [ $(( wheel_bytes + tree_bytes )) -gt $(( 64 << 20 )) ]; then
    echo "[gpu-check] $WHEELS ($(( wheel_bytes >> 20 )) MiB) and the tree ($(( tree_bytes >> 20 )) MiB) exceed the" \
      "64 MiB that travel with the tree: drop packages the GPU steps do not import (scripts/gpu_wheels.py NOT_NEEDED)" >&2
    exit 1
  fi
  echo "[gpu-check] dry run OK: $WHEELS satisfies $WHEELS/requirements.txt offline;" \
    "$(( (wheel_bytes + tree_bytes) >> 20 )) MiB with the tree (limit 64)"
  exit 0
fi

plan
echo "== setup"
if [ ! -f "$WHEELS/requirements.txt" ]; then
  echo "[gpu-check] $WHEELS/requirements.txt is missing: run 'bash scripts/gpu_wheels.sh' where PyPI is reachable, then carry $WHEELS here" >&2
  exit 1
fi
if [ ! -f "$DEPS/.installed" ]; then
  rm -rf "$DEPS"
  if ! "$PY3" -m pip --isolated install --quiet --no-index --no-deps --target "$DEPS" --find-links "$WHEELS" \
      -r "$WHEELS/requirements.txt"; then
    echo "[gpu-check] offline install into $DEPS failed (see above); nothing else runs" >&2
    exit 1
  fi
  touch "$DEPS/.installed"
fi
if [ "$SETUP_ONLY" = 1 ]; then
  echo "[gpu-check] installed into $DEPS; run the project with: $VPY"
  exit 0
fi
$VPY -c "import torch, transformers, grpc; assert torch.cuda.is_available(), 'torch sees no CUDA device'; print('[gpu-check] setup OK: torch', torch.__version__, '| transformers', transformers.__version__, '| grpcio', grpc.__version__)" || exit 1

declare -A RESULT
FAILED=0
for s in "${STEPS[@]}"; do
  echo "== $s: ${CMDS[$s]}"
  start=$(date +%s)
  if [ -n "$LOG_DIR" ]; then
    bash -c "${CMDS[$s]}" 2>&1 | tee "$LOG_DIR/$s.log"
    rc=${PIPESTATUS[0]}
  else
    bash -c "${CMDS[$s]}"
    rc=$?
  fi
  RESULT[$s]="rc=$rc $(( $(date +%s) - start ))s"
  if [ "$rc" -eq 0 ]; then echo "[gpu-check] $s PASSED (${RESULT[$s]})"; else echo "[gpu-check] $s FAILED (${RESULT[$s]})"; FAILED=1; fi
done
# the trainer step's JSON last line, on its own
if [ -n "$LOG_DIR" ] && tail -n 1 "$LOG_DIR/trainer.log" 2>/dev/null | grep -q '^{'; then
  tail -n 1 "$LOG_DIR/trainer.log" > "$LOG_DIR/trainer_step.json"
fi

echo "== summary"
json="{"
for s in "${STEPS[@]}"; do
  status=PASSED; [ "${RESULT[$s]%% *}" = "rc=0" ] || status=FAILED
  printf '  %-11s %s (%s)\n' "$s" "$status" "${RESULT[$s]}"
  json+="\"$s\": \"$status ${RESULT[$s]}\", "
done
json="${json%, }}"
[ -n "$LOG_DIR" ] && echo "$json" > "$LOG_DIR/summary.json"
echo "$json"
exit "$FAILED"
