python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PYTHONPATH TINN_ARCH=cuda PYTHONUNBUFFERED=1
timeout 200 python3 -m pytest -q -n 16 -p no:cacheprovider -m "not slow" tests/test_network_array.py tests/test_host_sync_cuda.py tests/test_torch_interop.py tests/test_tcnn_function.py tests/test_big_arrays.py tests/test_path_tools.py tests/test_encodings_grid.py tests/test_viewer_web.py tests/test_tcnn_native_tool.py tests/test_shipped_configs.py tests/test_mlp_fused_cuda.py tests/test_network_precision.py tests/test_network_selection.py > $OUT/rerun.log 2>&1; echo "rc=$?"
grep -E "^(FAILED|ERROR)|passed|failed" $OUT/rerun.log | tail -25
