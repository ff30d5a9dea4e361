# One device call: CUDA tests of what changed (grid parameter gradient in one launch, Adam pair, strided
# wgrad, stream query), host-side sections and profiles of the image step, the image demo.
export PYTHONUNBUFFERED=1
python3 benchmarks/debug/host_sections.py > $OUT/host_sections.log 2>&1
python3 benchmarks/profile_image.py --steps 300 --json $OUT/profile_image.json > $OUT/profile.log 2>&1
TINN_ARCH=cuda timeout 300 python3 -m pytest -q -p no:cacheprovider tests/test_encodings_cuda.py tests/test_direct_step.py tests/test_network_array.py tests/test_optimizers.py tests/test_mlp_fused_cuda.py tests/test_torch_interop.py -k "not activations and not widths and not sixteen and not many and not demo" > $OUT/tests.log 2>&1; echo "tests rc=$?" > $OUT/summary.txt; grep -E "^E |passed|failed|FAILED" $OUT/tests.log | head -14 >> $OUT/summary.txt
python3 benchmarks/profile_image.py --steps 300 > $OUT/profile2.log 2>&1
timeout 100 python3 demos/mlp_learning_an_image.py --config configs/config_hash.json --steps 1000 --batch 262144 --out /tmp/demo > $OUT/demo.log 2>&1; tail -1 $OUT/demo.log >> $OUT/summary.txt
cat $OUT/summary.txt; tail -22 $OUT/host_sections.log; grep -E "checks|host side alone|GPU busy" $OUT/profile.log $OUT/profile2.log; sed -n '/^kernel /,/host side (top/p' $OUT/profile.log | head -16
