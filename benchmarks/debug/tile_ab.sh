# Tile-size A/B for the fused kernels (register block R = tile / 16): kernel profile and a correctness check.
for t in 128 64 32; do
  echo "== TINN_FUSED_TILE=$t"
  TINN_FUSED_TILE=$t timeout 100 python3 benchmarks/profile_step.py 4096 22 2>&1 \
    | grep -E "\] (weight_gradients|backward_deltas|forward)_c" | grep -v serial
  TINN_FUSED_TILE=$t timeout 60 python3 benchmarks/debug/fused_debug.py 32 64 16 2 64 5000 all 2>&1 | grep -i "err" | tail -2
done
