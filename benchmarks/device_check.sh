#!/usr/bin/env bash
# Quick GPU check of the MLP-array kernels: CUDA tests, the target benchmark case, a kernel profile.
set -uo pipefail
OUT=${OUT:-out/gpu}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
TINN_ARCH=cuda timeout 300 python3 -m pytest -q -x -p no:cacheprovider tests/test_mlp_fused_cuda.py tests/test_network_array.py \
  tests/test_routing.py > "$OUT/tests.log" 2>&1; echo "tests rc=$?"; tail -n 15 "$OUT/tests.log"
timeout 200 python3 benchmarks/bench_mlp_array.py --networks 4096 --log2-samples 22 --routing even,sorted,ragged --unfused \
  --no-vmap --json "$OUT/bench_target.json" > "$OUT/bench_target.log" 2>&1; echo "bench rc=$?"; tail -n 6 "$OUT/bench_target.log"
timeout 120 python3 benchmarks/profile_step.py 4096 22 > "$OUT/profile.log" 2>&1; echo "profile rc=$?"; tail -n 25 "$OUT/profile.log"
