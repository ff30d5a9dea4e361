#!/usr/bin/env bash
# Everything worth running on a GPU machine, in parts that each fit one device call:
#   OUT=dir benchmarks/gpu_suite.sh kernels   CUDA kernel tests, the image step's kernel profile, the target
#                                             MLP case (tinn fused/unfused, torch bmm, torch.func vmap), image demo
#   OUT=dir benchmarks/gpu_suite.sh grid      the benchmark grid: N 1..16384 x widths 16..128, even + ragged
#   OUT=dir benchmarks/gpu_suite.sh scenes    KiloNeRF and octree-LoD demos at full size
#   OUT=dir benchmarks/gpu_suite.sh speed     the fused-kernel A/B runs of the speed work: per-kernel times of the
#                                             target case and width 128 under each tuning in SPEED_SETTINGS (each a
#                                             TINN_SETTINGS value, "default" for none), the image step under the same,
#                                             the host time per path (host_overhead.py), the SASS loop mix at widths
#                                             64 and 128, start-up cold and warm;
#                                             ARCHIVE=file.tgz packs OUT into one file (the device returns few files)
# Logs and JSON land in $OUT; each step prints its last lines.
set -uo pipefail
OUT=${OUT:-out/gpu}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
run() { local name=$1; local limit=$2; shift 2; echo "== $name"; timeout "$limit" "$@" > "$OUT/$name.log" 2>&1;
        echo "rc=$?"; tail -n "${TAIL:-4}" "$OUT/$name.log"; }
part=${1:-kernels}
if [ "$part" = kernels ]; then
  TINN_ARCH=cuda run tests 300 python3 -m pytest -q -p no:cacheprovider tests/test_mlp_fused_cuda.py tests/test_routing.py \
    tests/test_launch.py tests/test_encodings_cuda.py tests/test_part_contract.py tests/test_network_array.py tests/test_image_sampling.py
  TAIL=16 run profile_image 150 python3 benchmarks/profile_image.py --json "$OUT/profile_image.json"
  TAIL=4 run step_timeline 90 python3 benchmarks/tools/step_timeline.py   # GPU- or host-bound, per process
  TAIL=6 run bench_target 200 python3 benchmarks/bench_mlp_array.py --networks 4096 --log2-samples 22 \
    --routing even,sorted,ragged --unfused --json "$OUT/bench_target.json"
  run demo_hash 120 python3 demos/mlp_learning_an_image.py --config configs/config_hash.json --steps 1000 \
    --batch 262144 --out "$OUT/demo_hash"
fi
if [ "$part" = grid ]; then
  TAIL=45 run bench_grid 560 python3 benchmarks/bench_mlp_array.py --suite --log2-samples 20 --reps 3 \
    --json "$OUT/bench_suite.json"
fi
if [ "$part" = scenes ]; then
  TAIL=12 run kilonerf 300 python3 demos/kilonerf.py --out "$OUT/kilonerf"
  TAIL=12 run octree_lod 280 python3 demos/octree_lod.py --out "$OUT/octree_lod"
fi
if [ "$part" = speed ]; then
  TINN_ARCH=cuda run tests 300 python3 -m pytest -q -x -n 8 -p no:cacheprovider tests/test_mlp_fused_cuda.py tests/test_routing.py
  for setting in ${SPEED_SETTINGS:-default fused_backward_tile=64 fused_staged_weights=both}; do
    tag=${setting//[^a-z0-9]/_}
    env=$([ "$setting" = default ] || echo "$setting")
    TAIL=12 TINN_SETTINGS=$env run "profile_step_$tag" 150 python3 benchmarks/profile_step.py 64,4096 22 64,128
    TAIL=14 TINN_SETTINGS=$env run "profile_image_$tag" 90 python3 benchmarks/profile_image.py --json "$OUT/profile_image_$tag.json"
  done
  TAIL=8 run host_overhead 90 python3 benchmarks/tools/host_overhead.py --arch cuda --json "$OUT/host_overhead.json"
  mkdir -p "$OUT/ptx"
  TAIL=12 run ptx_w64 120 python3 benchmarks/tools/ptx_report.py "$OUT/ptx" 64
  TAIL=12 run ptx_w128 120 python3 benchmarks/tools/ptx_report.py "$OUT/ptx" 128
  TAIL=8 run startup 120 python3 benchmarks/bench_startup.py --arch cuda --kernels --json "$OUT/bench_startup.json"
  [ -z "${ARCHIVE:-}" ] || tar czf "$ARCHIVE" -C "$OUT" .
fi
