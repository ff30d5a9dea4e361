#!/usr/bin/env bash
# Everything worth running on a GPU machine in one go: CUDA tests, benchmarks, demos, a viewer frame.
# Usage: OUT=dir benchmarks/gpu_suite.sh   (logs and JSON land in $OUT)
set -uo pipefail
OUT=${OUT:-out/gpu}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
run() { local name=$1; shift; echo "== $name"; timeout "${LIMIT:-240}" "$@" > "$OUT/$name.log" 2>&1; echo "rc=$?"; tail -n "${TAIL:-3}" "$OUT/$name.log"; }
TINN_ARCH=cuda run tests python3 -m pytest -q -p no:cacheprovider tests/test_network_array.py tests/test_losses.py \
  tests/test_optimizers.py tests/test_encodings_cuda.py tests/test_torch_interop.py
run bench_mlp python3 benchmarks/bench_mlp_array.py --networks 1,64,4096 --log2-samples 20,22 --json "$OUT/bench_mlp.json"
run bench_ragged python3 benchmarks/bench_mlp_array.py --networks 4096 --log2-samples 22 --routing sorted,ragged --json "$OUT/bench_ragged.json"
run bench_grid python3 benchmarks/bench_grid.py --json "$OUT/bench_grid.json"
run bench_torch_path python3 benchmarks/bench_torch_path.py --json "$OUT/bench_torch_path.json"
run demo_hash python3 demos/mlp_learning_an_image.py --config configs/config_hash.json --tiles 8 --steps 1000 --out "$OUT/demo_hash"
run demo_freq python3 demos/mlp_learning_an_image.py --config configs/config.json --tiles 8 --steps 1000 --out "$OUT/demo_freq"
run demo_pytorch python3 demos/mlp_learning_an_image_pytorch.py --steps 1000 --out "$OUT/demo_pytorch"
run viewer python3 -m tinn.viewer --config configs/config_hash.json --tiles 4 --headless --steps 300 --out "$OUT/viewer"
