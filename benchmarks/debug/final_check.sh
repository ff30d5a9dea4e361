# Default fused geometry: correctness on a few shapes, then the target benchmark case against torch.
for c in "32 128 16 2 16 9000" "48 32 3 3 300 5000" "3 16 1 1 1 1000" "32 64 16 2 4096 60000"; do
  echo "== $c"; timeout 90 python3 benchmarks/debug/fused_debug.py $c all 2>&1 | grep -i "err" | tail -2; done
timeout 150 python3 benchmarks/bench_mlp_array.py --networks 4096 --log2-samples 22 --routing even,ragged --no-vmap 2>&1 | tail -4
