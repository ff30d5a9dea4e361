# One device call: the CUDA tests fixed last call, the image step's profile three times (host speed varies
# between processes), the 4096 x 64 target case against torch, the image demo.
export PYTHONUNBUFFERED=1
TINN_ARCH=cuda timeout 200 python3 -m pytest -q -p no:cacheprovider tests/test_torch_interop.py -k "not demo" > $OUT/tests.log 2>&1; echo "interop tests rc=$?" > $OUT/summary.txt; grep -E "^E |passed|failed|FAILED" $OUT/tests.log | head -8 >> $OUT/summary.txt
for i in 1 2 3; do python3 benchmarks/profile_image.py --steps 300 --json $OUT/profile_image_$i.json > $OUT/profile_$i.log 2>&1; grep -E "checks off|host side alone|GPU busy" $OUT/profile_$i.log | tr '\n' ' ' >> $OUT/summary.txt; echo >> $OUT/summary.txt; done
timeout 60 python3 benchmarks/debug/host_sections.py > $OUT/host_sections.log 2>&1
timeout 200 python3 benchmarks/bench_mlp_array.py --networks 4096 --log2-samples 22 --routing even,ragged --no-vmap --reps 3 --json $OUT/bench_target.json > $OUT/bench_target.log 2>&1; tail -4 $OUT/bench_target.log >> $OUT/summary.txt
timeout 90 python3 demos/mlp_learning_an_image.py --config configs/config_hash.json --steps 1000 --batch 262144 --out /tmp/demo > $OUT/demo.log 2>&1; tail -1 $OUT/demo.log >> $OUT/summary.txt
cat $OUT/summary.txt; head -12 $OUT/host_sections.log | tail -10
