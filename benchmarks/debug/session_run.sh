# One device call: hash-grid fwd+bwd (tables only) with the feature-lane gradient on and off, 1 grid
# and 1024 grids (3D, 16 levels x 2 features, 2^18 samples).
export PYTHONUNBUFFERED=1
timeout 100 python3 benchmarks/bench_grid.py --no-input-grad --iters 10 --json $OUT/bench_grid_lanes.json > $OUT/bench_grid_lanes.log 2>&1
TINN_GRID_FEATURE_LANES=0 timeout 100 python3 benchmarks/bench_grid.py --no-input-grad --iters 10 --json $OUT/bench_grid_nolanes.json > $OUT/bench_grid_nolanes.log 2>&1
tail -9 $OUT/bench_grid_lanes.log; tail -9 $OUT/bench_grid_nolanes.log
