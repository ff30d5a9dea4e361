# Register cap A/B for the fused kernels: kernel profile of one training step, 4096 nets x 64 wide, 2^22 samples.
for r in 0 128 96; do echo "== TINN_GPU_MAX_REG=$r"; TINN_GPU_MAX_REG=$r timeout 150 python3 benchmarks/profile_step.py 4096 22 2>&1 | grep -E "\] (weight_gradients|backward_deltas|forward)_c" | grep -v serial; done
