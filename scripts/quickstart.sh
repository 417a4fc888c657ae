#!/usr/bin/env bash
# Set everything up and run the main job of this version: build the local tiny model, validate the
# run configs, and sample from the model through the same loader every service uses.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
PY=${RFT_VENV:-.venv}/bin

"$PY/rft" make-tiny-model models/tiny
for cfg in examples/verl_mapping/*.yaml; do "$PY/rft" config check "$cfg"; done
"$PY/python" - <<'PY'
import torch
from services.common.modeling import load_model_and_tokenizer

model, tok = load_model_and_tokenizer("models/tiny")
torch.manual_seed(0)
batch = tok(["12+34=", "7*8="], return_tensors="pt", padding=True)
out = model.generate(**batch, max_new_tokens=8, do_sample=True)
for row in tok.batch_decode(out, skip_special_tokens=True):
    print("sample:", row)
PY
