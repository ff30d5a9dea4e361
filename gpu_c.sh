python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PYTHONPATH TINN_ARCH=cuda PYTHONUNBUFFERED=1
timeout 290 python3 -m pytest -q -n 16 -p no:cacheprovider -m "not slow" --maxfail=60 > $OUT/cuda_suite.log 2>&1; echo "suite rc=$?"
grep -E "^(FAILED|ERROR)|passed|failed" $OUT/cuda_suite.log | tail -40
