# A/B of the backward chunk size (weight gradients in registers across sub-tiles or not), kernel profile.
for c in 1 8; do echo "== TINN_FUSED_CHUNK=$c"; TINN_FUSED_CHUNK=$c timeout 150 python3 benchmarks/profile_step.py 4096 22 2>&1 | grep -E "backward|forward_c|Total" | head -4; done
