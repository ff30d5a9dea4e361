# One device call: CUDA tests of what changed, the image step's profile, the 4096 x 64 target case
# (with and without the derivative prefetch) and the image demo.
export PYTHONUNBUFFERED=1
TINN_ARCH=cuda timeout 300 python3 -m pytest -q -p no:cacheprovider tests/test_mlp_fused_cuda.py tests/test_direct_step.py tests/test_image_sampling.py tests/test_network_array.py -k "not activations and not widths and not sixteen and not many" > $OUT/tests.log 2>&1; echo "tests rc=$?"; grep -E "^E |passed|failed" $OUT/tests.log | head -12
python3 benchmarks/profile_image.py --steps 300 --json $OUT/profile_image.json > $OUT/profile_image.log 2>&1
grep -E "ms/step|host side alone|GPU busy" $OUT/profile_image.log | head -4; sed -n '/^kernel /,/host side (top/p' $OUT/profile_image.log | head -12
timeout 200 python3 benchmarks/bench_mlp_array.py --networks 4096 --log2-samples 22 --routing even,ragged --json $OUT/bench_target.json > $OUT/bench_target.log 2>&1; tail -5 $OUT/bench_target.log
TINN_FUSED_PREFETCH_DERIVATIVE=0 timeout 150 python3 benchmarks/bench_mlp_array.py --networks 4096 --log2-samples 22 --routing even --skip-torch --no-vmap > $OUT/bench_target_noprefetch.log 2>&1; tail -2 $OUT/bench_target_noprefetch.log
timeout 120 python3 demos/mlp_learning_an_image.py --config configs/config_hash.json --steps 1000 --batch 262144 --out $OUT/demo > $OUT/demo.log 2>&1; tail -1 $OUT/demo.log; rm -f $OUT/demo/*.png
