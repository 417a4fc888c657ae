#!/usr/bin/env bash
# The GPU check in one call, for a machine with one NVIDIA GPU (H100/H200), python 3.12 and a CUDA build of
# torch installed system-wide, and NO network. Run from the repository root after `bash scripts/gpu_wheels.sh`
# filled .gpu-wheels/ on a machine with PyPI, and the working tree (with .gpu-wheels/) was carried over:
#
#   bash scripts/gpu_check.sh            # install offline into .venv-gpu, then run the steps below
#   bash scripts/gpu_check.sh --dry-run  # print the plan; check offline that .gpu-wheels/ is complete
#
# Setup: a venv with --system-site-packages (it reuses the system torch), the pinned wheels of
# .gpu-wheels/requirements.txt and the project itself (`-e .`, --no-deps), never reaching an index.
# Steps, each reported, the next run even when one fails; the exit status is non-zero if any failed:
#   env      nvidia-smi, the torch / CUDA / device versions
#   pytest   `pytest -m gpu` over the test files that hold gpu-marked tests
#   rollout  the explorer's hf engine on CUDA (bench/rollout.py --quick --device cuda), tokens/s
#   trainer  one bf16 FSDP2 trainer step on a Qwen2-0.5B-shaped random model (bench/trainer_step.py --gpu):
#            tokens/s and MFU, its JSON last line with "ratio" = MFU / 0.35
# With $OUT set, everything printed is also written under $OUT/gpu_check/ (one log per step, summary.json).
set -uo pipefail
cd "$(dirname "$0")/.."

DRY_RUN=0
case "${1:-}" in
  "") ;;
  --dry-run) DRY_RUN=1 ;;
  *) echo "usage: bash scripts/gpu_check.sh [--dry-run] (unknown argument: $1)" >&2; exit 2 ;;
esac
WHEELS=${RFT_GPU_WHEELS:-.gpu-wheels}
VENV=${RFT_GPU_VENV:-.venv-gpu}
PY3=${RFT_GPU_PYTHON:-python3}
VPY=$VENV/bin/python
LOG_DIR=""
if [ -n "${OUT:-}" ]; then
  LOG_DIR=$OUT/gpu_check
  mkdir -p "$LOG_DIR"
  exec > >(tee -a "$LOG_DIR/gpu_check.log") 2>&1
fi

# The test files holding gpu-marked tests: collecting only them keeps the wheel set small (the whole tree
# imports data and plotting packages the GPU steps never use; see scripts/gpu_wheels.py).
mapfile -t GPU_TESTS < <(grep -rlE 'pytest\.mark\.gpu|pytestmark *=.*gpu' tests --include='*.py' | sort)

STEPS=(env pytest rollout trainer)
declare -A CMDS=(
  [env]="rc=0; nvidia-smi || rc=1; $VPY -c 'import torch; print(\"torch\", torch.__version__, \"| CUDA\", torch.version.cuda, \"| cuDNN\", torch.backends.cudnn.version(), \"| device\", torch.cuda.get_device_name(0), \"| bf16\", torch.cuda.is_bf16_supported())' || rc=1; exit \$rc"
  [pytest]="$VPY -m pytest -q -p no:cacheprovider -m gpu ${GPU_TESTS[*]}"
  [rollout]="$VPY bench/rollout.py --quick --device cuda"
  [trainer]="$VPY bench/trainer_step.py --gpu"
)

plan() {
  echo "[gpu-check] plan (wheels: $WHEELS, venv: $VENV, python: $PY3${LOG_DIR:+, logs: $LOG_DIR})"
  echo "  setup    $PY3 -m venv --system-site-packages $VENV"
  echo "           $VPY -m pip install --no-index --find-links $WHEELS -r $WHEELS/requirements.txt"
  echo "           $VPY -m pip install --no-index --no-deps --no-build-isolation -e ."
  for s in "${STEPS[@]}"; do printf '  %-8s %s\n' "$s" "${CMDS[$s]}"; done
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
  echo "[gpu-check] dry run OK: $WHEELS satisfies $WHEELS/requirements.txt offline ($(du -sh "$WHEELS" | cut -f1))"
  exit 0
fi

plan
echo "== setup"
if [ ! -f "$WHEELS/requirements.txt" ]; then
  echo "[gpu-check] $WHEELS/requirements.txt is missing: run 'bash scripts/gpu_wheels.sh' where PyPI is reachable, then carry $WHEELS here" >&2
  exit 1
fi
if [ ! -x "$VPY" ]; then
  "$PY3" -m venv --system-site-packages "$VENV" || "$PY3" -m venv --system-site-packages --without-pip "$VENV" || {
    echo "[gpu-check] could not create $VENV with $PY3" >&2; exit 1; }
fi
PIP=("$VPY" -m pip --isolated)
if ! "${PIP[@]}" --version >/dev/null 2>&1; then
  echo "[gpu-check] $VENV has no pip and the system python has none to lend" >&2
  exit 1
fi
if ! { "${PIP[@]}" install --quiet --no-index --find-links "$WHEELS" -r "$WHEELS/requirements.txt" \
    && "${PIP[@]}" install --quiet --no-index --find-links "$WHEELS" --no-deps --no-build-isolation -e .; }; then
  echo "[gpu-check] offline install into $VENV failed (see above); nothing else runs" >&2
  exit 1
fi
"$VPY" -c "import torch, transformers, grpc; assert torch.cuda.is_available(), 'torch sees no CUDA device'; print('[gpu-check] setup OK: torch', torch.__version__, '| transformers', transformers.__version__, '| grpcio', grpc.__version__)" || exit 1

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
  printf '  %-8s %s (%s)\n' "$s" "$status" "${RESULT[$s]}"
  json+="\"$s\": \"$status ${RESULT[$s]}\", "
done
json="${json%, }}"
[ -n "$LOG_DIR" ] && echo "$json" > "$LOG_DIR/summary.json"
echo "$json"
exit "$FAILED"
