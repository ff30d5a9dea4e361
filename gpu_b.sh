python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PYTHONPATH TINN_ARCH=cuda PYTHONUNBUFFERED=1
timeout 150 python3 -m pytest -q -n 14 -p no:cacheprovider tests/test_gradient_paths.py tests/test_mlp_fused_cuda.py tests/test_second_order.py tests/test_part_contract.py tests/test_network_precision.py tests/test_tcnn_api.py > $OUT/cuda_tests.log 2>&1; echo "tests rc=$?"
grep -E "^(FAILED|ERROR)|passed|failed" $OUT/cuda_tests.log | tail -12
timeout 100 python3 -m benchmarks.tools.tensor_core_check --part bench --quick --out $OUT/tc_bench.json > $OUT/tc_bench.log 2>&1; echo "tc bench rc=$?"
timeout 110 python3 -m benchmarks.bench_mlp_array --networks 64,4096 --log2-samples 22 --routing even,ragged --no-vmap --reps 5 --json $OUT/bench_array.json > $OUT/bench_array.log 2>&1; echo "bench rc=$?"
timeout 45 python3 -m benchmarks.tools.web_viewer_cost --seconds 5 --warmup 3 > $OUT/web_cost.log 2>&1; echo "web rc=$?"
for k in auto unfused; do TINN_ARCH=cpu TINN_SETTINGS=network_kernels=$k timeout 50 python3 -m benchmarks.bench_mlp_array --arch cpu --networks 64 --no-vmap --no-grouped --reps 3 > $OUT/cpu_$k.log 2>&1; echo "cpu $k rc=$?"; done
tail -4 $OUT/tc_bench.log | cut -c1-300; grep -A8 "^ N |" $OUT/bench_array.log | cut -c1-250; tail -3 $OUT/web_cost.log | cut -c1-400; for k in auto unfused; do grep -A2 "^ N |" $OUT/cpu_$k.log | tail -1 | cut -c1-200; done
