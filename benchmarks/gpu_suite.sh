#!/usr/bin/env bash
# Everything worth running on a GPU machine, in parts that each fit one device call:
#   OUT=dir benchmarks/gpu_suite.sh kernels   CUDA kernel tests, the image step's kernel profile, the target
#                                             MLP case (tinn fused/unfused, torch bmm, torch.func vmap), image demo
#   OUT=dir benchmarks/gpu_suite.sh grid      the benchmark grid: N 1..16384 x widths 16..128, even + ragged
#   OUT=dir benchmarks/gpu_suite.sh scenes    KiloNeRF and octree-LoD demos at full size
#   OUT=dir benchmarks/gpu_suite.sh speed     the speed work's runs, those named in SPEED_PARTS (default all):
#                                             ab: per-kernel times of STEP_CASES and the image step under each
#                                             tuning in SPEED_SETTINGS (TINN_SETTINGS values separated by ";",
#                                             "default" for none; tools/settings_ab.py); kernels: every GPU kernel
#                                             of the target step (tools/step_kernels.py); bench: training steps
#                                             against torch bmm and grouped GEMM, even routing, 64 and 4096
#                                             networks x widths 64 and 128; tests: the fused-kernel CUDA tests;
#   OUT=dir benchmarks/gpu_suite.sh speed-extra  the host time per path (host_overhead.py), the SASS loop mix at
#                                             widths 64 and 128, start-up cold and warm;
#                                             ARCHIVE=file.tgz packs OUT into one file (the device returns few files)
# On the device machine keep OUT local and the archive in the device's $OUT; bash assigns left to right, so
# name the archive first:  ARCHIVE=$OUT/speed.tgz OUT=/tmp/speed bash benchmarks/gpu_suite.sh speed
# Logs and JSON land in $OUT; each step prints its last lines.
set -uo pipefail
cd "$(dirname "$0")/.."  # the modules run with -m from the repository root
OUT=${OUT:-out/gpu}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
run() { local name=$1; local limit=$2; shift 2; echo "== $name"; timeout "$limit" "$@" > "$OUT/$name.log" 2>&1;
        echo "rc=$?"; tail -n "${TAIL:-4}" "$OUT/$name.log"; }
part=${1:-kernels}
if [ "$part" = kernels ]; then
  TINN_ARCH=cuda run tests 300 python3 -m pytest -q -p no:cacheprovider tests/test_mlp_fused_cuda.py tests/test_routing.py \
    tests/test_launch.py tests/test_encodings_cuda.py tests/test_part_contract.py tests/test_network_array.py tests/test_image_sampling.py
  TAIL=16 run profile_image 150 python3 -m benchmarks.profile_image --json "$OUT/profile_image.json"
  TAIL=4 run step_timeline 90 python3 -m benchmarks.tools.step_timeline   # GPU- or host-bound, per process
  TAIL=6 run bench_target 200 python3 -m benchmarks.bench_mlp_array --networks 4096 --log2-samples 22 \
    --routing even,sorted,ragged --unfused --json "$OUT/bench_target.json"
  run demo_hash 120 python3 demos/mlp_learning_an_image.py --config tinn/configs/config_hash.json --steps 1000 \
    --batch 262144 --out "$OUT/demo_hash"
fi
if [ "$part" = grid ]; then
  TAIL=45 run bench_grid 560 python3 -m benchmarks.bench_mlp_array --suite --log2-samples 20 --reps 3 \
    --json "$OUT/bench_suite.json"
fi
if [ "$part" = scenes ]; then
  TAIL=12 run kilonerf 300 python3 demos/kilonerf.py --out "$OUT/kilonerf"
  TAIL=12 run octree_lod 280 python3 demos/octree_lod.py --out "$OUT/octree_lod"
fi
if [ "$part" = speed ]; then
  parts=" ${SPEED_PARTS:-ab kernels bench tests} "
  [[ $parts == *" ab "* ]] && TAIL=40 run settings_ab "${AB_LIMIT:-300}" python3 -m benchmarks.tools.settings_ab \
    --out "$OUT/ab" --image --jobs 8 --settings "${SPEED_SETTINGS:-default;fused_loss=True;fused_loss=False}" \
    --step-cases "${STEP_CASES-4096:22:64,128}"
  [[ $parts == *" kernels "* ]] && TAIL=50 run step_kernels 150 python3 -m benchmarks.tools.step_kernels \
    --cases 4096:64,64:64 --json "$OUT/step_kernels.json"
  [[ $parts == *" bench "* ]] && TAIL=14 run bench_even 240 python3 -m benchmarks.bench_mlp_array --networks 64,4096 \
    --log2-samples 22 --widths 64,128 --routing even --no-vmap --json "$OUT/bench_even.json"
  [[ $parts == *" tests "* ]] && TINN_ARCH=cuda run tests "${TESTS_LIMIT:-300}" python3 -m pytest -q -n 8 \
    -p no:cacheprovider tests/test_mlp_fused_cuda.py tests/test_routing.py
  [ -z "${ARCHIVE:-}" ] || tar czf "$ARCHIVE" -C "$OUT" .
fi
if [ "$part" = speed-extra ]; then
  TAIL=8 run host_overhead 90 python3 -m benchmarks.tools.host_overhead --arch cuda --json "$OUT/host_overhead.json"
  mkdir -p "$OUT/ptx"
  TAIL=12 run ptx_w64 120 python3 -m benchmarks.tools.ptx_report "$OUT/ptx" 64
  TAIL=12 run ptx_w128 120 python3 -m benchmarks.tools.ptx_report "$OUT/ptx" 128
  TAIL=8 run startup 120 python3 -m benchmarks.bench_startup --arch cuda --kernels --json "$OUT/bench_startup.json"
  [ -z "${ARCHIVE:-}" ] || tar czf "$ARCHIVE" -C "$OUT" .
fi
