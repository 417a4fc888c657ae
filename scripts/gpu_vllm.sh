#!/usr/bin/env bash
# vLLM 0.33 on the lent GPU machine (one H100/H200, python3 = a virtualenv with torch 2.11 for CUDA 13, no
# vLLM, no network): the second prepared command after scripts/gpu_probe.sh. vLLM travels in <= 2 pieces
# made here by `python scripts/gpu_vllm_pack.py build` (git-ignored .gpu-vllm/: the wheel stripped to one
# sm_90 GPU with the Triton attention backend, plus the runtime dependencies the image lacks), so it takes
# two calls in a row while the machine stays warm:
#
#   call 1, carry .gpu-vllm/piece1.xz.part .gpu-vllm/manifest.json:
#       bash scripts/gpu_vllm.sh stage      # piece 1 checked and kept in .gpu-vllm-stage/ (git-ignored)
#   call 2, carry .gpu-vllm/piece2.xz.part .gpu-vllm/manifest.json .gpu-wheels:
#       bash scripts/gpu_vllm.sh run        # join, unpack, then the steps below within 540 s
#   bash scripts/gpu_vllm.sh --dry-run      # here: pieces present and whole, sizes fit, the named tests exist
#   bash scripts/gpu_vllm.sh --list         # the plan: step, planned seconds, command
#
# Steps (one summary line each: name, ok/failed/skipped/timeout, seconds; each bounded by what is left):
#   setup      .gpu-wheels into .gpu-deps (as the probe), the pieces joined and unpacked into .gpu-vllm-site
#   import     vLLM's compiled ops load on the image's torch (_C_stable_libtorch, cumem_allocator) and
#              _C.rms_norm equals torch's on the device (scripts/gpu_vllm_ops.py); versions
#   engine     tests/vllm_engine on the GPU: generation and log-probs, in-flight pause/resume, the sync
#              methods (nccl into the engine's workers, a lora_adapter load)
#   colocate   sleep/wake in one-GPU mode (tests/vllm_engine/test_vllm_colocate.py)
# Files (at most 8) under $OUT/vllm, or runs/gpu_vllm when $OUT is unset: summary.txt, results.jsonl,
# <step>.log.
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/gpu_steps.sh  # install_wheels, run_steps

