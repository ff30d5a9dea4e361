# Tile-size A/B for the fused kernels (register block R = tile / 16): kernel profile and a correctness check.
for t in "128 80" "64 48" "32 32"; do set -- $t
  echo "== TINN_FUSED_TILE=$1 TINN_FUSED_BWD_TILE=$2"
  TINN_FUSED_TILE=$1 TINN_FUSED_BWD_TILE=$2 timeout 100 python3 benchmarks/profile_step.py 4096 22 2>&1 | grep -E "\] (backward|forward)_c" | head -2
  TINN_FUSED_TILE=$1 TINN_FUSED_BWD_TILE=$2 timeout 60 python3 benchmarks/debug/fused_debug.py 32 64 16 2 64 5000 all 2>&1 | grep -i "err" | tail -2
done
