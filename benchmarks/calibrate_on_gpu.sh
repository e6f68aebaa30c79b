#!/usr/bin/env bash
# The calibration run for a machine with an NVIDIA GPU (issue 7), about 10 minutes: measure the
# corpus families with `horus-admin calibrate`, then report the cold-start estimator against
# the measurements and the cross-validated learned model (`horus-admin retrain`, which scores
# both on the same held-out rows). Everything lands in $OUT (default ./calibration-out):
#   gpu.csv, torch.txt      the GPU model, driver and torch/CUDA versions
#   calibration.csv         one row per (model, batch size, task), `horus-admin import` format
#   retrain.json            cold start vs learned: memory median error, utilization RMSLE/MAE
# Needs PyTorch with CUDA already installed (the GPU image's own build).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
out="${OUT:-./calibration-out}"
mkdir -p "$out"
python3 -m pip install -q --disable-pip-version-check -e ".[probe]"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > "$out/gpu.csv"
python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)" > "$out/torch.txt"
export HORUS_LEDGER_URL="sqlite:///$(realpath "$out")/ledger.db" HORUS_MODEL_DIR="$out/models"
horus-admin calibrate --out "$out/calibration.csv" --seconds "${SECONDS_PER_RUN:-10}" --resume
horus-admin retrain --import "$out/calibration.csv" --force --json > "$out/retrain.json"
cat "$out/gpu.csv" "$out/torch.txt" "$out/retrain.json"
