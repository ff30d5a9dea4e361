for c in "32 64 16 2 4 1000" "32 128 16 2 4 1000" "3 16 3 1 1 1000"; do
  echo "== $c"; timeout 120 python3 benchmarks/debug/fused_debug.py $c all 2>&1 | grep -v Warn | grep -i "err\|error" | head -4
done
