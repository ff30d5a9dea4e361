# One device call: the width-128 fused CUDA test (prefetch registers at their largest), then the
# weight-gradient prefetch off/on over widths 16..128 (1024 and 16384 networks, 2^20 samples, even).
export PYTHONUNBUFFERED=1
TINN_ARCH=cuda timeout 150 python3 -m pytest -q -p no:cacheprovider tests/test_mlp_fused_cuda.py -k "32-128-16-2-16" > $OUT/tests.log 2>&1
for v in 0 1; do TINN_FUSED_GRAD_PREFETCH=$v timeout 150 python3 benchmarks/bench_mlp_array.py --networks 1024,16384 \
  --widths 16,32,64,128 --log2-samples 20 --routing even --skip-torch --reps 3 > $OUT/prefetch_$v.log 2>&1; done
tail -2 $OUT/tests.log; for v in 0 1; do echo "== TINN_FUSED_GRAD_PREFETCH=$v"; grep -E "^ *[0-9]+ \|" $OUT/prefetch_$v.log | cut -d'|' -f1,2,5,6,12; done