DEADLINE_S=${RFT_PROBE_DEADLINE_S:-540}
MARGIN_S=15
PIECES=${RFT_GPU_VLLM:-.gpu-vllm}
STAGE=${RFT_GPU_VLLM_STAGE:-.gpu-vllm-stage}
SITE=${RFT_GPU_VLLM_SITE:-.gpu-vllm-site}
WHEELS=${RFT_GPU_WHEELS:-.gpu-wheels}
DEPS=${RFT_GPU_DEPS:-.gpu-deps}
PY3=${RFT_GPU_PYTHON:-python3}
case "$DEPS" in /*) ;; *) DEPS=$PWD/$DEPS ;; esac
case "$SITE" in /*) ;; *) SITE=$PWD/$SITE ;; esac
# vLLM 0.33 reads no attention backend from the environment; the explorer's engine passes this one on
# (services/explorer/engines/vllm.py attention_backend): FlashAttention does not travel
export RFT_VLLM_ATTENTION_BACKEND=${RFT_VLLM_ATTENTION_BACKEND:-TRITON_ATTN}
# the test engines run eager (tests/vllm_engine/conftest.py): vLLM 0.33 compiles with torch 2.14's inductor
export RFT_VLLM_ENFORCE_EAGER=${RFT_VLLM_ENFORCE_EAGER:-1}
VPY="env PYTHONPATH=$DEPS:$SITE:$PWD:$PWD/protos${PYTHONPATH:+:$PYTHONPATH} PATH=$DEPS/bin:$PATH $PY3"
PYTEST="$VPY -m pytest -q -p no:cacheprovider -rs -m vllm"
PACK="$PY3 scripts/gpu_vllm_pack.py"

STEPS=(setup import engine colocate)
declare -A PLANNED=([setup]=60 [import]=30 [engine]=240 [colocate]=90)
ENGINE_TESTS="tests/vllm_engine/test_vllm_generation.py tests/vllm_engine/test_vllm_inflight.py tests/vllm_engine/test_vllm_sync_methods.py"
COLOCATE_TESTS="tests/vllm_engine/test_vllm_colocate.py"
declare -A CMDS=(
  [setup]="install_wheels && install_vllm"
  [import]="$VPY scripts/gpu_vllm_ops.py"
  [engine]="$PYTEST $ENGINE_TESTS"
  [colocate]="$PYTEST $COLOCATE_TESTS"
)

install_vllm() {
  [ -f "$SITE/.installed" ] && return 0
  rm -rf "$SITE"
  $PY3 scripts/gpu_vllm_pack.py unpack --dest "$PIECES" --stage "$STAGE" --site "$SITE" && touch "$SITE/.installed"
}
export -f install_vllm
export WHEELS DEPS PY3 PIECES STAGE SITE

case "${1:-}" in
--list)
  for s in "${STEPS[@]}"; do printf '%s\t%s\t%s\n' "$s" "${PLANNED[$s]}" "${CMDS[$s]}"; done
  exit 0 ;;
--dry-run)
  CHECK_PY=${RFT_CHECK_PYTHON:-.venv/bin/python}
  [ -x "$CHECK_PY" ] || CHECK_PY=python3
  FAILED=0
  check() { echo "== $1"; shift; "$@" || { echo "[gpu-vllm] FAILED: $*" >&2; FAILED=1; }; }
  check "pieces whole, each within 64 MiB with the tree and $WHEELS (4 MiB spare)" \
    "$CHECK_PY" scripts/gpu_vllm_pack.py check --dest "$PIECES" --wheels "$WHEELS"
  tests_exist() {
    local f
    for f in $ENGINE_TESTS $COLOCATE_TESTS; do [ -f "$f" ] || { echo "  $f is missing"; return 1; }; done
    grep -q 'lora_adapter' tests/vllm_engine/test_vllm_sync_methods.py &&
      grep -q 'pause' tests/vllm_engine/test_vllm_inflight.py && echo "  the named test files exist"
  }
  check "named tests" tests_exist
  planned_sum() {
    local s total=0
    for s in "${STEPS[@]}"; do total=$(( total + PLANNED[$s] )); done
    echo "  planned ${total}s of ${DEADLINE_S}s"; [ "$total" -lt 480 ]
  }
  check "plan" planned_sum
  [ "$FAILED" = 0 ] && echo "[gpu-vllm] dry run OK" || echo "[gpu-vllm] dry run FAILED" >&2
  exit "$FAILED" ;;
stage)
  # call 1: keep piece 1 (checked against the manifest) where call 2's carry does not replace it
  mkdir -p "$STAGE"
  $PY3 - "$PIECES" "$STAGE" <<'PY'
import hashlib, json, shutil, sys
from pathlib import Path
src, stage = Path(sys.argv[1]), Path(sys.argv[2])
manifest = json.loads((src / "manifest.json").read_text())
kept = []
for p in manifest["pieces"]:
    f = src / p["name"]
    if f.is_file():
        if hashlib.sha256(f.read_bytes()).hexdigest() != p["sha256"]:
            sys.exit(f"[gpu-vllm] {f}: not the manifest's digest")
        shutil.copy(f, stage / p["name"]); kept.append(p["name"])
shutil.copy(src / "manifest.json", stage / "manifest.json")
if not kept:
    sys.exit(f"[gpu-vllm] no piece of the manifest in {src}")
print(f"[gpu-vllm] staged {', '.join(kept)} in {stage}; now `bash scripts/gpu_vllm.sh run` with the rest")
PY
  exit $? ;;
run) ;;
*) echo "usage: bash scripts/gpu_vllm.sh stage | run | --dry-run | --list" >&2; exit 2 ;;
esac

open_outputs "${OUT:-runs/gpu_vllm}/vllm"
say "[gpu-vllm] deadline ${DEADLINE_S}s; steps: ${STEPS[*]}; RFT_VLLM_ATTENTION_BACKEND=$RFT_VLLM_ATTENTION_BACKEND RFT_VLLM_ENFORCE_EAGER=$RFT_VLLM_ENFORCE_EAGER; files in $OUTDIR"
record() {  # one JSON line per step: status, seconds, pytest's counts, the import step's JSON
  "$PY3" - "$@" <<'PY' >> "$RESULTS"
import json, re, sys
name, status, seconds, planned, bound, log = sys.argv[1:7]
rec = {"step": name, "status": status, "seconds": int(seconds), "planned_s": int(planned), "bound_s": int(bound)}
try:
    lines = open(log, errors="replace").read().splitlines()
except OSError:
    lines = []
for line in lines:
    if line.startswith('{"vllm"'):
        rec["json"] = json.loads(line)
for line in reversed(lines):
    if re.search(r"\d+ (passed|failed|skipped|error)", line) and " in " in line:
        rec["pytest"] = {k: int(n) for n, k in re.findall(r"(\d+) (passed|failed|skipped|errors?|deselected)", line)}
        break
print(json.dumps(rec))
PY
}

run_steps gpu-vllm 10 setup import
say "[gpu-vllm] done in $(( SECONDS - START ))s; $( [ "$FAILED" = 0 ] && echo 'all ok' || echo 'some steps did not pass' )"
cat "$RESULTS"
exit "$FAILED"
