# GEMM-loop unrolling and weight-gradient step A/B: per-kernel times of the 4096 x 64 training step.
for v in "1 32" "2 32" "1 64"; do set -- $v
  echo "== TINN_FUSED_UNROLL_FWD=$1 TINN_FUSED_UNROLL_BWD=$1 TINN_FUSED_GRAD_STEP=$2"
  TINN_FUSED_UNROLL_FWD=$1 TINN_FUSED_UNROLL_BWD=$1 TINN_FUSED_GRAD_STEP=$2 timeout 150 python3 benchmarks/profile_step.py 4096 22 2>&1 \
    | grep -E "\] (weight_gradients|backward_deltas|forward)_c" | sed 's/^.*| *//'
done
